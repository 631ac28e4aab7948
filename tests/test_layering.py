"""The package's layers stay layers: no import cycle between its subpackages, and the CLI on top.

A cycle between two subpackages means neither can be read, tested or changed alone; the
CLI imported from below means library code depends on argument parsing. Both are read
from the source with `ast` (what is imported, not what happens to be loaded).
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests.test_packaging import _package_roots


def _modules():
    """(module name, file, is a package) for every module of the installed namespace."""
    for name, root in _package_roots().items():
        for path in root.rglob("*.py"):
            parts = list(path.relative_to(root).with_suffix("").parts)
            nested = name == "dspark_obs" and parts[0] in ("estimator", "exporters")
            if nested or "__pycache__" in parts:
                continue
            package = parts[-1] == "__init__"
            yield ".".join([name, *(parts[:-1] if package else parts)]), path, package


def _unit(module: str) -> str:
    """The subpackage (or top-level module) a module belongs to."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def _imports(module: str, path: Path, package: bool):
    base = (module if package else module.rpartition(".")[0]).split(".")
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                parent = base[: len(base) - node.level + 1]
                yield ".".join(parent + ([node.module] if node.module else []))
            else:
                yield node.module or ""
        elif isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)


def _edges() -> dict[str, set[str]]:
    edges: dict[str, set[str]] = {}
    for module, path, package in _modules():
        for target in _imports(module, path, package):
            if target.split(".")[0] == "dspark_obs" and _unit(target) != _unit(module):
                edges.setdefault(_unit(module), set()).add(_unit(target))
    return edges


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected set of more than one subpackage (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_no_import_cycle_between_subpackages():
    assert _cycles(_edges()) == []


def test_the_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_only_the_entry_point_imports_the_cli():
    importers = sorted(unit for unit, targets in _edges().items() if "cli" in targets)
    assert importers == ["__main__"]
