"""Reproducible floating-point reductions: MPI moves the bytes, fcoll does the arithmetic.

MPI's own reductions pick an algorithm by message size, so the order in which a float
element is combined across ranks changes with the size of the message: fusing arrays
into one buffer (the ``*_coalesced`` functions) would then change the low bits of the
result. Here every element of a floating or complex reduction is folded in group-rank
order, ``((x0 op x1) op x2) ...``, whatever the message size, so a result is
bit-identical whether its array travels alone or fused with others, and equal to a
sequential numpy reduction of the ranks' inputs.

This module also makes the choice between MPI's op and the fold (`allreduce`, `reduce`,
`reduce_scatter` carry out a `fcoll._plan.ReductionPlan`: ``plan.ufunc`` None means MPI's
op reduces, else the fold does).

Two ways to fold, both with that same per-element order:
- small messages: gather every rank's buffer, fold locally (one collective);
- large messages: exchange blocks (rank ``r`` gets block ``r`` of every rank, the
  bandwidth-optimal reduce-scatter), fold, then all-gather the folded blocks.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from fcoll._dispatch import on_node
from fcoll._fingerprint import kind_bits
from fcoll._plan import ReductionPlan
from fcoll.backends import mpi as backend
from fcoll.work import Call

# Per-rank bytes up to which gathering everything beats exchanging blocks (bench/).
GATHER_LIMIT = 32 << 10
REDUCE_SCATTER = kind_bits("reduce_scatter_tensor")  # a plan's fingerprint is an all_reduce's


def fold(rows: np.ndarray, ufunc: np.ufunc) -> np.ndarray:
    """Combine the rows of ``rows`` (shape ``(n, m)``) in row order into a new ``(m,)``."""
    acc: np.ndarray = rows[0].copy() if len(rows) == 1 else ufunc(rows[0], rows[1])
    for row in rows[2:]:
        ufunc(acc, row, out=acc)
    return acc


def blocks(size: int, n: int) -> list[int]:
    """Split ``size`` elements into ``n`` nearly equal consecutive blocks."""
    base, extra = divmod(size, n)
    return [base + (i < extra) for i in range(n)]


def allreduce(call: Call, plan: ReductionPlan, wire: np.ndarray) -> np.ndarray:
    """Every rank's reduced ``wire`` (a C-contiguous buffer made by ``plan.wire``): through
    on-node shared memory where `fcoll._dispatch.on_node` says so (always folded in rank
    order), else MPI."""
    if (shared := on_node(call, wire.nbytes)) is not None:
        return shared.allreduce(call, wire, plan.fold_ufunc, plan.fp)  # type: ignore[no-any-return]
    if plan.ufunc is None:
        return backend.allreduce(call, wire, plan.op)
    return fold_allreduce(call, wire.reshape(-1), plan.ufunc).reshape(wire.shape)


def reduce(call: Call, plan: ReductionPlan, wire: np.ndarray, root: int) -> np.ndarray | None:
    """The reduced ``wire`` on ``root``; ``None`` elsewhere."""
    if plan.ufunc is None:
        return backend.reduce(call, wire, plan.op, root)
    y = fold_reduce(call, wire.reshape(-1), plan.ufunc, root)
    return None if y is None else y.reshape(wire.shape)


def reduce_scatter(call: Call, plan: ReductionPlan, wire: np.ndarray, counts: Sequence[int]
                   ) -> np.ndarray:
    """Block ``rank`` (``counts[rank]`` elements) of the reduction of ``wire``: through
    on-node shared memory where the blocks are equal and `fcoll._dispatch.on_node` says so."""
    wire = wire.reshape(-1)
    if counts.count(counts[0]) == len(counts) and \
            (shared := on_node(call, wire.nbytes, "reduce_scatter")) is not None:
        return shared.reduce_scatter_block(  # type: ignore[no-any-return]
            call, wire, plan.fold_ufunc, plan.fp | REDUCE_SCATTER)
    if plan.ufunc is not None:
        return fold_reduce_scatter(call, wire, counts, plan.ufunc)
    if len(set(counts)) == 1:
        return backend.reduce_scatter_block(call, wire, plan.op)
    return backend.reduce_scatter(call, wire, counts, plan.op)


def fold_reduce_scatter(
    call: Call, wire: np.ndarray, counts: Sequence[int], ufunc: np.ufunc
) -> np.ndarray:
    """Block ``rank`` (``counts[rank]`` elements) of the reduction of flat ``wire``."""
    n, me, size = call.comm.Get_size(), call.comm.Get_rank(), wire.itemsize
    recv = np.empty((n, counts[me]), wire.dtype)
    if counts.count(counts[0]) == n:
        backend.alltoall(call, wire, recv)
    else:
        backend.alltoallv(call, wire, [c * size for c in counts], recv, [counts[me] * size] * n)
    return fold(recv, ufunc)


def fold_allreduce(call: Call, wire: np.ndarray, ufunc: np.ufunc) -> np.ndarray:
    """The reduction of every rank's flat ``wire`` on every rank."""
    n = call.comm.Get_size()
    if n == 1:
        return wire.copy()
    if wire.nbytes <= GATHER_LIMIT:
        rows = backend.allgather(call, wire, np.empty((n, wire.size), wire.dtype))
        return fold(rows, ufunc)
    counts = blocks(wire.size, n)
    mine = fold_reduce_scatter(call, wire, counts, ufunc)
    size = wire.itemsize
    out = np.empty(wire.size, wire.dtype)
    return backend.allgatherv(call, mine, out, [c * size for c in counts])


def fold_reduce(call: Call, wire: np.ndarray, ufunc: np.ufunc, root: int) -> np.ndarray | None:
    """The reduction of every rank's flat ``wire`` on ``root``; ``None`` elsewhere."""
    n, size = call.comm.Get_size(), wire.itemsize
    if wire.nbytes <= GATHER_LIMIT:
        rows = np.empty((n, wire.size), wire.dtype) if call.comm.Get_rank() == root else None
        got = backend.gatherv(call, wire, rows, [wire.nbytes] * n, root)
        return None if got is None else fold(got, ufunc)
    counts = blocks(wire.size, n)
    mine = fold_reduce_scatter(call, wire, counts, ufunc)
    out = np.empty(wire.size, wire.dtype) if call.comm.Get_rank() == root else None
    return backend.gatherv(call, mine, out, [c * size for c in counts], root)
