"""Reductions: all_reduce, reduce, reduce_scatter_tensor, reduce_scatter.

Each is the c10d function of the same name with its output argument removed: the result
is a new array and the input is never written.

Each function opens with its own fast-path lookup (the default group's table, then a
`Group`'s own), the same dozen lines with its own table and key in each of this module and
`fcoll.collectives.movement`. The repetition is deliberate: a shared helper would put one
more Python call per call: 34 ns (`timeit` of the table lookup and call, inline 64 ns,
through a helper 98 ns), 4 % of an 8 B all_reduce at n = 2 (0.84 us, bench/run.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, overload

import numpy as np

from fcoll.backends import mpi as backend
from fcoll.calls.work import Work
from fcoll.collectives import _fast, _fold, nonblocking
from fcoll.dispatch import device, device_list, shm_limit
from fcoll.gpu import fast as gpu_fast
from fcoll.gpu import route
from fcoll.groups import detail
from fcoll.groups.group import Group, GroupArg
from fcoll.groups.membership import member
from fcoll.policy.arrays import A
from fcoll.policy.ops import Op
from fcoll.policy.plan import reduction_plan
from fcoll.policy.validate import check_arrays, check_dim, check_divisible, check_rank


@overload
def all_reduce(x: A, op: Op = ..., group: GroupArg = ..., *, async_op: Literal[False] = ...) -> A: ...
@overload
def all_reduce(x: A, op: Op = ..., group: GroupArg = ..., *, async_op: Literal[True]) -> Work[A]: ...


def all_reduce(  # type: ignore[misc]  # the numpy path (fcoll.policy.arrays)
    x: np.ndarray, op: Op = "sum", group: GroupArg = None, *, async_op: bool = False
) -> np.ndarray | Work[np.ndarray]:
    """Reduce ``x`` elementwise over every rank of ``group``; every rank gets the result.

    Returns a new array of ``x``'s shape and dtype; ``x`` is not modified.

    Args:
        x: this rank's array (same shape and dtype on every rank).
        op: a `ReduceOp`, its name (``"sum"``, ``"avg"``, ...) or `premul_sum`.
        group: `Group`, list of global ranks, or ``None`` for the whole job.
        async_op: return a `Work` at once (``wait()`` gives the result); ``x`` is
            snapshotted, so it may be changed right after the call.

    Example:
        >>> y = fc.all_reduce(np.array([r + 1.0]))      # rank r of 4 ranks
        >>> y                                           # on every rank
        array([10.])
    """
    if group is None and not async_op and type(op) is str:
        if type(x) is np.ndarray:
            fast = _fast.ALL_REDUCE.get((op, x.dtype))
        else:
            fast = gpu_fast.ALL_REDUCE.get((op, x.dtype)) if type(x) in gpu_fast.ARRAY else None
        y = fast(x) if fast is not None else None
        if y is not None:
            return y
    elif type(group) is Group and not async_op and type(op) is str and type(x) is np.ndarray:
        fast = _fast.ALL_REDUCE.get((group, (op, x.dtype)))  # a group's own fast path
        if fast is not None and (y := fast(x)) is not None:
            return y
    if type(x) is not np.ndarray and (on := device(x, group)) is not None:
        return route.run(  # type: ignore[no-any-return]
            on, "all_reduce", all_reduce, x, op, group=group, async_op=async_op)
    g, call = member(group, "all_reduce")
    with detail.checked(g, call, "all_reduce", x=x, op=op):
        plan = reduction_plan(x, op, g, "all_reduce")
    if async_op:
        return nonblocking.all_reduce(call, g, plan, x)
    shared = shm_limit(g)  # the bytes from which on-node shared memory serves
    if x.flags.c_contiguous and type(op) is str:
        _fast.learn_reduction(_fast.ALL_REDUCE, _fast.key(group, (op, x.dtype)), g, plan, shared,
                              _fold.native_kernel(plan), scatter=False)
    if plan.direct and x.flags.c_contiguous and x.nbytes < shared:  # MPI reduces x as it is
        return backend.allreduce(call, x, plan.op)
    return _fold.allreduce(call, plan, x)


@overload
def reduce(
    x: A, dst: int = ..., op: Op = ..., group: GroupArg = ..., *, async_op: Literal[False] = ...
) -> A | None: ...
@overload
def reduce(
    x: A, dst: int = ..., op: Op = ..., group: GroupArg = ..., *, async_op: Literal[True]
) -> Work[A | None]: ...


def reduce(  # type: ignore[misc]  # the numpy path (fcoll.policy.arrays)
    x: np.ndarray,
    dst: int = 0,
    op: Op = "sum",
    group: GroupArg = None,
    *,
    async_op: bool = False,
) -> np.ndarray | Work[np.ndarray | None] | None:
    """Reduce ``x`` over ``group`` onto group rank ``dst``; other ranks get ``None``.

    Example:
        >>> y = fc.reduce(np.array([r + 1]), dst=0)      # rank r of 3 ranks
        >>> y                                            # rank 0; None on ranks 1, 2
        array([6])
    """
    if type(x) is not np.ndarray and (on := device(x, group)) is not None:
        return route.run(
            on, "reduce", reduce, x, dst, op, group=group, async_op=async_op)
    g, call = member(group, "reduce")
    with detail.checked(g, call, "reduce", x=x, dst=dst, op=op):
        root = check_rank(dst, g.size, "reduce", "dst")
        plan = reduction_plan(x, op, g, "reduce")
    if async_op:
        return nonblocking.reduce(call, g, plan, x, root)
    y = _fold.reduce(call, plan, plan.wire(x), root)
    return None if y is None else plan.finish(y)


def _blocks_first(x: np.ndarray, dim: int, n: int) -> np.ndarray:
    """``x`` with ``dim`` split into ``n`` blocks, the block index moved to axis 0."""
    shape = (*x.shape[:dim], n, x.shape[dim] // n, *x.shape[dim + 1 :])
    return np.moveaxis(x.reshape(shape), dim, 0)


@overload
def reduce_scatter_tensor(
    x: A, op: Op = ..., group: GroupArg = ..., *, scatter_dim: int = ..., async_op: Literal[False] = ...
) -> A: ...
@overload
def reduce_scatter_tensor(
    x: A, op: Op = ..., group: GroupArg = ..., *, scatter_dim: int = ..., async_op: Literal[True]
) -> Work[A]: ...


def reduce_scatter_tensor(  # type: ignore[misc]  # the numpy path (fcoll.policy.arrays)
    x: np.ndarray,
    op: Op = "sum",
    group: GroupArg = None,
    *,
    scatter_dim: int = 0,
    async_op: bool = False,
) -> np.ndarray | Work[np.ndarray]:
    """Reduce ``x`` over ``group``, then keep block ``rank`` of ``n`` along ``scatter_dim``.

    ``x.shape[scatter_dim]`` must be divisible by the group's size.

    Example:
        >>> y = fc.reduce_scatter_tensor(np.arange(4.0))   # each of 2 ranks
        >>> y                                              # rank 0; rank 1: [4., 6.]
        array([0., 2.])
    """
    if group is None and not async_op and type(op) is str and type(scatter_dim) is int \
            and scatter_dim == 0:
        if type(x) is np.ndarray:
            fast = _fast.REDUCE_SCATTER.get((op, x.dtype))
        else:
            fast = gpu_fast.REDUCE_SCATTER.get((op, x.dtype)) if type(x) in gpu_fast.ARRAY else None
        y = fast(x) if fast is not None else None
        if y is not None:
            return y
    elif type(group) is Group and not async_op and type(op) is str and type(scatter_dim) is int \
            and scatter_dim == 0 and type(x) is np.ndarray:
        fast = _fast.REDUCE_SCATTER.get((group, (op, x.dtype)))  # a group's own fast path
        if fast is not None and (y := fast(x)) is not None:
            return y
    if type(x) is not np.ndarray and (on := device(x, group)) is not None:
        return route.run(on, "reduce_scatter_tensor", reduce_scatter_tensor, x, op,  # type: ignore[no-any-return]
                         group=group, scatter_dim=scatter_dim, async_op=async_op)
    fn = "reduce_scatter_tensor"
    g, call = member(group, fn)
    n = g.size
    with detail.checked(g, call, fn, x=x, op=op, scatter_dim=scatter_dim):
        plan = reduction_plan(x, op, g, fn)
        dim = check_dim(x, scatter_dim, fn, "scatter_dim")
        check_divisible(x.shape, dim, n, fn, f"x.shape[{scatter_dim}]")
    if not async_op and dim == 0 and x.flags.c_contiguous:  # the common case
        shared = shm_limit(g, "reduce_scatter")  # MPI below this size, shared memory from it
        if type(op) is str and type(scatter_dim) is int:
            _fast.learn_reduction(_fast.REDUCE_SCATTER, _fast.key(group, (op, x.dtype)), g, plan, shared,
                                  _fold.native_kernel(plan), scatter=True)
        if plan.direct and x.nbytes < shared:
            return backend.reduce_scatter_block(call, x, plan.op)
    blocks = x if dim == 0 else _blocks_first(x, dim, n)
    out_shape = (*x.shape[:dim], x.shape[dim] // n, *x.shape[dim + 1 :])
    if async_op:
        return nonblocking.reduce_scatter(call, g, plan, x, blocks, out_shape)
    return _fold.reduce_scatter(call, plan, blocks, [x.size // n] * n).reshape(out_shape)


def reduce_scatter(chunks: Sequence[A], op: Op = "sum", group: GroupArg = None) -> A:
    """Rank ``r`` gets the reduction over ranks of everyone's ``chunks[r]``.

    ``chunks`` holds one array per group rank; their shapes may differ from index to
    index (each index must agree across ranks).

    Example:
        >>> y = fc.reduce_scatter([np.ones(1), np.ones(2)])   # each of 2 ranks
        >>> y                                                 # rank 1; rank 0: [2.]
        array([2., 2.])
    """
    if (on := device_list(chunks, group, "reduce_scatter", "chunks")) is not None:
        return route.run(  # type: ignore[no-any-return]  # the caller's array type
            on, "reduce_scatter", reduce_scatter, chunks, op, group=group)
    fn = "reduce_scatter"
    g, call = member(group, fn)
    with detail.checked(g, call, fn, chunks=chunks, op=op):
        arrays = check_arrays(chunks, g.size, fn, "chunks")
        plan = reduction_plan(arrays[0], op, g, fn)
    flat = np.concatenate([a.reshape(-1) for a in arrays])
    return _fold.reduce_scatter(call, plan, flat, [a.size for a in arrays]).reshape(  # type: ignore[return-value]
        arrays[g.rank].shape)
