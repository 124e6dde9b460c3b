"""One rank's latencies of all_reduce per size, for bench/waits.py (run under mpiexec).

    mpiexec -n 2 python bench/waits_worker.py --sizes 8 65536 --seconds 0.2

Prints one line per size: ``size_bytes median_us`` (the median over rounds of the slowest
rank's mean time per call in a round).
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

import fcoll as fc


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", type=int, nargs="+", default=[8, 65536])
    parser.add_argument("--seconds", type=float, default=0.2, help="per round")
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    for size in args.sizes:
        x = np.ones(max(size // 4, 1), np.float32)
        start = time.perf_counter()
        for _ in range(50):
            fc.all_reduce(x)
        guess = float(fc.all_reduce(np.array([(time.perf_counter() - start) / 50]), op=fc.ReduceOp.MAX)[0])
        reps = max(10, int(args.seconds / guess))  # a round spans many scheduler slices
        per_round = []
        for _ in range(args.rounds):
            fc.barrier()
            start = time.perf_counter()
            for _ in range(reps):
                fc.all_reduce(x)
            mine = (time.perf_counter() - start) / reps
            per_round.append(float(fc.all_reduce(np.array([mine]), op=fc.ReduceOp.MAX)[0]))
        if fc.get_rank() == 0:
            print(size, f"{statistics.median(per_round) * 1e6:.2f}", flush=True)


if __name__ == "__main__":
    main()
