"""What the flight recorder costs per call: 8-byte calls with ``FCOLL_TRACE=64`` against
``FCOLL_TRACE=0``, in alternating jobs.

    python bench/trace_overhead.py [-n 1 2] [--rounds 5] [--calls 20000]

For each world size, ``--rounds`` pairs of jobs (recorder on, then off; the order alternates),
each timing ``--calls`` back-to-back calls of: ``all_reduce`` and ``broadcast`` on the default
group (the fast paths) and ``all_reduce`` on a group of the same ranks made by ``split`` (the
whole path). Per call: the best of 3 loops in a job (the slowest rank's), the median over
jobs. The issue's budget: at most 0.2 us per call at 8 B.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
CASES = ("all_reduce", "broadcast", "all_reduce (split group)")


def child(calls: int) -> None:
    """One job: print the per-call µs of each case (the slowest rank's), on rank 0."""
    import fcoll as fc

    x, group = np.ones(2, np.float32), fc.world().split(color=0)
    runs = {"all_reduce": lambda: fc.all_reduce(x), "broadcast": lambda: fc.broadcast(x),
            "all_reduce (split group)": lambda: fc.all_reduce(x, group=group)}
    times = []
    for run in runs.values():
        run()
        best = float("inf")
        for _ in range(3):
            fc.barrier()
            t0 = time.perf_counter()
            for _ in range(calls):
                run()
            best = min(best, (time.perf_counter() - t0) / calls)
        times.append(max(fc.all_gather_object(best)))
    if fc.get_rank() == 0:
        print(" ".join(f"{t * 1e6:.4f}" for t in times))


def _job(n: int, trace: str, calls: int) -> list[float]:
    mpiexec = Path(sys.executable).parent / "mpiexec"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "HYDRA_"))}
    env["FCOLL_TRACE"] = trace
    done = subprocess.run([str(mpiexec), "-n", str(n), sys.executable, __file__, "--child",
                           "--calls", str(calls)], capture_output=True, text=True, env=env,
                          cwd=ROOT, timeout=600, check=True)
    return [float(v) for v in done.stdout.split()]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=20000)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.calls)
        return 0
    print(f"{'n':>2} {'case':26}{'off us':>9}{'on us':>9}{'cost us':>9}")
    for n in args.n:
        on: list[list[float]] = []
        off: list[list[float]] = []
        for r in range(args.rounds):
            for trace in (("64", "0") if r % 2 == 0 else ("0", "64")):
                (on if trace == "64" else off).append(_job(n, trace, args.calls))
        for i, case in enumerate(CASES):
            a, b = statistics.median(t[i] for t in off), statistics.median(t[i] for t in on)
            print(f"{n:>2} {case:26}{a:>9.3f}{b:>9.3f}{b - a:>9.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
