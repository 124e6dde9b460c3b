"""Faults in whole jobs: small mpiexec jobs launched from the world-size-1 pass, each
with a deadline. A dead rank, a silent rank or an exception on one rank must end the job
with a non-zero exit and a message, never a hang."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import fcoll as fc
from tests import jobs

pytestmark = pytest.mark.skipif(fc.get_world_size() != 1, reason="launches its own jobs")


def _job(tmp_path: Path, body: str, n: int = 2, limit: float = 60) -> tuple[int, str, float]:
    script = tmp_path / "job.py"
    script.write_text("import os, sys, time\nimport numpy as np\nimport fcoll as fc\n"
                      + textwrap.dedent(body))
    start = time.monotonic()
    done = subprocess.run(jobs.command(n, sys.executable, "-m", "fcoll.run", str(script)),
                          env=jobs.environment(), capture_output=True, text=True, timeout=limit)
    return done.returncode, done.stdout + done.stderr, time.monotonic() - start


@pytest.mark.smoke
def test_exception_on_one_rank_aborts_the_job(tmp_path):
    code, out, took = _job(tmp_path, """
        if fc.get_rank() == 1:
            raise ValueError("boom from rank 1")
        fc.all_reduce(np.ones(3))     # rank 0 would wait forever
    """)
    assert code != 0 and took < 30
    assert "[rank 1] ValueError: boom from rank 1" in out and "Traceback" in out


def test_silent_rank_times_out(tmp_path):
    code, out, took = _job(tmp_path, """
        fc.init(timeout=1.0)
        if fc.get_rank() == 1:
            time.sleep(20)            # alive, but never makes the call
        fc.all_reduce(np.ones(3))
    """)
    assert code != 0 and took < 20
    assert "CollectiveTimeoutError" in out and "all_reduce (call #1 on the group)" in out
    assert "1 s deadline on group ranks [0, 1]" in out
    # the flight record: rank 0's call, rank 1 asleep outside fcoll (no answer)
    assert "fcoll flight record (all_reduce missed its deadline on group [0, 1])" in out, out
    assert "no answer within 0.3 s from rank(s) 1" in out, out


def test_an_aborting_rank_prints_the_flight_record(tmp_path):
    code, out, took = _job(tmp_path, """
        fc.init(timeout=10.0)
        for _ in range(2):
            fc.all_reduce(np.ones(3))
        if fc.get_rank() == 1:
            raise ValueError("rank 1 gives up")
        fc.all_reduce(np.ones(3))     # rank 0 waits, answering the report
    """)
    assert code != 0 and took < 30, out
    assert "fcoll flight record (python -m fcoll.run: rank 1 raised ValueError: rank 1 gives up)" \
        in out, out
    assert "first difference at call #3: rank 0 made all_reduce float64[3]; rank 1 made no call #3 " \
        "(last: #2 all_reduce)" in out, out


@pytest.mark.smoke
def test_dead_rank_ends_the_job(tmp_path):
    code, _, took = _job(tmp_path, """
        fc.init(timeout=5.0)
        fc.barrier()
        if fc.get_rank() == 1:
            os._exit(7)               # dies without a word
        fc.all_reduce(np.ones(3))
    """)
    # MPICH's and Open MPI's mpiexec stop the job at once and exit with the dead rank's
    # code (7); MPICH's names no rank, and the surviving ranks are killed before they can say
    # anything. Under load MPICH's mpiexec may reap the rank it killed first and exit with its
    # status (9, SIGKILL: seen in CI, as in test_shm's dead-peer job).
    assert code in (7, 9) and took < 30, code


def test_nonzero_exit_aborts_the_job(tmp_path):
    code, _, took = _job(tmp_path, """
        if fc.get_rank() == 0:
            sys.exit(4)
        fc.barrier()
    """)
    assert code != 0 and took < 30


def test_clean_job_exits_zero(tmp_path):
    code, out, _ = _job(tmp_path, """
        print("sum", fc.all_reduce(np.ones(2)).tolist())
    """)
    assert code == 0 and out.count("[2.0, 2.0]") == 2, out  # the ranks' lines may interleave
