"""Imports run one way, down, and engines are the only place that knows one engine from another;
no module of the project (tools/ and the lab included) is over the size limit, and docs/layout.md
names every one.

The import graph is read from the source (every import: module level, inside functions, and under
TYPE_CHECKING), so a cycle that function-level imports keep importable still fails here. The modules
are found, parsed and their graph built once per run (functools.cache), not once per test.
"""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

import pytest

from conftest import ROOT

# Each layer may import only the layers before it (docs/layout.md). policy/ runs alone in the
# policy pack's own virtualenv: it may import only common/ (standard library only).
LAYERS = ["incluster", "common", "policy", "config", "planning", "engines", "components", "plane", "render", "changes",
          "tools", "__main__"]
PROGRAM_MODULES_MAX_LINES = 600
# The lab wing (lab/: the llama.cpp build, the contract harness, the bench): it may import the program's
# layers (not tools/ or __main__), and of the program only tools/ imports it (tests/ do too).
LAB = "lab"
LAB_MAY_IMPORT = [layer for layer in LAYERS if layer not in ("tools", "__main__")] + [LAB]
LAYOUT = ROOT / "docs" / "layout.md"
# sys.path edits: only at entry points run as scripts (the policy pack Pulumi starts from policy/, two tools
# run by path) and in the in-cluster programs' own layout, which a test imports as the pod does.
SYS_PATH_EDITS_MAX = 6


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _python_files(folders: list[str]) -> dict[str, Path]:
    """Module name -> file, for every .py under these top-level folders (a virtualenv's left out)."""
    found = {}
    for top in folders:
        folder = ROOT / top
        if folder.is_dir():
            for path in sorted(folder.rglob("*.py")):
                if not any("venv" in part or part == "__pycache__" for part in path.parts):
                    found[_module_name(path)] = path
    return found


@functools.cache
def _modules() -> dict[str, Path]:
    """The layered modules (read-only: shared by every test of the run)."""
    return {"__main__": ROOT / "__main__.py", "plane": ROOT / "plane.py", **_python_files(LAYERS + [LAB])}


@functools.cache
def _program_modules() -> dict[str, Path]:
    """Every module of the project held to the size limit and named in docs/layout.md: the layers and the lab."""
    return _modules()


@functools.cache
def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), str(path))


def _imports(name: str, path: Path, known: set[str]) -> set[str]:
    """Project modules this module imports, resolved (relative imports included)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    targets: set[str] = set()
    for node in ast.walk(_tree(path)):
        if isinstance(node, ast.Import):
            candidates = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)] if package else []
                base = ".".join(anchor + ([base] if base else []))
            candidates = [base] + [f"{base}.{alias.name}" for alias in node.names]
        else:
            continue
        for candidate in candidates:
            # The deepest project module the import names (a package's attribute counts as the package).
            while candidate and candidate not in known:
                candidate = candidate.rpartition(".")[0]
            if candidate and candidate != name:
                targets.add(candidate)
    return targets


@functools.cache
def import_graph() -> dict[str, set[str]]:
    """Module -> the project modules it imports; built once per run (read-only)."""
    modules = _modules()
    known = set(modules)
    return {name: _imports(name, path, known) for name, path in modules.items()}


def _layer(module: str) -> str:
    return module.split(".")[0]


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if state.get(nxt) is None:
                found = visit(nxt)
                if found:
                    return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def test_the_graph_sees_imports_inside_functions_and_type_checking_blocks():
    graph = import_graph()
    # plane.py imports engines at module level; __main__ imports components; a function-level and a
    # TYPE_CHECKING import are found too (engines/base.py imports planning.memory only for types).
    assert "engines" in graph["plane"] and "planning.memory" in graph["engines.base"]
    assert "config.types" in graph["planning.capacity"]


def test_no_import_cycle_between_modules():
    assert find_cycle(import_graph()) is None


def test_the_cycle_finder_finds_one():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]


def test_each_layer_imports_only_the_layers_below_it():
    """The program's layers run down; the lab imports the program (never tools/), and only tools/ of the
    program imports the lab."""
    wrong = []
    for module, targets in import_graph().items():
        if _layer(module) == LAB:
            allowed = LAB_MAY_IMPORT
        elif _layer(module) == "policy":
            allowed = ["common", "policy"]
        else:
            allowed = LAYERS[: LAYERS.index(_layer(module)) + 1] + ([LAB] if _layer(module) == "tools" else [])
        for target in targets:
            if _layer(target) not in allowed:
                wrong.append(f"{module} -> {target}")
    assert wrong == []


def test_the_lab_is_one_package_that_the_program_does_not_import():
    """bench/ keeps only recorded results and the scripts' data; the code is lab/ (issue #46), and no module
    of the program's layers (tools/ aside) imports it."""
    assert not list((ROOT / "bench").glob("*.py")) and not (ROOT / "tests" / "contract").exists()
    assert {"lab.llama_build", "lab.contract.server", "lab.bench.run"} <= set(_modules())
    importers = {module for module, targets in import_graph().items() for target in targets
                 if _layer(target) == LAB and _layer(module) != LAB}
    assert all(_layer(module) == "tools" for module in importers), importers


