"""One dim of a halo exchange over MPI (`fcoll.halo_exchange`): this rank's two edges to its
neighbours along a mesh axis, their edges into its ghost cells, all in its result array.

A slice along dim 0 of a C-ordered array is contiguous and travels as it is (a view). A slice
along another dim is strided: it is packed into a contiguous buffer kept per (shape, dtype,
dim, width) and the received faces unpacked from two more (a `Plan`'s), as a careful mpi4py code
does; this measured faster here than handing MPI a subarray datatype of the whole array
(0.93-1.25x raw against 1.2-1.5x at 512^2, bench/numeric.py), and it is the same bytes.
Without a deadline a dim is two ``MPI_Sendrecv`` (up, then down); with one, four
nonblocking messages polled against it.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from fcoll.calls.errors import timed_out
from fcoll.calls.work import Call, backoff
from fcoll.collectives.p2p import BYTE, HALO_TAG, MPI
from fcoll.diagnostics import flight

UP, DOWN = HALO_TAG, HALO_TAG + 1  # data moving to the next rank along the axis, the previous
_STATUSES = [MPI.Status() for _ in range(4)]  # reused: fcoll's calls never overlap
NULL = MPI.PROC_NULL


class Plan:
    """One dim's exchange for blocks of one shape and dtype, worked out once: the index of
    each region along ``dim`` (low ghosts, high ghosts, high edge, low edge), the peers
    (``NULL`` for none) and, off dim 0, the contiguous face buffers.

    Example:
        >>> plan = Plan((66, 66), np.dtype("float64"), 0, 1, 0, 1)    # rows, rank 0 of 2
        >>> exchange(call, y, plan)
    """

    def __init__(self, shape: tuple[int, ...], dtype: np.dtype[Any], dim: int, width: int,
                 src: int | None, dst: int | None) -> None:
        n, head = shape[dim], (slice(None),) * dim
        self.dim, self.width, self.shape = dim, width, shape
        self.index = [(*head, slice(a, a + width)) for a in (0, n - width, n - 2 * width, width)]
        self.src, self.dst = NULL if src is None else src, NULL if dst is None else dst
        self.peers = (src is not None) + (dst is not None)
        self.face = int(np.prod(shape, dtype=np.int64)) // n * width * dtype.itemsize
        face_shape = (*shape[:dim], width, *shape[dim + 1 :])
        self.buffers = None if dim == 0 else [[np.empty(face_shape, dtype), BYTE] for _ in range(4)]


def exchange(call: Call, y: np.ndarray, plan: Plan) -> None:
    """Along ``plan.dim`` of ``y``: send its first ``width`` cells inside the ghosts to
    ``src`` (the lower neighbour) and its last ones to ``dst``; receive ``src``'s into the
    low ghosts and ``dst``'s into the high ones. Without a deadline two ``MPI_Sendrecv`` (a
    shift up, then down, as MPI's Cartesian codes do), with one four nonblocking messages
    polled against it. Faces along dim 0 travel as views of ``y``; along another dim they
    are packed into (and unpacked from) the plan's buffers."""
    comm = call.begin()
    index, src, dst = plan.index, plan.src, plan.dst
    buffers = plan.buffers
    if buffers is None:
        low, high = [y[index[0]], BYTE], [y[index[1]], BYTE]
        top, bottom = [y[index[2]], BYTE], [y[index[3]], BYTE]
    else:
        low, high, top, bottom = buffers
        if dst != NULL:
            np.copyto(top[0], y[index[2]])
        if src != NULL:
            np.copyto(bottom[0], y[index[3]])
    if call.seconds is None:
        up, down = _STATUSES[0], _STATUSES[1]
        comm.Sendrecv(top, dst, UP, low, src, UP, up)
        comm.Sendrecv(bottom, src, DOWN, high, dst, DOWN, down)
        call.end()
        if (src != NULL and up.Get_count(BYTE) != plan.face) or (
                dst != NULL and down.Get_count(BYTE) != plan.face):
            _not_a_grid(call, plan, up if src != NULL and up.Get_count(BYTE) != plan.face else down)
    else:
        requests = []
        if src != NULL:
            requests.append(comm.Irecv(low, src, UP))
        if dst != NULL:
            requests.append(comm.Irecv(high, dst, DOWN))
            requests.append(comm.Isend(top, dst, UP))
        if src != NULL:
            requests.append(comm.Isend(bottom, src, DOWN))
        statuses = _STATUSES[: len(requests)]
        _wait(requests, statuses, call)
        for status in statuses[: plan.peers]:
            if status.Get_count(BYTE) != plan.face:
                _not_a_grid(call, plan, status)
    if buffers is not None:
        if src != NULL:
            np.copyto(y[index[0]], low[0])
        if dst != NULL:
            np.copyto(y[index[1]], high[0])


def _not_a_grid(call: Call, plan: Plan, status: Any) -> None:
    raise ValueError(f"{call.fn}: expected a neighbour's face of {plan.face} bytes along dim "
                     f"{plan.dim} (this rank's, shape {plan.shape}, width {plan.width}), got "
                     f"{status.Get_count(BYTE)} bytes from group rank {status.Get_source()}: "
                     "the blocks do not form a grid")


def _wait(requests: list[Any], statuses: list[Any], call: Call) -> None:
    """``Waitall``, or polled against the call's deadline."""
    if call.seconds is None:
        MPI.Request.Waitall(requests, statuses)
        call.end()
        return
    pause, started = 1e-5, time.monotonic()
    while not MPI.Request.Testall(requests, statuses):
        if time.monotonic() - call.start > call.seconds:
            flight.fail(call.slot)
            raise timed_out(call.fn, call.group, call.seconds, call.group.seq)
        pause = backoff(started, pause)
    call.end()
