"""What fcoll's reliability machinery costs per call, in alternating jobs of one run.

    python bench/trace_overhead.py [-n 1 2] [--compare trace|watch|tree] [--baseline DIR]
                                   [--rounds 5] [--calls 20000]

``--compare`` picks the two kinds of job that alternate:

- ``trace`` (default): the flight recorder on (``FCOLL_TRACE=64``) against off (``0``);
- ``watch``: the stall watch and the node board on (the defaults) against off
  (``FCOLL_STALL_WARN=0 FCOLL_ABORT_ON_ERROR=0``, so no watch thread starts);
- ``tree``: this source tree against another checkout of fcoll (``--baseline DIR``, e.g. a
  ``git worktree`` of the commit before a change), for costs on the call's own path such as
  the shared-memory fingerprint.

For each world size, ``--rounds`` pairs of jobs (the order alternates), each timing
``--calls`` back-to-back calls of: ``all_reduce`` and ``broadcast`` of 8 B on the default
group (the fast paths), ``all_reduce`` of 8 B on a group of the same ranks made by
``split`` (the whole path), and ``all_reduce`` of 64 KiB on the default group (through the
on-node shared memory at n >= 2). Per call: the best of 3 loops in a job (the slowest
rank's), the median over jobs; the cost is the second kind's time minus the first's.
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
CASES = ("all_reduce 8 B", "broadcast 8 B", "all_reduce 8 B (split group)", "all_reduce 64 KiB")
# (label of the job kind measured first, its environment; the second's) per comparison
KINDS = {
    "trace": (("recorder off", {"FCOLL_TRACE": "0"}), ("recorder on", {"FCOLL_TRACE": "64"})),
    "watch": (("watch off", {"FCOLL_STALL_WARN": "0", "FCOLL_ABORT_ON_ERROR": "0"}),
              ("watch on", {})),
    "tree": (("baseline", {}), ("this tree", {})),
}


def child(calls: int) -> None:
    """One job: print the per-call µs of each case (the slowest rank's), on rank 0."""
    import fcoll as fc

    x, big, group = np.ones(2, np.float32), np.ones(16384, np.float32), fc.world().split(color=0)
    runs = {"8": lambda: fc.all_reduce(x), "b": lambda: fc.broadcast(x),
            "s": lambda: fc.all_reduce(x, group=group), "64": lambda: fc.all_reduce(big)}
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


def _job(n: int, env_extra: dict[str, str], tree: Path, calls: int) -> list[float]:
    mpiexec = Path(sys.executable).parent / "mpiexec"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "HYDRA_"))}
    env.update(env_extra)
    env["PYTHONPATH"] = str(tree)
    done = subprocess.run([str(mpiexec), "-n", str(n), sys.executable, __file__, "--child",
                           "--calls", str(calls)], capture_output=True, text=True, env=env,
                          cwd=tree, timeout=600, check=True)
    return [float(v) for v in done.stdout.split()]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--compare", choices=sorted(KINDS), default="trace")
    parser.add_argument("--baseline", type=Path, help="the other fcoll checkout (--compare tree)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=20000)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.calls)
        return 0
    if args.compare == "tree" and args.baseline is None:
        parser.error("--compare tree needs --baseline DIR")
    (first, first_env), (second, second_env) = KINDS[args.compare]
    trees = (args.baseline or ROOT, ROOT)
    print(f"{'n':>2} {'case':30}{first + ' us':>16}{second + ' us':>16}{'cost us':>9}")
    for n in args.n:
        times: tuple[list[list[float]], list[list[float]]] = ([], [])
        for r in range(args.rounds):
            for k in ((0, 1) if r % 2 == 0 else (1, 0)):
                times[k].append(_job(n, (first_env, second_env)[k], trees[k], args.calls))
        for i, case in enumerate(CASES):
            a, b = (statistics.median(t[i] for t in times[k]) for k in (0, 1))
            print(f"{n:>2} {case:30}{a:>16.3f}{b:>16.3f}{b - a:>9.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
