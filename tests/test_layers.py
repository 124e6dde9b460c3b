"""The package's import graph has no circle and no arrow from a lower layer to a higher one
(docs/design.md, "Layers"). Read with `ast` from the source, lazy imports inside
functions included, so a new upward import fails here before it becomes a circle."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import fcoll as fc

pytestmark = pytest.mark.skipif(fc.get_world_size() != 1, reason="reads the source once")

PACKAGE = Path(fc.__file__).resolve().parent

# Bottom to top; a module belongs to the first layer with a prefix of its name. A module
# may import its own layer and the layers below, never one above.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("runtime", ("fcoll._types", "fcoll._memory", "fcoll._startup", "fcoll._launcher", "fcoll._runtime",
                 "fcoll._trace", "fcoll._trace_report", "fcoll._board", "fcoll._stall_report", "fcoll._watch",
                 "fcoll._abort", "fcoll._mpi_errors")),
    ("operations in flight", ("fcoll.work", "fcoll._fingerprint")),
    ("transport", ("fcoll.backends", "fcoll.gpu.nccl", "fcoll.gpu.aware", "fcoll.gpu.staged")),
    ("policy", ("fcoll.ops", "fcoll.dtypes", "fcoll._validate", "fcoll._plan", "fcoll._header")),
    ("dispatch", ("fcoll.gpu.settings", "fcoll._dispatch", "fcoll.gpu.probe", "fcoll._tree")),
    ("groups", ("fcoll._meshes", "fcoll.group", "fcoll._calls", "fcoll.mesh", "fcoll.subgroups",
                "fcoll._debug", "fcoll._halo_axes")),
    ("GPU collectives", ("fcoll.gpu.events", "fcoll.gpu.fast", "fcoll.gpu.collectives",
                         "fcoll.gpu.lists", "fcoll.gpu.neighbors", "fcoll.gpu.route")),
    ("collectives", ("fcoll.collectives", "fcoll.p2p", "fcoll.objects", "fcoll.monitor")),
    ("on top", ("fcoll.lax", "fcoll._axes", "fcoll.xla", "fcoll.dp", "fcoll.gpu", "fcoll.debug",
                "fcoll.torch", "fcoll._autograd")),
    ("public names", ("fcoll.__init__",)),
    ("tooling", ("fcoll.testing", "fcoll.cli", "fcoll.__main__", "fcoll.run")),
]


def _module(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" and len(parts) > 2 else parts)


def _resolve(name: str, known: set[str]) -> str | None:
    """The fcoll module ``name`` names (``fcoll.x.y`` may be module ``fcoll.x``'s ``y``)."""
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name or None


def imports() -> dict[str, set[str]]:
    """``{module: fcoll modules it imports}`` for every module of the package."""
    files = {_module(p): p for p in PACKAGE.rglob("*.py")}
    known = set(files)
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        package = name.removesuffix(".__init__") if path.name == "__init__.py" \
            else name.rpartition(".")[0]
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1]
                                    + ([base] if base else []))
                # `from pkg import sub` imports the module pkg.sub; `from mod import name`, mod
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base
                           for a in node.names]
            else:
                continue
            for target in targets:
                if target == "fcoll" or not target.startswith("fcoll."):
                    continue
                module = _resolve(target, known)
                if module is not None and module != name:
                    found.add(module)
        graph[name] = found
    return graph


def layer(module: str) -> int:
    for i, (_, prefixes) in enumerate(LAYERS):
        if any(module == p or module.startswith(p + ".") for p in prefixes):
            return i
    raise AssertionError(f"{module} belongs to no layer: add it to LAYERS in {__file__}")


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph.get(v, ())):
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

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_graph_is_read():
    graph = imports()
    assert "fcoll.backends.mpi" in graph["fcoll.collectives.reductions"]
    assert "fcoll.work" in graph["fcoll.backends.mpi"]
    assert len(graph) >= 40


def test_no_import_circle():
    assert circles(imports()) == []


def test_circles_are_found():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_arrow_runs_up():
    up = [f"{a} ({LAYERS[layer(a)][0]}) imports {b} ({LAYERS[layer(b)][0]})"
          for a, targets in sorted(imports().items()) for b in sorted(targets)
          if layer(b) > layer(a)]
    assert up == []
