"""The canonical results of reductions and scans, for users' own tests (API.md, "Reduction
order"): what every fcoll reduction of a ``p``-rank group returns, bit for bit, computed
here on one process from the list of the ranks' inputs.

Written from the definition, apart from the code the transports run
(`fcoll.backends.tree.order`): the pre-step pairs, then the leaves combined level by level
(distance 1, 2, 4, ...), the lower rank's operand on the left; float16/bfloat16 in float32,
``avg`` divided once at the end, ``premul_sum`` scaled first, as the collectives do.

Example:
    >>> xs = [np.float32(1e8), np.float32(1), np.float32(-1e8), np.float32(1)]
    >>> reference_reduce(xs, "sum")          # (1e8 + 1) + (-1e8 + 1): the tree of 4
    array(0., dtype=float32)
    >>> reference_scan(xs, "sum")[2]         # (1e8 + 1) + -1e8
    array(0., dtype=float32)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from fcoll.policy.plan import ReductionPlan, plan_for


def _inputs(xs: Sequence[Any], op: object, fn: str) -> tuple[ReductionPlan, list[np.ndarray]]:
    arrays = [np.asarray(x) for x in xs]
    if not arrays:
        raise ValueError(f"{fn}: expected xs to hold one array per rank, got an empty list")
    first = arrays[0]
    for r, a in enumerate(arrays):
        if a.shape != first.shape or a.dtype != first.dtype:
            raise ValueError(f"{fn}: expected every rank's array to be {first.dtype}"
                             f"{list(first.shape)} as rank 0's, got {a.dtype}{list(a.shape)} "
                             f"for rank {r}")
    plan = plan_for(op, first.dtype, len(arrays), fn)
    return plan, [plan.wire(a) for a in arrays]


def _tree(values: list[np.ndarray], ufunc: np.ufunc) -> np.ndarray:
    """The tree over ``values`` (the leaves, already paired), level by level."""
    while len(values) > 1:
        values = [ufunc(values[k], values[k + 1]) for k in range(0, len(values), 2)]
    return values[0]


def _leaves(wires: list[np.ndarray], ufunc: np.ufunc) -> list[np.ndarray]:
    p = len(wires)
    m = p - (1 << (p.bit_length() - 1))
    return [ufunc(wires[2 * i], wires[2 * i + 1]) for i in range(m)] + list(wires[2 * m:])


def reference_reduce(xs: Sequence[Any], op: object = "sum") -> np.ndarray:
    """The result every rank of a ``len(xs)``-rank group gets from ``all_reduce(xs[rank], op)``
    (and ``reduce``'s root; ``reduce_scatter_tensor``'s blocks are its blocks): a new array.

    Example:
        >>> reference_reduce([np.ones(2, "float16")] * 5, "avg")
        array([1., 1.], dtype=float16)
    """
    plan, wires = _inputs(xs, op, "reference_reduce")
    out = _tree(_leaves(wires, plan.fold_ufunc), plan.fold_ufunc)
    return plan.finish(np.array(out, copy=True))


def reference_scan(xs: Sequence[Any], op: object = "sum", *, exclusive: bool = False
                   ) -> list[np.ndarray | None]:
    """Every rank's result of ``scan(xs[rank], op)`` (``exclusive``: ``exscan``'s, None for
    rank 0), in the scan order: leaf ``i``'s prefix is ``S_k op (... op (S_1 op leaf_i))``
    with ``S_b`` the subtrees left of it, smallest first; the first rank of a pair gets
    ``E_i op x[2i]``, ``E_i`` the same chain without the leaf; ``exscan`` is the previous
    rank's ``scan``.

    Example:
        >>> reference_scan([np.ones(1)] * 3)
        [array([1.]), array([2.]), array([3.])]
    """
    plan, wires = _inputs(xs, op, "reference_scan")
    ufunc, p = plan.fold_ufunc, len(wires)
    leaves = _leaves(wires, ufunc)
    m = p - len(leaves)
    inclusive: list[np.ndarray] = []
    for r in range(p):
        i = r // 2 if r < 2 * m else r - m
        chain: np.ndarray | None = None if r < 2 * m and r % 2 == 0 else leaves[i]
        for b in range(i.bit_length()):
            if i >> b & 1:
                lo = ((i >> b) ^ 1) << b
                left = _tree(leaves[lo:lo + (1 << b)], ufunc)
                chain = left if chain is None else ufunc(left, chain)
        if chain is None:
            chain = wires[r]
        elif r < 2 * m and r % 2 == 0:
            chain = ufunc(chain, wires[r])
        inclusive.append(plan.finish(np.array(chain, copy=True)))
    if exclusive:
        return [None, *inclusive[:-1]]
    return list(inclusive)
