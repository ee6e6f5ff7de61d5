"""Imports run one way, down, and engines are the only place that knows one engine from another.

The import graph is read from the source (every import: module level, inside functions, and under
TYPE_CHECKING), so a cycle that function-level imports keep importable still fails here.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from conftest import ROOT

# Each layer may import only the layers before it (docs/layout.md). policy/ runs alone in the
# policy pack's own virtualenv: it may import only common/ (standard library only).
LAYERS = ["common", "policy", "config", "planning", "engines", "components", "plane", "render", "changes", "tools",
          "__main__"]
PROGRAM_MODULES_MAX_LINES = 600


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    found = {"__main__": ROOT / "__main__.py", "plane": ROOT / "plane.py"}
    for layer in LAYERS:
        folder = ROOT / layer
        if folder.is_dir():
            for path in folder.rglob("*.py"):
                if "venv" not in path.parts:
                    found[_module_name(path)] = path
    return found


def _imports(name: str, path: Path, known: set[str]) -> set[str]:
    """Project modules this module imports, resolved (relative imports included)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    targets: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
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


def import_graph() -> dict[str, set[str]]:
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
    wrong = []
    for module, targets in import_graph().items():
        rank = LAYERS.index(_layer(module))
        for target in targets:
            allowed = ["common", "policy"] if _layer(module) == "policy" else LAYERS[: rank + 1]
            if _layer(target) not in allowed:
                wrong.append(f"{module} -> {target}")
    assert wrong == []


def test_only_engines_know_one_engine_from_another():
    """No `engine ==` outside engines/, and nothing outside engines/ imports an engine's module."""
    wrong = []
    for module, path in _modules().items():
        if _layer(module) == "engines":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Compare) and any(isinstance(op, (ast.Eq, ast.NotEq, ast.In, ast.NotIn)) for op in node.ops):
                sides = [node.left, *node.comparators]
                if any(isinstance(s, ast.Attribute) and s.attr == "engine" for s in sides):
                    wrong.append(f"{module}:{node.lineno} compares .engine")
        for target in import_graph()[module]:
            if target.startswith("engines.") and target not in ("engines.base",):
                wrong.append(f"{module} imports {target}")
    assert wrong == []


@pytest.mark.parametrize("module", sorted(m for m in _modules() if _layer(m) not in ("tools",)))
def test_no_program_module_is_over_the_size_limit(module):
    lines = len(_modules()[module].read_text().splitlines())
    assert lines <= PROGRAM_MODULES_MAX_LINES, f"{module}: {lines} lines; split it by job"