def test_sys_path_is_edited_at_a_handful_of_entry_points_only():
    """Tests, the lab and tools import by package (pytest.ini puts the project folder on the path): no
    `sys.path` edit beyond the entry points that run by path."""
    edits = []
    for path in sorted(ROOT.rglob("*.py")):
        if any("venv" in part or part in ("__pycache__", ".git") for part in path.relative_to(ROOT).parts):
            continue
        for number, line in enumerate(path.read_text().splitlines(), start=1):
            if re.search(r"sys\.path(\.insert|\.append|\[|\s*=)", line):
                edits.append(f"{path.relative_to(ROOT)}:{number}")
    assert len(edits) <= SYS_PATH_EDITS_MAX, edits


def test_only_engines_know_one_engine_from_another():
    """No `engine ==` outside engines/, and nothing outside engines/ imports an engine's module."""
    wrong = []
    for module, path in _modules().items():
        if _layer(module) in ("engines", LAB):  # the lab measures each engine on its own terms
            continue
        for node in ast.walk(_tree(path)):
            if isinstance(node, ast.Compare) and any(isinstance(op, (ast.Eq, ast.NotEq, ast.In, ast.NotIn)) for op in node.ops):
                sides = [node.left, *node.comparators]
                if any(isinstance(s, ast.Attribute) and s.attr == "engine" for s in sides):
                    wrong.append(f"{module}:{node.lineno} compares .engine")
        for target in import_graph()[module]:
            if target.startswith("engines.") and target not in ("engines.base",):
                wrong.append(f"{module} imports {target}")
    assert wrong == []


@pytest.mark.parametrize("module", sorted(_program_modules()))
def test_no_program_module_is_over_the_size_limit(module):
    """tools/ and the lab included: no exemption."""
    lines = len(_program_modules()[module].read_text().splitlines())
    assert lines <= PROGRAM_MODULES_MAX_LINES, f"{module}: {lines} lines; split it by job"


# --- docs/layout.md names every module ------------------------------------------------------------


def listing_lines(layout: str) -> dict[str, str]:
    """Top-level folder -> its line in layout.md's indented listing (a line may list several folders:
    `bench/  schemas/  tools/  ...`), the folders' names left out of the text."""
    lines: dict[str, str] = {}
    for line in layout.splitlines():
        if not line.startswith("    "):
            continue
        words = line.split()
        folders = []
        while words and words[0].endswith("/"):
            folders.append(words.pop(0).rstrip("/"))
        for folder in folders:
            lines[folder] = lines.get(folder, "") + " " + " ".join(words)
    return lines


def unnamed_modules(layout: str, files: list[str]) -> list[str]:
    """The files (paths from the project root) that layout.md does not name. A module is named by its
    path anywhere in the page (`config/facts.py`), or by its path inside its top-level folder on that
    folder's listing line (`facts.py`, `prefetch/hub_download.py`); a package by its folder
    (`components/prefetch/`, or `prefetch/` on the components/ line); a top-level folder's own
    __init__.py by the folder having a listing line."""
    listing = listing_lines(layout)
    missing = []
    for file in files:
        parts = file.split("/")
        if parts[-1] == "__init__.py":
            parts[-1] = ""  # the package: its folder, written with a trailing slash
        path = "/".join(parts)
        if len(parts) == 1:
            named = re.search(rf"(?<![\w/.]){re.escape(path)}(?![\w])", layout) is not None
        elif len(parts) == 2 and not parts[1]:
            named = parts[0] in listing
        else:
            inside = "/".join(parts[1:])
            named = (re.search(rf"(?<![\w/.]){re.escape(path)}(?![\w])", layout) is not None
                     or re.search(rf"(?<![\w/.]){re.escape(inside)}(?![\w])", listing.get(parts[0], "")) is not None)
        if not named:
            missing.append(file)
    return missing


