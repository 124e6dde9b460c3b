"""Prefix reductions: `scan` (inclusive) and `exscan` (exclusive), MPI's ``Scan`` and
``Exscan`` as pure functions.

Every element is folded in group-rank order, ``((x0 op x1) op x2) ...``, so results are
reproducible and independent of the transport and the message size
(`fcoll.collectives._prefix`). Every op and dtype of `fcoll.all_reduce` works but avg and
premul_sum, which are not prefix ops (`ValueError`); a binary numpy ufunc works too.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal, overload

import numpy as np

from fcoll.calls.work import Work
from fcoll.collectives import _fast, _prefix, _scan_fast
from fcoll.dispatch import device
from fcoll.gpu import route
from fcoll.groups import detail
from fcoll.groups.group import Group, GroupArg
from fcoll.groups.membership import member
from fcoll.policy.arrays import A
from fcoll.policy.dtypes import identity
from fcoll.policy.ops import Op, PremulSum, ReduceOp, resolve_op
from fcoll.policy.plan import ReductionPlan, reduction_plan

Named = ReduceOp | str  # an op with an identity (a ufunc may have none)


def _plan(x: np.ndarray, op: object, g: Group, fn: str) -> ReductionPlan:
    """The reduction plan, after refusing the ops that are not prefix ops."""
    resolved = resolve_op(op, fn)
    if resolved is ReduceOp.AVG or isinstance(resolved, PremulSum):
        raise ValueError(f"{fn}: expected a prefix op (sum, product, min, max, band, bor, bxor or "
                         f"a binary ufunc), got {resolved!r}: avg and premul_sum are not prefix "
                         "ops; scan with sum and scale the result")
    return reduction_plan(x, op, g, fn)


def _entry(public: Callable[..., Any], x: np.ndarray, op: Op, group: GroupArg, with_total: bool,
           async_op: bool) -> Any:
    """`scan` or `exscan` (``public``): the default group's fast path, the device arrays'
    route, or the numpy call."""
    fn = public.__name__
    if not with_total and not async_op and type(op) is str and type(x) is np.ndarray \
            and (group is None or type(group) is Group):
        fast = _scan_fast.SCAN.get(_fast.key(group, (fn, op, x.dtype)))  # one dict lookup
        if fast is not None and (y := fast(x)) is not None:
            return y
    if type(x) is not np.ndarray and (on := device(x, group)) is not None:
        return route.run(on, fn, public, x, op, group=group, with_total=with_total,
                         async_op=async_op)
    return _prefix_call(fn, x, op, group, with_total, async_op)


def _prefix_call(fn: str, x: np.ndarray, op: Op, group: GroupArg, with_total: bool,
                 async_op: bool) -> Any:
    """`scan` or `exscan` (``fn``) on a numpy ``x``."""
    g, call = member(group, fn)
    with detail.checked(g, call, fn, x=x, op=op, with_total=with_total):
        plan = _plan(x, op, g, fn)
        if type(with_total) is not bool:
            raise TypeError(f"{fn}: expected with_total to be a bool, got {type(with_total).__name__}")
    exclusive = fn == "exscan"
    first = exclusive and g.rank == 0
    empty = identity(plan.reduce_op, x.dtype) if first else None

    def done(prefix: np.ndarray | None, total: np.ndarray | None) -> Any:
        if first:
            prefix = None if empty is None else np.full(x.shape, empty, x.dtype)
        return (prefix, total) if with_total else prefix

    if async_op:
        return _prefix.start(call, g, plan, x, exclusive, with_total, done)
    result = done(*_prefix.run(call, plan, x, exclusive, with_total))
    key = _fast.key(group, (fn, op, x.dtype))
    if key is not None and not with_total and type(op) is str and x.flags.c_contiguous:
        _scan_fast.learn(key, fn, g, plan, empty, _prefix.segment(call, plan, x.nbytes) is not None)
    return result


@overload
def scan(x: A, op: Op = ..., group: GroupArg = ..., *, with_total: Literal[False] = ...,
         async_op: Literal[False] = ...) -> A: ...
@overload
def scan(x: A, op: Op = ..., group: GroupArg = ..., *, with_total: Literal[True],
         async_op: Literal[False] = ...) -> tuple[A, A]: ...
@overload
def scan(x: A, op: Op = ..., group: GroupArg = ..., *, with_total: Literal[False] = ...,
         async_op: Literal[True]) -> Work[A]: ...
@overload
def scan(x: A, op: Op = ..., group: GroupArg = ..., *, with_total: Literal[True],
         async_op: Literal[True]) -> Work[tuple[A, A]]: ...
@overload
def scan(x: A, op: Op = ..., group: GroupArg = ..., *, with_total: bool = ...,
         async_op: Literal[True]) -> Work[A | tuple[A, A]]: ...


def scan(  # type: ignore[misc]  # the numpy path (fcoll.policy.arrays)
    x: np.ndarray, op: Op = "sum", group: GroupArg = None, *, with_total: bool = False,
    async_op: bool = False,
) -> Any:
    """Inclusive prefix (MPI's ``Scan``): rank r gets the reduction of ranks 0..r's ``x``.

    Returns a new array of ``x``'s shape and dtype; ``x`` is not modified. Folded in group
    rank order (float16/bfloat16 in float32), so the result does not depend on the
    transport or the message size.

    Args:
        x: this rank's array (same shape and dtype on every rank).
        op: a `ReduceOp` or its name (not avg, premul_sum), or a binary numpy ufunc.
        group: `Group`, list of global ranks, or ``None`` for the whole job.
        with_total: also return the reduction over every rank: ``(prefix, total)``.
        async_op: return a `Work` at once (``wait()`` gives the result).

    Example:
        >>> fc.scan(np.array([r + 1]))                  # rank r of 4 ranks
        array([3])                                      # rank 1; rank 3: [10]
        >>> fc.scan(np.array([r + 1]), with_total=True)  # on rank 1
        (array([3]), array([10]))
    """
    return _entry(scan, x, op, group, with_total, async_op)


@overload
def exscan(x: A, op: Named = ..., group: GroupArg = ..., *,
           with_total: Literal[False] = ..., async_op: Literal[False] = ...) -> A: ...
@overload
def exscan(x: A, op: Named = ..., group: GroupArg = ..., *, with_total: Literal[True],
           async_op: Literal[False] = ...) -> tuple[A, A]: ...
@overload
def exscan(x: A, op: Op = ..., group: GroupArg = ..., *,
           with_total: Literal[False] = ..., async_op: Literal[False] = ...) -> A | None: ...
@overload
def exscan(x: A, op: Op = ..., group: GroupArg = ..., *, with_total: Literal[True],
           async_op: Literal[False] = ...) -> tuple[A | None, A]: ...
@overload
def exscan(x: A, op: Named = ..., group: GroupArg = ..., *,
           with_total: Literal[False] = ..., async_op: Literal[True]) -> Work[A]: ...
@overload
def exscan(x: A, op: Op = ..., group: GroupArg = ..., *,
           with_total: Literal[False] = ..., async_op: Literal[True]) -> Work[A | None]: ...
@overload
def exscan(x: A, op: Named = ..., group: GroupArg = ..., *, with_total: Literal[True],
           async_op: Literal[True]) -> Work[tuple[A, A]]: ...
@overload
def exscan(x: A, op: Op = ..., group: GroupArg = ..., *, with_total: Literal[True],
           async_op: Literal[True]) -> Work[tuple[A | None, A]]: ...
@overload
def exscan(x: A, op: Op = ..., group: GroupArg = ..., *, with_total: bool = ...,
           async_op: Literal[True]) -> Work[A | tuple[A | None, A] | None]: ...


def exscan(  # type: ignore[misc]  # the numpy path (fcoll.policy.arrays)
    x: np.ndarray, op: Op = "sum", group: GroupArg = None, *, with_total: bool = False,
    async_op: bool = False,
) -> Any:
    """Exclusive prefix (MPI's ``Exscan``): rank r gets the reduction of ranks 0..r-1's ``x``.

    Rank 0 gets the op's identity (0 for sum, 1 for product, -inf/+inf for float max/min,
    the integer dtype's lowest/highest value, all bits set for band, a ufunc's
    ``identity``), or ``None`` for a ufunc without one. ``with_total=True`` returns
    ``(prefix, total)`` in one call: the offsets of a parallel write and the file's size.

    Its arguments are `scan`'s.

    Example:
        >>> offset, size = fc.exscan(np.array(nbytes), with_total=True)   # 3 ranks
        >>> offset, size              # rank 2, ranks holding 10, 20, 5 bytes
        (array(30), array(35))        # rank 0 gets (array(0), array(35))
    """
    return _entry(exscan, x, op, group, with_total, async_op)
