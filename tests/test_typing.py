"""The public signatures as type checkers see them (fcoll/policy/arrays.py): mypy --strict and
pyright (standard mode) both pass tests/typing/check_public_types.py, whose ``assert_type``
lines infer each result's type from a numpy, torch, JAX or cupy-shaped input and whose
non-array calls must be rejected (an ignore comment that hides no error is an error).

Runs at world size 1 only; needs torch and JAX installed (the file imports them) and
pyright, from the ``test`` extra (the pinned PyPI wheel, with Node.js from PyPI)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

import fcoll as fc

ROOT = Path(__file__).resolve().parents[1]
TYPING = ROOT / "tests" / "typing"
CHECKED = TYPING / "check_public_types.py"
BIN = Path(sys.executable).parent

pytestmark = [
    pytest.mark.skipif(fc.get_world_size() != 1, reason="runs at world size 1 only"),
    pytest.mark.skipif(any(importlib.util.find_spec(m) is None for m in ("torch", "jax")),
                       reason="the typing check reads torch's and JAX's types: install both"),
]


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "HYDRA_", "MPI"))}
    return subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


def test_mypy_strict_infers_each_array_type_and_rejects_non_arrays():
    done = _run(str(BIN / "mypy"), "--strict", "--warn-unused-ignores", str(CHECKED))
    assert done.returncode == 0, done.stdout + done.stderr


def test_pyright_infers_each_array_type_and_rejects_non_arrays():
    done = _run(str(BIN / "pyright"), "-p", str(TYPING / "pyrightconfig.json"),
                "--pythonpath", sys.executable)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 errors" in done.stdout, done.stdout
