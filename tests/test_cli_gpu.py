"""``python -m fcoll check --gpu`` on the CPU stand-in for cupy and NCCL (tests/fake_cupy.py):
real commands from the world-size-1 pass (they launch their own jobs) on three machines
the stand-in can play (NCCL and a GPU per rank; ranks sharing a GPU with CUDA-aware MPI;
no NCCL), then the tracer and the report in this process. The run on a real GPU is
scripts/gpu-check.sh's."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import fcoll as fc
from fcoll.backends import nccl
from fcoll.cli import gpu_routes
from fcoll.cli.gpu_check import report
from fcoll.cli.gpu_routes import Facts, faster, taken, why
from fcoll.dispatch import gpu_settings
from tests import fake_cupy

ROOT = Path(__file__).resolve().parents[1]
FAKE_SITE = ROOT / "tests" / "fake_cupy_site"
spawns = pytest.mark.skipif(fc.get_world_size() != 1, reason="launches its own jobs")
COLLECTIVES = 15


def _check_gpu(n: int, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items()
             if not k.startswith(("PMI_", "HYDRA_", "MPI", "FCOLL_", "FAKE_CUPY"))}
    clean.update({"FCOLL_FAKE_CUPY": "1",
                  "PYTHONPATH": os.pathsep.join([str(FAKE_SITE), str(ROOT)]), **env})
    return subprocess.run([sys.executable, "-m", "fcoll", "check", "--gpu", "-n", str(n), *args],
                          cwd=ROOT, env=clean, capture_output=True, text=True, timeout=300)


def _route(out: str, name: str) -> list[str]:
    """The line of collective ``name`` and its ``faster:`` line, if any, split in words."""
    lines = out.splitlines()
    at = next(i for i, line in enumerate(lines) if line.split()[:1] == [name])
    following = lines[at + 1].split() if at + 1 < len(lines) else []
    return lines[at].split() + (following if following[:1] == ["faster:"] else [])


@spawns
def test_nccl_and_a_gpu_per_rank():
    done = _check_gpu(2)
    out = done.stdout
    assert done.returncode == 0, out + done.stderr
    assert "PASS  nccl    all_reduce, all_gather_into_tensor of float32[1024] match numpy" in out, out
    assert "PASS  staged  " in out, out
    assert "SKIP  aware   MPI is not CUDA-aware" in out and "MPICH_GPU_SUPPORT_ENABLED=1" in out, out
    for name in gpu_routes.calls(0, 2, np):
        assert _route(out, name)[1] == "nccl", (name, out)
    assert "faster:" not in out, out
    assert f"{2 + COLLECTIVES} passed, 0 failed on 2 ranks" in out, out


@spawns
def test_one_rank_where_some_calls_move_nothing():
    done = _check_gpu(1)
    assert done.returncode == 0, done.stdout + done.stderr
    assert " ".join(_route(done.stdout, "permute_tensor")) == (
        "permute_tensor local nothing leaves this rank in this call: fcoll copies on the device, "
        "no transport"), done.stdout
    assert _route(done.stdout, "all_reduce")[1] == "nccl", done.stdout


@spawns
def test_ranks_sharing_a_gpu_with_cuda_aware_mpi():
    done = _check_gpu(2, FAKE_CUPY_DEVICES="1", FCOLL_CUDA_AWARE_MPI="1")
    out = done.stdout
    assert done.returncode == 0, out + done.stderr
    assert "SKIP  nccl    ranks 0 and 1 share a GPU, and NCCL allows one rank per GPU" in out, out
    assert "PASS  aware   " in out and "PASS  staged  " in out, out
    for name in ("all_reduce", "broadcast", "all_gather_into_tensor", "all_to_all_single"):
        line = " ".join(_route(out, name))
        assert line.startswith(f"{name} aware CUDA-aware MPI takes the device buffers (not NCCL: "
                               "ranks share a GPU) faster: NCCL: one GPU per rank"), line
    line = " ".join(_route(out, "reduce"))
    assert "staged CUDA-aware MPI serves all_reduce, broadcast" in line, line
    assert f"{2 + COLLECTIVES} passed, 0 failed on 2 ranks" in out, out


@spawns
def test_no_nccl_names_its_wheel_and_cuda_aware_mpi():
    done = _check_gpu(2, FAKE_CUPY_NCCL="0")
    out = done.stdout
    assert done.returncode == 0, out + done.stderr
    assert "SKIP  nccl    cupy has no usable NCCL" in out and "pip install nvidia-nccl-cu13" in out
    for name in gpu_routes.calls(0, 2, np):
        words = _route(out, name)
        assert words[1] == "staged" and "NCCL: install NCCL's wheel" in " ".join(words), (name, out)
    assert "not NCCL: cupy has no usable NCCL, and MPI is not CUDA-aware: host copies" in out


@spawns
def test_without_cupy_or_with_other_options_it_says_so(tmp_path):
    (tmp_path / "cupy").mkdir()
    (tmp_path / "cupy" / "__init__.py").write_text("raise ImportError('no cupy in this test')\n")
    done = _check_gpu(1, FCOLL_FAKE_CUPY="0", PYTHONPATH=f"{tmp_path}{os.pathsep}{ROOT}")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "FAIL  cupy arrays  on rank 0: [rank 0] no GPU here: cupy not importable" in done.stdout
    done = _check_gpu(1, "--array", "cupy")
    assert done.returncode == 2 and "expected --gpu alone" in done.stderr, done.stderr


@pytest.fixture
def cupy(monkeypatch: pytest.MonkeyPatch) -> Any:
    """The stand-in in this process (one device per rank), and fcoll looking for it afresh."""
    monkeypatch.setattr(fake_cupy, "_state", fake_cupy._State())
    module = fake_cupy.install(monkeypatch)
    gpu_settings.forget()
    import fcoll.gpu

    fcoll.gpu.use_local_device()  # a device per rank, as NCCL needs
    yield module
    gpu_settings.forget()
    nccl.forget()


@pytest.mark.parametrize("transport", ["auto", "mpi"])
def test_the_tracer_sees_the_route_a_call_takes(cupy, monkeypatch, transport):
    monkeypatch.setenv(gpu_settings.ENV, transport)
    from fcoll.gpu import fast

    fast.reset()
    x = cupy.asarray(np.arange(4.0))
    group = fc.world().split(color=0)  # a group of its own: no NCCL state left on the world
    way = taken(lambda: fc.broadcast(x, src=0, group=group))
    assert way == ("nccl" if transport == "auto" else "staged")
    assert taken(lambda: fc.get_rank()) == "local"


FACTS = Facts(setting="auto", nccl=None, nccl_why="no libnccl", shared=None, aware=False,
              aware_why="the MPI library says it does not take device buffers", mpi="Open MPI")


def test_why_and_faster_name_the_setting():
    aware = Facts(**{**FACTS.__dict__, "aware": True, "nccl": "2.28.3", "shared": "ranks 0 and 1 "
                     "share a GPU"})
    assert why("all_reduce", "staged", aware).startswith(  # a float sum at 3 ranks: rank order
        "MPI's own op would not reduce this call as fcoll does")
    assert why("reduce", "staged", FACTS) == \
        "not NCCL: cupy has no usable NCCL, and MPI is not CUDA-aware: host copies"
    assert faster("reduce", "staged", FACTS).startswith("NCCL: install NCCL's wheel")
    on_mpi = Facts(**{**FACTS.__dict__, "setting": "mpi", "nccl": "2.28.3"})
    assert faster("broadcast", "staged", on_mpi).startswith("NCCL: unset FCOLL_GPU_TRANSPORT")
    shared = Facts(**{**FACTS.__dict__, "nccl": "2.28.3", "shared": "ranks 0 and 1 share a GPU"})
    assert faster("all_to_all_single", "staged", shared).startswith("NCCL: one GPU per rank")
    assert faster("all_to_all_single", "nccl", FACTS) == ""
    assert gpu_routes.aware_setting("Open MPI").startswith("an Open MPI built with CUDA")
    assert "MPICH_GPU_SUPPORT_ENABLED=1" in gpu_routes.aware_setting("MPICH")


def test_a_failed_round_trip_or_call_fails_the_report():
    trips = [[("nccl", None, 10.0), ("aware", "SKIP not here", 0.0), ("staged", None, 50.0)],
             [("nccl", "all_reduce: expected the numpy result, got other values", 0.0),
              ("aware", "SKIP not here", 0.0), ("staged", None, 60.0)]]
    ways = [{"all_reduce": "nccl", "reduce": "staged"}, {"all_reduce": "nccl", "reduce": "error: x"}]
    text, code = report(Facts(**{**FACTS.__dict__, "nccl": "2.28.3"}), trips, ways)
    assert code == 1, text
    assert "FAIL  nccl    [rank 1] all_reduce: expected the numpy result" in text, text
    assert "PASS  staged  all_reduce, all_gather_into_tensor of float32[1024] match numpy on every " \
           "rank; 60.0 us per all_reduce" in text, text
    assert "mixed: rank 0 staged, rank 1 error: x" in text, text
    assert text.splitlines()[-1] == "2 passed, 2 failed on 2 ranks", text
