"""Reductions carried out: the on-node segment, MPI's own op, or fcoll's tree schedules.

Every floating-point and complex reduction combines the group's values along the canonical
tree of the group's size (`fcoll.backends.tree.order`, API.md "Reduction order"): on one
node the segment folds every rank's slot in that order (in C where the compiled core runs),
across MPI fcoll's own point-to-point schedules reach the same expression
(`fcoll.backends.tree`: recursive doubling, recursive halving + doubling, a binomial
reduce). So a result depends on the group's size alone, not on the message size, the
transport or the node layout. Integer and bool reductions (exact in any order) and sums and
products on one or two ranks (one possible result) use MPI's own op.

This module makes that choice (`allreduce`, `reduce`, `reduce_scatter` carry out a
`fcoll.policy.plan.ReductionPlan`: ``plan.ufunc`` None means MPI's op reduces, else the tree).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from fcoll.backends import mpi as backend
from fcoll.backends import native, nodes, tree
from fcoll.calls.fingerprint import kind_bits
from fcoll.calls.work import Call
from fcoll.dispatch import across_nodes, on_node
from fcoll.policy.ops import ReduceOp
from fcoll.policy.plan import ReductionPlan

REDUCE_SCATTER = kind_bits("reduce_scatter_tensor")  # a plan's fingerprint is an all_reduce's


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


def _raw_kernel(h: nodes.Hierarchy, plan: ReductionPlan) -> native.Kernel | None:
    """The core's fold of ``plan``'s wire data without division or scaling, where ``h``'s
    segment steps in C (the hierarchy finishes once, at the end)."""
    if h.node.shm.core is None:
        return None
    return native.kernel(plan.wire_dtype, plan.fold_ufunc, False, None)


def allreduce(call: Call, plan: ReductionPlan, x: np.ndarray, out: np.ndarray | None = None
              ) -> np.ndarray:
    """Every rank's ``x`` (the call's data in its own dtype, any layout) reduced, finished (the
    result of the call, ``x``'s shape): through on-node shared memory where
    `fcoll.dispatch.on_node` says so (folded in the tree's order; in C where the core runs),
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
    if (h := across_nodes(call)) is not None:
        y = nodes.allreduce(call, h, wire.reshape(-1), plan.ufunc, _raw_kernel(h, plan), plan.fp)
    else:
        y = tree.allreduce(call, wire.reshape(-1), plan.ufunc)
    return _put(out, plan.finish(y).reshape(wire.shape))


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
    y = tree.reduce(call, wire.reshape(-1), plan.ufunc, root)
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
        if counts.count(counts[0]) == len(counts) and \
                (h := across_nodes(call, "reduce_scatter", x.nbytes)) is not None:
            return plan.finish(nodes.reduce_scatter(call, h, wire, plan.ufunc,
                                                    _raw_kernel(h, plan), plan.fp | REDUCE_SCATTER))
        return plan.finish(tree.reduce_scatter(call, wire, counts, plan.ufunc))
    if len(set(counts)) == 1:
        return plan.finish(backend.reduce_scatter_block(call, wire, plan.op))
    return plan.finish(backend.reduce_scatter(call, wire, counts, plan.op))
