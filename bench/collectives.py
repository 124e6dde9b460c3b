"""Per-rank worker of `bench/run.py`: every implementation of every (op, size), in one run.

    mpiexec -n N python -m mpi4py bench/collectives.py --csv OUT.csv [--sizes ...] [--ops ...]

All implementations run in the same processes, in interleaved timed batches (the order
rotates every batch), so drift in the machine's load hits them alike. A batch is a
barrier then ``iters`` back-to-back calls of one implementation; its per-call time is the
slowest rank's (MAX over ranks, outside the timed region). Each implementation gets its
own ``iters`` (calls that fill ``--batch-ms``). Reported: median and quartiles over
batches; ``vs_raw`` is the median of per-batch ratios against raw (paired batches).
"""

from __future__ import annotations

import argparse
import csv
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from common import FULL_SIZES, IMPLS, OPS, QUICK_SIZES, bus_bytes, bus_factor, human, parse_size


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="bench/run.py's per-rank worker")
    p.add_argument("--sizes", nargs="+", metavar="SIZE", help="bytes per rank, e.g. 8 4K 1M")
    p.add_argument("--ops", nargs="+", choices=OPS, default=list(OPS))
    p.add_argument("--impls", nargs="+", choices=IMPLS, default=list(IMPLS))
    p.add_argument("--quick", action="store_true", help="5 sizes, fewer and shorter batches")
    p.add_argument("--batches", type=int, help="timed batches per impl (default 11; quick 5)")
    p.add_argument("--batch-ms", type=float, help="target ms per batch (default 20; quick 10)")
    p.add_argument("--max-cell-s", type=float, help="seconds per (op, size), all impls (default 8)")
    p.add_argument("--max-iters", type=int, default=20000)
    p.add_argument("--csv", type=Path, required=True)
    args = p.parse_args(argv)
    sizes = args.sizes and [parse_size(s) for a in args.sizes for s in a.split(",") if s]
    args.sizes = sizes or (QUICK_SIZES if args.quick else FULL_SIZES)
    args.batches = args.batches or (5 if args.quick else 11)
    args.batch_ms = args.batch_ms or (10.0 if args.quick else 20.0)
    args.max_cell_s = args.max_cell_s or (3.0 if args.quick else 8.0)
    return args


ARGS = parse_args()
import numpy as np  # noqa: E402

import fcoll  # noqa: E402  (starts MPI at fcoll's thread level, before mpi4py.MPI)

fcoll.init()
from impls import MAKERS, Impl, Unsupported, count_for, data, expected, start_gloo  # noqa: E402
from mpi4py import MPI  # noqa: E402


def timed(comm: Any, impl: Impl, iters: int) -> float:
    comm.Barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        impl.call()
    return (time.perf_counter() - t0) / iters


def slowest(comm: Any, values: list[float]) -> list[float]:
    send = np.array(values, np.float64)
    out = np.empty_like(send)
    comm.Allreduce(send, out, MPI.MAX)
    return [float(v) for v in out]


def build(op: str, nbytes: int, impls: list[str], comm: Any) -> tuple[dict[str, Impl], dict[str, str]]:
    """Make and check every implementation; ({impl: Impl}, {impl: why it was left out})."""
    rank, n = comm.Get_rank(), comm.Get_size()
    count = count_for(op, nbytes, n)
    x = data(count, rank)
    made: dict[str, Impl] = {}
    skipped: dict[str, str] = {}
    for name in impls:
        impl = MAKERS[name](op, x, comm)
        try:
            result = impl.first()
            want = expected(op, name, count, rank, n)
            ok = result.shape == want.shape and np.allclose(result, want, rtol=1e-6, atol=0)
            why = "" if ok else "wrong result"
        except Unsupported as e:
            why = f"unsupported: {e}"
        whys = comm.allgather(why)
        why = next((w for w in whys if w), "")
        if why:
            skipped[name] = why
        else:
            made[name] = impl
    return made, skipped


def measure(made: dict[str, Impl], comm: Any, args: argparse.Namespace) -> dict[str, list[float]]:
    names = list(made)
    est = slowest(comm, [timed(comm, made[k], 1) for k in names])  # second call of each
    iters = [int(min(args.max_iters, max(1, args.batch_ms * 1e-3 / max(t, 1e-9)))) for t in est]
    per_batch = sum(i * t for i, t in zip(iters, est, strict=True))
    batches = int(min(args.batches, max(1, args.max_cell_s / max(per_batch, 1e-9))))
    if batches < 3:  # too slow for a spread: single calls, as many as the budget allows
        iters = [1] * len(names)
        batches = int(min(args.batches, max(1, args.max_cell_s / max(sum(est), 1e-9))))
    samples: dict[str, list[float]] = {k: [] for k in names}
    for b in range(batches):
        order = names[b % len(names):] + names[:b % len(names)]
        local = {k: timed(comm, made[k], iters[names.index(k)]) for k in order}
        for k, t in zip(names, slowest(comm, [local[k] for k in names]), strict=True):
            samples[k].append(t)
    return samples


