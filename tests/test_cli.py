"""``python -m fcoll info`` and ``python -m fcoll check``: real commands from the
world-size-1 pass (they launch their own jobs), plus the report logic on its own."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import fcoll as fc
from fcoll.cli import check_cases
from fcoll.cli import info as _info
from fcoll.cli.check_cases import CHECKS, HOST_ONLY, same
from fcoll.cli.check_job import Verdict, report, verdicts

ROOT = Path(__file__).resolve().parents[1]
FAKE_SITE = ROOT / "tests" / "fake_cupy_site"  # puts tests/fake_cupy.py in every rank
spawns = pytest.mark.skipif(fc.get_world_size() != 1, reason="launches its own jobs")


def _fcoll(*args: str, timeout: float = 120, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "HYDRA_", "MPI"))}
    return subprocess.run([sys.executable, "-m", "fcoll", *args], cwd=ROOT, env={**clean, **env},
                          capture_output=True, text=True, timeout=timeout)


@spawns
def test_info_prints_mpi_library_and_versions():
    done = _fcoll("info", FCOLL_DEBUG="info")
    assert done.returncode == 0, done.stderr
    out = done.stdout
    from mpi4py import MPI

    assert " ".join(MPI.Get_library_version().splitlines()[0].split()) in out
    assert f"{fc.__version__}" in out and f"{np.__version__}" in out
    assert "thread level" in out and "serialized" in out
    assert "FCOLL_DEBUG" in out and "info" in out
    assert "CUDA-aware MPI" in out and "world size" in out


@spawns
@pytest.mark.parametrize("setting", ["auto", "0"])
def test_info_says_which_engine_steps_the_segment(setting):
    """The compiled core where it was built (the suite's installs build it), the numpy
    path with FCOLL_NATIVE=0."""
    import importlib.util

    done = _fcoll("info", "--json", FCOLL_NATIVE=setting)
    assert done.returncode == 0, done.stderr
    step = json.loads(done.stdout)["shared memory"]["step"]
    if setting == "0":
        assert step == "numpy path (FCOLL_NATIVE=0)"
    elif importlib.util.find_spec("fcoll.backends._shmcore") is not None:
        assert step.startswith("compiled core (") and "_shmcore" in step, step
    else:
        assert step.startswith("numpy path"), step


@spawns
def test_info_has_a_torch_section():
    done = _fcoll("info", "--json", FCOLL_TORCH_ENGINE="0")
    assert done.returncode == 0, done.stderr
    section = json.loads(done.stdout)["torch"]
    assert section["entry point"].startswith("fcoll = fcoll.torch.plugin:register")
    if importlib.util.find_spec("torch") is None:
        assert section["torch"] == "not installed"
        return
    import torch

    assert section["torch"].startswith(torch.__version__)
    assert section['backend "fcoll"'] == "registered"
    assert section["engine"].startswith("off")
    assert section["CUDA"].startswith("not available") != torch.cuda.is_available()


@spawns
def test_info_json_parses():
    done = _fcoll("info", "--json", FCOLL_MPI_THREAD_LEVEL="funneled")
    assert done.returncode == 0, done.stderr
    report_ = json.loads(done.stdout)
    assert set(report_) == {"versions", "mpi", "launcher", "start-up", "shared memory",
                            "nodes", "environment", "gpu", "torch"}
    assert report_["nodes"] == {"nodes": "1", "ranks per node": "1", "placement": "by block",
                                "world group": "one rank"}
    assert report_["mpi"]["world size"] == "1"
    assert report_["mpi"]["thread level"].startswith("funneled")
    assert report_["mpi"]["oversubscribed"] == "no"
    assert report_["environment"]["FCOLL_MPI_THREAD_LEVEL"] == "funneled"
    assert report_["versions"]["numpy"] == np.__version__
    assert report_["gpu"]["CUDA-aware MPI"] in ("yes", "no", "unknown")
    assert report_["start-up"]["MPI started by"].startswith("fcoll")
    assert report_["start-up"]["not in effect"] == "nothing"
    assert report_["start-up"]["malloc tuning"].startswith(("applied", "not applied (not glibc)"))
    assert report_["launcher"]["launcher says"].startswith("nothing")


@spawns
def test_check_on_two_ranks_passes():
    done = _fcoll("check", "-n", "2")
    assert done.returncode == 0, done.stdout + done.stderr
    lines = [line for line in done.stdout.splitlines() if line.startswith(("PASS", "FAIL"))]
    assert len(lines) == len(CHECKS) and all(line.startswith("PASS") for line in lines)
    assert f"{len(CHECKS)} passed, 0 failed on 2 ranks" in done.stdout


@spawns
def test_check_reports_a_failing_check_and_exits_nonzero():
    done = _fcoll("check", "-n", "2", "--only", "broadcast", "--only", "barrier",
                  "--inject-failure", "broadcast")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "PASS  barrier" in done.stdout
    assert "FAIL  broadcast  on rank 1: [rank 1] AssertionError: deliberate failure" in done.stdout
    assert "1 passed, 1 failed on 2 ranks" in done.stdout


@spawns
def test_check_reports_a_hung_job(tmp_path):
    hang = tmp_path / "mpiexec"
    hang.write_text("#!/bin/sh\nsleep 60\n")
    hang.chmod(0o755)
    done = _fcoll("check", "--timeout", "1", MPIEXEC=str(hang), timeout=30)
    assert done.returncode == 124, done.stdout + done.stderr
    assert "FAIL  the job timed out after 1 s" in done.stdout


@spawns
def test_check_on_cupy_arrays_on_the_cpu_stand_in():
    """``--array all`` with FCOLL_FAKE_CUPY=1: every check on numpy, then every check that
    takes arrays on (fake) cupy arrays, against the same numpy values."""
    done = _fcoll("check", "-n", "2", "--array", "all", FCOLL_FAKE_CUPY="1",
                  PYTHONPATH=os.pathsep.join([str(FAKE_SITE), str(ROOT)]))
    assert done.returncode == 0, done.stdout + done.stderr
    on_cupy = [name for name in CHECKS if name not in HOST_ONLY]
    assert "barrier" in HOST_ONLY and "all_reduce sum float64" in on_cupy
    assert all(f"PASS  {name} [cupy]\n" in done.stdout for name in on_cupy), done.stdout
    assert f"{len(CHECKS) + len(on_cupy)} passed, 0 failed on 2 ranks" in done.stdout
    assert "2 ranks, 120 s limit, all arrays" in done.stdout


@spawns
def test_check_on_cupy_without_cupy_says_so(tmp_path):
    """No cupy: ``--array cupy`` fails naming why; ``--array all`` notes it and passes."""
    (tmp_path / "cupy").mkdir()
    (tmp_path / "cupy" / "__init__.py").write_text("raise ImportError('no cupy in this test')\n")
    done = _fcoll("check", "-n", "1", "--array", "cupy", PYTHONPATH=str(tmp_path))
    assert done.returncode == 1, done.stdout + done.stderr
    assert ("FAIL  cupy arrays  on rank 0: [rank 0] no GPU here: cupy not importable "
            "(ImportError: no cupy in this test)") in done.stdout
    assert "0 passed, 1 failed on 1 rank" in done.stdout
    done = _fcoll("check", "-n", "1", "--array", "all", "--only", "broadcast",
                  PYTHONPATH=str(tmp_path))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SKIP  cupy arrays: [rank 0] no GPU here: cupy not importable" in done.stdout
    assert "PASS  broadcast\n" in done.stdout and "1 passed, 0 failed on 1 rank" in done.stdout


def test_check_cases_on_an_unknown_array_type():
    with pytest.raises(ValueError, match="expected kind in"):
        check_cases.use_arrays("jax")
    assert check_cases.put(np.ones(2)).__class__ is np.ndarray  # numpy: the array itself


@spawns
def test_check_rejects_an_unknown_name():
    done = _fcoll("check", "--only", "all_reduce_typo")
    assert done.returncode == 2 and "got ['all_reduce_typo']" in done.stderr


def test_gpu_facts_come_from_the_probe(monkeypatch):
    from fcoll.dispatch import gpu_probe

    monkeypatch.setattr(gpu_probe, "gpu_report", lambda: {"cupy": "13.3.0", "NCCL": "2.21.5"})
    monkeypatch.setattr(gpu_probe, "cuda_aware_mpi", lambda: True)
    assert _info._gpu_section() == {"cupy": "13.3.0", "NCCL": "2.21.5", "CUDA-aware MPI": "yes"}


def test_gpu_section_without_cupy(monkeypatch):
    monkeypatch.setitem(sys.modules, "cupy", None)  # import fails as if not installed
    section = _info._gpu_section()
    assert section["cupy"] == "not installed" and section["CUDA-aware MPI"] in ("no", "unknown")


def test_a_failing_probe_is_reported_not_raised(monkeypatch):
    from fcoll.dispatch import gpu_probe

    def broken() -> dict[str, str]:
        raise OSError("driver gone")

    monkeypatch.setattr(gpu_probe, "gpu_report", broken)
    assert _info._gpu_section() == {"probe": "failed (OSError: driver gone)"}


def test_report_names_the_failing_ranks():
    per_rank = [[None, None, "AssertionError: result: expected [1], got [2]"],
                [None, "ValueError: bad", "AssertionError: result: expected [1], got [3]"]]
    results = verdicts(["a", "bb", "ccc"], per_rank)
    assert results == [Verdict("a", {}), Verdict("bb", {1: "ValueError: bad"}),
                       Verdict("ccc", {0: per_rank[0][2], 1: per_rank[1][2]})]
    text, code = report(results, 2)
    assert code == 1
    assert text.splitlines() == [
        "PASS  a",
        "FAIL  bb   on rank 1: [rank 1] ValueError: bad",
        "FAIL  ccc  on rank 0, 1: [rank 0] AssertionError: result: expected [1], got [2]",
        "1 passed, 2 failed on 2 ranks",
    ]
    assert report([Verdict("a", {})], 1) == ("PASS  a\n1 passed, 0 failed on 1 rank", 0)


def test_same_detects_value_shape_and_dtype_differences():
    same(np.arange(3), np.arange(3))
    same(None, None)
    with pytest.raises(AssertionError, match=r"expected \[0, 1, 2\], got \[0, 1, 3\]"):
        same(np.array([0, 1, 3]), np.arange(3))
    with pytest.raises(AssertionError, match="expected shape"):
        same(np.arange(3).reshape(3, 1), np.arange(3))
    with pytest.raises(AssertionError, match="expected dtype int64, got int32"):
        same(np.arange(3, dtype=np.int32), np.arange(3, dtype=np.int64))
    with pytest.raises(AssertionError, match="expected None"):
        same(np.arange(3), None)


def test_every_check_passes_in_this_job(rank, world_size):
    """The checks themselves, at the suite's own world size (every rank runs each)."""
    for name, check in CHECKS.items():
        try:
            check(rank, world_size)
        except Exception as error:
            raise AssertionError(f"check {name!r} failed on rank {rank}") from error


def test_info_into_a_closed_pipe_is_quiet(tmp_path):
    """``python -m fcoll info | true`` (the reader is gone before the first line): no
    BrokenPipeError traceback, exit 0."""
    script = (f"{sys.executable} -m fcoll info | true; echo \"status=${{PIPESTATUS[0]}}\"")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "HYDRA_", "MPI"))}
    done = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60,
                          env=env)
    assert "status=0" in done.stdout and "BrokenPipe" not in done.stderr, done
