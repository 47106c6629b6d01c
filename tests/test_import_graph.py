"""The import graph of ``datahub/`` and ``operators/`` points down the layers only (STYLE.md).

Built from the source with ``ast``, so it sees what runs: imports inside functions count (a deferred
import that breaks a cycle is still a cycle); imports under ``if TYPE_CHECKING:`` do not.
``import a.b.c`` and ``from a.b import c`` also run ``a/__init__`` and ``a/b/__init__``, so they are
edges to those packages too, except to a package the importing module is itself part of (it is
already initialized, or initializing, when the module runs).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
ROOTS = ("datahub", "operators")

# The layer order, bottom first (STYLE.md). A module may import its own layer or any layer below.
LAYERS: list[tuple[str, ...]] = [
    ("datahub", "datahub.errors", "datahub.sample_id", "datahub.retry", "datahub.settings", "datahub.kinds"),
    ("datahub.config",),
    ("datahub.lake", "datahub.storage"),
    ("datahub.engines",),
    ("datahub.operator",),
    ("operators",),
    ("datahub.pipeline",),
    ("datahub.release", "datahub.qa", "datahub.lineage", "datahub.report", "datahub.evalset"),
    ("datahub.export", "datahub.shards", "datahub.loader"),
    ("datahub.schedule", "datahub.cli"),
]
ENGINE_ONLY = ("ray", "pyspark")  # imported only under datahub/engines/
ENGINES = "datahub.engines"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for root in ROOTS for p in sorted((REPO / root).rglob("*.py"))}


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _import_nodes(node: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import under ``node``, at any depth, except those in ``if TYPE_CHECKING:`` bodies."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.If) and _is_type_checking(child.test):
            for sub in child.orelse:
                yield from _import_nodes_of(sub)
            continue
        yield from _import_nodes_of(child)


def _import_nodes_of(node: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        yield node
    yield from _import_nodes(node)


def _imported_names(module: str, path: Path) -> Iterator[tuple[str, int]]:
    """(dotted name, line) for each name an import statement of ``module`` executes."""
    is_package = path.name == "__init__.py"
    for node in _import_nodes(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno
            continue
        base = node.module or ""
        if node.level:
            anchor = module.split(".") if is_package else module.split(".")[:-1]
            anchor = anchor[: len(anchor) - (node.level - 1)]
            base = ".".join(anchor + ([base] if base else []))
        yield base, node.lineno
        for alias in node.names:
            yield f"{base}.{alias.name}", node.lineno


def _prefixes(name: str) -> list[str]:
    parts = name.split(".")
    return [".".join(parts[: i + 1]) for i in range(len(parts))]


def _edges(modules: dict[str, Path]) -> dict[str, dict[str, int]]:
    """module -> {internal module it runs: first line}."""
    edges: dict[str, dict[str, int]] = {}
    for module, path in modules.items():
        own_packages = set(_prefixes(module))
        targets: dict[str, int] = {}
        for name, line in _imported_names(module, path):
            for target in _prefixes(name):
                if target in modules and target not in own_packages:
                    targets.setdefault(target, line)
        edges[module] = targets
    return edges


def _layer(module: str) -> int | None:
    best: tuple[int, int] | None = None  # (prefix length, layer)
    for index, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            if module == prefix or module.startswith(prefix + "."):
                if best is None or len(prefix) > best[0]:
                    best = (len(prefix), index)
    return None if best is None else best[1]


def _strongly_connected(edges: dict[str, dict[str, int]]) -> list[list[str]]:
    """Tarjan's algorithm (iterative); components with more than one module, or a self-loop."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    components: list[list[str]] = []
    counter = 0
    for start in sorted(edges):
        if start in index:
            continue
        work: list[tuple[str, Iterator[str]]] = [(start, iter(sorted(edges[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            advanced = False
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges[child]))))
                    advanced = True
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1 or node in edges[node]:
                    components.append(sorted(component))
    return components


def _cycle_through(component: list[str], edges: dict[str, dict[str, int]]) -> list[str]:
    """One shortest cycle through the component's first module (breadth-first), to name in the message."""
    members = set(component)
    start = component[0]
    parents: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for child in sorted(edges[node]):
                if child not in members:
                    continue
                if child == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(parents[path[-1]])
                    return [start, *reversed(path[:-1]), start]
                if child not in parents:
                    parents[child] = node
                    following.append(child)
        frontier = following
    return component


def _where(module: str, target: str, modules: dict[str, Path], edges: dict[str, dict[str, int]]) -> str:
    return f"{modules[module].relative_to(REPO)}:{edges[module][target]} imports {target}"


def test_every_module_has_a_layer() -> None:
    missing = sorted(m for m in _modules() if _layer(m) is None)
    assert not missing, "modules outside the LAYERS table (add their package to it): " + ", ".join(missing)


def test_no_import_cycles() -> None:
    modules = _modules()
    edges = _edges(modules)
    lines = []
    for component in _strongly_connected(edges):
        cycle = _cycle_through(component, edges)
        lines.append(f"cycle of {len(component)} modules: {', '.join(component)}")
        lines.extend(f"    {_where(a, b, modules, edges)}" for a, b in zip(cycle, cycle[1:]))
    assert not lines, "import cycles (deferred imports count):\n" + "\n".join(lines)


def test_imports_point_down_the_layers() -> None:
    modules = _modules()
    edges = _edges(modules)
    upward = []
    for module in sorted(edges):
        source = _layer(module)
        for target in sorted(edges[module]):
            layer = _layer(target)
            if source is not None and layer is not None and layer > source:
                upward.append(f"    {_where(module, target, modules, edges)}  (layer {source} -> {layer})")
    assert not upward, "imports that point up the layer order:\n" + "\n".join(upward)


def test_only_engines_import_ray_or_pyspark() -> None:
    modules = _modules()
    found = []
    for module, path in sorted(modules.items()):
        if module == ENGINES or module.startswith(ENGINES + "."):
            continue
        for name, line in _imported_names(module, path):
            if name.split(".")[0] in ENGINE_ONLY:
                found.append(f"    {path.relative_to(REPO)}:{line} imports {name}")
    assert not found, "ray/pyspark imported outside datahub/engines/:\n" + "\n".join(sorted(set(found)))


def test_the_graph_sees_deferred_imports_and_skips_type_checking(tmp_path: Path) -> None:
    """The walker itself: a function-level import is an edge, a TYPE_CHECKING one is not."""
    source = tmp_path / "probe.py"
    source.write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from datahub.pipeline import run\n"
        "def f():\n    from datahub.config.spec import JobSpec\n    import datahub.lake.lake\n"
        "from . import sibling\n")
    names = {name for name, _ in _imported_names("datahub.engines.probe", source)}
    assert "datahub.config.spec.JobSpec" in names and "datahub.lake.lake" in names
    assert "datahub.engines.sibling" in names
    assert not any(name.startswith("datahub.pipeline") for name in names)
