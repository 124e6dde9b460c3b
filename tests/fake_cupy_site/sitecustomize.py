"""Put this folder first on ``PYTHONPATH`` with ``FCOLL_FAKE_CUPY=1`` and every Python
process started so (each rank of ``python -m fcoll check --array cupy``, say) gets
tests/fake_cupy.py for ``import cupy``, as pytest does through tests/conftest.py.

Without ``FCOLL_FAKE_CUPY=1`` it does nothing. Either way it then runs the
``sitecustomize`` this one shadows, if there is one. For tests only (scripts/gpu-check.sh,
tests/test_cli.py).

Example:
    FCOLL_FAKE_CUPY=1 PYTHONPATH=tests/fake_cupy_site:. python -m fcoll check --array cupy
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys
from pathlib import Path

_HERE = Path(__file__).resolve().parent


def _install_fake_cupy() -> None:
    path = _HERE.parent / "fake_cupy.py"
    spec = importlib.util.spec_from_file_location("tests.fake_cupy", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["tests.fake_cupy"] = module
    spec.loader.exec_module(module)
    module.install()


def _run_shadowed() -> None:
    """The next ``sitecustomize`` on ``sys.path`` (a distribution's), which this one hides."""
    others = [p for p in sys.path if Path(p or ".").resolve() != _HERE]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", others)
    if spec is not None and spec.loader is not None:
        spec.loader.exec_module(importlib.util.module_from_spec(spec))


if os.environ.get("FCOLL_FAKE_CUPY", "").strip() == "1":
    _install_fake_cupy()
_run_shadowed()
