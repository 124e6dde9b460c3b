"""The quick start's light install: scripts/example.sh installs fcoll with the MPI wheel and
the ``examples`` extra only (``FCOLL_ENV=example`` in scripts/env.sh), so every package the
example imports at module level must come from those. Reads the source and the installed
distributions' metadata; launches nothing."""

from __future__ import annotations

import ast
import importlib.metadata
import re
import sys
from pathlib import Path

import pytest

import fcoll as fc

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(fc.get_world_size() != 1, reason="reads the source once")
tomllib = pytest.importorskip("tomllib")  # Python >= 3.11


def _name(requirement: str) -> str:
    return re.split(r"[<>=!~\[; ]", requirement, maxsplit=1)[0].lower().replace("_", "-")


def light_install() -> set[str]:
    """The distributions scripts/example.sh installs: fcoll's own dependencies and its
    ``mpich`` and ``examples`` extras (as named in pyproject.toml)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    wanted = [*project["dependencies"], *extras["mpich"], *extras["examples"]]
    return {"fcoll"} | {_name(r) for r in wanted}


def module_imports(path: Path) -> set[str]:
    """The top-level packages ``path`` imports at module level (not inside functions)."""
    found = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Import):
            found |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module.split(".")[0])
    return found - set(sys.stdlib_module_names) - {"__future__"}


def test_the_example_needs_only_the_light_install():
    script = (ROOT / "scripts" / "example.sh").read_text()
    assert "FCOLL_ENV=${FCOLL_ENV:-example}" in script  # env.sh's light profile
    env = (ROOT / "scripts" / "env.sh").read_text()
    assert 'example) extras="$mpi,examples" ;;' in env, "env.sh's example profile changed"
    owners = importlib.metadata.packages_distributions()
    light = light_install()
    for example in ("train_digits.py", "tour.py"):
        for module in module_imports(ROOT / "examples" / example):
            dists = {d.lower().replace("_", "-") for d in owners.get(module, [module])}
            assert dists & light, (f"examples/{example} imports {module} (from {sorted(dists)}), "
                                   f"which scripts/example.sh does not install: {sorted(light)}")


def test_the_light_install_holds_no_torch_or_jax(tmp_path):
    assert not {"torch", "jax", "jaxlib"} & light_install()
    example = tmp_path / "heavy.py"  # the check sees a module-level import, not a lazy one
    example.write_text("import os\nimport torch.nn as nn\nfrom jax import numpy\n"
                       "def gpu():\n    import cupy\n")
    assert module_imports(example) == {"torch", "jax"}
