"""Point-to-point and async latency: fcoll against raw mpi4py, in one run.

    mpiexec -n 2 .venv/bin/python -m mpi4py bench/bench_p2p.py [--sizes 8 64 4K 64K 1M]

- send/recv: a ping-pong between ranks 0 and 1 (other ranks idle); latency is half the
  round trip. fcoll's `recv` needs no template (shape and dtype come with the message);
  raw mpi4py `Send`/`Recv` receives into a preallocated buffer.
- async all_reduce: `fc.all_reduce(x, async_op=True).wait()` against
  `comm.Iallreduce(x, out).Wait()` (float32 sum) on every rank.

fcoll and raw alternate batch by batch; the ratio is the median of per-batch ratios.
Prints a table and writes bench/results/p2p_n{N}.csv.
"""

from __future__ import annotations

import argparse
import csv
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

import fcoll as fc

fc.init()
from mpi4py import MPI  # noqa: E402  (after fcoll chose the thread level)

SIZES = {"8": 8, "64": 64, "4K": 4 << 10, "64K": 64 << 10, "1M": 1 << 20}


def batch(fn: Callable[[], None], iters: int, comm: MPI.Comm) -> float:
    comm.Barrier()
    start = time.perf_counter()
    for _ in range(iters):
        fn()
    elapsed = (time.perf_counter() - start) / iters
    return float(comm.allreduce(elapsed, op=MPI.MAX))


def ping_pong(comm: MPI.Comm, nbytes: int) -> tuple[Callable[[], None], Callable[[], None]]:
    x = np.ones(max(nbytes // 4, 1), np.float32)
    buf = np.empty_like(x)
    me = comm.rank

    def fcoll_pp() -> None:
        if me == 0:
            fc.send(x, 1)
            fc.recv(1)
        elif me == 1:
            fc.send(fc.recv(0), 0)

    def raw_pp() -> None:
        if me == 0:
            comm.Send(x, 1)
            comm.Recv(buf, 1)
        elif me == 1:
            comm.Recv(buf, 0)
            comm.Send(buf, 0)

    return fcoll_pp, raw_pp


def async_allreduce(comm: MPI.Comm, nbytes: int) -> tuple[Callable[[], None], Callable[[], None]]:
    x = np.ones(max(nbytes // 4, 1), np.float32)
    out = np.empty_like(x)

    def fcoll_round_trip() -> None:
        fc.all_reduce(x, async_op=True).wait()

    def raw_round_trip() -> None:
        comm.Iallreduce(x, out, MPI.SUM).Wait()

    return fcoll_round_trip, raw_round_trip


def measure(comm: MPI.Comm, pair: tuple[Callable[[], None], Callable[[], None]], nbytes: int,
            batches: int, halve: bool) -> tuple[float, float, float]:
    iters = max(5, min(5000, int(2e5 // max(nbytes, 64))))
    for fn in pair:
        batch(fn, iters, comm)  # warm-up
    times: tuple[list[float], list[float]] = ([], [])
    for _ in range(batches):
        for side, fn in enumerate(pair):
            times[side].append(batch(fn, iters, comm) / (2 if halve else 1))
    ratio = statistics.median(f / r for f, r in zip(*times, strict=True))
    return statistics.median(times[0]) * 1e6, statistics.median(times[1]) * 1e6, ratio


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", nargs="+", default=list(SIZES), choices=list(SIZES))
    parser.add_argument("--batches", type=int, default=15)
    parser.add_argument("--csv", type=Path)
    args = parser.parse_args()
    comm = MPI.COMM_WORLD.Dup()
    if comm.size < 2:
        raise SystemExit("bench_p2p.py needs at least 2 ranks")
    rows = []
    for name, make, halve in (("send/recv", ping_pong, True),
                              ("async all_reduce", async_allreduce, False)):
        for size in args.sizes:
            nbytes = SIZES[size]
            fcoll_us, raw_us, ratio = measure(comm, make(comm, nbytes), nbytes, args.batches,
                                              halve)
            rows.append({"op": name, "bytes": nbytes, "fcoll_us": round(fcoll_us, 3),
                         "raw_us": round(raw_us, 3), "ratio": round(ratio, 3), "n": comm.size,
                         "thread_level": MPI.Query_thread()})
    if comm.rank == 0:
        report(rows, args.csv or Path(f"bench/results/p2p_n{comm.size}.csv"))


def report(rows: list[dict[str, object]], path: Path) -> None:
    print(f"{'op':18s} {'bytes':>8s} {'fcoll µs':>9s} {'raw µs':>8s} {'fcoll/raw':>9s}")
    for row in rows:
        print(f"{row['op']!s:18s} {row['bytes']!s:>8s} {row['fcoll_us']:>9.2f} "
              f"{row['raw_us']:>8.2f} {row['ratio']:>9.2f}")
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
