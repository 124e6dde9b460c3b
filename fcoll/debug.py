"""The flight recorder's public side: what each rank was doing when the job stopped; and
`traffic`, what this rank's calls hand to the transports (`fcoll.calls.traffic`).

Each rank keeps its last calls (``FCOLL_TRACE``, default 64; ``0`` turns it off): op, group
ranks, call number on the group, array shapes and dtypes, state (``sent``: in flight, or
enqueued on a GPU stream; ``completed``; ``failed``) and timing. fcoll gathers every rank's
record and prints it side by side, the first call number at which ranks differ marked, on a
`CollectiveTimeoutError` (also in its ``flight_record``), in `fcoll.testing`'s hang reports
and when ``python -m fcoll.run`` aborts a job; `dump` does it on demand.

Example:
    >>> fc.init(timeout=5)                  # every rank; rank 1 skips a call
    >>> if fc.get_rank() != 1:
    ...     fc.all_reduce(np.ones(4))       # CollectiveTimeoutError after 5 s; rank 0 prints:
    fcoll flight record (all_reduce missed its deadline on group [0, 1]): ...
      #4    all_reduce float32[4] failed 5s    -                    <<< first difference
      first difference at call #4: rank 0 made all_reduce float32[4]; rank 1 made no call #4 ...
"""

from __future__ import annotations

import sys
from typing import TextIO

from fcoll import runtime
from fcoll.calls.traffic import traffic
from fcoll.diagnostics import flight, flight_report
from fcoll.groups.group import is_initialized

__all__ = ["dump", "record", "trace", "traffic"]


def dump(timeout: float = 5.0, file: TextIO | None = sys.stderr) -> str:
    """Gather every rank's flight record and return the side-by-side report.

    Waits at most ``timeout`` seconds for the other ranks: those that call `dump` too, or
    wait in an fcoll call with a deadline, answer; the report names the others. The lowest
    answering rank writes the report to ``file`` (None: nobody writes).

    Example:
        >>> report = fc.debug.dump(timeout=2)     # every rank, e.g. in an except block
        >>> "first difference" in report          # when the ranks' calls diverged
        True
    """
    if not is_initialized():
        return flight_report.local("fcoll.debug.dump() before fcoll started: no calls yet")
    return flight_report.collect("fcoll.debug.dump()", timeout, file)


def record() -> list[tuple[object, ...]]:
    """This rank's record, oldest first: ``(group ranks, call number, op, arguments,
    array part of the arguments, state, seconds)`` per call (seconds: the duration, or the
    time since it started while in flight).

    Example:
        >>> fc.all_reduce(np.ones(2)); fc.debug.record()[-1][:3]   # any rank
        ((0, 1), 1, 'all_reduce')
    """
    return list(flight_report.snapshot())


def trace(size: int) -> None:
    """Keep the last ``size`` calls from now on (0: off; rounded up to a power of two); the
    record so far is dropped. Overrides ``FCOLL_TRACE``.

    Example:
        >>> fc.debug.trace(0)       # every rank: no recording (the fast paths' 0.1-0.2 us)
    """
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        raise ValueError(f"trace: expected size to be an int >= 0, got {size!r}")
    flight.configure(size)
    if size and is_initialized():
        flight_report.start(runtime.mpi().COMM_WORLD)
    runtime.changed()  # the fast paths hold the old ring
