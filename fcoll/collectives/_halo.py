"""One dim of a halo exchange over MPI (`fcoll.halo_exchange`): this rank's two edges to its
neighbours along a mesh axis, their edges into its ghost cells, all in its result array.

A slice along dim 0 of a C-ordered array is contiguous and travels as it is; a slice along
another dim travels as an MPI subarray datatype of the whole array (``Create_subarray``),
so MPI reads and writes the strided cells itself and nothing is packed here. Datatypes are
made once per (shape, itemsize, dim, width) and kept (`KEPT` of them).
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
KEPT = 256
_TYPES: dict[tuple[Any, ...], list[Any]] = {}
_ELEMENTS: dict[int, Any] = {}
_STATUSES = [MPI.Status() for _ in range(4)]  # reused: fcoll's calls never overlap


def _element(itemsize: int) -> Any:
    """A committed datatype of ``itemsize`` bytes."""
    kind = _ELEMENTS.get(itemsize)
    if kind is None:
        kind = _ELEMENTS[itemsize] = BYTE.Create_contiguous(itemsize).Commit()
    return kind


def _subarrays(shape: tuple[int, ...], itemsize: int, dim: int, width: int) -> list[Any]:
    """The four regions of an exchange along ``dim`` (low ghosts, high ghosts, high edge, low
    edge) as subarray datatypes of an array of ``shape``, made once."""
    key = (shape, itemsize, dim, width)
    kinds = _TYPES.get(key)
    if kinds is None:
        if len(_TYPES) >= KEPT:
            for old in _TYPES.values():
                for kind in old:
                    kind.Free()
            _TYPES.clear()
        n, sizes = shape[dim], list(shape)
        subsizes = [width if i == dim else s for i, s in enumerate(shape)]
        kinds = _TYPES[key] = [
            _element(itemsize).Create_subarray(sizes, subsizes, [start if i == dim else 0
                                                              for i in range(len(shape))]).Commit()
            for start in (0, n - width, n - 2 * width, width)]
    return kinds


def regions(y: np.ndarray, dim: int, width: int) -> list[list[Any]]:
    """The message buffers of ``y``'s (C-contiguous) low ghosts, high ghosts, high edge and low
    edge along ``dim``: views along dim 0 (rows: one run of memory each), else ``y`` with a
    subarray datatype."""
    n = y.shape[dim]
    if dim == 0:
        return [[y[0:width], BYTE], [y[n - width : n], BYTE], [y[n - 2 * width : n - width], BYTE],
                [y[width : 2 * width], BYTE]]
    return [[y, 1, kind] for kind in _subarrays(y.shape, y.itemsize, dim, width)]


def exchange(call: Call, y: np.ndarray, dim: int, width: int, src: int | None,
             dst: int | None) -> None:
    """Along ``dim`` of ``y``: send its first ``width`` cells inside the ghosts to ``src``
    (the lower neighbour) and its last ones to ``dst``; receive ``src``'s into the low
    ghosts and ``dst``'s into the high ones (``None``: no neighbour on that side)."""
    comm = call.begin()
    low, high, top, bottom = regions(y, dim, width)
    requests = []
    if src is not None:
        requests.append(comm.Irecv(low, src, UP))
    if dst is not None:
        requests.append(comm.Irecv(high, dst, DOWN))
        requests.append(comm.Isend(top, dst, UP))
    if src is not None:
        requests.append(comm.Isend(bottom, src, DOWN))
    statuses = _STATUSES[: len(requests)]
    _wait(requests, statuses, call)
    face = y.nbytes // y.shape[dim] * width
    for status in statuses[: (src is not None) + (dst is not None)]:
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
            flight.fail(call.slot)
            raise timed_out(call.fn, call.group, call.seconds, call.group.seq)
        pause = backoff(started, pause)
    call.end()
