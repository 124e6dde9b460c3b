"""Parameters across data-parallel ranks: broadcast, consistency check, model averaging.

Leaves may be numpy or cupy arrays, one kind per tree: cupy trees are packed with cupy and
stay on their device.
"""

from __future__ import annotations

from typing import Any, cast

import numpy as np
import optree

from fcoll.collectives import all_reduce_coalesced, broadcast
from fcoll.collectives.objects import all_gather_object
from fcoll.dispatch import is_cupy
from fcoll.dispatch.pytrees import array_module, foreign_leaves, pack, path_name, unpack
from fcoll.groups.group import GroupArg
from fcoll.policy.arrays import T


@foreign_leaves
def broadcast_parameters(params: T, src: int = 0, group: GroupArg = None) -> T:
    """A new pytree equal to group rank ``src``'s ``params`` on every rank.

    All leaves travel in one message (every rank's tree must have the same structure,
    shapes and dtypes; `check_parameters` verifies that).

    Example:
        >>> p = {"w": np.full(2, float(r))}
        >>> fc.dp.broadcast_parameters(p)           # on every rank
        {'w': array([0., 0.])}
    """
    leaves, spec = optree.tree_flatten(cast(Any, params))
    if not leaves:
        return params
    xp = array_module(leaves, "broadcast_parameters", params)
    if xp is np:
        leaves = [np.asarray(leaf) for leaf in leaves]
    return cast(T, optree.tree_unflatten(spec, unpack(broadcast(pack(leaves, xp), src, group), leaves)))


@foreign_leaves
def check_parameters(params: Any, group: GroupArg = None) -> None:
    """Raise `ValueError` on every rank if the ranks' trees differ in structure, leaf
    shapes or dtypes (or numpy against cupy); the message names the leaf paths and the ranks.

    Example:
        >>> fc.dp.check_parameters({"w": np.zeros(3 if r == 0 else 4)})
        ValueError: check_parameters: leaf ['w']: rank 0 has (3,) float64, rank 1 has (4,) float64
    """
    paths, leaves, _ = optree.tree_flatten_with_path(params)
    mine = [(path_name(p), tuple(leaf.shape), f"cupy {leaf.dtype}") if is_cupy(leaf)
            else (path_name(p), tuple(np.shape(leaf)), str(np.asarray(leaf).dtype))
            for p, leaf in zip(paths, leaves, strict=True)]
    everyone = all_gather_object(mine, group)
    problems = []
    reference = dict((p, (s, d)) for p, s, d in everyone[0])
    for rank, entries in enumerate(everyone[1:], start=1):
        seen = dict((p, (s, d)) for p, s, d in entries)
        for path in sorted(set(reference) | set(seen)):
            a, b = reference.get(path), seen.get(path)
            if a != b:
                problems.append(f"leaf {path}: rank 0 has {_leaf(a)}, rank {rank} has {_leaf(b)}")
    if problems:
        raise ValueError("check_parameters: the ranks' parameters differ: " + "; ".join(problems))


def _leaf(entry: tuple[tuple[int, ...], str] | None) -> str:
    return "no such leaf" if entry is None else f"{entry[0]} {entry[1]}"


@foreign_leaves
def average_parameters(params: T, group: GroupArg = None) -> T:
    """A new pytree of the mean over ranks of every leaf (one fused message per dtype).

    Example:
        >>> fc.dp.average_parameters({"w": np.full(2, float(r))})    # 2 ranks
        {'w': array([0.5, 0.5])}
    """
    leaves, spec = optree.tree_flatten(cast(Any, params))
    array_module(leaves, "average_parameters", params)  # names a leaf if numpy and cupy mix
    return cast(T, optree.tree_unflatten(spec, all_reduce_coalesced(leaves, "avg", group)))


class PeriodicModelAverager:
    """Local SGD: every ``period`` steps (after ``warmup_steps``), average the parameters.

    Its k-th call (0-based) of `average_parameters` averages when ``k >= warmup_steps``
    and ``(k - warmup_steps) % period == 0``; otherwise it returns ``params`` unchanged.

    Example:
        >>> avg = fc.dp.PeriodicModelAverager(period=4, warmup_steps=100)
        >>> params = avg.average_parameters(params)      # after each optimizer step
    """

    def __init__(self, period: int, warmup_steps: int = 0, group: GroupArg = None) -> None:
        if type(period) is not int or period < 1:
            raise ValueError(f"PeriodicModelAverager: expected period >= 1, got {period!r}")
        if type(warmup_steps) is not int or warmup_steps < 0:
            raise ValueError(f"PeriodicModelAverager: expected warmup_steps >= 0, "
                             f"got {warmup_steps!r}")
        self.period, self.warmup_steps, self.group = period, warmup_steps, group
        self.step = 0

    def average_parameters(self, params: T) -> T:
        """Average now if the schedule says so; count the call either way.

        Example:
            >>> avg = fc.dp.PeriodicModelAverager(period=2)
            >>> p = {"w": np.array([float(fc.get_rank())])}     # rank 0: [0.], rank 1: [1.]
            >>> avg.average_parameters(p)                      # call 0: averaged, both ranks
            {'w': array([0.5])}
            >>> avg.average_parameters(p)                      # call 1: returned unchanged
            {'w': array([1.])}                                 # on rank 1
        """
        k, self.step = self.step, self.step + 1
        if k >= self.warmup_steps and (k - self.warmup_steps) % self.period == 0:
            return average_parameters(params, self.group)
        return params
