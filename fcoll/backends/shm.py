"""The on-node shared-memory transport: reductions through a segment the group's ranks share.

For a group whose ranks all run on one node, an all_reduce goes through the group's
`fcoll.backends.segment.Segment` in steps of at most ``CHUNK`` bytes per rank: each rank
copies its step's bytes into its slot and announces it (one flag), waits for every other
rank's flag, then folds the slots along the canonical tree of the group's size
(`fcoll.backends.tree.order`, the MPI schedules' bits) straight into its new result,
reading its own piece from its input rather than its slot (`reduce_scatter_block`: each
step carries the next piece of every block but the rank's own; each folds its block's).
Per byte of an all_reduce each rank moves: the copy in (read the input, write the slot),
the fold (read its input and ``n - 1`` slots, write the result): ``n + 3`` bytes, where
MPI's reduce-scatter + all-gather moves and synchronises more (docs/performance.md). The steps keep
a chunk's slots in cache between the copy and the fold. A call that fits one step can
come from the default group's fast path (`allreduce_step`, `reduce_scatter_step`).

The fold is the tree's program run with the op's ufunc, so results are bit-identical to the
MPI path's for every dtype and op (integer and bitwise ops are exact in any order).

Where the segment serves (which ops, which sizes) and its settings (``FCOLL_SHM``,
``FCOLL_SHM_NODE_SIZE``): `fcoll.backends.shm_window`, re-exported here.
"""

from __future__ import annotations

import numpy as np

from fcoll.backends import native
from fcoll.backends.segment import CHUNK, Segment
from fcoll.backends.shm_window import ENV as ENV
from fcoll.backends.shm_window import MAX_BYTES as MAX_BYTES
from fcoll.backends.shm_window import MIN_BYTES as MIN_BYTES
from fcoll.backends.shm_window import NAME as NAME
from fcoll.backends.shm_window import NATIVE_MAX_BYTES as NATIVE_MAX_BYTES
from fcoll.backends.shm_window import NATIVE_MIN_BYTES as NATIVE_MIN_BYTES
from fcoll.backends.shm_window import NEVER as NEVER
from fcoll.backends.shm_window import OVERSUBSCRIBED_MAX_BYTES as OVERSUBSCRIBED_MAX_BYTES
from fcoll.backends.shm_window import ceiling as ceiling
from fcoll.backends.shm_window import forget as forget
from fcoll.backends.shm_window import limit as limit
from fcoll.backends.shm_window import settings as settings
from fcoll.backends.tree.order import allreduce_program, execute
from fcoll.calls import fingerprint
from fcoll.calls.work import Call, wait_request
from fcoll.diagnostics.board import NODE_ENV as NODE_ENV
from fcoll.diagnostics.board import split_node


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
    node = split_node(comm, settings()[1])
    if node.Get_size() != comm.Get_size():
        node.Free()
        return None
    core = native.module() if native.running() and node.Get_size() <= native.MAX_RANKS else None
    return Segment(node, 64 << 10, core, owner=call.group)


def allreduce(call: Call, send: np.ndarray, ufunc: np.ufunc, fp: int,
              out: np.ndarray | None = None) -> np.ndarray:
    """Every rank's C-contiguous ``send`` reduced with ``ufunc`` along the tree, in a
    new array of its shape and dtype, or into ``out`` (C-contiguous, the same shape and
    dtype; it may be ``send`` itself). ``fp`` is the call's fingerprint (`fcoll.calls.fingerprint`):
    every rank announces it with its element count, and ranks that differ raise
    `fcoll.calls.errors.CollectiveMismatchError` on every rank.

    Example:
        >>> allreduce(call, np.array([r + 1.0]), np.add, fp)    # rank r of 3 on one node
        array([6.])
    """
    seg = _segment(call)
    flat = send.reshape(-1)
    in_place = out is send  # then this rank's own row is read from its slot, not overwritten
    out = np.empty(send.shape, send.dtype) if out is None else out
    dest = out.reshape(-1)
    per = CHUNK // max(send.itemsize, 1)  # elements per step
    for start in range(0, max(flat.size, 1), per):
        piece = flat[start : start + per]
        rows = _step(call, seg, piece, fp, flat.size)
        fold(rows, seg.rank, rows[seg.rank] if in_place else piece,
             dest[start : start + piece.size], ufunc)
    call.end()
    return out


