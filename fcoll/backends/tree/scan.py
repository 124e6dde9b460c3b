"""Inclusive and exclusive scans of floats by recursive doubling over the canonical tree's
leaves, in the scan order of `fcoll.backends.tree.order` (MPICH's
``scan_intra_recursive_doubling.c``, with the all-reduce's pre-step).

Pre-step: rank ``2i`` of a pair sends ``x`` to ``2i+1``, which folds the leaf. Each leaf keeps
its subtree's value ``part`` (first the leaf), its inclusive prefix and its exclusive prefix.
At distance 1, 2, 4, ... leaves ``v`` and ``v ^ d`` swap ``part``; both fold it into ``part``
(lower leaf on the left); the higher leaf also folds it, on the left, into its prefixes.
So ``part`` ends as the whole tree (the all-reduce's bits: the total) and the prefixes as
the chains of the scan order. Post-step: ``2i+1`` sends ``2i`` its exclusive prefix (and the
total when asked), from which ``2i`` makes its own.

Cost per rank: ``(lg q + 2) (alpha + n beta) + (2 lg q + 2) n gamma``; messages sent
``<= lg q + 2``; memory ``<= 5 n`` (part, the two prefixes, a receive buffer, the total).
"""

from __future__ import annotations

import numpy as np

from fcoll.backends.tree.doubling import rank_of
from fcoll.backends.tree.order import leaf_of, split
from fcoll.backends.tree.steps import Link, Schedule, combine

Pair = tuple[np.ndarray | None, np.ndarray | None]


def scan(link: Link, x: np.ndarray, ufunc: np.ufunc, me: int, p: int, exclusive: bool,
         total: bool) -> Schedule[Pair]:
    """``(prefix, total)``: this rank's prefix in the scan order (None for rank 0's
    exclusive one) and, with ``total``, the tree's reduction over every rank.

    Example:
        >>> run(call, scan(link, np.ones(2), np.add, r, 3, False, True))   # rank r of 3
        (array([r + 1., r + 1.]), array([3., 3.]))
    """
    q, m = split(p)
    if me < 2 * m and me % 2 == 0:
        return (yield from _first_of_pair(link, x, ufunc, me, exclusive, total))
    v = leaf_of(p, me)[0]
    below: np.ndarray | None = None  # a pair's x[2i]
    tmp = np.empty_like(x)
    part = x.copy()
    if me < 2 * m:
        below = np.empty_like(x)
        yield [link.recv(below, me - 1)]
        combine(ufunc, below, x, part)
    incl = part.copy()
    excl: np.ndarray | None = None
    mask = 1
    while mask < q:
        partner = v ^ mask
        yield link.exchange(part, tmp, rank_of(p, partner))
        if partner < v:
            combine(ufunc, tmp, incl, incl)
            excl = tmp.copy() if excl is None else combine(ufunc, tmp, excl, excl)
            combine(ufunc, tmp, part, part)
        else:
            combine(ufunc, part, tmp, part)
        mask <<= 1
    if below is not None:  # 2i+1: tell 2i
        posts = [] if excl is None else [link.send(excl, me - 1)]
        yield posts + ([link.send(part, me - 1)] if total else [])
        if exclusive:  # E_i op x[2i]
            excl = below if excl is None else combine(ufunc, excl, below, excl)
    return (excl if exclusive else incl), (part if total else None)


def _first_of_pair(link: Link, x: np.ndarray, ufunc: np.ufunc, me: int, exclusive: bool,
                   total: bool) -> Schedule[Pair]:
    """Rank ``2i``: its prefix from ``2i+1``'s exclusive prefix ``E_i`` (none for ``i = 0``)."""
    excl = np.empty_like(x) if me > 0 else None
    whole = np.empty_like(x) if total else None
    posts = [link.send(x, me + 1)]
    posts += [] if excl is None else [link.recv(excl, me + 1)]
    yield posts + ([] if whole is None else [link.recv(whole, me + 1)])
    if exclusive:
        return excl, whole
    return (x.copy() if excl is None else combine(ufunc, excl, x, excl)), whole
