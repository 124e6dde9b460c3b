"""Recursive halving and doubling over the canonical tree's leaves (Rabenseifner's
algorithm; MPICH's ``allreduce_intra_reduce_scatter_allgather.c``), for large messages.

Pre-step as `fcoll.backends.tree.doubling`. Reduce-scatter by recursive halving: the ``q``
leaves hold the message cut into ``q`` blocks; at distance 1, 2, 4, ... leaves ``v`` and
``v ^ d`` each keep half of the blocks they hold (the lower leaf the lower half), send the
other half and fold what they receive, the lower leaf's values on the left. Each element is
so folded at distance 1, then 2, ...: the tree, whichever leaf folds it. Leaf ``v`` ends
with block ``bitrev(v)``. All-gather by recursive doubling, the distances in reverse: each
step swaps the blocks held, straight into the result. Post-step: ``2i+1`` sends the result
to ``2i``.

Cost per rank: ``2 lg q alpha + 2 n (q-1)/q beta + n (q-1)/q gamma`` (plus
``2 (alpha + n beta) + n gamma`` with pre-step pairs); messages sent ``<= 2 lg q + 1``;
memory: the result and a receive buffer of ``n / 2`` (``n`` on a pair's odd rank).
`reduce` gathers the blocks to leaf 0 instead (a binomial tree, the distances in
reverse) and `reduce_scatter` sends each leaf's block to its owner (one more exchange).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from fcoll.backends.tree.doubling import deliver, rank_of
from fcoll.backends.tree.order import leaf_of, split
from fcoll.backends.tree.steps import Link, Schedule, combine


def offsets(counts: Sequence[int]) -> list[int]:
    """Where each block starts, and the end.

    Example:
        >>> offsets([2, 3])
        [0, 2, 5]
    """
    out = [0]
    for c in counts:
        out.append(out[-1] + c)
    return out


def even_blocks(n: int, q: int) -> list[int]:
    """``q`` nearly equal block offsets over ``n`` elements (the larger first, so the lower
    half of any range `halve` keeps is the larger one)."""
    base, extra = divmod(n, q)
    return offsets([base + (i < extra) for i in range(q)])


def halve(link: Link, acc: np.ndarray, offs: Sequence[int], tmp: np.ndarray, ufunc: np.ufunc,
          v: int, p: int) -> Schedule[int]:
    """Recursive halving on ``acc`` (this leaf's whole vector; ``offs``: the ``q`` blocks'
    offsets): afterwards ``acc``'s block ``b`` (returned, ``bitrev(v)``) holds the tree's
    reduction of that block. ``tmp``: a receive buffer as large as any kept half."""
    q = split(p)[0]
    lo, hi, mask = 0, q, 1
    while mask < q:
        mid = (lo + hi) // 2
        lower = not v & mask
        keep, give = ((lo, mid), (mid, hi)) if lower else ((mid, hi), (lo, mid))
        a, b = offs[keep[0]], offs[keep[1]]
        recv = tmp[: b - a]
        yield link.exchange(acc[offs[give[0]]:offs[give[1]]], recv, rank_of(p, v ^ mask))
        mine = acc[a:b]
        if lower:
            combine(ufunc, mine, recv, mine)
        else:
            combine(ufunc, recv, mine, mine)
        lo, hi = keep
        mask <<= 1
    return lo


def double(link: Link, acc: np.ndarray, offs: Sequence[int], v: int, p: int, block: int
           ) -> Schedule[None]:
    """The all-gather after `halve`: every leaf's block into every leaf's ``acc``."""
    q = split(p)[0]
    lo, hi, mask = block, block + 1, q >> 1
    while mask:
        size = hi - lo
        plo, phi = (hi, hi + size) if not v & mask else (lo - size, lo)
        yield link.exchange(acc[offs[lo]:offs[hi]], acc[offs[plo]:offs[phi]],
                            rank_of(p, v ^ mask))
        lo, hi = min(lo, plo), max(hi, phi)
        mask >>= 1


def _leaf_start(link: Link, x: np.ndarray, ufunc: np.ufunc, me: int, p: int, half: int
                ) -> Schedule[tuple[np.ndarray, np.ndarray]]:
    """A leaf's vector (a new array) and a receive buffer of at least ``half`` elements:
    a pair's odd rank folds its even partner's ``x`` first."""
    m = split(p)[1]
    acc = np.empty_like(x)
    if me < 2 * m:
        tmp = np.empty_like(x)
        yield [link.recv(tmp, me - 1)]
        combine(ufunc, tmp, x, acc)
        return acc, tmp
    np.copyto(acc, x)
    return acc, np.empty(half, x.dtype)


def allreduce(link: Link, x: np.ndarray, ufunc: np.ufunc, me: int, p: int
              ) -> Schedule[np.ndarray]:
    """The tree's reduction of every rank's flat C-contiguous ``x``, a new array everywhere.

    Example:
        >>> run(call, allreduce(link, np.ones(1 << 20), np.add, r, 4))[0]   # each of 4
        4.0
    """
    q, m = split(p)
    if me < 2 * m and me % 2 == 0:
        out = np.empty_like(x)
        yield [link.send(x, me + 1), link.recv(out, me + 1)]
        return out
    offs = even_blocks(x.size, q)
    acc, tmp = yield from _leaf_start(link, x, ufunc, me, p, offs[q // 2])  # the larger half
    v = leaf_of(p, me)[0]
    block = yield from halve(link, acc, offs, tmp, ufunc, v, p)
    del tmp
    yield from double(link, acc, offs, v, p, block)
    if me < 2 * m:
        yield [link.send(acc, me - 1)]
    return acc


def reduce(link: Link, x: np.ndarray, ufunc: np.ufunc, me: int, p: int, root: int
           ) -> Schedule[np.ndarray | None]:
    """The tree's reduction on ``root`` (None elsewhere): `halve`, then the blocks gathered
    to leaf 0 along a binomial tree (distances q/2, ..., 1), which sends it to ``root``."""
    q, m = split(p)
    acc: np.ndarray | None = None
    if me < 2 * m and me % 2 == 0:
        yield [link.send(x, me + 1)]
    else:
        offs = even_blocks(x.size, q)
        acc, tmp = yield from _leaf_start(link, x, ufunc, me, p, offs[q // 2])
        v = leaf_of(p, me)[0]
        block = yield from halve(link, acc, offs, tmp, ufunc, v, p)
        del tmp
        if not (yield from _gather(link, acc, offs, v, p, block)):
            acc = None
    return (yield from deliver(link, acc, x, me, p, root))


def _gather(link: Link, acc: np.ndarray, offs: Sequence[int], v: int, p: int, block: int
            ) -> Schedule[bool]:
    """The blocks of `halve` to leaf 0 (True there: ``acc`` is whole)."""
    q = split(p)[0]
    lo, hi, mask = block, block + 1, q >> 1
    while mask:
        if v < 2 * mask:
            size = hi - lo
            if v & mask:
                yield [link.send(acc[offs[lo]:offs[hi]], rank_of(p, v - mask))]
                return False
            yield [link.recv(acc[offs[hi]:offs[hi + size]], rank_of(p, v + mask))]
            hi += size
        mask >>= 1
    return True


def reduce_scatter(link: Link, x: np.ndarray, counts: Sequence[int], ufunc: np.ufunc, me: int,
                   p: int) -> Schedule[np.ndarray]:
    """Rank ``me``'s block (``counts[me]`` elements, blocks in rank order) of the tree's
    reduction of every rank's flat ``x``, a new array: `halve` over the leaves' blocks (a
    pair's two blocks make its leaf's), then each leaf swaps the block it holds with the
    leaf that owns it, and a pair's odd rank sends the even rank its part."""
    q, m = split(p)
    ranks = offsets(counts)
    if me < 2 * m and me % 2 == 0:
        out = np.empty(counts[me], x.dtype)
        yield [link.send(x, me + 1), link.recv(out, me + 1)]
        return out
    firsts = [2 * j if j < m else j + m for j in range(q)] + [p]
    offs = [ranks[r] for r in firsts]  # the leaves' blocks
    acc, tmp = yield from _leaf_start(link, x, ufunc, me, p, x.size)
    v = leaf_of(p, me)[0]
    block = yield from halve(link, acc, offs, tmp, ufunc, v, p)
    del tmp
    if block != v:  # bitrev is its own inverse: the owner of ``block`` holds block ``v``
        yield link.exchange(acc[offs[block]:offs[block + 1]], acc[offs[v]:offs[v + 1]],
                            rank_of(p, block))
    if me < 2 * m:
        yield [link.send(acc[ranks[me - 1]:ranks[me]], me - 1)]
    return acc[ranks[me]:ranks[me + 1]].copy()
