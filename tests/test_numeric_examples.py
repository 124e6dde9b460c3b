"""examples/poisson.py and examples/fft2.py at the suite's world size: each matches its
single-process answer (scipy.sparse's direct solve, numpy.fft.fft2), on every rank; and
each runs as a script under the launcher (world size 1 pass)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

import fcoll as fc
from tests import jobs
from tests.helpers import load_example

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


@pytest.mark.parametrize("size", [24, 37])
def test_poisson_matches_scipy(size):
    pytest.importorskip("scipy")
    ex = load_example("poisson")
    u, where, iterations, _ = ex.solve(size, rtol=1e-12)
    assert 0 < iterations < 10 * size
    # CG stops at a relative residual of 1e-12; the error is at most cond(A) (~0.4 N^2) times it
    assert ex.error(u, where, size) < 1e-12 * size * size


@pytest.mark.parametrize("rows,cols", [(24, 36), (13, 7), (5, 9)])
def test_fft2_matches_numpy(rows, cols):
    ex = load_example("fft2")
    fcoll_s, raw_s, err = ex.run(rows, cols, repeat=2)
    assert err < 1e-13 and fcoll_s > 0 and raw_s > 0


@pytest.mark.skipif(fc.get_world_size() != 1, reason="launches its own jobs at world size 1")
@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_examples_run_as_scripts(n):
    pytest.importorskip("scipy")
    for name, args in (("poisson", ["--size", "40"]), ("fft2", ["--rows", "30", "--cols", "21"])):
        done = jobs.run(n, sys.executable, "-m", "fcoll.run", f"examples/{name}.py", *args,
                        timeout=300)
        assert done.returncode == 0, done.stdout + done.stderr
        line = done.stdout.strip().splitlines()[-1]
        assert line.startswith(f"{name}:") and float(line.rsplit(" ", 1)[1]) < 1e-9, line
