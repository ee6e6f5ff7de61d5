"""The in-cluster programs a pod runs (incluster/: the admission proxy, the downloaders, the keeper),
shipped as files of a ConfigMap of the server's, mounted read-only at PROGRAMS_DIR and run as scripts
by the pinned Python image; never as `python3 -c` source in the pod's spec (Linux caps one argv string
at 128 KiB, and a spec edit would restart the pod for a comment).

The pod template carries a hash of the programs' code (their syntax trees less docstrings; h11 and its
licence as bytes): a change to what runs restarts the pods that run it, an edited comment or docstring
does not (the kubelet updates the mounted files in place).

h11, the admission proxy's HTTP implementation, is not in this repository: it is the pinned package
installed beside the program (requirements.txt), its files checked against H11_SHA256 and shipped
with its licence."""

from __future__ import annotations

import ast
import functools
import hashlib
import importlib.metadata
import importlib.util
from dataclasses import dataclass
from pathlib import Path

PROGRAMS_DIR = "/opt/inference-plane"
INCLUSTER = Path(__file__).resolve().parent.parent / "incluster"
H11_VERSION = "0.16.0"
# sha256 over h11 0.16.0's files as the wheel installs them (every h11/*.py, py.typed and LICENSE.txt, by
# name): a different h11 in the environment is refused rather than shipped.
H11_SHA256 = "a4bee1fb31d432f03ab830de0c08253c7be57b6a6a89f2f9c8c6083a49b36f9e"
# The annotation on the pod template: the programs' code hash.
PROGRAMS_ANNOTATION = "inference-plane/programs"


@dataclass(frozen=True)
class Program:
    entry: str  # the script the container runs
    modules: tuple[str, ...]  # incluster/ files it imports, itself included
    h11: bool = False


PROGRAMS = {
    # A router's pod: the proxy on the server's port.
    "admission": Program("admission_proxy.py", ("admission_proxy.py", "admission.py", "http_io.py", "router_rules.py",
                                                "fit.py"), h11=True),
    # A single-model server's init container.
    "prefetch": Program("hub_download.py", ("hub_download.py", "hub.py")),
    # A router's init container and keeper.
    "library": Program("library.py", ("library.py", "hub.py", "preset.py", "router_rules.py")),
    # The init container of a server sharing its card with a router: waits for the router to make room.
    "room": Program("room.py", ("room.py",)),
    # The init container of a split's main server: waits for every helper's ggml-rpc-server.
    "rpc_wait": Program("rpc_wait.py", ("rpc_wait.py",)),
}


class ProgramsError(ValueError):
    """One line: what is wrong with the programs to ship, and the way out."""


def command(program: str) -> list[str]:
    """The container's command: the script from the mounted ConfigMap, in isolated mode less the script's
    folder (-E -s: no PYTHON* variables, no user site; the folder stays on the path for its modules),
    writing no bytecode (-B: the root filesystem is read-only)."""
    return ["python3", "-B", "-E", "-s", f"{PROGRAMS_DIR}/{PROGRAMS[program].entry}"]


def _key(relative: str) -> str:
    """A ConfigMap key for a file (keys are flat: h11/_util.py -> h11._util.py)."""
    return relative.replace("/", ".")


@functools.cache
def h11_files() -> dict[str, str]:
    """h11's files, by path under PROGRAMS_DIR, from the installed package; refused unless they are the
    pinned release's."""
    try:
        distribution = importlib.metadata.distribution("h11")
        spec = importlib.util.find_spec("h11")
    except (importlib.metadata.PackageNotFoundError, ValueError):
        spec, distribution = None, None
    if spec is None or distribution is None or spec.origin is None:
        raise ProgramsError(f"h11 {H11_VERSION} is not installed: the admission proxy ships it; "
                            "pip install -r requirements.txt")
    package = Path(spec.origin).parent
    files = {f"h11/{p.name}": p.read_text() for p in sorted(package.iterdir()) if p.suffix == ".py" or p.name == "py.typed"}
    licences = [f for f in distribution.files or () if f.name.upper().startswith("LICENSE")]
    if not licences:
        raise ProgramsError("h11's licence file is missing from its installed metadata; reinstall h11")
    files["h11/LICENSE.txt"] = licences[0].read_text()
    digest = _digest(files)
    if distribution.version != H11_VERSION or digest != H11_SHA256:
        raise ProgramsError(f"the installed h11 is {distribution.version} (files sha256 {digest[:16]}...), not the "
                            f"pinned {H11_VERSION} ({H11_SHA256[:16]}...): pip install -r requirements.txt")
    return files


def _digest(files: dict[str, str]) -> str:
    h = hashlib.sha256()
    for name in sorted(files):
        h.update(name.encode() + b"\0" + files[name].encode() + b"\0")
    return h.hexdigest()


def program_files(programs: tuple[str, ...]) -> dict[str, str]:
    """Every file the named programs need, by path under PROGRAMS_DIR."""
    files: dict[str, str] = {}
    for name in programs:
        program = PROGRAMS[name]
        for module in program.modules:
            files[module] = (INCLUSTER / module).read_text()
        if program.h11:
            files.update(h11_files())
    return dict(sorted(files.items()))


def config_map_data(files: dict[str, str]) -> dict[str, str]:
    return {_key(path): content for path, content in files.items()}


def volume_items(files: dict[str, str]) -> list[dict]:
    return [{"key": _key(path), "path": path} for path in files]


def _code(path: str, content: str) -> str:
    """What runs of a file: a Python file's syntax tree less its docstrings (comments are not in it)."""
    if not path.endswith(".py"):
        return content
    tree = ast.parse(content)
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
                node.body = node.body[1:] or [ast.Pass()]
    return ast.dump(tree)


def code_hash(files: dict[str, str]) -> str:
    return _digest({path: _code(path, content) for path, content in files.items()})[:16]
