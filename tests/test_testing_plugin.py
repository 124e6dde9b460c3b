"""fcoll.testing, the pytest plugin for MPI suites: small throwaway suites run as
``mpiexec -n N python -m pytest -p fcoll.testing`` jobs from the world-size-1 pass.

Each rank writes its pytest exit status to a file, so the tests can check that every rank
exits with the same status."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

import fcoll as fc
from fcoll.testing import TIMEOUT_ENV

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
pytestmark = pytest.mark.skipif(fc.get_world_size() != 1, reason="launches its own jobs")

LAUNCHER = """
import os, sys, pytest
code = int(pytest.main(sys.argv[1:]))
rank = os.environ.get("PMI_RANK", "0")
with open(os.path.join(os.environ["STATUS_DIR"], f"status-{rank}"), "w") as f:
    f.write(str(code))
sys.exit(code)
"""


@dataclass
class Job:
    code: int
    out: str
    took: float
    statuses: list[int]


def _suite(tmp_path: Path, n: int, *args: str, limit: float = 3, **files: str) -> Job:
    """Write ``files`` (name -> source) into a fresh directory and run pytest there on ``n``
    ranks with the plugin and a per-test limit of ``limit`` seconds."""
    suite = tmp_path / "suite"
    suite.mkdir()
    for name, source in files.items():
        (suite / f"{name}.py").write_text(textwrap.dedent(source))
    (tmp_path / "launch.py").write_text(LAUNCHER)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "HYDRA_", "MPI"))}
    env.update(PYTHONPATH=str(ROOT), STATUS_DIR=str(tmp_path), MPIEXEC_TIMEOUT="30",
               PYTEST_ADDOPTS="", COLUMNS="200")
    env.pop(TIMEOUT_ENV, None)
    start = time.monotonic()
    done = subprocess.run(
        [str(BIN / "mpiexec"), "-n", str(n), sys.executable, str(tmp_path / "launch.py"),
         "-p", "fcoll.testing", "-p", "no:cacheprovider", "-rA", f"--mpi-timeout={limit}",
         "--rootdir", str(suite), str(suite), *args],
        cwd=suite, env=env, capture_output=True, text=True, timeout=60)
    statuses = [int(p.read_text()) for p in sorted(tmp_path.glob("status-*"))]
    return Job(done.returncode, done.stdout + done.stderr, time.monotonic() - start, statuses)


def test_failures_marker_shared_dir_and_hypothesis_on_two_ranks(tmp_path):
    job = _suite(tmp_path, 2, test_a="""
        import numpy as np, pytest, fcoll as fc
        from hypothesis import given, strategies as st

        def test_ok():
            assert fc.all_reduce(np.ones(1))[0] == 2

        def test_x():
            assert fc.get_rank() != 1, "boom on rank 1"

        @pytest.mark.mpi(min_size=3)
        def test_big():
            pass

        def test_shared(mpi_tmp_path):
            if fc.get_rank() == 1:
                (mpi_tmp_path / "note.txt").write_text("from rank 1")
            fc.barrier()
            assert (mpi_tmp_path / "note.txt").read_text() == "from rank 1"
            paths = fc.all_gather_object(str(mpi_tmp_path))
            assert paths[0] == paths[1], paths
            print("shared ok")

        DRAWN = []

        @given(st.integers(), st.text(max_size=5))
        def test_draw(i, s):
            DRAWN.append((i, s))

        def test_draws_agree():
            draws = fc.all_gather_object(DRAWN)
            assert len(DRAWN) > 10 and draws[0] == draws[1]
    """)
    out = job.out
    assert "FAILED test_a.py::test_x@rank1 - AssertionError: boom on rank 1" in out, out
    assert "_ test_x@rank1 _" in out and "assert fc.get_rank() != 1" in out, out
    assert "FAILED test_a.py::test_x " not in out, out  # it passed on rank 0
    assert "SKIPPED [1] test_a.py:11: needs an MPI world size >= 3, got 2" in out, out
    assert "PASSED test_a.py::test_shared" in out and "PASSED test_a.py::test_draws_agree" in out, out
    assert "1 failed, 5 passed, 1 skipped" in out, out
    assert job.code == 1 and job.statuses == [1, 1], (job.code, job.statuses)


def test_failure_on_rank_2_and_equal_exit_status_on_three_ranks(tmp_path):
    job = _suite(tmp_path, 3, test_b="""
        import pytest, fcoll as fc

        @pytest.mark.mpi(min_size=3)
        def test_y():
            if fc.get_rank() == 2:
                raise ValueError("only rank 2")

        def test_fine():
            pass
    """)
    assert "FAILED test_b.py::test_y@rank2 - ValueError: only rank 2" in job.out, job.out
    assert "test_y@rank1" not in job.out and "1 failed, 2 passed" in job.out, job.out
    assert job.statuses == [1, 1, 1], job.statuses


def test_collection_error_on_one_rank_stops_every_rank(tmp_path):
    job = _suite(tmp_path, 2, test_c="""
        import fcoll as fc
        if fc.get_rank() == 1:
            raise ImportError("no such thing on rank 1")

        def test_z():
            pass
    """)
    assert "ERROR test_c.py@rank1" in job.out and "no such thing on rank 1" in job.out, job.out
    assert "errors during collection on ranks [1]" in job.out, job.out
    assert job.statuses == [2, 2], job.statuses


def test_no_tests_is_the_same_status_everywhere(tmp_path):
    job = _suite(tmp_path, 2, test_d="x = 1\n")
    assert job.statuses == [5, 5] and job.code == 5, (job.statuses, job.out)


def test_hang_on_rank_0_is_reported_and_ends_the_job(tmp_path):
    job = _suite(tmp_path, 2, limit=2, test_e="""
        import numpy as np, fcoll as fc

        def test_hang():
            if fc.get_rank() == 1:
                raise ValueError("rank 1 gives up")   # and skips the collective
            fc.all_reduce(np.ones(1))

        def test_after():
            pass
    """)
    assert job.code != 0 and job.took < 20, (job.code, job.took, job.out)
    assert "FAILED test_e.py::test_hang@rank0 - did not finish within 2 s: in fcoll all_reduce " \
           "(call #1 on group ranks [0, 1]), blocked inside MPI" in job.out, job.out
    assert "rank 1: finished it and is waiting for the others; it failed there: call: " \
           "ValueError: rank 1 gives up" in job.out, job.out
    assert "test_after" not in job.out


def test_hang_on_other_ranks_is_reported_by_rank_0(tmp_path):
    job = _suite(tmp_path, 3, limit=2, test_f="""
        import numpy as np, fcoll as fc

        def test_hang():
            if fc.get_rank() != 0:      # rank 0 skips the collective
                fc.all_reduce(np.ones(1))
    """)
    assert job.code != 0 and job.took < 20, (job.code, job.took, job.out)
    for rank in (1, 2):
        assert f"FAILED test_f.py::test_hang@rank{rank} - did not finish within 2 s: in fcoll " \
               "all_reduce (call #1 on group ranks [0, 1, 2])" in job.out, job.out
    assert "not finished within the 2 s limit (mpi_timeout) on ranks [1, 2]" in job.out, job.out
    assert "called at test_f.py:6 in test_hang: `fc.all_reduce(np.ones(1))`" in job.out, job.out
    assert "fcoll flight record (hang in test_f.py::test_hang)" in job.out, job.out
    assert "first difference at call #1: ranks 1, 2 made all_reduce float64[1]; rank 0 made no " \
           "call #1 (last: none)" in job.out, job.out


def test_collective_timeout_fails_the_test_and_stops_the_session(tmp_path):
    job = _suite(tmp_path, 2, limit=10, test_g="""
        import numpy as np, fcoll as fc
        fc.init(timeout=1)

        def test_late():
            if fc.get_rank() != 1:
                fc.all_reduce(np.ones(1))

        def test_after():
            pass
    """)
    assert "FAILED test_g.py::test_late - fcoll.calls.errors.CollectiveTimeoutError: all_reduce (call #1 " \
           "on the group) did not complete within its 1 s deadline" in job.out, job.out
    assert "the session stops here" in job.out and "test_after" not in job.out, job.out
    assert job.statuses == [2, 2] and job.took < 20, (job.statuses, job.took)


PYTEST_MPI_SUITE = """
    import numpy as np, pytest, fcoll as fc

    @pytest.mark.mpi(min_size=2)
    def test_sum(mpi_tmpdir, mpi_file_name, mpi_tmp_path):
        assert fc.all_reduce(np.ones(1))[0] == fc.get_world_size()
        assert fc.all_gather_object(mpi_file_name) == [mpi_file_name] * fc.get_world_size()
        assert str(mpi_tmpdir) == str(mpi_tmp_path) and mpi_file_name.endswith(".hdf5")

    @pytest.mark.mpi(min_size=3)
    def test_needs_three():
        pass

    @pytest.mark.mpi_skip
    def test_not_under_mpi():
        raise AssertionError("mpi_skip must skip this")

    @pytest.mark.mpi_xfail
    def test_known_to_fail_under_mpi():
        raise AssertionError("expected")

    def test_serial():
        pass

    @pytest.mark.mpi
    def test_fails_on_rank_1():
        assert fc.get_rank() != 1, "deliberate"
