"""bench/run.py runs end to end (a tiny configuration), and its model fit recovers known costs."""

from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import fcoll as fc
from tests import jobs
from tests.jobs import environment

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


def test_gpu_overhead_bench_times_every_op_on_the_stand_in():
    """bench/gpu_overhead.py: fcoll's host cost per cupy call, on the CPU stand-in."""
    cmd = [sys.executable, str(ROOT / "bench" / "gpu_overhead.py"), "--calls", "200"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=ROOT,
                          env={**environment(), "FCOLL_ALLOW_SINGLETON": "1"})
    assert done.returncode == 0, done.stdout + done.stderr
    rows = {line.split()[0]: [float(v) for v in line.split()[1:]]
            for line in done.stdout.splitlines()[1:] if line.strip()}
    assert set(rows) == {"all_reduce", "reduce_scatter_tensor", "all_gather_into_tensor",
                         "all_to_all_single", "broadcast"}, done.stdout
    assert all(len(v) == 4 and v[0] > 0 for v in rows.values()), rows


def test_gpu_bench_without_a_gpu_says_so_and_its_table_reads():
    import bench_gpu

    if bench_gpu._unavailable() is None:
        pytest.skip("a GPU is here: scripts/gpu-check.sh runs the benchmark")
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "bench_gpu.py")], capture_output=True,
                          text=True, timeout=120, cwd=ROOT, env=environment())
    assert done.returncode == 0 and "bench_gpu: skipped:" in done.stdout, done.stdout + done.stderr
    row = {"op": "all_reduce", "bytes": 8, "fcoll": 11.0, "raw": 5.5, "raw+new": 10.0, "torch": 22.0}
    table = bench_gpu._markdown([row]).splitlines()
    assert table[2].startswith("| all_reduce | 8 | 11.0 | 5.5 | 10.0 | 22.0 | — | — | 2.00 | 1.10 | 0.50 |")


@pytest.mark.parametrize("script", ["bench_torch_ddp.py", "bench_jax_pmean.py"])
def test_training_benches_run_at_two_ranks(script, tmp_path):
    """bench/bench_torch_ddp.py (fcoll.dp against DDP over gloo) and bench/bench_jax_pmean.py
    (fcoll.lax.pmean against one process), tiny: at n = 2 fcoll's parameters equal DDP's bit
    for bit (a + b in either order), and JAX's averaged gradient is the whole batch's."""
    pytest.importorskip("torch" if "torch" in script else "jax")
    out = tmp_path / "rows.csv"
    done = jobs.run(2, sys.executable, str(ROOT / "bench" / script), "--hidden", "32", "--steps", "3",
                    "--warmup", "1", "--csv", str(out), timeout=240)
    assert done.returncode == 0, done.stdout + done.stderr
    row = next(csv.DictReader(out.open()))
    if "torch" in script:
        assert row["fcoll_max_abs_diff"] == row["overlap_max_abs_diff"] == "0.0", row
        assert "bit-identical" in done.stdout
    else:
        assert 0 <= float(row["grad_rel_diff"]) < 1e-5, row
    assert float(row["n"]) == 2 and "| 2 |" in done.stdout


def test_transforms_bench_runs_at_two_ranks(tmp_path):
    """bench/bench_transforms.py, tiny: every implementation of table 1 at 8 B, the training
    step both ways and each torch op forward and forward + backward, in the CSV and tables."""
    pytest.importorskip("torch")
    pytest.importorskip("jax")
    done = jobs.run(2, sys.executable, str(ROOT / "bench" / "bench_transforms.py"), "--sizes", "8",
                    "--batches", "1", "--out", str(tmp_path), timeout=240)
    assert done.returncode == 0, done.stdout + done.stderr
    rows = list(csv.DictReader((tmp_path / "transforms.csv").open()))
    impls = {row["impl"] for row in rows}
    assert {"fcoll jit", "io_callback", "fcoll.lax eager (JAX)", "whole step in one jit",
            "eager pmean", "all_reduce forward + backward"} <= impls, impls
    assert all(float(row["us"]) > 0 for row in rows)
    assert (tmp_path / "transforms.png").exists() and "| 8 B |" in done.stdout


def test_shared_memory_ab_bench_runs_at_two_ranks():
    """bench/shm_movement.py (fcoll with the segment against fcoll on MPI, one job), tiny:
    a line with the three ratios per op and size, and the setting restored."""
    done = jobs.run(2, sys.executable, str(ROOT / "bench" / "shm_movement.py"), "--sizes", "16K",
                    "--batches", "2", timeout=240)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = [line for line in done.stdout.splitlines() if "shm/mpi" in line]
    ops = ["all_reduce", "reduce_scatter_tensor", "all_gather_into_tensor", "broadcast"]
    assert [line.split()[0] for line in lines] == ops, done.stdout
    assert all(float(line.split("shm/raw")[1]) > 0 for line in lines)


