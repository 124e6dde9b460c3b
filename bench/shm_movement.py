"""fcoll with the shared segment against fcoll on MPI, in the same processes (issue 17).

    mpiexec -n 2 .venv/bin/python bench/shm_movement.py [--batches 9] [--sizes 16K 64K ...]
        [--ops all_reduce reduce_scatter_tensor all_gather_into_tensor broadcast]

Separate jobs with ``FCOLL_SHM=1`` and ``=0`` drift apart on a shared machine (the same
cell moved 2x between runs here); this script switches the setting between batches of one
job instead. Per op and size, in rotating batches (a batch's time is the slowest rank's):

- ``shm``: fcoll with ``FCOLL_SHM=1`` (every size through the world's segment);
- ``mpi``: fcoll with ``FCOLL_SHM=0`` (today's MPI path; a fresh result each call);
- ``raw``: mpi4py into an output allocated once (what a pure function cannot reach).

Prints medians of per-batch ratios: ``shm/mpi`` below 1 is where the segment pays, which
is how `fcoll.backends.shm.MIN_BYTES` and ``MAX_BYTES`` were chosen. Results are kept
until the next call, as a caller would. About 30 s at the default sizes.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

import fcoll

sys.path.insert(0, str(Path(__file__).parent))
from common import human, parse_size

fcoll.init()
from mpi4py import MPI  # noqa: E402

from fcoll import runtime  # noqa: E402

OPS = ("all_reduce", "reduce_scatter_tensor", "all_gather_into_tensor", "broadcast")
Fn = Callable[[], Any]


def setting(value: str) -> None:
    """FCOLL_SHM for the next calls (every rank switches at the same point)."""
    os.environ["FCOLL_SHM"] = value
    runtime.changed()  # read again; fast paths learned under the other value dropped


def raw(op: str, comm: Any, x: np.ndarray) -> Fn:
    n = comm.Get_size()
    if op == "all_reduce":
        out = np.empty_like(x)
        return lambda: comm.Allreduce(x, out, MPI.SUM)
    if op == "reduce_scatter_tensor":
        out = np.empty(x.size // n, x.dtype)
        return lambda: comm.Reduce_scatter_block(x, out, MPI.SUM)
    if op == "all_gather_into_tensor":
        out = np.empty(x.size * n, x.dtype)
        return lambda: comm.Allgather(x, out)
    buf = x.copy()
    return lambda: comm.Bcast(buf, 0)


def with_fcoll(op: str, x: np.ndarray, value: str) -> Fn:
    fn = getattr(fcoll, op)
    kept: list[Any] = [None]

    def call() -> None:
        kept[0] = fn(x)

    def run() -> None:
        setting(value)
        call()  # relearn the fast path outside the timed loop's steady state
        kept[0] = None

    run.call = call  # type: ignore[attr-defined]
    return run


def batch(comm: Any, prepare: Fn | None, fn: Fn, iters: int) -> float:
    if prepare is not None:
        prepare()
    comm.Barrier()
    start = time.perf_counter()
    for _ in range(iters):
        fn()
    return float(comm.allreduce(time.perf_counter() - start, op=MPI.MAX)) / iters


def measure(comm: Any, op: str, size: int, batches: int) -> dict[str, list[float]]:
    n = comm.Get_size()
    count = max(n, size // 4 // n * n)  # float32, divisible for reduce_scatter
    x = np.full(count, comm.Get_rank() + 1.0, np.float32)
    shm, mpi = with_fcoll(op, x, "1"), with_fcoll(op, x, "0")
    impls: dict[str, tuple[Fn | None, Fn]] = {
        "shm": (shm, shm.call), "mpi": (mpi, mpi.call), "raw": (None, raw(op, comm, x))}  # type: ignore[attr-defined]
    iters = max(3, min(2000, int(2e7 // max(size, 1))))
    times: dict[str, list[float]] = {k: [] for k in impls}
    for b in range(batches):
        order = list(impls)[b % 3 :] + list(impls)[: b % 3]
        for k in order:
            times[k].append(batch(comm, *impls[k], iters))
    return times


def ratio(times: dict[str, list[float]], a: str, b: str) -> float:
    """The median of per-batch ratios ``a / b``."""
    return statistics.median(s / t for s, t in zip(times[a], times[b], strict=True))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", nargs="+", default=["8K", "16K", "64K", "256K", "1M", "2M", "8M"])
    parser.add_argument("--ops", nargs="+", choices=OPS, default=list(OPS))
    parser.add_argument("--batches", type=int, default=9)
    args = parser.parse_args()
    comm = fcoll.world()._comm
    before = os.environ.get("FCOLL_SHM")
    for op in args.ops:
        for size in (parse_size(s) for s in args.sizes):
            times = measure(comm, op, size, args.batches)
            if comm.Get_rank() == 0:
                us = {k: statistics.median(v) * 1e6 for k, v in times.items()}
                print(f"{op:24} {human(size):>8}  shm {us['shm']:8.1f} us  mpi {us['mpi']:8.1f} us"
                      f"  raw {us['raw']:8.1f} us  shm/mpi {ratio(times, 'shm', 'mpi'):.2f}"
                      f"  mpi/raw {ratio(times, 'mpi', 'raw'):.2f}  shm/raw {ratio(times, 'shm', 'raw'):.2f}",
                      flush=True)
    setting(before or "auto")


if __name__ == "__main__":
    main()
