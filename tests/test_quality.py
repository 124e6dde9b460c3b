"""Checks that need one process: lint, types, the docs build, import hygiene, the example.

They run in the world-size-1 pass of scripts/test.sh and are skipped at larger sizes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import fcoll as fc
from tests import jobs

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent

pytestmark = pytest.mark.skipif(fc.get_world_size() != 1, reason="runs at world size 1 only")


def _run(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "HYDRA_", "MPI"))}
    env["NO_MKDOCS_2_WARNING"] = "1"
    return subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


def test_ruff():
    done = _run(str(BIN / "ruff"), "check", "fcoll", "tests", "examples", "bench", "scripts")
    assert done.returncode == 0, done.stdout + done.stderr


def test_mypy():
    done = _run(str(BIN / "mypy"))
    assert done.returncode == 0, done.stdout + done.stderr


def test_docs_build_strict(tmp_path):
    done = _run(str(BIN / "mkdocs"), "build", "--strict", "-q", "-d", str(tmp_path / "site"))
    assert done.returncode == 0, done.stdout + done.stderr
    assert (tmp_path / "site" / "api" / "index.html").exists()


def test_import_does_not_import_cupy_torch_or_jax():
    code = ("import sys, fcoll\n"
            "for name in ('cupy', 'torch', 'jax'): assert name not in sys.modules, name\n"
            "print(fcoll.__all__)")
    done = _run(sys.executable, "-c", code)
    assert done.returncode == 0, done.stderr


def test_numpy_calls_do_not_import_cupy_torch_or_jax():
    code = ("import sys, numpy as np, fcoll as fc\n"
            "x = np.arange(4.0)\n"
            "fc.all_reduce(x); fc.all_reduce(x, async_op=True).wait(); fc.broadcast(x)\n"
            "fc.all_gather(x); fc.all_to_all([x]); fc.scatter([x]); fc.gather(x)\n"
            "fc.reduce_scatter([x]); fc.all_reduce_coalesced([x]); fc.permute_tensor(x, [0])\n"
            "fc.all_gather_into_tensor(x); fc.all_to_all_single(x); fc.reduce_scatter_tensor(x)\n"
            "lax = fc.lax; fc.dp.average_gradients({'w': x})\n"
            "for name in ('cupy', 'torch', 'jax'): assert name not in sys.modules, name")
    done = _run(sys.executable, "-c", code)
    assert done.returncode == 0, done.stderr


def test_training_example_converges_and_agrees():
    done = jobs.run(2, sys.executable, "-m", "fcoll.run", "examples/train_digits.py",
                    "--epochs", "4", timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "parameters identical on all 2 ranks: True" in done.stdout
    accuracy = float(done.stdout.split("test accuracy ")[1].split()[0])
    assert accuracy > 0.85, done.stdout


def test_mesh_example_on_a_2x2_mesh():
    done = jobs.run(4, sys.executable, "-m", "fcoll.run", "examples/mesh_matmul.py", timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "match the single-process result on all 4 ranks" in done.stdout


@pytest.mark.smoke
def test_example_runs_on_four_ranks():
    done = jobs.run(4, sys.executable, "-m", "mpi4py", "examples/tour.py", timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "all_reduce(x)" in done.stdout and "array([60., 64.])" in done.stdout
