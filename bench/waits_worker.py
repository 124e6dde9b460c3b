"""One rank's latencies of all_reduce per size, for bench/waits.py (run under mpiexec).

    mpiexec -n 2 python bench/waits_worker.py --sizes 8 65536 --seconds 0.2

Prints one line per size: ``size_bytes median_us cpu_share`` (the median over rounds of the
slowest rank's mean time per call in a round; the CPU time the ranks used over the timed
rounds, every thread, divided by the wall time, averaged over the ranks: 1.0 = a core each).
"""

from __future__ import annotations

import argparse
import resource
import statistics
import time

import numpy as np

import fcoll as fc


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", type=int, nargs="+", default=[8, 65536])
    parser.add_argument("--seconds", type=float, default=0.2, help="per round")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--late", type=float, default=0.0,
                        help="ms rank 0 computes (a busy loop) before each call: a late peer")
    args = parser.parse_args()
    for size in args.sizes:
        x = np.ones(max(size // 4, 1), np.float32)
        late = args.late / 1e3 if fc.get_rank() == 0 else 0.0
        start = time.perf_counter()
        for _ in range(50):
            compute(late)
            fc.all_reduce(x)
        guess = float(fc.all_reduce(np.array([(time.perf_counter() - start) / 50]), op=fc.ReduceOp.MAX)[0])
        reps = max(10, int(args.seconds / guess))  # a round spans many scheduler slices
        per_round = []
        cpu, wall = _cpu(), time.perf_counter()
        for _ in range(args.rounds):
            fc.barrier()
            start = time.perf_counter()
            for _ in range(reps):
                compute(late)
                fc.all_reduce(x)
            mine = (time.perf_counter() - start) / reps
            per_round.append(float(fc.all_reduce(np.array([mine]), op=fc.ReduceOp.MAX)[0]))
        share = (_cpu() - cpu) / (time.perf_counter() - wall)
        share = float(fc.all_reduce(np.array([share]))[0]) / fc.get_world_size()
        if fc.get_rank() == 0:
            print(size, f"{statistics.median(per_round) * 1e6:.2f}", f"{share:.3f}", flush=True)


def compute(seconds: float) -> None:
    """Keep this core busy for ``seconds`` (the work of a rank that comes late)."""
    until = time.perf_counter() + seconds
    while seconds and time.perf_counter() < until:
        pass


def _cpu() -> float:
    use = resource.getrusage(resource.RUSAGE_SELF)
    return use.ru_utime + use.ru_stime


if __name__ == "__main__":
    main()
