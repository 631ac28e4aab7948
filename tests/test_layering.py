"""The package's layers stay layers: the documented order, no import cycle, and a serving
process's side of the hook free of everything behind it.

The order is read from the Layers table of docs/architecture.md, so the doc and the code
cannot drift apart: a package the table leaves out fails, and so does a name in the table
that is no package. Imports are read from the source with `ast` (what is imported, not what
happens to be loaded), function-local ones included: a lazy import still runs in whatever
process calls the function, and an upward one is a dependency all the same.
"""

from __future__ import annotations

import ast
import re
import sys
from dataclasses import dataclass

from tests.test_packaging import ROOT, _package_roots

ARCHITECTURE = ROOT / "docs" / "architecture.md"

#: What the serving side may import besides the standard library and its own modules:
#: the array and device libraries, and each plugin its host engine (found inside it).
SERVING_LIBRARIES = {"numpy", "torch", "triton"}
HOST_ENGINE = {
    "dspark_obs.hooks.sglang_plugin": "sglang",
    "dspark_obs.hooks.vllm_plugin": "vllm",
}
#: Imports of the serving side that docs/architecture.md names as exceptions, each one
#: function-local: the mode names a ring's header encodes (the step vocabulary, which is
#: the standard library and numpy only, checked below), and the inline consumer that
#: tests and notebooks ask for (`consumer="inline"`), which no serving process builds.
SERVING_EXCEPTIONS = {
    ("dspark_obs.hooks.shared_ring", "dspark_obs.telemetry.batch"),
    ("dspark_obs.hooks.rendezvous", "dspark_obs.pipeline"),
    ("dspark_obs.hooks.rendezvous", "dspark_obs.hooks.node_consumer"),
}


@dataclass(frozen=True)
class Import:
    module: str  # the importing module
    target: str  # the imported module (a package's name for `from package import name`)
    line: int
    lazy: bool  # inside a function

    def __str__(self) -> str:
        where = "inside a function" if self.lazy else "at module level"
        return f"{self.module} (line {self.line}, {where}) imports {self.target}"


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


MODULES = {name: (path, package) for name, path, package in _modules()}


def _unit(module: str) -> str:
    """The subpackage (or top-level module) a module belongs to; the package itself for its
    own `__init__`."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def _imports(module: str) -> list[Import]:
    """Every import in `module`'s source, resolved to absolute names; `from p import name`
    names the module `p.name` where that is one of ours, else `p`."""
    path, package = MODULES[module]
    base = (module if package else module.rpartition(".")[0]).split(".")
    found: list[Import] = []

    def visit(node: ast.AST, lazy: bool) -> None:
        for child in ast.iter_child_nodes(node):
            inner = lazy or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef)
            if isinstance(child, ast.ImportFrom):
                if child.level:
                    parent = base[: len(base) - child.level + 1]
                    source = ".".join(parent + ([child.module] if child.module else []))
                else:
                    source = child.module or ""
                for alias in child.names:
                    target = f"{source}.{alias.name}"
                    target = target if target in MODULES else source
                    found.append(Import(module, target, child.lineno, inner))
            elif isinstance(child, ast.Import):
                found.extend(Import(module, a.name, child.lineno, inner) for a in child.names)
            visit(child, inner)

    visit(ast.parse(path.read_text(encoding="utf-8")), False)
    return found


def _package_imports() -> list[Import]:
    """Every import of one of our modules from another unit than the importer's own."""
    return [
        i
        for module in MODULES
        for i in _imports(module)
        if i.target.split(".")[0] == "dspark_obs" and _unit(i.target) != _unit(module)
    ]


def _edges() -> dict[str, set[str]]:
    edges: dict[str, set[str]] = {}
    for i in _package_imports():
        edges.setdefault(_unit(i.module), set()).add(_unit(i.target))
    return edges


