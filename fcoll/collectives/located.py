"""Located reductions: `maxloc` and `minloc` (MPI's ``MAXLOC``/``MINLOC``) as pure functions.

Each is two all-reduces: the values (max or min), then the lowest group rank holding them
with that rank's sign bit (an int64 min), so the value kept among equals, ``-0.0`` against
``0.0``, is the lowest rank's whichever transport folded the values. NaN counts as the
extreme, as ``np.maximum`` and ``np.argmax`` have it: the first rank with a NaN wins. Both
all-reduces take the usual transports (the segment on one node, NCCL for cupy).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fcoll.collectives.reductions import all_reduce
from fcoll.dispatch import INTEROP, device, is_cupy
from fcoll.gpu import route
from fcoll.groups.group import GroupArg
from fcoll.groups.membership import member
from fcoll.policy.arrays import A
from fcoll.policy.dtypes import check_dtype, check_op
from fcoll.policy.ops import ReduceOp
from fcoll.policy.validate import check_array


def _located(fn: str, op: ReduceOp, x: Any, group: GroupArg) -> tuple[Any, Any]:
    if type(x) is not np.ndarray and (on := device(x, group)) is INTEROP:
        return route.run(on, fn, maxloc if op is ReduceOp.MAX else minloc, x, group=group)
    g, _ = member(group, fn)
    if is_cupy(x):
        check_dtype(x.dtype, fn)
    else:
        check_array(x, fn)
    check_op(op, x.dtype, fn)
    values = all_reduce(x, op.value, group)
    flat, best = x.reshape(-1), values.reshape(-1)
    hit = flat == best
    exact = x.dtype.kind in "biu"
    if not exact:  # NaN: equal to nothing, the extreme of every fold
        hit |= (flat != flat) & (best != best)
    # 2 * own rank (+1 for a negative sign) where it holds the value, else 2 * size: the min
    # gives the lowest rank holding it and that rank's sign, which tells -0.0 from 0.0.
    sign = 0 if exact else _negative(flat)
    mine = hit.astype(np.int64) * (2 * (g.rank - g.size) + sign) + 2 * g.size
    lowest = all_reduce(mine, "min", group)
    if not exact:
        values = _signed_zeros(best, lowest % 2 == 1).reshape(x.shape)
    return values, (lowest // 2).reshape(x.shape)


def _negative(flat: Any) -> Any:
    """1 where ``flat``'s sign bit is set, else 0, as int64 (any float dtype, bfloat16 too)."""
    bits = 8 * flat.dtype.itemsize
    return (flat.view(f"u{flat.dtype.itemsize}") >> (bits - 1)).astype(np.int64)


def _signed_zeros(best: Any, negative: Any) -> Any:
    """``best`` with each zero given the sign of the lowest rank holding it: equal values are
    every rank's alike except -0.0 and 0.0, which whichever fold MPI ran may have mixed."""
    zero = best == 0
    if zero.any():
        best = best.copy()
        best[zero] = abs(best[zero])
        neg = zero & negative
        best[neg] = -best[neg]
    return best


def maxloc(x: A, group: GroupArg = None) -> tuple[A, A]:
    """``(values, ranks)``: the elementwise maximum of every rank's ``x`` and the group rank
    holding it (ties: the lowest rank), as MPI's ``MAXLOC``.

    ``values`` has ``x``'s shape and dtype, ``ranks`` its shape as int64, both of ``x``'s
    array type; ``x`` is not modified. Complex data has no order: `ValueError`, as for max.

    Example:
        >>> values, ranks = fc.maxloc(np.array([r, 5 - r]))   # rank r of 4 ranks
        >>> values, ranks                                     # on every rank
        (array([3, 5]), array([3, 0]))
    """
    return _located("maxloc", ReduceOp.MAX, x, group)


def minloc(x: A, group: GroupArg = None) -> tuple[A, A]:
    """``(values, ranks)``: the elementwise minimum of every rank's ``x`` and the group rank
    holding it (ties: the lowest rank), as MPI's ``MINLOC``. See `maxloc`.

    Example:
        >>> values, ranks = fc.minloc(np.array([r % 2, 7.0]))   # rank r of 4 ranks
        >>> values, ranks                                       # on every rank
        (array([0., 7.]), array([0, 0]))
    """
    return _located("minloc", ReduceOp.MIN, x, group)

