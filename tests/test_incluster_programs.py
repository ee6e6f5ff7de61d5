"""The in-cluster programs as shipped (issue #42 item 4): real files of a ConfigMap, never `python3 -c`
source; each program's files are exactly what it imports; they import only the standard library, each
other and h11 (the pinned, hash-checked release, with its licence); they run under the pinned image's
Python; and the pod template's hash follows their code, not their comments."""
from __future__ import annotations

import ast
import subprocess
import sys

import pytest

from conftest import ROOT, STACKS


from lab.contract.pod_programs import image_minor, pod_python

from components import programs
from config.defaults import PREFETCH_IMAGE

INCLUSTER = ROOT / "incluster"


def _imports(text: str) -> set[str]:
    tree = ast.parse(text)
    names = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    names |= {node.module.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module
              and node.level == 0}
    return names


def test_the_in_cluster_programs_import_only_the_standard_library_each_other_and_h11():
    own = {path.stem for path in INCLUSTER.glob("*.py")}
    for path in sorted(INCLUSTER.glob("*.py")):
        outside = _imports(path.read_text()) - set(sys.stdlib_module_names) - own - {"__future__"}
        allowed = {"h11"} if path.name in ("http_io.py", "admission_proxy.py", "admission.py") else set()
        assert outside <= allowed, f"incluster/{path.name} imports {sorted(outside - allowed)}"


@pytest.mark.parametrize("name", sorted(programs.PROGRAMS))
def test_each_program_ships_exactly_the_files_it_imports(name):
    program = programs.PROGRAMS[name]
    own = {path.stem for path in INCLUSTER.glob("*.py")}
    needed, todo = set(), [program.entry[:-3]]
    while todo:
        module = todo.pop()
        if module in needed:
            continue
        needed.add(module)
        todo += sorted(_imports((INCLUSTER / f"{module}.py").read_text()) & own)
    assert {f"{m}.py" for m in needed} == set(program.modules)
    uses_h11 = any("h11" in _imports((INCLUSTER / f"{m}.py").read_text()) for m in needed)
    assert program.h11 == uses_h11


def test_the_programs_run_under_the_images_python():
    """Each file compiles with the interpreter of the pinned image's minor version (3.12 for
    python:3.12.11-slim-bookworm), and the entry points start there (--help-less: imported, not run)."""
    minor = image_minor(PREFETCH_IMAGE)
    assert minor == "3.12", PREFETCH_IMAGE  # the image's own tag names its Python
    python = pod_python(minor)
    version = subprocess.run([python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                             capture_output=True, text=True).stdout.strip()
    print(f"in-cluster programs checked with {python} ({version}; the image's is {minor})")
    files = programs.program_files(tuple(programs.PROGRAMS))
    for path, text in files.items():
        if path.endswith(".py"):
            ast.parse(text, path, feature_version=tuple(int(p) for p in minor.split(".")))
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import admission_proxy, library, hub_download; "
            "print(admission_proxy.h11.__version__)")
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as folder:
        for path, text in files.items():
            (Path(folder) / path).parent.mkdir(parents=True, exist_ok=True)
            (Path(folder) / path).write_text(text)
        done = subprocess.run([python, "-B", "-E", "-s", "-c", code, folder], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == programs.H11_VERSION, done.stderr


def test_h11_is_the_pinned_release_with_its_licence():
    files = programs.h11_files()
    assert "Permission is hereby granted, free of charge" in files["h11/LICENSE.txt"]  # MIT, kept with the code
    assert programs._digest(files) == programs.H11_SHA256
    assert f'__version__ = "{programs.H11_VERSION}"' in files["h11/_version.py"]


def test_the_template_hash_follows_code_not_comments_or_docstrings():
    files = programs.program_files(("admission",))
    base = programs.code_hash(files)
    text = files["admission_proxy.py"]
    commented = dict(files, **{"admission_proxy.py": text.replace('"""The admission proxy in front', '"""The proxy in front', 1)
                                + "\n# a comment\n"})
    assert commented["admission_proxy.py"] != text and programs.code_hash(commented) == base
    changed = dict(files, **{"admission_proxy.py": text.replace("MAX_CONNECTIONS = 256", "MAX_CONNECTIONS = 255")})
    assert changed["admission_proxy.py"] != text and programs.code_hash(changed) != base


def _rendered(stack):
    from render.manifests import manifests
    from render.offline import run_stack

    return list(manifests(run_stack(stack)).values())


@pytest.mark.parametrize("stack", STACKS)
def test_no_rendered_object_carries_program_source(stack):
    """No container or probe runs `python -c <source>`; every in-cluster program a pod runs is a file of its
    programs ConfigMap, mounted read-only where its command names it, and the template carries the hash."""
    for manifest in _rendered(stack):
        if manifest["kind"] not in ("Deployment", "StatefulSet"):
            continue
        pod = manifest["spec"]["template"]["spec"]
        volumes = {v["name"]: v for v in pod["volumes"]}
        for container in pod.get("initContainers", []) + pod["containers"]:
            commands = [container.get("command") or []] + [container.get(p, {}).get("exec", {}).get("command") or []
                                                           for p in ("startupProbe", "readinessProbe", "livenessProbe")]
            for command in commands:
                assert not (command[:1] == ["python3"] and "-c" in command), (manifest["metadata"]["name"], container["name"])
                if command[:1] != ["python3"]:
                    continue
                script = command[-2] if command[-1] == "alive" else command[-1]
                assert script.startswith(programs.PROGRAMS_DIR + "/"), script
                (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == programs.PROGRAMS_DIR]
                assert mount["readOnly"] is True
                items = {i["path"] for i in volumes[mount["name"]]["configMap"]["items"]}
                assert script.removeprefix(programs.PROGRAMS_DIR + "/") in items
                assert programs.PROGRAMS_ANNOTATION in manifest["spec"]["template"]["metadata"]["annotations"]


def test_the_programs_config_map_fits_and_matches_the_pod():
    files = _rendered("rtx3090-library")
    (config_map,) = [m for m in files if m["kind"] == "ConfigMap" and m["metadata"]["name"].endswith("-programs")]
    (deployment,) = [m for m in files if m["kind"] == "Deployment"]
    size = sum(len(k) + len(v.encode()) for k, v in config_map["data"].items())
    assert size < 512 * 1024  # a ConfigMap holds at most 1 MiB
    shipped = {path: config_map["data"][key] for key, path in
               ((i["key"], i["path"]) for v in deployment["spec"]["template"]["spec"]["volumes"]
                if v["name"] == "programs" for i in v["configMap"]["items"])}
    assert shipped == programs.program_files(("admission", "library"))
    assert deployment["spec"]["template"]["metadata"]["annotations"][programs.PROGRAMS_ANNOTATION] == programs.code_hash(shipped)
