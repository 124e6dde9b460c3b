"""What deadlines and debug levels cost: all_reduce (float32 sum) at 8 B and 1 MiB with
no deadline (the fast blocking path), with a deadline (nonblocking call polled until done
or late), and with debug="info" and debug="detail", in one run.

    mpiexec -n 2 .venv/bin/python -m mpi4py bench/bench_reliability.py

Ratios are against the blocking path, median of per-batch ratios, slowest rank per batch.
"""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Callable

import numpy as np

import fcoll as fc

fc.init()
from mpi4py import MPI  # noqa: E402

# info: every call is formatted and handled (by a handler that drops it), as when logging
LOG = logging.getLogger("fcoll")
LOG.addHandler(logging.NullHandler())


def batch(fn: Callable[[], object], iters: int, comm: MPI.Comm) -> float:
    comm.Barrier()
    start = time.perf_counter()
    for _ in range(iters):
        fn()
    return float(comm.allreduce((time.perf_counter() - start) / iters, op=MPI.MAX))


def main() -> None:
    comm = MPI.COMM_WORLD.Dup()
    plain = fc.new_group()
    timed = fc.new_group(timeout=60.0)
    rows = []
    for nbytes in (8, 1 << 20):
        x = np.ones(nbytes // 4, np.float32)
        iters = 4000 if nbytes < 1024 else 40
        variants: dict[str, Callable[[], object]] = {
            "deadline": lambda x=x: fc.all_reduce(x, group=timed),
            "info": lambda x=x: fc.all_reduce(x, group=plain),
            "detail": lambda x=x: fc.all_reduce(x, group=plain),
        }
        for name, fn in variants.items():
            ratios, base_t, var_t = [], [], []
            for _ in range(15):
                fc.init(debug="off")
                base = batch(lambda x=x: fc.all_reduce(x, group=plain), iters, comm)
                fc.init(debug=name if name != "deadline" else "off")
                LOG.setLevel(logging.INFO if name == "info" else logging.WARNING)
                var = batch(fn, iters, comm)
                ratios.append(var / base)
                base_t.append(base)
                var_t.append(var)
            fc.init(debug="off")
            rows.append((name, nbytes, statistics.median(base_t) * 1e6,
                         statistics.median(var_t) * 1e6, statistics.median(ratios)))
    if comm.rank == 0:
        print(f"{'variant':10s} {'bytes':>8s} {'blocking µs':>12s} {'variant µs':>11s} {'ratio':>6s}")
        for name, nbytes, base, var, ratio in rows:
            print(f"{name:10s} {nbytes:>8d} {base:>12.2f} {var:>11.2f} {ratio:>6.2f}")


if __name__ == "__main__":
    main()
