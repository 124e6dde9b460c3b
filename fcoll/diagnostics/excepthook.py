"""A failing rank ends the job: fcoll's ``sys.excepthook`` and its at-exit check.

Installed by ``import fcoll``. In a job of more than one process, an exception that
escapes a rank's script is printed with the rank (``[rank 1] Traceback ...``), every
answering rank's flight record is printed (`fcoll.diagnostics.flight_report`, within ``FLIGHT_SECONDS``),
and the whole job ends at once with exit status 1 (``MPI_Abort``), where the other ranks
would otherwise wait forever in their next collective. ``FCOLL_ABORT_ON_ERROR=0`` turns it
off. It does not fire for exceptions the script catches, for ``SystemExit`` (``sys.exit``),
in an interactive interpreter (``python -i``, the REPL), in a job of one process, or inside
`fcoll.testing` (which reports failures itself). A hook the program installed before
importing fcoll still runs (fcoll adds its line after it); one installed after replaces
fcoll's, and the at-exit check then ends the job (Python keeps the exception in
``sys.last_value``).

At exit, a rank whose script ended tells the stall watch (`fcoll.diagnostics.watch.ended`), which ends
the job if a peer on this node waits in a call this rank never made.

Example:
    >>> # job.py, run as: mpiexec -n 2 python job.py
    >>> import fcoll as fc
    >>> if fc.get_rank() == 1:
    ...     raise ValueError("boom")         # rank 1 prints its traceback, the job ends (status 1)
    >>> fc.all_reduce(np.ones(3))            # rank 0 would have waited forever
"""

from __future__ import annotations

import atexit
import sys
import traceback
from collections.abc import Callable
from types import TracebackType
from typing import Any

from fcoll import runtime
from fcoll.diagnostics import flight, flight_report, watch

FLIGHT_SECONDS = 1.0  # how long the failing rank gathers the others' records
_STATE = {"installed": False, "handled": False, "testing": False}
Hook = Callable[[type[BaseException], BaseException, TracebackType | None], Any]


def install() -> None:
    """Wrap ``sys.excepthook`` (keeping the program's own) and register the at-exit check;
    once per process."""
    if _STATE["installed"]:
        return
    _STATE["installed"] = True
    previous: Hook = sys.excepthook

    def hook(kind: type[BaseException], value: BaseException, tb: TracebackType | None) -> None:
        if not ends_job(kind):
            previous(kind, value, tb)
            return
        _STATE["handled"] = True
        fail(value, previous)

    sys.excepthook = hook
    atexit.register(_at_exit)


def under_testing() -> None:
    """`fcoll.testing` reports failures itself: no hook (the at-exit check still runs)."""
    _STATE["testing"] = True


def interactive() -> bool:
    return hasattr(sys, "ps1") or bool(sys.flags.interactive)


def ends_job(kind: type[BaseException]) -> bool:
    """Whether an uncaught ``kind`` ends the job here."""
    if _STATE["testing"] or issubclass(kind, SystemExit) or interactive() or not runtime.ends_jobs():
        return False
    MPI = runtime._MPI
    return MPI is not None and not MPI.Is_finalized() and MPI.COMM_WORLD.Get_size() > 1


def fail(error: BaseException, previous: Hook | None = None, runner: str = "") -> None:
    """Print ``error`` with this rank and the flight record, then end the job (status 1).
    ``previous``: the program's own hook, which prints the traceback instead of fcoll."""
    rank = runtime.mpi().COMM_WORLD.Get_rank()
    if previous is None or previous is sys.__excepthook__:
        text = "".join(traceback.format_exception(type(error), error, error.__traceback__))
        sys.stderr.write("".join(f"[rank {rank}] {line}\n" for line in text.splitlines()))
    else:
        previous(type(error), error, error.__traceback__)
    summary = "".join(traceback.format_exception_only(type(error), error)).strip().splitlines()[-1]
    made_calls = bool(flight.RING) and flight.RING.pos[0] > 0
    if flight_report._COMM and made_calls and type(error).__name__ != "CollectiveTimeoutError":
        flight_report.collect(f"{runner or 'fcoll'}: rank {rank} raised {summary[:80]}",
                              FLIGHT_SECONDS, always=True)
    runtime.end_job(1, f"[rank {rank}] fcoll: the uncaught {type(error).__name__} above ended this "
                        "rank's script: ending the job (FCOLL_ABORT_ON_ERROR=0 turns this off)")


def _at_exit() -> None:
    """The script ended: an exception fcoll's hook did not see ends the job; otherwise the
    stall watch learns that this rank ended (and ends the job if a peer waits for it)."""
    error = getattr(sys, "last_value", None)
    if error is not None and not _STATE["handled"] and ends_job(type(error)):
        fail(error, previous=lambda *args: None)
    if runtime._MPI is None or runtime._MPI.Is_finalized():
        return
    reason = f"uncaught {type(error).__name__}" if error is not None else "it returned or called sys.exit"
    watch.ended(reason, failed=error is not None)
