"""A stress job for the shared-memory step protocol (run by tests/test_native_stress.py):

    mpiexec -n N python tests/stress_job.py STEPS SEED

``STEPS`` collectives through the on-node segment (every size goes there: the job runs with
``FCOLL_SHM=1``), each checked on every rank against what numpy computes locally from every
rank's input: all_reduce (int64 sum, float32 sum folded along the canonical tree, float16 sum in
float32, int32 max), reduce_scatter_tensor, all_gather_into_tensor and broadcast from a
random root, with sizes that cross the step's inline limit (40 bytes), fill the first
segment and grow it, on the world group (the fast path) and on the world in reverse order
(`Group.split` with reversed keys: the full path, another segment). Every rank draws the
same plan from ``SEED``; each rank also sleeps or spins a random while before about 2 %
of its steps, so ranks arrive in every order. Each input depends on the step number, so
a value left from an earlier step fails the check. A wrong result raises (fcoll's hook
ends the job); rank 0 prints ``stress ok: STEPS steps, N ranks, T s`` at the end.
"""

from __future__ import annotations

import sys
import time
from typing import Any

import numpy as np

import fcoll as fc

SIZES = np.array([0, 1, 2, 5, 10, 11, 64, 300, 4096, 20000, 70000])  # elements
WEIGHTS = np.array([2, 20, 10, 10, 10, 10, 15, 10, 8, 4, 1], float)
DTYPES = [np.dtype("int64"), np.dtype("float32"), np.dtype("float16"), np.dtype("int32")]
OPS = ["sum", "sum", "sum", "max"]  # by dtype
FOLDS = [np.add, np.add, np.add, np.maximum]


def data(rank: int, step: int, size: int, dtype: np.dtype[Any]) -> np.ndarray:
    """Rank ``rank``'s input at ``step``: distinct per rank and step, exact in ``dtype``."""
    base = np.arange(size, dtype=np.int64) % 97
    if dtype.kind == "f":
        return ((base + 1) * 0.1 + rank * 0.37 + (step % 11) * 0.013).astype(dtype)
    return (base * 1000 + rank * 31 + step % 100003).astype(dtype)


def tree(values: list[np.ndarray], f: np.ufunc) -> np.ndarray:
    """The canonical tree (API.md "Reduction order"): pre-step pairs, then level by level."""
    m = len(values) - (1 << (len(values).bit_length() - 1))
    level = [f(values[2 * i], values[2 * i + 1]) for i in range(m)] + values[2 * m:]
    while len(level) > 1:
        level = [f(level[k], level[k + 1]) for k in range(0, len(level), 2)]
    return level[0]


def fold(rows: list[np.ndarray], ufunc: np.ufunc, dtype: np.dtype[Any]) -> np.ndarray:
    """The canonical tree's fold as fcoll's contract has it (float16 accumulated in float32)."""
    wide = np.float32 if dtype == np.float16 else dtype
    out: np.ndarray = tree([row.astype(wide) for row in rows], ufunc)
    return out.astype(dtype)


def check(what: str, step: int, got: np.ndarray, want: np.ndarray) -> None:
    if got.dtype != want.dtype or got.shape != want.shape or not np.array_equal(got, want):
        bad = np.flatnonzero(got.reshape(-1) != want.reshape(-1))[:5] if got.shape == want.shape else []
        raise AssertionError(f"rank {fc.get_rank()} step {step} {what}: got {got.dtype}{got.shape} "
                             f"expected {want.dtype}{want.shape}; first differing elements {list(bad)}")


def one(step: int, kind: int, size: int, d: int, root: int, group: Any, ranks: list[int]) -> None:
    """One collective of the plan, checked. ``ranks``: the group's ranks, in group order."""
    me, n = ranks.index(fc.get_rank()), len(ranks)
    dtype = DTYPES[d]
    if kind == 0:  # all_reduce
        y = fc.all_reduce(data(fc.get_rank(), step, size, dtype), OPS[d], group=group)
        check("all_reduce", step, y, fold([data(r, step, size, dtype) for r in ranks], FOLDS[d], dtype))
    elif kind == 1:  # reduce_scatter_tensor: n blocks of `size`
        y = fc.reduce_scatter_tensor(data(fc.get_rank(), step, n * size, dtype), OPS[d], group=group)
        whole = fold([data(r, step, n * size, dtype) for r in ranks], FOLDS[d], dtype)
        check("reduce_scatter_tensor", step, y, whole[me * size:(me + 1) * size])
    elif kind == 2:  # all_gather_into_tensor
        y = fc.all_gather_into_tensor(data(fc.get_rank(), step, size, dtype), group=group)
        check("all_gather_into_tensor", step, y, np.concatenate([data(r, step, size, dtype) for r in ranks]))
    else:  # broadcast from a random root
        y = fc.broadcast(data(fc.get_rank(), step, size, dtype), src=root % n, group=group)
        check("broadcast", step, y, data(ranks[root % n], step, size, dtype))


def main(steps: int, seed: int) -> None:
    rank, n = fc.get_rank(), fc.get_world_size()
    plan = np.random.default_rng(seed)  # the same on every rank
    kinds, dtypes, roots = plan.integers(0, 4, steps), plan.integers(0, 4, steps), plan.integers(0, n, steps)
    sizes = plan.choice(SIZES, steps, p=WEIGHTS / WEIGHTS.sum())
    reverse = plan.random(steps) < 0.2
    own = np.random.default_rng([seed, rank])  # each rank's own delays
    delays = own.random(steps)
    world, backwards = list(range(n)), list(range(n))[::-1]
    reversed_group = fc.world().split(0, key=n - 1 - rank)  # group rank k: global rank n-1-k
    assert list(reversed_group.ranks) == backwards, reversed_group.ranks
    start = time.perf_counter()
    for i in range(steps):
        if delays[i] < 0.01:
            time.sleep(own.random() * 3e-4)
        elif delays[i] < 0.02:
            until = time.perf_counter() + own.random() * 5e-5
            while time.perf_counter() < until:
                pass
        group, ranks = (reversed_group, backwards) if reverse[i] else (None, world)
        one(i, int(kinds[i]), int(sizes[i]), int(dtypes[i]), int(roots[i]), group, ranks)
    took = time.perf_counter() - start
    fc.barrier()
    if rank == 0:
        print(f"stress ok: {steps} steps, {n} ranks, {took:.1f} s", flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]))
