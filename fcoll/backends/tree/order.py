"""The canonical reduction order of a group of ``p`` ranks (API.md, "Reduction order").

**The tree.** With ``q = 2**floor(log2 p)`` and ``m = p - q``, the ``q`` *leaves* are, in rank
order, ``x[2i] op x[2i+1]`` for ``i < m`` (the pre-step pairs) and ``x[i + m]`` for ``i >= m``;
the leaves combine pairwise at distance 1, 2, 4, ... (a balanced binary tree), the lower
rank's operand always on the left. This is MPICH's recursive-doubling tree: its
``MPI_Allreduce`` by ``recursive_doubling`` or ``reduce_scatter_allgather`` (Thakur,
Rabenseifner and Gropp, "Optimization of Collective Communication Operations in MPICH",
IJHPCA 2005) gives the same bits. For ``p <= 3`` it is the sequential fold.

**The scan order** (the recursive-doubling scan over the leaves, MPICH's
``MPIR_Scan_intra_recursive_doubling``, with the same pre-step). Leaf ``i``'s inclusive prefix
is ``S_k op (... op (S_1 op L_i))``, where ``S_1, S_2, ...`` are the subtrees of the tree
that lie left of ``i``, smallest first (the left sibling at each level where bit ``b`` of
``i`` is set); its exclusive prefix ``E_i`` is the same chain without ``L_i``. Then:

- rank ``2i+1`` of a pair and a single-rank leaf: ``scan`` = leaf ``i``'s inclusive prefix;
- rank ``2i`` of a pair: ``scan = E_i op x[2i]`` (``x[0]`` for ``i = 0``);
- ``exscan`` of a rank = ``scan`` of the rank before it (``E_i`` for the first rank of leaf ``i``).

So the last rank's ``scan`` (leaf ``q - 1``, every bit set) is the tree itself: the same bits
as ``all_reduce``. A prefix depends on ``p`` and the rank alone.

**Programs.** `allreduce_program` and `scan_program` write an order as a list of binary
operations ``(dst, a, b)``: ``dst = a op b``, operands ``0..p-1`` the ranks' rows, ``p + t``
scratch buffer ``t``, `OUT` the result. The on-node segment runs them (numpy: `execute`;
the compiled core: the same list, element block by element block) on every rank's slot;
the MPI schedules (`fcoll.backends.tree`) reach the same expression with messages.

Example:
    >>> allreduce_program(5).ops         # ((x0+x1)+x2) + (x3+x4)
    ((5, 0, 1), (5, 5, 2), (6, 3, 4), (-1, 5, 6))
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

OUT = -1  # operand: the result buffer
NONE = -2  # a program's result when there is none (rank 0's exscan)


def split(p: int) -> tuple[int, int]:
    """``(q, m)``: the tree's ``q = 2**floor(log2 p)`` leaves and ``m = p - q`` pre-step pairs.

    Example:
        >>> split(6)
        (4, 2)
    """
    q = 1 << (p.bit_length() - 1)
    return q, p - q


def leaf_of(p: int, rank: int) -> tuple[int, bool]:
    """``(leaf, first)``: the leaf that holds ``rank``, and whether ``rank`` is the first of a
    pre-step pair (``2i`` with ``i < m``).

    Example:
        >>> leaf_of(6, 4), leaf_of(6, 1)
        ((2, False), (0, False))
    """
    m = split(p)[1]
    if rank < 2 * m:
        return rank // 2, rank % 2 == 0
    return rank - m, False


@dataclass(frozen=True)
class Program:
    """One rank's reduction as binary operations (module docstring): ``ops``, ``(dst, a, b)``
    each; ``result``: `OUT` when there are ops, else the row that is the result, or `NONE`;
    ``temps``: scratch buffers the ops use."""

    p: int
    ops: tuple[tuple[int, int, int], ...]
    result: int
    temps: int

    def as_array(self) -> np.ndarray:
        """The ops as an ``(len(ops), 3)`` int32 array (for the compiled core)."""
        return np.array(self.ops, np.int32).reshape(-1, 3)


class _Builder:
    """Emits the ops of one program; scratch buffer ``t`` is operand ``p + t``. A subtree
    computed into buffer ``t`` uses buffers ``t + 1, ...`` for its right halves only, so
    nothing it needs is overwritten."""

    def __init__(self, p: int) -> None:
        self.p = p
        self.q, self.m = split(p)
        self.ops: list[tuple[int, int, int]] = []
        self.temps = 0

    def emit(self, t: int, a: int, b: int) -> int:
        self.temps = max(self.temps, t + 1)
        self.ops.append((self.p + t, a, b))
        return self.p + t

    def leaf(self, i: int, t: int) -> int:
        return self.emit(t, 2 * i, 2 * i + 1) if i < self.m else i + self.m

    def subtree(self, lo: int, size: int, t: int) -> int:
        if size == 1:
            return self.leaf(lo, t)
        a = self.subtree(lo, size // 2, t)
        b = self.subtree(lo + size // 2, size // 2, t + 1)
        return self.emit(t, a, b)

    def exclusive(self, i: int) -> int | None:
        """``E_i`` into buffer 0 (or a row), None for leaf 0."""
        acc: int | None = None
        for b in range(i.bit_length()):
            if i >> b & 1:
                lo = ((i >> b) ^ 1) << b
                if acc is None:
                    acc = self.subtree(lo, 1 << b, 0)
                else:
                    acc = self.emit(0, self.subtree(lo, 1 << b, 1), acc)
        return acc

    def inclusive(self, i: int) -> int:
        """Leaf ``i``'s inclusive prefix into buffer 0 (or a row)."""
        acc = self.leaf(i, 0)
        for b in range(i.bit_length()):
            if i >> b & 1:
                acc = self.emit(0, self.subtree(((i >> b) ^ 1) << b, 1 << b, 1), acc)
        return acc

    def finish(self, result: int | None) -> Program:
        if result is None:
            return Program(self.p, (), NONE, 0)
        if not self.ops:
            return Program(self.p, (), result, 0)
        ops = self.ops
        ops[-1] = (OUT, ops[-1][1], ops[-1][2])
        return Program(self.p, tuple(ops), OUT, self.temps)


