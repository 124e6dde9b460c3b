"""Soak: 100,000 small and 1,000 large collectives; reports resident memory growth and
operations left in flight.

    mpiexec -n 2 .venv/bin/python -m mpi4py bench/soak.py [--small 100000 --large 1000]

Memory is the resident set (``/proc/self/statm``) after a warm-up round and at the end;
the target is < 5 % growth. Mixes blocking and async all_reduce, all_gather_into_tensor,
reduce_scatter_tensor, all_to_all_single, broadcast and barrier.
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np

import fcoll as fc


def rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def round_of(x: np.ndarray, i: int) -> None:
    n = fc.get_world_size()
    work = fc.all_reduce(x, async_op=True)
    fc.all_gather_into_tensor(x)
    fc.reduce_scatter_tensor(np.concatenate([x] * n))
    fc.all_to_all_single(np.concatenate([x] * n))
    fc.broadcast(x, src=i % n)
    work.wait()
    if i % 100 == 0:
        fc.barrier()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--small", type=int, default=100_000)
    parser.add_argument("--large", type=int, default=1_000)
    args = parser.parse_args()
    small, large = np.ones(2, np.float32), np.ones(1 << 18, np.float32)  # 8 B, 1 MiB
    for i in range(200):
        round_of(small, i)
    for i in range(5):
        round_of(large, i)
    start, t0 = rss_mib(), time.perf_counter()
    for i in range(args.small // 5):  # 5 collectives (+ a barrier now and then) per round
        round_of(small, i)
    for i in range(args.large // 5):
        round_of(large, i)
    end = rss_mib()
    pending = len(fc.world().pending)
    rows = fc.all_gather_object((fc.get_rank(), start, end, pending))
    if fc.get_rank() == 0:
        print(f"{args.small} small + {args.large} large collectives per rank in "
              f"{time.perf_counter() - t0:.1f} s")
        for rank, a, b, p in rows:
            print(f"rank {rank}: RSS {a:.1f} -> {b:.1f} MiB ({100 * (b - a) / a:+.2f} %), "
                  f"operations in flight at the end: {p}")


if __name__ == "__main__":
    main()
