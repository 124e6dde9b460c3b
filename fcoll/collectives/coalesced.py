"""Coalesced forms: a list in, a list out, one message per dtype.

Each result is bit-identical to calling the single-array function once per array: the
reductions are elementwise and the bytes are the same, only packed into one buffer.
An empty list gives an empty list without communicating.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from fcoll.collectives import _fold, movement
from fcoll.dispatch import device_list
from fcoll.gpu import route
from fcoll.groups import detail
from fcoll.groups.group import GroupArg
from fcoll.groups.membership import member
from fcoll.policy.arrays import A
from fcoll.policy.dtypes import as_bytes
from fcoll.policy.ops import Op
from fcoll.policy.plan import reduction_plan
from fcoll.policy.validate import check_array, check_divisible


def _checked(xs: object, fn: str) -> list[np.ndarray]:
    if isinstance(xs, np.ndarray) or not isinstance(xs, Sequence):
        raise TypeError(f"{fn}: expected xs to be a list of numpy arrays, got {type(xs).__name__}")
    return [check_array(x, fn, f"xs[{i}]") for i, x in enumerate(xs)]


def _by_dtype(xs: list[np.ndarray]) -> dict[np.dtype[Any], list[int]]:
    """Indices of ``xs`` per dtype, in first-seen order (the same on every rank)."""
    groups: dict[np.dtype[Any], list[int]] = {}
    for i, x in enumerate(xs):
        groups.setdefault(x.dtype, []).append(i)
    return groups


def _per_dtype(
    xs: list[np.ndarray], run: Callable[[list[np.ndarray]], list[np.ndarray]]
) -> list[np.ndarray]:
    out: list[np.ndarray] = [np.empty(0)] * len(xs)
    for indices in _by_dtype(xs).values():
        for i, y in zip(indices, run([xs[i] for i in indices]), strict=True):
            out[i] = y
    return out


def _split(flat: np.ndarray, sizes: list[int], shapes: list[tuple[int, ...]]) -> list[np.ndarray]:
    offsets = np.cumsum([0, *sizes]).tolist()
    return [flat[a:b].reshape(s) for a, b, s in zip(offsets, offsets[1:], shapes, strict=False)]


def all_reduce_coalesced(xs: Sequence[A], op: Op = "sum", group: GroupArg = None) -> list[A]:
    """`all_reduce` of every array in ``xs``, fused into one message per dtype.

    Example:
        >>> ys = fc.all_reduce_coalesced([np.ones(2), np.arange(3)])   # each of 2 ranks
        >>> ys
        [array([2., 2.]), array([0, 2, 4])]
    """
    fn = "all_reduce_coalesced"
    if (on := device_list(xs, group, fn, "xs")) is not None:
        return route.run(on, fn, all_reduce_coalesced, xs, op, group=group)
    g, call = member(group, fn)
    with detail.checked(g, call, fn, xs=xs, op=op):
        arrays = _checked(xs, fn)
        plans = {x.dtype: reduction_plan(x, op, g, fn) for x in arrays}

    def run(same: list[np.ndarray]) -> list[np.ndarray]:
        plan = plans[same[0].dtype]
        flat = np.concatenate([x.reshape(-1) for x in same])
        y = _fold.allreduce(call, plan, flat)
        return _split(y, [x.size for x in same], [x.shape for x in same])

    return _per_dtype(arrays, run)  # type: ignore[return-value]  # numpy in, numpy out


def all_gather_into_tensor_coalesced(xs: Sequence[A], group: GroupArg = None) -> list[A]:
    """`all_gather_into_tensor` (along axis 0) of every array in ``xs``, in one message.

    Example:
        >>> ys = fc.all_gather_into_tensor_coalesced([np.array([r]), np.array([[r, r]])])
        >>> ys                                      # 2 ranks, on every rank
        [array([0, 1]), array([[0, 0],
               [1, 1]])]
    """
    fn = "all_gather_into_tensor_coalesced"
    if (on := device_list(xs, group, fn, "xs")) is not None:
        return route.run(on, fn, all_gather_into_tensor_coalesced, xs, group=group)
    g, call = member(group, fn)
    with detail.checked(g, call, fn, xs=xs):
        arrays = [x.reshape(1) if x.ndim == 0 else x for x in _checked(xs, fn)]
    if not arrays:
        return []
    send = np.concatenate([as_bytes(x) for x in arrays])
    gathered = movement.allgather(call, send, np.empty((g.size, send.size), np.uint8))
    offsets = np.cumsum([0, *(x.nbytes for x in arrays)]).tolist()
    return [
        np.ascontiguousarray(gathered[:, a:b]).view(x.dtype).reshape(  # type: ignore[misc]  # numpy in, out
            g.size * x.shape[0], *x.shape[1:])
        for x, a, b in zip(arrays, offsets, offsets[1:], strict=False)
    ]


def reduce_scatter_tensor_coalesced(xs: Sequence[A], op: Op = "sum", group: GroupArg = None) -> list[A]:
    """`reduce_scatter_tensor` (along axis 0) of every array in ``xs``, one message per dtype.

    Example:
        >>> ys = fc.reduce_scatter_tensor_coalesced([np.arange(2.0), np.ones((4, 1))])
        >>> ys                                      # 2 ranks, on rank 1
        [array([2.]), array([[2.],
               [2.]])]
    """
    fn = "reduce_scatter_tensor_coalesced"
    if (on := device_list(xs, group, fn, "xs")) is not None:
        return route.run(on, fn, reduce_scatter_tensor_coalesced, xs, op, group=group)
    g, call = member(group, fn)
    n = g.size
    with detail.checked(g, call, fn, xs=xs, op=op):
        arrays = _checked(xs, fn)
        for i, x in enumerate(arrays):
            check_divisible(x.shape, 0, n, fn, f"xs[{i}].shape[0]")
        plans = {x.dtype: reduction_plan(x, op, g, fn) for x in arrays}

    def run(same: list[np.ndarray]) -> list[np.ndarray]:
        plan = plans[same[0].dtype]
        blocks = np.concatenate([x.reshape(n, x.size // n) for x in same], axis=1)
        y = _fold.reduce_scatter(call, plan, blocks.reshape(-1), [blocks.shape[1]] * n)
        shapes = [(x.shape[0] // n, *x.shape[1:]) for x in same]
        return _split(y, [x.size // n for x in same], shapes)

    return _per_dtype(arrays, run)  # type: ignore[return-value]  # numpy in, numpy out