def ready(call: Call, seg: Segment, nbytes: int, fp: int, count: int) -> Segment:
    """``seg``, holding a step of ``nbytes`` per rank (``min(nbytes, CHUNK)``): a segment too
    small first announces (so disagreeing ranks raise before anyone grows), then every rank
    grows it alike."""
    need = min(nbytes, CHUNK)
    if need > seg.capacity:
        seg.exchange(np.empty(0, np.uint8), call, fp, count, send=False)  # announce, compare
        seg.grow(max(need, min(2 * seg.capacity, CHUNK)))
    return seg


def allreduce_native(call: Call, x: np.ndarray, kernel: native.Kernel, fp: int,
                     out: np.ndarray | None = None) -> np.ndarray:
    """`allreduce` by the compiled core: ``x`` C-contiguous in its own dtype (float16 and
    bfloat16 travel as themselves and are folded in float32), folded with ``kernel``
    (`fcoll.backends.native.kernel`), a new finished array (avg divided, premul scaled), or
    into ``out`` (C-contiguous, ``x``'s shape and dtype; it may be ``x`` itself).

    Example:
        >>> allreduce_native(call, np.array([r + 1.0]), native.kernel(f8, np.add, False, None), fp)
        array([3.])                                              # rank r of 2 on one node
    """
    seg = ready(call, _segment(call), x.nbytes, fp, x.size)
    if out is None:
        result: np.ndarray = seg.native(call, seg.core.allreduce, x, *kernel, fp)
    else:
        result = seg.native(call, seg.core.allreduce_into, out, x, *kernel, fp)
    call.end()
    return result


