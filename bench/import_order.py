"""fcoll/raw for all_reduce when the program imports ``mpi4py.MPI`` before fcoll (issue 13).

    mpiexec -n 2 .venv/bin/python bench/import_order.py [--fcoll-first] [--batches 15]

MPI is started by mpi4py (at its default thread level, ``multiple``), then fcoll is
imported, as in most user scripts. ``--fcoll-first`` imports fcoll first instead, for
comparison. Times a float32 sum of 1 MiB and 8 MiB: fcoll's ``all_reduce`` (a fresh result
each call, kept until the next call returns) against raw ``comm.Allreduce`` into an output
allocated once, and raw ``Allreduce`` into a fresh ``np.empty`` output kept the same way
(fcoll's allocation pattern without fcoll). Batches rotate the three; a batch's time is
the slowest rank's; ratios are medians of per-batch ratios (paired batches). About 10 s.
``MPI4PY_RC_THREAD_LEVEL=serialized`` makes mpi4py start MPI at fcoll's thread level.
"""

from __future__ import annotations

import argparse
import importlib
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

ARGS = argparse.Namespace(fcoll_first=False, batches=15)
if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fcoll-first", action="store_true", help="import fcoll first")
    parser.add_argument("--batches", type=int, default=15, help="batches per size (default 15)")
    ARGS = parser.parse_args()

if ARGS.fcoll_first:
    importlib.import_module("fcoll")
import numpy as np  # noqa: E402
from mpi4py import MPI  # noqa: E402  (the point: before fcoll, unless --fcoll-first)

import fcoll  # noqa: E402

MiB = 1 << 20
SIZES = (MiB, 8 * MiB)
BATCH_S = 0.05  # target seconds per batch


def batch(fn: Callable[[], object], iters: int, comm: Any) -> float:
    """Seconds per call of ``fn`` over ``iters`` calls, the slowest rank's."""
    comm.Barrier()
    start = time.perf_counter()
    for _ in range(iters):
        fn()
    return float(comm.allreduce((time.perf_counter() - start) / iters, op=MPI.MAX))


def contenders(comm: Any, nbytes: int) -> dict[str, Callable[[], object]]:
    """fcoll; raw into one preallocated output; raw into a fresh output kept until the next
    call (what fcoll does, without fcoll: separates fcoll's cost from the MPI library's)."""
    x = np.full(nbytes // 4, float(comm.rank + 1), dtype=np.float32)
    out = np.empty_like(x)
    kept: list[Any] = [None, None]

    def functional() -> None:
        kept[0] = fcoll.all_reduce(x)  # the result lives until the next call returns

    def raw() -> None:
        comm.Allreduce(x, out, MPI.SUM)

    def raw_fresh() -> None:
        fresh = np.empty_like(x)
        comm.Allreduce(x, fresh, MPI.SUM)
        kept[1] = fresh

    functional(), raw(), raw_fresh()
    assert np.array_equal(kept[0], out) and np.array_equal(kept[1], out), "results disagree"
    return {"fcoll": functional, "raw": raw, "raw fresh": raw_fresh}


def measure(comm: Any, nbytes: int, batches: int) -> dict[str, tuple[float, float]]:
    """``{name: (median s per call, median of per-batch ratios to raw)}`` for one size."""
    fns = contenders(comm, nbytes)
    iters = max(1, int(BATCH_S / max(batch(fns["raw"], 3, comm), 1e-6)))
    times: dict[str, list[float]] = {name: [] for name in fns}
    names = list(fns)
    for b in range(batches):
        for name in names[b % len(names):] + names[:b % len(names)]:  # rotate the order
            times[name].append(batch(fns[name], iters, comm))
    return {name: (statistics.median(t),
                   statistics.median(a / r for a, r in zip(t, times["raw"], strict=True)))
            for name, t in times.items()}


def main() -> None:
    comm = MPI.COMM_WORLD.Dup()
    fcoll.init()
    rows = {nbytes: measure(comm, nbytes, ARGS.batches) for nbytes in SIZES}
    if comm.rank == 0:
        from fcoll.runtime import memory

        levels = ("single", "funneled", "serialized", "multiple")
        order = "fcoll first" if ARGS.fcoll_first else "mpi4py.MPI first"
        tuned = getattr(memory, "tuned", None)
        print(f"n = {comm.size}, {order}, thread level {levels[MPI.Query_thread()]}, malloc "
              f"tuning {'unknown (older fcoll)' if tuned is None else 'on' if tuned() else 'off'}")
        print(f"{'size':>6}  {'fcoll':>9}  {'raw':>9}  {'raw fresh':>9}  fcoll/raw  raw fresh/raw")
        for nbytes, cells in rows.items():
            (f, ratio), (r, _), (rf, fresh_ratio) = cells["fcoll"], cells["raw"], cells["raw fresh"]
            print(f"{nbytes // MiB:>2} MiB  {f * 1e6:>6.0f} us  {r * 1e6:>6.0f} us  {rf * 1e6:>6.0f} us"
                  f"  {ratio:>8.2f}x  {fresh_ratio:>11.2f}x")
    comm.Free()


if __name__ == "__main__":
    sys.exit(main())
