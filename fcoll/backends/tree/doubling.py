"""All-reduce by recursive doubling over the canonical tree's leaves (MPICH's
``allreduce_intra_recursive_doubling.c``), for small messages.

Pre-step (``m = p - q`` pairs): rank ``2i`` sends its ``x`` to ``2i+1``, which folds the
leaf ``x[2i] op x[2i+1]``; ``2i`` then waits for the result. Then ``lg q`` exchanges: at
distance 1, 2, 4, ... leaves ``v`` and ``v ^ d`` swap what they hold and both fold it, the
lower leaf's value on the left, so both hold the same bits of the next subtree; at the
end every leaf holds the whole tree. Post-step: ``2i+1`` sends the result to ``2i``.

Cost per rank (alpha-beta-gamma; n bytes; Thakur, Rabenseifner, Gropp 2005):
``(lg q + 2 [m > 0]) (alpha + n beta) + (lg q + 1) n gamma``; messages sent ``<= lg q + 1``;
memory: the result and one receive buffer, ``2 n``.
"""

from __future__ import annotations

import numpy as np

from fcoll.backends.tree.order import leaf_of, split
from fcoll.backends.tree.steps import Link, Schedule, combine


def rank_of(p: int, leaf: int) -> int:
    """The rank that stands for ``leaf`` in the exchanges (the odd one of a pair).

    Example:
        >>> [rank_of(6, j) for j in range(4)]
        [1, 3, 4, 5]
    """
    m = split(p)[1]
    return 2 * leaf + 1 if leaf < m else leaf + m


def allreduce(link: Link, x: np.ndarray, ufunc: np.ufunc, me: int, p: int
              ) -> Schedule[np.ndarray]:
    """The tree's reduction of every rank's flat C-contiguous ``x``, a new array on every rank.

    Example:
        >>> run(call, allreduce(link, np.ones(3), np.add, r, 4))    # each of 4 ranks
        array([4., 4., 4.])
    """
    q, m = split(p)
    out = np.empty_like(x)
    if me < 2 * m and me % 2 == 0:
        yield [link.send(x, me + 1), link.recv(out, me + 1)]
        return out
    tmp = np.empty_like(x)
    cur = x
    if me < 2 * m:
        yield [link.recv(tmp, me - 1)]
        cur = combine(ufunc, tmp, x, out)
    v = leaf_of(p, me)[0]
    mask = 1
    while mask < q:
        partner = v ^ mask
        yield link.exchange(cur, tmp, rank_of(p, partner))
        cur = combine(ufunc, cur, tmp, out) if partner > v else combine(ufunc, tmp, cur, out)
        mask <<= 1
    if cur is x:
        np.copyto(out, x)
    if me < 2 * m:
        yield [link.send(out, me - 1)]
    return out


def reduce(link: Link, x: np.ndarray, ufunc: np.ufunc, me: int, p: int, root: int
           ) -> Schedule[np.ndarray | None]:
    """The tree's reduction on ``root`` (None elsewhere) by a binomial tree over the leaves:
    at distance 1, 2, ... leaf ``v + d`` sends to ``v`` (``v`` a multiple of ``2d``), which
    folds it on the right; leaf 0 then sends the result to ``root``.
    Cost: ``(lg q + 2) (alpha + n beta) + (lg q + 1) n gamma`` on the longest path; memory
    ``<= 3 n`` (on the folding leaves: the result, a receive buffer; ``root``'s copy).
    """
    q, m = split(p)
    cur: np.ndarray | None = None
    if me < 2 * m and me % 2 == 0:
        yield [link.send(x, me + 1)]
    else:
        cur = yield from _binomial(link, x, ufunc, me, p, q, m)
    return (yield from deliver(link, cur if cur is not x else x.copy(), x, me, p, root))


def deliver(link: Link, whole: np.ndarray | None, x: np.ndarray, me: int, p: int, root: int
            ) -> Schedule[np.ndarray | None]:
    """The result to ``root``: leaf 0's rank holds it (``whole``) and sends it there unless
    it is ``root``; ``root`` returns it (a new array like ``x``), every other rank None."""
    first = rank_of(p, 0)
    if me == first and root != first:
        assert whole is not None
        yield [link.send(whole, root)]
        return None
    if me != root:
        return None
    if root == first:
        return whole
    out = np.empty_like(x)
    yield [link.recv(out, first)]
    return out


def _binomial(link: Link, x: np.ndarray, ufunc: np.ufunc, me: int, p: int, q: int, m: int
              ) -> Schedule[np.ndarray | None]:
    """This leaf's part of the binomial reduction: leaf 0 returns the tree's value."""
    tmp: np.ndarray | None = None
    acc: np.ndarray | None = None
    cur = x
    if me < 2 * m:
        tmp, acc = np.empty_like(x), np.empty_like(x)
        yield [link.recv(tmp, me - 1)]
        cur = combine(ufunc, tmp, x, acc)
    v = leaf_of(p, me)[0]
    mask = 1
    while mask < q:
        if v & mask:
            yield [link.send(cur, rank_of(p, v - mask))]
            return None
        if tmp is None or acc is None:
            tmp, acc = np.empty_like(x), np.empty_like(x)
        yield [link.recv(tmp, rank_of(p, v + mask))]
        cur = combine(ufunc, cur, tmp, acc)
        mask <<= 1
    return cur