def reduce_scatter_native(call: Call, x: np.ndarray, kernel: native.Kernel, fp: int) -> np.ndarray:
    """`reduce_scatter_block` by the compiled core (see `allreduce_native`).

    Example:
        >>> reduce_scatter_native(call, np.arange(4.0), kernel, fp)   # each of 2 ranks
        array([0., 2.])                                               # rank 0; rank 1: [4., 6.]
    """
    n = call.group.size
    seg = ready(call, _segment(call), min(x.nbytes // n, CHUNK // n) * n, fp, x.size)
    out: np.ndarray = seg.native(call, seg.core.reduce_scatter, x, *kernel, fp)
    call.end()
    return out


def allreduce_step(seg: Segment, call: Call, x: np.ndarray, ufunc: np.ufunc, fp: int
                   ) -> np.ndarray:
    """`allreduce` of a C-contiguous ``x`` that fits the segment in one step, for a call
    with no deadline on a group whose segment exists (the default group's fast path,
    `fcoll.collectives._fast`): the same steps and checks, without the call's set-up.

    Example:
        >>> allreduce_step(group.shm, group.call, np.ones(4096), np.add, fp)   # 2 ranks
        array([2., 2., ...])
    """
    flat = x if x.ndim == 1 else x.reshape(-1)
    rows = seg.exchange(flat, call, fp, flat.size)
    out = np.empty(x.shape, x.dtype)
    fold(rows, seg.rank, flat, out if x.ndim == 1 else out.reshape(-1), ufunc)
    return out


def reduce_scatter_block(call: Call, send: np.ndarray, ufunc: np.ufunc, fp: int) -> np.ndarray:
    """Block ``rank`` of ``n`` along axis 0 of every rank's C-contiguous ``send``, reduced
    with ``ufunc`` along the tree. Each step moves the next piece of every block, so
    every rank folds its own block at every step.

    Example:
        >>> reduce_scatter_block(call, np.arange(4.0), np.add, fp)   # each of 2 ranks on a node
        array([0., 2.])                                          # rank 0; rank 1: [4., 6.]
    """
    seg = _segment(call)
    n, me = seg.n, seg.rank
    blocks = send.reshape(n, -1)
    out = np.empty((send.shape[0] // n, *send.shape[1:]), send.dtype)
    dest = out.reshape(-1)
    per = max(1, CHUNK // n // max(send.itemsize, 1))  # elements of each block per step
    for start in range(0, max(blocks.shape[1], 1), per):
        pieces = blocks[:, start : start + per]
        size = pieces.shape[1]
        rows = _step(call, seg, pieces, fp, send.size)
        mine = [row[me * size : (me + 1) * size] for row in rows]
        fold(mine, me, pieces[me], dest[start : start + size], ufunc)
    call.end()
    return out


def reduce_scatter_step(seg: Segment, call: Call, x: np.ndarray, ufunc: np.ufunc, fp: int
                        ) -> np.ndarray:
    """`reduce_scatter_block` of a C-contiguous ``x`` that fits the segment in one step, for
    a call with no deadline on a group whose segment exists (the default group's fast path).

    Example:
        >>> reduce_scatter_step(group.shm, group.call, np.ones(4096), np.add, fp)   # 2 ranks
        array([2., 2., ...])                                                     # 2048 each
    """
    n, me = seg.n, seg.rank
    blocks = x.reshape(n, -1)
    size = blocks.shape[1]
    rows = seg.exchange(blocks, call, fp, x.size)
    out = np.empty((x.shape[0] // n, *x.shape[1:]), x.dtype)
    fold([row[me * size : (me + 1) * size] for row in rows], me, blocks[me], out.reshape(-1),
         ufunc)
    return out


def allgather(call: Call, send: np.ndarray, out: np.ndarray, fp: int) -> np.ndarray:
    """Every rank's C-contiguous ``send`` in group-rank order, into ``out`` (C-contiguous,
    ``n`` times ``send``'s size), in steps of at most ``CHUNK`` bytes per rank.

    Example:
        >>> allgather(call, np.array([r]), np.empty(2, int), fp)   # rank r of 2 on one node
        array([0, 1])
    """
    seg = _segment(call)
    if seg.core is not None:
        ready(call, seg, send.nbytes, fp, send.size)
        seg.native(call, seg.core.allgather, send.reshape(-1), out, fp)
        call.end()
        return out
    flat = send.reshape(-1)
    dest = out.reshape(seg.n, -1)
    per = CHUNK // max(send.itemsize, 1)
    for start in range(0, max(flat.size, 1), per):
        piece = flat[start : start + per]
        rows = _step(call, seg, piece, fp, flat.size)
        _gather(rows, seg.rank, piece, dest[:, start : start + piece.size])
    call.end()
    return out


def allgather_step(seg: Segment, call: Call, x: np.ndarray, fp: int) -> np.ndarray:
    """`allgather` of a C-contiguous ``x`` (at least 1-D) that fits the segment in one step
    into a new array, for the default group's fast path (no deadline, segment made).

    Example:
        >>> allgather_step(group.shm, group.call, np.array([r, r]), fp)   # rank r of 2
        array([0, 0, 1, 1])
    """
    flat = x if x.ndim == 1 else x.reshape(-1)
    rows = seg.exchange(flat, call, fp, flat.size)
    out = np.empty((x.shape[0] * seg.n, *x.shape[1:]), x.dtype)
    _gather(rows, seg.rank, flat, out.reshape(seg.n, -1))
    return out


def _gather(rows: list[np.ndarray], me: int, mine: np.ndarray, dest: np.ndarray) -> None:
    """Row ``j`` of ``dest`` from rank ``j``'s slot; this rank's from ``mine``."""
    for j, row in enumerate(rows):
        dest[j] = mine if j == me else row


def broadcast(call: Call, x: np.ndarray, root: int, fp: int) -> np.ndarray:
    """Group rank ``root``'s ``x`` (any layout) in a new C-contiguous array on every rank:
    the root copies it into its slot, the others copy it out, in steps of ``CHUNK`` bytes.
    Every rank announces the call's fingerprint ``fp`` (root and dtype included) and its
    ``x``'s size: ranks that differ raise `fcoll.calls.errors.CollectiveMismatchError` on every rank.

    Example:
        >>> broadcast(call, np.array([r]), 1, fp)              # rank r of 2 on one node
        array([1])
    """
    seg = _segment(call)
    if seg.core is not None:
        ready(call, seg, x.nbytes, fp, x.size)
        data = x.copy(order="C") if seg.rank == root and not x.flags.c_contiguous else x
        result: np.ndarray = seg.native(call, seg.core.broadcast, data, root, fp)
        call.end()
        return result
    is_root = seg.rank == root
    out = np.array(x, order="C", copy=True) if is_root else np.empty(x.shape, x.dtype)
    flat = out.reshape(-1)
    per = CHUNK // max(x.itemsize, 1)
    for start in range(0, max(flat.size, 1), per):
        piece = flat[start : start + per]
        rows = _step(call, seg, piece, fp, flat.size, is_root)
        if not is_root:
            piece[...] = rows[root]
    call.end()
    return out


def broadcast_step(seg: Segment, call: Call, x: np.ndarray, root: int, fp: int) -> np.ndarray:
    """`broadcast` of an ``x`` that fits the segment in one step, for the default group's
    fast path (no deadline, segment made).

    Example:
        >>> broadcast_step(group.shm, group.call, np.array([r]), 1, fp)   # rank r of 2
        array([1])
    """
    if seg.rank == root:
        out = x.copy()  # C order
        seg.exchange(out.reshape(-1), call, fp, out.size)
        return out
    out = np.empty(x.shape, x.dtype)
    flat = out.reshape(-1)
    flat[...] = seg.exchange(flat, call, fp, flat.size, send=False)[root]
    return out


BARRIER = fingerprint.of("barrier", "", np.dtype(np.uint8))


def barrier(call: Call) -> None:
    """Every rank of the group arrived: one announcing step of its segment (`Segment.barrier`)."""
    _segment(call).barrier(call, BARRIER)
    call.end()


def _segment(call: Call) -> Segment:
    seg = segment(call)
    if seg is None:
        raise RuntimeError(f"{call.fn}: the shared-memory path needs a group on one node")
    call.begin()
    return seg


def _step(call: Call, seg: Segment, data: np.ndarray, fp: int, count: int, send: bool = True
          ) -> list[np.ndarray]:
    """One step (`Segment.exchange`) for ``data`` (1-D, or one row per block), announcing
    the call's fingerprint ``fp`` and element count ``count`` (every rank raises the same
    `fcoll.calls.errors.CollectiveMismatchError` when they differ). A first step that does not fit
    the segment announces first, then every rank grows the segment alike and takes the step.
    ``send=False``: this rank copies nothing in (`Segment.exchange`)."""
    need = data.nbytes
    if need > seg.capacity:  # only a first step (the largest): every rank's need is alike
        seg.exchange(data[:0], call, fp, count, send=False)  # announce, compare
        seg.grow(max(need, min(2 * seg.capacity, CHUNK)))
    return seg.exchange(data, call, fp, count, send)


def fold(rows: list[np.ndarray], me: int, mine: np.ndarray, out: np.ndarray, ufunc: np.ufunc
         ) -> None:
    """Fold ``rows`` (one per rank, ``me``'s replaced by ``mine``, the same values in this
    rank's own memory) into ``out`` with ``ufunc`` along the canonical tree of ``len(rows)``
    (`fcoll.backends.tree.order`). Reading ``mine`` spares this rank the slot its peers are
    reading: about 30 % of a 1 MiB call at n = 2 here."""
    operands = list(rows)
    operands[me] = mine
    execute(allreduce_program(len(rows)), operands, out, ufunc)