def rows_for(op: str, nbytes: int, samples: dict[str, list[float]], skipped: dict[str, str],
             n: int) -> list[dict[str, Any]]:
    real = count_for(op, nbytes, n) * 4
    s_bytes, factor = bus_bytes(op, real, n), bus_factor(op, n)
    rows = []
    for impl, ts in samples.items():
        med = statistics.median(ts)
        q = statistics.quantiles(ts, n=4) if len(ts) >= 2 else [ts[0]] * 3
        raw = samples.get("raw")
        vs_raw = statistics.median(t / r for t, r in zip(ts, raw, strict=True)) if raw else ""
        rows.append({"n": n, "op": op, "bytes": real, "impl": impl, "median_us": med * 1e6,
                     "q1_us": q[0] * 1e6, "q3_us": q[2] * 1e6, "min_us": min(ts) * 1e6,
                     "max_us": max(ts) * 1e6, "batches": len(ts), "vs_raw": vs_raw,
                     "algbw_GBps": s_bytes / med / 1e9, "busbw_GBps": s_bytes / med * factor / 1e9,
                     "note": ""})
    for impl, why in skipped.items():
        rows.append({"n": n, "op": op, "bytes": real, "impl": impl, "note": why})
    return rows


def progress(rank: int, total: int) -> Any:
    """A rich progress bar on rank 0 (stderr); a no-op object elsewhere."""
    if rank != 0:
        return None
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    bar = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                   TimeElapsedColumn(), console=Console(stderr=True), transient=False)
    bar.start()
    bar.add_task(f"n={MPI.COMM_WORLD.Get_size()}", total=total)
    return bar


def meta(comm: Any) -> dict[str, Any]:
    names = {getattr(MPI, f"THREAD_{t}"): t.lower() for t in ("SINGLE", "FUNNELED", "SERIALIZED", "MULTIPLE")}
    env = " ".join(f"{k}={v}" for k, v in sorted(os.environ.items())
                   if k.startswith(("MPIR_CVAR_", "FCOLL_", "OMPI_MCA")))
    local = comm.Split_type(MPI.COMM_TYPE_SHARED)
    ranks_here = local.Get_size()
    local.Free()
    return {"thread_level": names.get(MPI.Query_thread(), "?"),
            "mpi_library": " ".join(MPI.Get_library_version().splitlines()[0].split()),
            "ranks_per_node": ranks_here, "cores": len(os.sched_getaffinity(0)), "env": env,
            "date": time.strftime("%Y-%m-%d %H:%M")}


def main(args: argparse.Namespace) -> int:
    comm = MPI.COMM_WORLD.Dup()
    rank, n = comm.Get_rank(), comm.Get_size()
    impls = list(args.impls)
    notes: dict[str, str] = {}
    if "gloo" in impls:
        why = start_gloo(comm)
        if why:
            impls.remove("gloo")
            notes["gloo"] = why
            if rank == 0:
                print(f"gloo skipped: {why}", file=sys.stderr, flush=True)
    info = meta(comm)
    bar = progress(rank, len(args.ops) * len(args.sizes))
    rows: list[dict[str, Any]] = []
    for op in args.ops:
        for nbytes in args.sizes:
            if bar is not None:
                bar.update(0, description=f"n={n} {op} {human(nbytes)}")
            made, skipped = build(op, nbytes, impls, comm)
            skipped.update(notes)
            rows += rows_for(op, nbytes, measure(made, comm, args), skipped, n)
            if bar is not None:
                bar.advance(0)
    if bar is not None:
        bar.stop()
        write(args.csv, [{**r, **info} for r in rows])
    if "gloo" in impls:  # gloo's threads must be joined before exit, or the process aborts
        import torch.distributed as dist

        dist.destroy_process_group()
    comm.Free()
    return 0


def write(path: Path, rows: list[dict[str, Any]]) -> None:
    fields = list(dict.fromkeys(k for r in rows for k in r))
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields)
        writer.writeheader()
        for r in rows:
            writer.writerow({k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in r.items()})


if __name__ == "__main__":
    sys.exit(main(ARGS))