def test_layout_names_every_module_of_the_program():
    files = [path.relative_to(ROOT).as_posix() for path in _program_modules().values()]
    missing = unnamed_modules(LAYOUT.read_text(), files)
    assert missing == [], f"docs/layout.md does not name {missing}: add a line for each under Modules"


def test_the_layout_check_finds_a_module_it_does_not_name():
    layout = ("    plane.py   wiring\n    config/    the stack's config: types.py, load.py\n"
              "    bench/  tools/   `make bench`; build.py\n\n    config/checks.py   between fields\n"
              "See `components/prefetch/` and components/pod.py.\n")
    files = ["plane.py", "__main__.py", "config/__init__.py", "config/types.py", "config/checks.py",
             "config/history.py", "tools/build.py", "bench/build.py", "components/__init__.py",
             "components/pod.py", "components/prefetch/__init__.py", "components/prefetch/hub.py",
             "config/load_more.py"]
    assert unnamed_modules(layout, files) == ["__main__.py", "config/history.py", "components/__init__.py",
                                              "components/prefetch/hub.py", "config/load_more.py"]


@pytest.mark.parametrize("stack", ["rtx3090-library", "strix-halo"])
def test_building_a_server_asks_which_engine_it_runs_once(tmp_path, stack):
    """Issue #46 item 3: the build side's twin of Engine.estimate. No component (nor the wiring) imports
    engine_of; each server of a render is built by its engine exactly once (engines.server_builds), and the
    components render from that ServerBuild."""
    for module, path in _modules().items():
        if _layer(module) in ("components", "__main__"):
            names = {alias.name for node in ast.walk(_tree(path)) if isinstance(node, ast.ImportFrom)
                     for alias in node.names}
            assert "engine_of" not in names, f"{module} imports engine_of"

    from engines.base import Engine
    from render.output import render_stack

    built: list[str] = []
    original = Engine.build

    def counting(self, model, plan, mount_path):
        built.append(model.name)
        return original(self, model, plan, mount_path)

    Engine.build = counting
    try:
        result = render_stack(stack, tmp_path / "out")
    finally:
        Engine.build = original
    names = [model.name for model in result.run.config.models.values()]
    assert sorted(built) == sorted(names)


# --- docs/layout.md's prose says what the rules above hold -------------------------------------------------

def _layout_prose() -> str:
    return " ".join(LAYOUT.read_text().split())


def test_the_layout_page_states_the_import_order_the_test_holds():
    """"Imports run one way, down: `__main__` → ... → `incluster`": the order this test enforces (LAYERS)."""
    match = re.search(r"Imports run one way, down: ((?:`[^`]+` → )+`[^`]+`)", _layout_prose())
    assert match, "docs/layout.md no longer states the import order"
    assert re.findall(r"`([^`]+)`", match.group(1)) == LAYERS[::-1]


def test_the_layout_page_names_every_incluster_module_the_program_imports():
    """"the program imports only `incluster.fit` ... and `incluster.preset` ...": exactly the in-cluster modules
    the program's layers import (the others are shipped as files, never imported)."""
    match = re.search(r"the program imports only (.+?) and reads the rest as files to ship", _layout_prose())
    assert match, "docs/layout.md no longer says which in-cluster modules the program imports"
    said = set(re.findall(r"`(incluster\.[a-z_]+)`", match.group(1)))
    imported = {target for module, targets in import_graph().items() if _layer(module) not in ("incluster", LAB)
                for target in targets if _layer(target) == "incluster" and target != "incluster"}  # the package itself
    assert said == imported


def test_the_layout_page_states_the_size_limit_the_test_holds():
    assert f"a module over {PROGRAM_MODULES_MAX_LINES} lines" in _layout_prose()