def test_issue_17_targets_are_judged_where_they_apply():
    from report import shm_checks

    assert [ok for ok, _ in shm_checks(2, "all_reduce", 512 << 10, 0.7)] == [True, False]
    assert [ok for ok, _ in shm_checks(2, "all_reduce", 32 << 10, 1.01)] == [False]
    assert [ok for ok, _ in shm_checks(2, "all_reduce", 4 << 20, 0.9)] == [True]
    assert shm_checks(2, "all_reduce", 16 << 10, 0.5) == []  # below the targets' sizes
    assert shm_checks(4, "all_reduce", 1 << 20, 0.5) == shm_checks(2, "broadcast", 1 << 20, 0.5) == []


def test_native_core_bench_writes_its_table_csv_and_plot(tmp_path):
    """bench/native_core.py end to end on two sizes: both engines' jobs, the target lines,
    the CSV and the latency plot."""
    cmd = [sys.executable, str(ROOT / "bench" / "native_core.py"), "-n", "2", "--sizes", "8", "1024",
           "--batches", "2", "--no-gloo", "--out", str(tmp_path)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=environment())
    assert done.returncode == 0, done.stdout + done.stderr
    rows = (tmp_path / "native.csv").read_text().splitlines()
    engines = {line.split(",")[0] for line in rows[1:]}
    assert engines == {"native", "numpy"} or (engines == {"numpy"} and "_shmcore" not in done.stdout)
    assert "| n=2 all_reduce 8 B, call/raw |" in done.stdout
    assert (tmp_path / "native_latency_n2.png").stat().st_size > 1000


def test_the_wait_benchmark_runs_both_trees(tmp_path):
    """bench/waits.py, tiny, with this checkout as both trees: every scenario's latency and
    CPU rows, and a CSV row each."""
    out = tmp_path / "waits.csv"
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "waits.py"), "--before", str(ROOT),
                           "--repeat", "1", "--seconds", "0.005", "--csv", str(out)],
                          capture_output=True, text=True, env=environment(), timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    rows = list(csv.DictReader(out.open()))
    assert {row["scenario"] for row in rows} == {"n=2 quiet", "n=4 on 2 cores", "n=2 + 2 busy",
                                                 "n=4, rank 0 late 1 ms"}, rows
    assert len(rows) == 16 and all(float(row["after"]) > 0 for row in rows), rows


def test_scale_model_reduces_to_the_textbook_formulas_on_one_node():
    """bench/scale.py's step model on one node (every message over shared memory) gives Thakur,
    Rabenseifner and Gropp's costs, and its traffic formulas the schedules' totals."""
    from scale import FABRICS, Net, expected, t_doubling, t_halving, t_ring

    a, b, g, n = 2e-6, 1 / 5e9, 1 / 20e9, float(1 << 20)
    for p in (2, 4, 8, 16):
        net = Net(p, a, b, FABRICS[0], g)
        lg = p.bit_length() - 1
        assert np.isclose(t_doubling(net, p, n)[0], lg * (a + n * b + n * g))
        assert np.isclose(t_halving(net, p, n)[0], 2 * lg * a + 2 * n * (p - 1) / p * b + n * (p - 1) / p * g)
        assert np.isclose(t_ring(net, p, n), 2 * (p - 1) * a + 2 * n * (p - 1) / p * b + n * (p - 1) / p * g)
    assert expected(16, 1 << 18, 4, 64 << 10) == [(8, 2 * (1 << 20) * 15 // 16)] * 16
    assert expected(6, 256, 4, 64 << 10) == [(1, 1024), (3, 3072)] * 2 + [(2, 2048)] * 2
    assert expected(5, 1 << 18, 4, 0)[:3] == [(1, 1 << 20), (5, 5 << 19), (4, 3 << 19)]


def test_scale_bench_counts_every_rank_and_writes_its_tables(tmp_path):
    """bench/scale.py --quick --no-tcp end to end: ping-pong alpha/beta and gamma, every rank's
    messages and bytes at p = 2..5 against the schedules' formulas, the p = 4 timings with the
    crossover, the predicted table at p = 8..4096 and both plots."""
    cmd = [sys.executable, str(ROOT / "bench" / "scale.py"), "--quick", "--no-tcp", "--out", str(tmp_path)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=240, cwd=ROOT, env=environment())
    assert done.returncode == 0, done.stdout + done.stderr
    for name in ("measured.json", "pingpong.csv", "traffic.csv", "timing.csv", "model.csv", "scale.md",
                 "scale_model.png", "scale_measured.png"):
        assert (tmp_path / name).stat().st_size > 0, name
    traffic = list(csv.DictReader((tmp_path / "traffic.csv").open()))
    assert {int(r["p"]) for r in traffic} == {2, 3, 4, 5} and all(r["match"] == "True" for r in traffic)
    model = list(csv.DictReader((tmp_path / "model.csv").open()))
    assert {int(r["p"]) for r in model} >= {8, 4096} and all(float(r["tree"]) > 0 for r in model)
    timing = list(csv.DictReader((tmp_path / "timing.csv").open()))
    assert {r["impl"] for r in timing} == {"mpi", "fcoll", "doubling", "halving"}
    assert all(r["ok"] == "True" for r in timing), timing
    assert "measured crossover (shm, p = 4)" in done.stdout
    assert "traffic check: every rank matches" in done.stdout
