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

# Bottom to top, one folder of fcoll/ a layer (docs/design.md opens with the tree). The
# front ends are the public modules and packages users import beside ``fcoll``; the top
# level of fcoll/ holds nothing else (`test_the_top_level_holds_the_public_modules`). A
# module may import its own layer and the layers below, never one above.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("runtime", ("fcoll.runtime",)),
    ("diagnostics", ("fcoll.diagnostics",)),
    ("calls", ("fcoll.calls",)),
    ("transports", ("fcoll.backends",)),
    ("policy", ("fcoll.policy",)),
    ("dispatch", ("fcoll.dispatch",)),
    ("groups", ("fcoll.groups",)),
    ("GPU collectives", ("fcoll.gpu",)),
    ("collectives", ("fcoll.collectives",)),
    ("front ends", ("fcoll.lax", "fcoll.xla", "fcoll.dp", "fcoll.torch", "fcoll.debug", "fcoll._autograd")),
    ("public names", ("fcoll.__init__",)),
    ("tooling", ("fcoll.testing", "fcoll.cli", "fcoll.__main__", "fcoll.run")),
]
# The modules at fcoll/'s top level: the public ones, and the bridge to torch's autograd
# (`fcoll._autograd`: inside fcoll/torch/ it would import torch with fcoll).
TOP_LEVEL = {"__init__.py", "__main__.py", "run.py", "debug.py", "lax.py", "_autograd.py"}


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
                if target == "fcoll":  # `import fcoll`, `from fcoll import Work`: the public names
                    target = "fcoll.__init__"
                if not target.startswith("fcoll."):
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
    assert "fcoll.calls.work" in graph["fcoll.backends.mpi"]
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


def folder(module: str) -> str:
    """The folder of fcoll/ that holds ``module``; a module of the top level stands alone."""
    parts = module.split(".")
    return ".".join(parts[:2]) if len(parts) > 2 or (PACKAGE / parts[-1]).is_dir() else module


def test_each_folder_is_one_layer():
    layers: dict[str, set[str]] = {}
    for module in imports():
        if folder(module) != module or (PACKAGE / module.split(".")[-1]).is_dir():
            layers.setdefault(folder(module), set()).add(LAYERS[layer(module)][0])
    assert {f: ls for f, ls in layers.items() if len(ls) > 1} == {}
    assert len(layers) >= 12


def test_the_top_level_holds_the_public_modules():
    assert {p.name for p in PACKAGE.glob("*.py")} == TOP_LEVEL


def test_folders_import_each_other_one_way():
    folders: dict[str, set[str]] = {}
    for a, targets in imports().items():
        folders.setdefault(folder(a), set()).update(folder(b) for b in targets if folder(b) != folder(a))
    assert circles(folders) == []


def depth(graph: dict[str, set[str]]) -> list[str]:
    """The longest chain of imports, from the module at its top down to one that imports
    no fcoll module."""
    memo: dict[str, list[str]] = {}

    def chain(module: str) -> list[str]:
        if module not in memo:
            below = [chain(m) for m in sorted(graph[module])]
            memo[module] = [module, *max(below, key=len, default=[])]
        return memo[module]

    return max((chain(m) for m in sorted(graph)), key=len)


def test_depth_follows_imports():
    assert depth({"a": {"b"}, "b": {"c"}, "c": set(), "d": {"c"}}) == ["a", "b", "c"]


if __name__ == "__main__":  # python tests/test_layers.py: the measures of docs/design.md
    graph = imports()
    top = sorted(p.name for p in PACKAGE.glob("*.py"))
    folders = sorted(p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists())
    longest = depth(graph)
    up = sum(layer(b) > layer(a) for a, targets in graph.items() for b in targets)
    print(f"modules: {len(graph)}; at fcoll/'s top level: {len(top)} ({', '.join(top)})")
    print(f"folders: {len(folders)} ({', '.join(folders)})")
    print(f"import depth: {len(longest)} ({' -> '.join(longest)})")
    print(f"circles: {len(circles(graph))}; upward arrows: {up}")
