"""Reproducible floating-point reductions: MPI moves the bytes, fcoll does the arithmetic.

MPI's own reductions pick an algorithm by message size, so the order in which a float
element is combined across ranks changes with the size of the message: fusing arrays
into one buffer (the ``*_coalesced`` functions) would then change the low bits of the
result. Here every element of a floating or complex reduction is folded in group-rank
order, ``((x0 op x1) op x2) ...``, whatever the message size, so a result is
bit-identical whether its array travels alone or fused with others, and equal to a
sequential numpy reduction of the ranks' inputs.

This module also makes the choice between MPI's op and the fold (`allreduce`, `reduce`,
`reduce_scatter` carry out a `fcoll.policy.plan.ReductionPlan`: ``plan.ufunc`` None means MPI's
op reduces, else the fold does).

Two ways to fold, both with that same per-element order:
- small messages: gather every rank's buffer, fold locally (one collective);
- large messages: exchange blocks (rank ``r`` gets block ``r`` of every rank, the
  bandwidth-optimal reduce-scatter), fold, then all-gather the folded blocks.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from fcoll.backends import mpi as backend
from fcoll.backends import native
from fcoll.calls.fingerprint import kind_bits
from fcoll.calls.work import Call
from fcoll.dispatch import on_node
from fcoll.policy.ops import ReduceOp
from fcoll.policy.plan import ReductionPlan

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


def _kernel(plan: ReductionPlan) -> native.Kernel | None:
    """The compiled core's fold for ``plan`` (`fcoll.backends.native.kernel`), or None."""
    factor = getattr(plan.reduce_op, "factor", None)  # premul_sum
    return native.kernel(plan.dtype, plan.fold_ufunc, plan.reduce_op is ReduceOp.AVG, factor)


def native_kernel(plan: ReductionPlan) -> native.Kernel | None:
    """The core's fold for ``plan`` where this job's segments step in C, else None."""
    return _kernel(plan) if native.running() else None


def _native(call: Call, plan: ReductionPlan) -> native.Kernel | None:
    """The core's fold when this call's segment steps in C (every rank of the job alike)."""
    seg = call.group.shm
    return _kernel(plan) if seg and seg.core is not None else None


def allreduce(call: Call, plan: ReductionPlan, x: np.ndarray, out: np.ndarray | None = None
              ) -> np.ndarray:
    """Every rank's ``x`` (the call's data in its own dtype, any layout) reduced, finished (the
    result of the call, ``x``'s shape): through on-node shared memory where
    `fcoll.dispatch.on_node` says so (always folded in rank order; in C where the core runs),
    else MPI. Given ``out`` (C-contiguous, ``x``'s shape and dtype, possibly ``x`` itself),
    the result is written there: by the transport where its output is the result (the
    compiled core; a plan whose wire is ``x``'s own data), else copied."""
    if (shared := on_node(call, x.nbytes)) is not None:
        if (kernel := _native(call, plan)) is not None:
            data = x if x.flags.c_contiguous else np.ascontiguousarray(x)
            return shared.allreduce_native(call, data, kernel, plan.fp, out)  # type: ignore[no-any-return]
        into = out if plan.simple else None
        return _put(out, plan.finish(shared.allreduce(call, plan.wire(x), plan.fold_ufunc, plan.fp,
                                                      into)))
    wire = plan.wire(x)
    if plan.ufunc is None:
        return _put(out, plan.finish(backend.allreduce(call, wire, plan.op,
                                                       out if plan.simple else None)))
    return _put(out, plan.finish(fold_allreduce(call, wire.reshape(-1), plan.ufunc)
                                 ).reshape(wire.shape))


def _put(out: np.ndarray | None, y: np.ndarray) -> np.ndarray:
    """``y`` written into ``out`` (returned), or ``y`` itself without ``out``."""
    if out is None or y is out:
        return y
    np.copyto(out, y.reshape(out.shape))
    return out


def reduce(call: Call, plan: ReductionPlan, wire: np.ndarray, root: int) -> np.ndarray | None:
    """The reduced ``wire`` on ``root``; ``None`` elsewhere."""
    if plan.ufunc is None:
        return backend.reduce(call, wire, plan.op, root)
    y = fold_reduce(call, wire.reshape(-1), plan.ufunc, root)
    return None if y is None else y.reshape(wire.shape)


def reduce_scatter(call: Call, plan: ReductionPlan, x: np.ndarray, counts: Sequence[int]
                   ) -> np.ndarray:
    """Block ``rank`` (``counts[rank]`` elements) of the reduction of the blocks of ``x`` (the
    call's data in its own dtype, blocks one after another, any layout), finished and flat:
    through on-node shared memory where the blocks are equal and `fcoll.dispatch.on_node`
    says so."""
    if counts.count(counts[0]) == len(counts) and \
            (shared := on_node(call, x.nbytes, "reduce_scatter")) is not None:
        fp = plan.fp | REDUCE_SCATTER
        if (kernel := _native(call, plan)) is not None:
            data = np.ascontiguousarray(x).reshape(-1)
            return shared.reduce_scatter_native(call, data, kernel, fp)  # type: ignore[no-any-return]
        return plan.finish(shared.reduce_scatter_block(call, plan.wire(x).reshape(-1),
                                                       plan.fold_ufunc, fp))
    wire = plan.wire(x).reshape(-1)
    if plan.ufunc is not None:
        return plan.finish(fold_reduce_scatter(call, wire, counts, plan.ufunc))
    if len(set(counts)) == 1:
        return plan.finish(backend.reduce_scatter_block(call, wire, plan.op))
    return plan.finish(backend.reduce_scatter(call, wire, counts, plan.op))


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