def _documented_layers() -> list[list[str]]:
    """The Layers table of docs/architecture.md, bottom row first: each row's names."""
    text = ARCHITECTURE.read_text(encoding="utf-8")
    section = text.split("\n## Layers\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    return [re.findall(r"`([^`]+)`", row.split("|")[1]) for row in rows]


def _serving_side() -> set[str]:
    """The serving-side modules docs/architecture.md lists, as module names."""
    text = ARCHITECTURE.read_text(encoding="utf-8")
    sentence = re.search(r"The serving side \((.*?)\) imports only", text, re.S)
    assert sentence, "docs/architecture.md no longer lists the hook's serving side"
    names = re.findall(r"`([^`]+)`", sentence.group(1))
    return {f"dspark_obs.{n}" if n == "listen" else f"dspark_obs.hooks.{n}" for n in names}


def _order_violations(imports: list[Import], layers: list[list[str]]) -> list[str]:
    """Each import of a unit from a later row of `layers` than the importer's own. The
    package's own `__init__` (its version) is below every row; it imports nothing."""
    rank = {unit: i for i, row in enumerate(layers) for unit in row}
    rank["dspark_obs"] = -1
    known = [i for i in imports if _unit(i.module) in rank and _unit(i.target) in rank]
    return [
        f"{i}: {_unit(i.module)} may import only its own row and the rows before it "
        f"in docs/architecture.md's Layers table, and {_unit(i.target)} comes later"
        for i in known
        if rank[_unit(i.target)] > rank[_unit(i.module)]
    ]


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


def test_the_layers_table_names_every_package_once():
    layers = _documented_layers()
    documented = [unit for row in layers for unit in row]
    units = {_unit(m) for m in MODULES} - {"dspark_obs"}
    assert sorted(units - set(documented)) == [], "add to docs/architecture.md's Layers table"
    assert sorted(set(documented) - units) == [], "in the Layers table but not in the package"
    assert len(documented) == len(set(documented)), "a package in two rows of the Layers table"


def test_every_import_follows_the_documented_order():
    violations = _order_violations(_package_imports(), _documented_layers())
    assert violations == [], "\n".join(violations)


def test_the_order_check_names_an_upward_import():
    """A function-local import of a later layer is caught, and the message names it."""
    layers = [["telemetry"], ["domain"], ["analysis"]]
    imports = [
        Import("dspark_obs.domain.step_cost", "dspark_obs.telemetry.batch", 3, False),
        Import("dspark_obs.domain.cost_table", "dspark_obs.analysis.cost_fit", 7, True),
    ]
    (message,) = _order_violations(imports, layers)
    assert message.startswith(
        "dspark_obs.domain.cost_table (line 7, inside a function) imports "
        "dspark_obs.analysis.cost_fit: domain may import only"
    )


def test_no_import_cycle_between_subpackages():
    assert _cycles(_edges()) == []


def test_the_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_only_the_entry_point_imports_the_cli():
    importers = sorted(unit for unit, targets in _edges().items() if "cli" in targets)
    assert importers == ["__main__"]


def _serving_violations(serving: set[str]) -> list[str]:
    bad = []
    for module in sorted(serving):
        for i in _imports(module):
            top = i.target.split(".")[0]
            allowed = (
                top in sys.stdlib_module_names
                or top in SERVING_LIBRARIES
                or top == HOST_ENGINE.get(module)
                or i.target in serving
                or i.target in ("dspark_obs", "dspark_obs.hooks")  # `__init__`s, empty
                or (i.lazy and (module, i.target) in SERVING_EXCEPTIONS)
            )
            if not allowed:
                bad.append(f"{i}: not the standard library, numpy, torch, Triton or serving")
    return bad


def test_the_hooks_serving_side_imports_only_what_a_serving_process_has():
    """The modules an inference server's process loads import the standard library, numpy,
    torch, Triton and each other (the plugins their host engine too): the pipeline, polars,
    the exporters live in the node's consumer process (docs/architecture.md)."""
    serving = _serving_side()
    assert sorted(serving - set(MODULES)) == [], "docs/architecture.md lists a missing module"
    bad = _serving_violations(serving)
    assert bad == [], "\n".join(bad)


def test_the_serving_sides_exceptions_are_light():
    """The step vocabulary a ring's header reads (`SERVING_EXCEPTIONS`), and its package's
    `__init__`, import the standard library and numpy only."""
    light = sys.stdlib_module_names | {"numpy"}
    for module in ("dspark_obs.telemetry", "dspark_obs.telemetry.batch"):
        heavy = [
            str(i)
            for i in _imports(module)
            if i.target != "dspark_obs.telemetry.batch" and i.target.split(".")[0] not in light
        ]
        assert heavy == [], heavy