"""

FCOLL_SUITE = """
    import numpy as np, pytest, fcoll as fc

    @pytest.mark.mpi(min_size=2, max_size=4, timeout=20)
    def test_sum(mpi_tmp_path):
        assert fc.all_reduce(np.ones(1))[0] == fc.get_world_size()

    @pytest.mark.mpi(min_size=3)
    def test_needs_three():
        pass

    def test_serial():
        pass

    def test_fails_on_rank_1():
        assert fc.get_rank() != 1, "deliberate"
"""


@pytest.mark.parametrize("present", [True, False], ids=["with-pytest-mpi", "without-pytest-mpi"])
@pytest.mark.parametrize("suite", ["pytest-mpi suite", "fcoll suite"])
def test_pytest_mpi_and_fcoll_testing_agree(tmp_path, suite, present):
    """Both kinds of suite, with pytest-mpi loadable or blocked: the MPI tests run (no
    silent skips), the counts are right and the deliberate failure fails the job."""
    pytest.importorskip("pytest_mpi")  # in the test extra (pyproject.toml)
    source, extra = ((PYTEST_MPI_SUITE, ["--with-mpi"]) if suite == "pytest-mpi suite"
                     else (FCOLL_SUITE, []))
    blocked = [] if present else ["-p", "no:pytest_mpi"]
    job = _suite(tmp_path, 2, *extra, *blocked, test_s=source)
    # rank 0 counts its pass of test_fails_on_rank_1 and rank 1's failure of it
    want = ("1 failed, 3 passed, 2 skipped, 1 xfailed" if suite == "pytest-mpi suite"
            else "1 failed, 3 passed, 1 skipped")
    assert want in job.out, job.out
    assert "FAILED test_s.py::test_fails_on_rank_1@rank1" in job.out
    assert job.code == 1 and job.statuses == [1, 1], (job.code, job.statuses)
    assert "is installed; fcoll.testing handles its markers, options and fixtures" in job.out


def test_only_mpi_runs_only_marked_tests(tmp_path):
    pytest.importorskip("pytest_mpi")
    job = _suite(tmp_path, 2, "--only-mpi", test_s=PYTEST_MPI_SUITE)
    assert "1 failed, 2 passed, 4 skipped in" in job.out, job.out
    assert "not marked mpi (--only-mpi)" in job.out