@functools.lru_cache(maxsize=64)
def allreduce_program(p: int) -> Program:
    """The tree of ``p`` as a program (every rank runs the same one).

    Example:
        >>> allreduce_program(3).ops
        ((3, 0, 1), (-1, 3, 2))
    """
    b = _Builder(p)
    return b.finish(b.subtree(0, b.q, 0))


@functools.lru_cache(maxsize=256)
def scan_program(p: int, rank: int, exclusive: bool) -> Program:
    """``rank``'s scan (``exclusive``: exscan) in the scan order of ``p`` as a program.

    Example:
        >>> scan_program(4, 2, False).ops     # (x0+x1) + x2
        ((5, 0, 1), (-1, 5, 2))
    """
    b = _Builder(p)
    i, first = leaf_of(p, rank)
    if exclusive and rank % 2 == 1 and rank < 2 * b.m:  # 2i+1: E_i op x[2i]
        acc = b.exclusive(i)
        return b.finish(2 * i if acc is None else b.emit(0, acc, 2 * i))
    if exclusive or first:
        acc = b.exclusive(i)
        if exclusive:
            return b.finish(acc)
        return b.finish(rank if acc is None else b.emit(0, acc, rank))
    return b.finish(b.inclusive(i))


def execute(program: Program, rows: Sequence[np.ndarray], out: np.ndarray, ufunc: np.ufunc
            ) -> np.ndarray | None:
    """Run ``program`` on ``rows`` (one per rank, equal shapes) with ``ufunc`` into ``out``
    (returned; None for a program without result). Scratch buffer 0 is ``out`` itself (it
    only ever holds the running left operand of the result: `_Builder`), so a program of
    up to 3 ranks needs no scratch and one of ``p`` ranks ``floor(lg p) - 1``.

    Example:
        >>> execute(allreduce_program(3), [np.ones(2)] * 3, np.empty(2), np.add)
        array([3., 3.])
    """
    if not program.ops:
        if program.result == NONE:
            return None
        np.copyto(out, rows[program.result])
        return out
    p = program.p
    operands: list[Any] = [*rows[:p], out]
    operands += [np.empty_like(out) for _ in range(program.temps - 1)]
    operands.append(out)  # OUT (-1)
    for dst, a, b in program.ops:
        ufunc(operands[a], operands[b], out=operands[dst])
    return out
