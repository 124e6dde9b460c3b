"""Uneven inputs: the agreement behind `GradientAverager.join`.

Each synced averaging step inside a join block starts with one small all-gather of two
flags per rank (still contributing, needs the tree's layout). The number of ranks still
contributing divides the summed buckets; a rank that has left keeps answering with zero
gradients until no rank contributes, so every rank leaves the block together. A rank
that never averaged (no data at all) gets the leaves' shapes and dtypes from the first
contributing rank.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fcoll.collectives import all_gather_into_tensor
from fcoll.group import GroupArg, resolve_group
from fcoll.objects import broadcast_object

Template = list[tuple[tuple[int, ...], np.dtype[Any]]]


class Joiner:
    """This rank's side of one join block: the last layout it averaged, and the steps."""

    def __init__(self, group: GroupArg) -> None:
        self.group = group
        self.template: Template | None = None

    def agree(self, contributing: bool, leaves: list[np.ndarray] | None = None) -> int:
        """One step's agreement; returns how many ranks contribute (0: all have left).

        ``leaves``: this rank's gradients of the step (their layout is remembered).
        """
        if leaves is not None:
            self.template = [(leaf.shape, leaf.dtype) for leaf in leaves]
        mine = np.array([[int(contributing), int(self.template is None)]], np.int64)
        flags = all_gather_into_tensor(mine, group=self.group)
        count = int(flags[:, 0].sum())
        if count and flags[:, 1].any():
            root = int(np.flatnonzero(flags[:, 0])[0])
            me = resolve_group(self.group, "join").rank
            self.template = broadcast_object(self.template if me == root else None, src=root,
                                             group=self.group)
        return count

    def zeros(self) -> list[np.ndarray]:
        """Zero gradients of the remembered layout: a departed rank's contribution."""
        assert self.template is not None  # agree() fetched it when any rank contributes
        return [np.zeros(shape, dtype) for shape, dtype in self.template]
