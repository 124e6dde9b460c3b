"""Uneven inputs: the agreement behind `GradientAverager.join`.

Each synced averaging step inside a join block starts with one small all-gather of two
flags per rank (still contributing, needs the tree's layout). The number of ranks still
contributing divides the summed buckets; a rank that has left keeps answering with zero
gradients until no rank contributes, so every rank leaves the block together. A rank
that never averaged (no data at all) gets the leaves' shapes and dtypes from the first
contributing rank, and with it whether they are numpy or cupy arrays (the zeros are made
on this rank's current device then: cupy is imported, as the others train on it).
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any

import numpy as np

from fcoll.collectives import all_gather_into_tensor
from fcoll.collectives.objects import broadcast_object
from fcoll.dispatch import is_cupy
from fcoll.dispatch.pytrees import Array
from fcoll.groups.group import GroupArg, resolve_group

Template = list[tuple[tuple[int, ...], np.dtype[Any]]]


class Joiner:
    """This rank's side of one join block: the last layout it averaged, and the steps."""

    def __init__(self, group: GroupArg) -> None:
        self.group = group
        self.template: Template | None = None
        self.on_device = False  # the template's gradients were cupy arrays

    def agree(self, contributing: bool, leaves: list[Array] | None = None) -> int:
        """One step's agreement; returns how many ranks contribute (0: all have left).

        ``leaves``: this rank's gradients of the step (their layout is remembered).
        """
        if leaves is not None:
            self.template = [(tuple(leaf.shape), leaf.dtype) for leaf in leaves]
            self.on_device = bool(leaves) and is_cupy(leaves[0])
        mine = np.array([[int(contributing), int(self.template is None)]], np.int64)
        flags = all_gather_into_tensor(mine, group=self.group)
        count = int(flags[:, 0].sum())
        if count and flags[:, 1].any():
            root = int(np.flatnonzero(flags[:, 0])[0])
            me = resolve_group(self.group, "join").rank
            self.template, self.on_device = broadcast_object(
                (self.template, self.on_device) if me == root else None, src=root,
                group=self.group)
        return count

    def module(self) -> ModuleType:
        """numpy, or cupy when the remembered gradients were cupy arrays."""
        return importlib.import_module("cupy") if self.on_device else np

    def zeros(self) -> list[Array]:
        """Zero gradients of the remembered layout (numpy, or cupy on the current device):
        a departed rank's contribution."""
        assert self.template is not None  # agree() fetched it when any rank contributes
        xp = self.module()
        return [xp.zeros(shape, dtype) for shape, dtype in self.template]
