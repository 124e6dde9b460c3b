"""bench/run.py runs end to end (a tiny configuration), and its model fit recovers known costs."""

from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import fcoll as fc

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))


@pytest.fixture(autouse=True)
def _one_process():
    if fc.get_world_size() != 1:
        pytest.skip("launches its own jobs; runs at world size 1 only")


def test_bench_command_runs_and_writes_every_output(tmp_path):
    cmd = [sys.executable, str(ROOT / "bench" / "run.py"), "-n", "2", "--sizes", "8", "4K", "64K",
           "--ops", "all_reduce", "broadcast", "dp_average", "--impls", "fcoll", "raw", "pickle",
           "--batches", "3", "--max-cell-s", "1", "--out", str(tmp_path), "--timeout", "120"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=240, cwd=ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    for name in ("results.csv", "summary.md", "latency_n2.png", "busbw_n2.png", "model.csv", "model.png"):
        assert (tmp_path / name).stat().st_size > 0, name
    rows = list(csv.DictReader((tmp_path / "results.csv").open()))
    assert {(r["op"], r["impl"]) for r in rows} >= {("all_reduce", "fcoll"), ("dp_average", "pickle")}
    assert all(r["note"] == "" and float(r["median_us"]) > 0 for r in rows), rows
    assert "fcoll/raw" in done.stdout and "targets:" in done.stdout


def test_model_fit_recovers_alpha_and_beta():
    from model import design, fit

    c, alpha, beta = 1e-6, 2e-6, 1 / 5e9
    points = [(n, s, float(np.dot(design("all_reduce", n, s), [c, alpha, beta])))
              for n in (2, 4, 8) for s in (8, 4096, 1 << 20, 1 << 24)]
    coef, err = fit(points, "all_reduce")
    assert np.allclose(coef, [c, alpha, beta], rtol=1e-6) and err < 1e-9
