"""pytest plugin for running one pytest per MPI rank (``mpiexec -n N python -m pytest``).

- Only rank 0 prints; the other ranks' stdout goes to /dev/null, their stderr stays
  (a failure or a hang there is still visible in the log as it happens).
- After every test the ranks exchange outcomes: a test that failed on another rank is
  reported on rank 0 (as an error at teardown) with that rank's traceback.
- If some ranks do not reach that exchange within ``FCOLL_TEST_SYNC_TIMEOUT`` seconds (a
  rank blocked in a collective the others skipped), the job is aborted with a message
  naming the test, instead of hanging until CI's limit.
- Every rank exits with the same status.
"""

from __future__ import annotations

import atexit
import os
import sys
import time
from collections.abc import Generator
from typing import Any

import pytest

import fcoll
from fcoll._runtime import mpi

_SYNC_TIMEOUT = float(os.environ.get("FCOLL_TEST_SYNC_TIMEOUT", "240"))
_comm: Any = None


def _wait_for_all(nodeid: str, when: str) -> None:
    """Poll a nonblocking barrier; abort the job if it does not complete in time."""
    request = _comm.Ibarrier()
    deadline = time.monotonic() + _SYNC_TIMEOUT
    pause = 1e-5
    while not request.Test():
        if time.monotonic() > deadline:
            sys.stderr.write(
                f"\n[rank {_comm.rank}] {nodeid} ({when}): the other ranks did not finish "
                f"within {_SYNC_TIMEOUT:.0f} s; some rank is blocked in a collective. "
                "Aborting the job.\n"
            )
            sys.stderr.flush()
            mpi().COMM_WORLD.Abort(3)
        time.sleep(pause)
        pause = min(pause * 2, 1e-2)


def pytest_configure(config: pytest.Config) -> None:
    global _comm
    fcoll.init()
    _comm = mpi().COMM_WORLD.Dup()
    if _comm.rank != 0:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        os.close(devnull)
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - closed at exit
        atexit.register(sys.stdout.close)


def pytest_report_header(config: pytest.Config) -> str:
    MPI = mpi()
    return (f"fcoll test harness: world size {_comm.size}, {MPI.Get_library_version().splitlines()[0]}"
            f", thread level {MPI.Query_thread()}")


_FAILURES = pytest.StashKey[list[str]]()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[Any, Any, None]:
    """Collect this rank's failures of every phase; exchange them once, at teardown (the one
    phase every rank reaches, whatever it skipped), and report other ranks' failures there."""
    outcome = yield
    report: pytest.TestReport = outcome.get_result()
    failures = item.stash.setdefault(_FAILURES, [])
    if report.failed:
        failures.append(f"({call.when}) {report.longreprtext}")
        if _comm.rank != 0:
            sys.stderr.write(f"\n[rank {_comm.rank}] FAILED {item.nodeid} ({call.when}):\n"
                             f"{report.longreprtext}\n")
    if call.when != "teardown":
        return
    _wait_for_all(item.nodeid, call.when)
    everyone = _comm.allgather(failures)
    others = [(rank, f) for rank, fs in enumerate(everyone) if rank != _comm.rank for f in fs]
    if others and not report.failed:
        report.outcome = "failed"
        report.longrepr = "\n\n".join(
            f"---- failed on rank {rank} of {_comm.size} ----\n{text}" for rank, text in others
        )


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    statuses = _comm.allgather(int(session.exitstatus))
    worst = max(statuses)
    session.exitstatus = 0 if worst == 5 and min(statuses) == 0 else worst
