"""The on-node shared-memory transport: reductions through a segment the group's ranks share.

For a group whose ranks all run on one node, an all_reduce goes through the group's
`fcoll.backends._segment.Segment` in steps of at most ``CHUNK`` bytes per rank: each rank
copies its step's bytes into its slot and announces it (one flag), waits for every other
rank's flag, then folds the slots in group-rank order, ``((s0 op s1) op s2) ...``, straight
into its new result. Per byte of the result each rank moves: the copy in (read the input,
write the slot), the fold (read ``n`` slots, write the result): ``n + 3`` bytes, where MPI's
reduce-scatter + all-gather moves and synchronises more (see docs/performance.md, "Shared-
memory transport"). The steps keep a chunk's slots in cache between the copy and the fold.

The fold is the same elementwise ufunc loop as `fcoll.collectives._fold.fold`, so results
are bit-identical to the MPI path's for every dtype and op (integer and bitwise ops are
exact in any order; floats are folded in rank order there too).

Settings, read once per process (again after `fcoll.init`): ``FCOLL_SHM`` ``auto`` (default:
on where it measured faster, messages of at least `MIN_BYTES`), ``1`` (every size, for
tests), ``0`` (never); ``FCOLL_SHM_NODE_SIZE=k`` pretends each node holds ``k`` consecutive
global ranks (to test groups that span nodes on one machine). Every rank must see the same
settings.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from fcoll import _runtime
from fcoll.backends._segment import Segment
from fcoll.work import Call, wait_request

NAME = "shm"
ENV = "FCOLL_SHM"
NODE_ENV = "FCOLL_SHM_NODE_SIZE"
CHUNK = 1 << 20  # bytes per rank per step (a step's n slots stay in the 32 MiB L3 here)
MIN_BYTES = 16 << 10  # per rank: below this MPI's all_reduce is faster (docs/performance.md)
NEVER = float("inf")
_SETTING: list[tuple[float, int]] = []  # (bytes from which shm is used, node size), read once


def settings() -> tuple[float, int]:
    """``(bytes from which all_reduce goes through shared memory, simulated node size)``.

    Example:
        >>> settings()                   # FCOLL_SHM unset
        (16384, 0)
    """
    if _SETTING:
        return _SETTING[0]
    value = os.environ.get(ENV, "auto").strip().lower() or "auto"
    limits = {"auto": MIN_BYTES, "1": 0, "on": 0, "0": NEVER, "off": NEVER}
    if value not in limits:
        raise ValueError(f"{ENV}: expected one of auto, 1, 0, got {value!r}")
    size = os.environ.get(NODE_ENV, "").strip() or "0"
    if not size.isdigit():
        raise ValueError(f"{NODE_ENV}: expected a number of ranks per node, got {size!r}")
    _SETTING.append((limits[value], int(size)))
    return _SETTING[0]


def forget() -> None:
    """Read the settings again at the next call (`fcoll.init` does this)."""
    _SETTING.clear()


_runtime.on_change(forget)


def limit(group: Any) -> float:
    """The per-rank bytes from which ``group``'s all_reduce uses shared memory (`NEVER`
    where it cannot: one rank, or the group already found to span nodes)."""
    if group.size < 2 or group.shm is False:
        return NEVER
    return settings()[0]


def segment(call: Call) -> Segment | None:
    """The group's segment, made at its first use (collective over the group: every rank
    reaches it in the same call); None for a group that spans nodes."""
    g = call.group
    if g.shm is None:
        g.shm = attach(call) or False
    return g.shm or None


def attach(call: Call) -> Segment | None:
    """Split the group by node; a segment if every rank shares this node, else None (the
    same answer on every rank: each sees a node smaller than the group)."""
    comm = call.begin()
    if call.seconds is not None:  # everyone is in this call before the blocking setup
        wait_request(comm.Ibarrier(), call)
    MPI = _runtime.mpi()
    node = comm.Split_type(MPI.COMM_TYPE_SHARED, key=comm.Get_rank())
    per_node = settings()[1]
    if per_node:
        fake = node.Split(MPI.COMM_WORLD.Get_rank() // per_node, node.Get_rank())
        node.Free()
        node = fake
    if node.Get_size() != comm.Get_size():
        node.Free()
        return None
    return Segment(node, 64 << 10)


def allreduce(call: Call, send: np.ndarray, ufunc: np.ufunc) -> np.ndarray:
    """Every rank's C-contiguous ``send`` reduced with ``ufunc`` in group-rank order, in a
    new array of its shape and dtype.

    Example:
        >>> allreduce(call, np.array([r + 1.0]), np.add)    # rank r of 3 on one node
        array([6.])
    """
    seg = segment(call)
    if seg is None:
        raise RuntimeError(f"{call.fn}: the shared-memory path needs a group on one node")
    call.begin()
    flat = send.reshape(-1).view(np.uint8)
    out = np.empty(send.shape, send.dtype)
    dest = out.reshape(-1).view(np.uint8)
    first = min(flat.size, CHUNK)
    _start(call, seg, flat[:first], flat.size)
    _fold(seg, seg.step, dest[:first], send.dtype, ufunc)
    for start in range(first, flat.size, CHUNK):
        piece = flat[start : start + CHUNK]
        seg.step += 1
        seg.slot(seg.step, seg.rank)[: piece.size] = piece
        seg.arrive(seg.step, piece.size)
        seg.wait(seg.step, call)
        _fold(seg, seg.step, dest[start : start + piece.size], send.dtype, ufunc)
    call.end()
    return out


def _start(call: Call, seg: Segment, piece: np.ndarray, nbytes: int) -> None:
    """The call's first step: copy in (if it fits), announce ``nbytes``, wait for all;
    every rank raises the same `ValueError` when the ranks' sizes differ, and every rank
    grows the segment when the step does not fit (then takes the step again)."""
    seg.step += 1
    fits = piece.size <= seg.capacity
    if fits:
        seg.slot(seg.step, seg.rank)[: piece.size] = piece
    seg.arrive(seg.step, nbytes)
    seg.wait(seg.step, call)
    sizes = seg.announced(seg.step)
    if len(set(sizes)) > 1:
        raise ValueError(f"{call.fn}: expected the same number of bytes on every rank of "
                         f"group {list(call.group.ranks)}, got {sizes} (by group rank)")
    if not fits:
        seg.grow(max(piece.size, min(2 * seg.capacity, CHUNK)))
        _start(call, seg, piece, nbytes)


def _fold(seg: Segment, step: int, dest: np.ndarray, dtype: np.dtype[Any], ufunc: np.ufunc) -> None:
    """Fold every rank's slot of ``step`` into ``dest`` (bytes), in group-rank order."""
    size = dest.size
    out = dest.view(dtype)
    rows = [seg.slot(step, j)[:size].view(dtype) for j in range(seg.n)]
    ufunc(rows[0], rows[1], out=out)
    for row in rows[2:]:
        ufunc(out, row, out=out)
