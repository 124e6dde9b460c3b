"""Which all-reduce algorithm is fastest for large messages? MPICH's, by CVAR, against
reduce-scatter + all-gather composed from two MPI calls (what fcoll does above a size).

    .venv/bin/python bench/allreduce_algorithms.py [-n 2] [--sizes 64K 1M 16M 64M]

Each MPICH setting is read at MPI_Init, so each runs as its own job (this file re-launches
itself under mpiexec with ``--worker``). Every job times, per size, ``comm.Allreduce``
(float32 sum, preallocated output) and the composition ``Reduce_scatter`` + ``Allgatherv``
into the same output; the table is the median µs per call (slowest rank, 9 batches).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from common import human, parse_size

POSIX = "MPIR_CVAR_ALLREDUCE_POSIX_INTRA_ALGORITHM"
INTRA = "MPIR_CVAR_ALLREDUCE_INTRA_ALGORITHM"
SETTINGS = {
    "MPICH default": {},
    "mpir (generic) auto": {POSIX: "mpir"},
    "mpir ring": {POSIX: "mpir", INTRA: "ring"},
    "mpir reduce_scatter_allgather": {POSIX: "mpir", INTRA: "reduce_scatter_allgather"},
    "mpir recursive_doubling": {POSIX: "mpir", INTRA: "recursive_doubling"},
}


def worker(sizes: list[int]) -> None:
    from mpi4py import MPI

    comm = MPI.COMM_WORLD.Dup()
    out = {str(nbytes): one_size(comm, nbytes) for nbytes in sizes}
    if comm.Get_rank() == 0:
        print(json.dumps(out))


def one_size(comm: Any, nbytes: int) -> dict[str, float]:
    import numpy as np
    from mpi4py import MPI

    n, rank = comm.Get_size(), comm.Get_rank()
    count = nbytes // 4
    x = ((np.arange(count) * 7 + rank) % 13).astype(np.float32)
    y = np.empty_like(x)
    counts = [count // n + (r < count % n) for r in range(n)]
    displs = [sum(counts[:r]) for r in range(n)]
    part = np.empty(counts[rank], np.float32)

    def allreduce() -> None:
        comm.Allreduce(x, y, MPI.SUM)

    def composed() -> None:
        comm.Reduce_scatter(x, part, counts, MPI.SUM)
        comm.Allgatherv(part, [y, counts, displs, MPI.FLOAT])

    calls = {"Allreduce": allreduce, "Reduce_scatter+Allgatherv": composed}
    times: dict[str, list[float]] = {name: [] for name in calls}
    composed()
    want = y.copy()
    allreduce()
    assert np.array_equal(want, y), "the composition must give Allreduce's bits"
    iters = max(1, int(0.02 / max(1e-6, _once(allreduce))))
    for b in range(9):  # alternate which goes first
        for name in (list(calls) if b % 2 else list(calls)[::-1]):
            comm.Barrier()
            t0 = time.perf_counter()
            for _ in range(iters):
                calls[name]()
            times[name].append(comm.allreduce((time.perf_counter() - t0) / iters, op=MPI.MAX))
    return {k: statistics.median(v) * 1e6 for k, v in times.items()}


def _once(fn: Callable[[], None]) -> float:
    from mpi4py import MPI

    t0 = time.perf_counter()
    fn()
    return float(MPI.COMM_WORLD.allreduce(time.perf_counter() - t0, op=MPI.MAX))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("-n", type=int, default=2)
    p.add_argument("--sizes", nargs="+", default=["64K", "256K", "1M", "4M", "16M", "64M"])
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    sizes = [parse_size(s) for s in args.sizes]
    if args.worker:
        worker(sizes)
        return 0
    mpiexec = str(Path(sys.executable).parent / "mpiexec")
    table: dict[str, dict[str, dict[str, float]]] = {}
    for name, env in SETTINGS.items():
        cmd = [mpiexec, "-n", str(args.n), sys.executable, __file__, "--worker", "--sizes", *args.sizes]
        done = subprocess.run(cmd, env={**os.environ, **env, "MPIEXEC_TIMEOUT": "600"},
                              capture_output=True, text=True, timeout=660)
        if done.returncode != 0:
            print(f"{name}: failed\n{done.stderr[-1500:]}", file=sys.stderr)
            continue
        table[name] = json.loads(done.stdout.strip().splitlines()[-1])
        print(f"{name}: done", file=sys.stderr, flush=True)
    names = list(table)
    print(f"median µs per call, float32 sum, n={args.n}")
    print("| size | " + " | ".join(f"Allreduce, {s}" for s in names) + " | composed (default) |")
    print("|---:|" + "---:|" * (len(names) + 1))
    for nbytes in sizes:
        row = [f"{table[s][str(nbytes)]['Allreduce']:.0f}" for s in names]
        comp = table[names[0]][str(nbytes)]["Reduce_scatter+Allgatherv"] if names else float("nan")
        print(f"| {human(nbytes)} | " + " | ".join(row) + f" | {comp:.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
