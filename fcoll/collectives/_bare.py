"""`fcoll.sendrecv` with ``like=``: nothing travels but the data (`fcoll.collectives.neighbors`).

The caller says what arrives (``like``: an array, or ``(shape, dtype)``), so the receive goes
straight into a new array of that shape, posted before the data arrives, on the user tag's
third wire tag (``PARTS * tag + BARE``, `fcoll.collectives.p2p`), which no message with a
header uses. A message of another size raises `ValueError` on the receiving rank: a shorter
one by its count, a longer one by MPI's truncation, which fcoll's error handler lets pass for
these receives (`fcoll.diagnostics.mpi_errors.TOLERATE`; with ``FCOLL_ABORT_ON_ERROR=0``
mpi4py raises it); either way the message is consumed and the communicator stays usable.
Without a deadline it is one ``MPI_Sendrecv``; with one, ``Isend``/``Irecv`` polled.

Example:
    >>> y = _bare.exchange(call, np.arange(3.0), 1, 1, tag, (3,), np.dtype("float64"))
    >>> y                                                     # what rank 1 sent
    array([10., 11., 12.])
"""

from __future__ import annotations

import math
import time
from typing import Any

import numpy as np

from fcoll.calls.errors import timed_out
from fcoll.calls.work import Call, backoff
from fcoll.collectives._common import c_order
from fcoll.collectives.p2p import BYTE, MPI
from fcoll.diagnostics import flight, mpi_errors

_STATUS = MPI.Status()  # reused: one sendrecv at a time per thread that calls it
PROC_NULL = MPI.PROC_NULL


def exchange(call: Call, x: np.ndarray | None, to: int, source: int, tag: int,
             shape: tuple[int, ...], dtype: np.dtype[Any]) -> np.ndarray | None:
    """Send ``x`` (None: nothing) to ``to`` and receive ``shape``/``dtype`` from ``source``
    (``PROC_NULL``: nothing, None returned) on ``tag``, data alone."""
    if x is None:
        send, to = None, PROC_NULL
    else:
        send = [x if x.flags.c_contiguous else c_order(x), BYTE]
    out = None if source == PROC_NULL else np.empty(shape, dtype)
    status, before, tolerate = _STATUS, mpi_errors.TRUNCATED[0], mpi_errors.TOLERATE
    tolerate[0] += 1
    try:
        if call.seconds is None:
            call.comm.Sendrecv(send, to, tag, None if out is None else [out, BYTE], source, tag,
                               status)
        else:
            _polled(call, send, to, None if out is None else [out, BYTE], source, tag, status)
    except MPI.Exception as error:  # FCOLL_ABORT_ON_ERROR=0: mpi4py's handler
        if error.Get_error_class() != MPI.ERR_TRUNCATE:
            raise
        mpi_errors.TRUNCATED[0] += 1
    finally:
        tolerate[0] -= 1
    if out is not None and (mpi_errors.TRUNCATED[0] != before
                            or status.Get_count(BYTE) != out.nbytes):
        mismatch(call.fn, out, status, mpi_errors.TRUNCATED[0] != before, source)
    return out


def _polled(call: Call, send: Any, to: int, recv: Any, source: int, tag: int, status: Any) -> None:
    """``Isend``/``Irecv`` polled against the call's deadline, each on its own (a truncated
    receive then tells its own error, not MPI_ERR_IN_STATUS)."""
    comm, seconds = call.comm, call.seconds
    assert seconds is not None
    pending = [(comm.Irecv(recv, source, tag), status)] if recv is not None else []
    if send is not None:
        pending.append((comm.Isend(send, to, tag), MPI.Status()))
    pause, started = 1e-5, time.monotonic()
    while pending:
        pending = [(request, s) for request, s in pending if not request.Test(s)]
        if pending and time.monotonic() - call.start > seconds:
            flight.fail(call.slot)
            raise timed_out(call.fn, call.group, seconds, call.group.seq)
        if pending:
            pause = backoff(started, pause)


def mismatch(fn: str, out: np.ndarray, status: Any, truncated: bool, source: int) -> None:
    """`ValueError` from ``fn``: the message was not ``out``'s size (``truncated``: longer)."""
    got = status.Get_count(BYTE)
    what = f"more than {out.nbytes}" if truncated else str(got)
    raise ValueError(f"{fn}: expected {out.nbytes} bytes from group rank {source} (like= "
                     f"{out.shape} {out.dtype}, {math.prod(out.shape)} elements), got {what} "
                     "bytes: the sender's array differs from like")
