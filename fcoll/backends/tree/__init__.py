"""fcoll's own reduction schedules over MPI point-to-point messages: every floating-point
reduction that crosses MPI follows the canonical tree of the group's size
(`fcoll.backends.tree.order`, API.md "Reduction order"), bit for bit the same as the on-node
segment's fold of the same tree, at any message size and node layout.

One algorithm a module, each with its cost formula (alpha: latency, beta: seconds per byte,
gamma: seconds per byte folded; ``q = 2**floor(lg p)``):

- `doubling`: recursive doubling (all-reduce) and a binomial tree (reduce), small messages
  (up to `doubling_limit`):
  ``lg q + 2`` steps of ``n`` bytes;
- `halving`: recursive halving + doubling (Rabenseifner: reduce-scatter, then all-gather),
  large messages, and every reduce-scatter: ``2 lg q + 2`` steps moving ``~2 n`` bytes;
- `scan`: recursive doubling for ``scan``/``exscan``: ``lg q + 2`` steps of ``n`` bytes.

No schedule gathers ``p`` inputs: each rank sends at most ``2 lg q + 2`` messages and
holds ``O(n)`` bytes. `steps` runs them (blocking, or as a `fcoll.calls.work.Operation` for
``async_op=True``). The functions here take the call and flat C-contiguous wire data.

Example:
    >>> allreduce(call, np.full(4, r + 1.0), np.add)      # rank r of 5 (FCOLL_SHM=0)
    array([15., 15., 15., 15.])
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from fcoll.backends.tree import doubling, halving
from fcoll.backends.tree import scan as scans
from fcoll.backends.tree.order import split
from fcoll.backends.tree.steps import Link, Schedule, Scheduled, run
from fcoll.calls.work import Call

# Bytes per rank up to which recursive doubling runs, above it recursive halving + doubling:
# DOUBLING_LIMIT where the tree has more than 8 leaves, 16 times it up to 8. bench/scale.py:
# at p = 4 here fcoll's Python steps make doubling faster up to 512 KiB-1 MiB (shared memory
# and TCP); its model of 8-rank nodes puts the crossover at 8-32 KiB from p = 16 on (MPI's
# step costs) and at 256 KiB at p = 8 (with fcoll's cost per step). Read per call (tests
# and the bench set it).
DOUBLING_LIMIT = 16 << 10


def doubling_limit(p: int) -> int:
    """The bytes per rank up to which an all-reduce or reduce of ``p`` ranks takes recursive
    doubling.

    Example:
        >>> doubling_limit(4), doubling_limit(64)
        (262144, 16384)
    """
    return DOUBLING_LIMIT if split(p)[0] > 8 else DOUBLING_LIMIT << 4


def _start(call: Call, eager: bool = True, seq: int | None = None) -> tuple[Link, int, int]:
    call.begin()
    g = call.group
    tagged = g.seq if seq is None else seq
    return Link(call, tagged, eager and call.seconds is None and not g.pending), g.rank, g.size


def _allreduce(link: Link, x: np.ndarray, ufunc: np.ufunc, me: int, p: int) -> Schedule[Any]:
    if x.nbytes <= doubling_limit(p) or x.size < split(p)[0]:
        return doubling.allreduce(link, x, ufunc, me, p)
    return halving.allreduce(link, x, ufunc, me, p)


def _reduce(link: Link, x: np.ndarray, ufunc: np.ufunc, me: int, p: int, root: int
            ) -> Schedule[Any]:
    if x.nbytes <= doubling_limit(p) or x.size < split(p)[0]:
        return doubling.reduce(link, x, ufunc, me, p, root)
    return halving.reduce(link, x, ufunc, me, p, root)


def allreduce(call: Call, x: np.ndarray, ufunc: np.ufunc) -> np.ndarray:
    """The tree's reduction of every rank's flat ``x``, a new array on every rank."""
    link, me, p = _start(call)
    return run(call, _allreduce(link, x, ufunc, me, p))


def reduce(call: Call, x: np.ndarray, ufunc: np.ufunc, root: int) -> np.ndarray | None:
    """The tree's reduction of every rank's flat ``x`` on group rank ``root``; None elsewhere."""
    link, me, p = _start(call)
    return run(call, _reduce(link, x, ufunc, me, p, root))  # type: ignore[no-any-return]


def reduce_scatter(call: Call, x: np.ndarray, counts: Sequence[int], ufunc: np.ufunc
                   ) -> np.ndarray:
    """Block ``rank`` (``counts[rank]`` elements) of the tree's reduction of the flat ``x``."""
    link, me, p = _start(call)
    return run(call, halving.reduce_scatter(link, x, counts, ufunc, me, p))


def scan(call: Call, x: np.ndarray, ufunc: np.ufunc, exclusive: bool, total: bool
         ) -> tuple[np.ndarray | None, np.ndarray | None]:
    """``(prefix, total)`` in the scan order (`fcoll.backends.tree.scan`)."""
    link, me, p = _start(call)
    return run(call, scans.scan(link, x, ufunc, me, p, exclusive, total))


def start(name: str, call: Call, kind: str, finish: Callable[[Any], Any], x: np.ndarray,
          ufunc: np.ufunc, *args: Any, seq: int | None = None) -> Scheduled:
    """``async_op=True``: schedule ``kind`` (``allreduce``, ``reduce`` with ``root``,
    ``reduce_scatter`` with ``counts``, ``scan`` with ``exclusive, total``) in flight as an
    operation whose value is ``finish(result)``. ``seq``: the number its messages' tag comes
    from, where not the group's call number (pieces of one call in flight together,
    `fcoll.backends.nodes`)."""
    link, me, p = _start(call, eager=False, seq=seq)
    if kind == "allreduce":
        schedule = _allreduce(link, x, ufunc, me, p)
    elif kind == "reduce":
        schedule = _reduce(link, x, ufunc, me, p, *args)
    elif kind == "reduce_scatter":
        schedule = halving.reduce_scatter(link, x, args[0], ufunc, me, p)
    else:
        schedule = scans.scan(link, x, ufunc, me, p, *args)
    return Scheduled(name, call.group, schedule, finish)
