"""One dim of a halo exchange over MPI (`fcoll.halo_exchange`): this rank's two edges to its
neighbours along a mesh axis, their edges into its ghost cells, all in its result array.

A slice along dim 0 of a C-ordered array is contiguous and travels as it is; a slice along
another dim travels as an MPI subarray datatype of the whole array (``Create_subarray``),
so MPI reads and writes the strided cells itself and nothing is packed here. Datatypes are
made once per (shape, itemsize, dim, start, width) and kept (`KEPT` of them).
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from fcoll import _trace
from fcoll.p2p import BYTE, HALO_TAG, MPI
from fcoll.work import Call, backoff, timed_out

UP, DOWN = HALO_TAG, HALO_TAG + 1  # data moving to the next rank along the axis, the previous
KEPT = 256
_TYPES: dict[tuple[Any, ...], Any] = {}
_ELEMENTS: dict[int, Any] = {}


def _element(itemsize: int) -> Any:
    """A committed datatype of ``itemsize`` bytes."""
    kind = _ELEMENTS.get(itemsize)
    if kind is None:
        kind = _ELEMENTS[itemsize] = BYTE.Create_contiguous(itemsize).Commit()
    return kind


def _subarray(shape: tuple[int, ...], itemsize: int, dim: int, start: int, width: int) -> Any:
    key = (shape, itemsize, dim, start, width)
    kind = _TYPES.get(key)
    if kind is None:
        if len(_TYPES) >= KEPT:
            for old in _TYPES.values():
                old.Free()
            _TYPES.clear()
        sizes = list(shape)
        starts = [start if i == dim else 0 for i in range(len(shape))]
        subsizes = [width if i == dim else s for i, s in enumerate(shape)]
        kind = _TYPES[key] = _element(itemsize).Create_subarray(sizes, subsizes, starts).Commit()
    return kind


def region(y: np.ndarray, dim: int, start: int, width: int) -> list[Any]:
    """The message buffer of ``y``'s cells ``start:start + width`` along ``dim`` (``y``
    C-contiguous): a contiguous view, or ``y`` with a subarray datatype."""
    if all(s == 1 for s in y.shape[:dim]):  # rows of a C-ordered array: one run of memory
        index = (0,) * dim + (slice(start, start + width),)
        return [y[index], BYTE]
    return [y, 1, _subarray(y.shape, y.itemsize, dim, start, width)]


def exchange(call: Call, y: np.ndarray, dim: int, width: int, src: int | None,
             dst: int | None) -> None:
    """Along ``dim`` of ``y``: send its first ``width`` cells inside the ghosts to ``src``
    (the lower neighbour) and its last ones to ``dst``; receive ``src``'s into the low
    ghosts and ``dst``'s into the high ones (``None``: no neighbour on that side)."""
    comm, n = call.begin(), y.shape[dim]
    face = y.nbytes // n * width
    requests = []
    if src is not None:
        requests.append(comm.Irecv(region(y, dim, 0, width), src, UP))
    if dst is not None:
        requests.append(comm.Irecv(region(y, dim, n - width, width), dst, DOWN))
        requests.append(comm.Isend(region(y, dim, n - 2 * width, width), dst, UP))
    if src is not None:
        requests.append(comm.Isend(region(y, dim, width, width), src, DOWN))
    statuses = [MPI.Status() for _ in requests]
    _wait(requests, statuses, call)
    receives = (src is not None) + (dst is not None)
    for status in statuses[:receives]:
        if status.Get_count(BYTE) != face:
            raise ValueError(f"{call.fn}: expected a neighbour's face of {face} bytes along dim "
                             f"{dim} (this rank's, shape {y.shape}, width {width}), got "
                             f"{status.Get_count(BYTE)} bytes from group rank "
                             f"{status.Get_source()}: the blocks do not form a grid")


def _wait(requests: list[Any], statuses: list[Any], call: Call) -> None:
    """``Waitall``, or polled against the call's deadline."""
    if call.seconds is None:
        MPI.Request.Waitall(requests, statuses)
        call.end()
        return
    pause, started = 1e-5, time.monotonic()
    while not MPI.Request.Testall(requests, statuses):
        if time.monotonic() - call.start > call.seconds:
            _trace.fail(call.slot)
            raise timed_out(call.fn, call.group, call.seconds, call.group.seq)
        pause = backoff(started, pause)
    call.end()
