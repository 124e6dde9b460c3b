"""fcoll's four core collectives against raw mpi4py buffer calls, in one run.

Run (every rank runs this file):

    mpiexec -n 4 .venv/bin/python -m mpi4py bench/bench_core.py [--sizes 8,1M] [--quick]
        [--csv PATH] [--thread-level serialized|multiple|funneled|single]

For each op and message size the fcoll function (fresh output every call) and the raw
mpi4py call (``comm.Allreduce`` ... on a Dup of COMM_WORLD, outputs preallocated once)
run in the same process, in alternating timed batches, so that drift in the machine's
load hits both alike. A batch is: barrier, then ``iters`` back-to-back calls; its per-call
time is the slowest rank's (MAX over ranks). The reported latency is the median over
batches. Bandwidth follows nccl-tests (``algbw = S / t``; ``busbw = algbw * factor``).
See bench/README.md.
"""

from __future__ import annotations

import argparse
import csv
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

KiB, MiB = 1 << 10, 1 << 20
FULL_SIZES = [8, 64, 512, 4 * KiB, 32 * KiB, 256 * KiB, MiB, 2 * MiB, 8 * MiB, 16 * MiB, 64 * MiB]
QUICK_SIZES = [8, 4 * KiB, 256 * KiB, MiB, 8 * MiB]
OPS = ("all_reduce", "all_gather_into_tensor", "reduce_scatter_tensor", "all_to_all_single")
THREAD_LEVELS = ("single", "funneled", "serialized", "multiple")
DTYPE = np.dtype(np.float32)
# Targets: fcoll/raw at the smallest size, and at every size >= LARGE.
SMALL_TARGET, LARGE_TARGET, LARGE = 1.5, 1.05, MiB


def parse_size(text: str) -> int:
    """``"8"``, ``"4K"``, ``"1M"``, ``"64MiB"`` -> bytes (binary units)."""
    t = text.strip().upper().removesuffix("IB").removesuffix("B")
    scale = {"K": KiB, "M": MiB, "G": 1 << 30}.get(t[-1:], 1)
    return int(float(t[:-1] if scale > 1 else t) * scale)


def human(nbytes: int) -> str:
    for unit, scale in (("M", MiB), ("K", KiB)):
        if nbytes >= scale and nbytes % scale == 0:
            return f"{nbytes // scale}{unit}"
    return str(nbytes)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", nargs="+", metavar="SIZE",
                   help="bytes per rank input, e.g. 8 4K 1M (or 8,4K,1M); default 8 B .. 64 MiB")
    p.add_argument("--ops", nargs="+", choices=OPS, default=list(OPS))
    p.add_argument("--csv", type=Path, help="default bench/results/core_n{N}[_LEVEL].csv")
    p.add_argument("--quick", action="store_true",
                   help="fewer sizes (8 B .. 8 MiB), batches and shorter batches")
    p.add_argument("--thread-level", choices=THREAD_LEVELS,
                   help="sets FCOLL_MPI_THREAD_LEVEL before fcoll starts MPI")
    p.add_argument("--batches", type=int, help="timed batches per impl (default 15; quick 7)")
    p.add_argument("--batch-ms", type=float,
                   help="target duration of one batch in ms (default 20; quick 10)")
    p.add_argument("--drop-results", action="store_true",
                   help="discard each fcoll result at once instead of holding it until the "
                        "next call's returns (y = f(x) in a loop holds two outputs live)")
    p.add_argument("--max-iters", type=int, default=20000, help="cap on calls per batch")
    p.add_argument("--max-cell-s", type=float,
                   help="time budget of one (op, size) cell in s (default 6; quick 2): "
                        "slower cells get fewer batches")
    p.add_argument("--max-call-s", type=float, default=0.5,
                   help="skip an op's larger sizes once one call of it took longer (s)")
    args = p.parse_args(argv)
    sizes = args.sizes and [parse_size(s) for a in args.sizes for s in a.split(",") if s]
    args.sizes = sizes or (QUICK_SIZES if args.quick else FULL_SIZES)
    args.batches = args.batches or (7 if args.quick else 15)
    args.batch_ms = args.batch_ms or (10.0 if args.quick else 20.0)
    args.max_cell_s = args.max_cell_s or (2.0 if args.quick else 6.0)
    return args


ARGS = parse_args()
if ARGS.thread_level:
    os.environ["FCOLL_MPI_THREAD_LEVEL"] = ARGS.thread_level

# fcoll starts MPI (at FCOLL_MPI_THREAD_LEVEL, default serialized) when it is imported /
# first used, but only if mpi4py.MPI is not imported yet: so fcoll first, then MPI.
import fcoll  # noqa: E402
from fcoll._runtime import _node_cpus  # noqa: E402

fcoll.init()
import mpi4py  # noqa: E402
from mpi4py import MPI  # noqa: E402


@dataclass
class Case:
    """One (op, size): the input, the two callables, and the bytes nccl-tests counts."""

    op: str
    nbytes: int  # bytes of this rank's input
    fcoll_call: Callable[[], Any]  # the timed call: keeps or drops its result (--drop-results)
    raw_call: Callable[[], Any]
    first_call: Callable[[], Any]  # fcoll's warm-up call, which keeps its result for check()
    check: Callable[[], bool]  # fcoll's first result == raw's output; then drops it
    bus_bytes: int  # S: the larger buffer, as nccl-tests defines it
    bus_factor: float


def make_case(op: str, nbytes: int, comm: Any, rank: int, n: int, keep: bool) -> Case:
    count = max(1, nbytes // DTYPE.itemsize)
    if op in ("reduce_scatter_tensor", "all_to_all_single"):
        count = -(-count // n) * n  # divisible by n: 8 B at n=4 becomes 16 B
    # Small integers: float32 sums are exact, so fcoll and raw must agree bit for bit.
    x = ((np.arange(count, dtype=np.int64) * 7 + rank) % 13).astype(DTYPE)
    nb = x.nbytes
    fn: Callable[[np.ndarray], np.ndarray]
    if op == "all_reduce":
        fn, out, bus, factor = fcoll.all_reduce, np.empty_like(x), nb, 2 * (n - 1) / n
        raw = lambda: comm.Allreduce(x, out, MPI.SUM)  # noqa: E731
    elif op == "all_gather_into_tensor":
        fn, out, bus, factor = fcoll.all_gather_into_tensor, np.empty(count * n, DTYPE), nb * n, (n - 1) / n
        raw = lambda: comm.Allgather(x, out)  # noqa: E731
    elif op == "reduce_scatter_tensor":
        fn, out, bus, factor = fcoll.reduce_scatter_tensor, np.empty(count // n, DTYPE), nb, (n - 1) / n
        raw = lambda: comm.Reduce_scatter_block(x, out, MPI.SUM)  # noqa: E731
    elif op == "all_to_all_single":
        fn, out, bus, factor = fcoll.all_to_all_single, np.empty_like(x), nb, (n - 1) / n
        raw = lambda: comm.Alltoall(x, out)  # noqa: E731
    else:
        raise ValueError(op)
    # Keeping the result (y = f(x) in a loop) holds the previous output while the next is
    # made: two live output buffers, against raw's one.
    last: dict[str, np.ndarray] = {}

    def keep_call() -> None:
        last["y"] = fn(x)

    def drop_call() -> None:
        fn(x)

    def check() -> bool:
        return bool(np.array_equal(last.pop("y"), out))

    return Case(op, nb, keep_call if keep else drop_call, raw, keep_call, check, bus, factor)


def timed(comm: Any, call: Callable[[], Any], iters: int) -> float:
    """Barrier, then ``iters`` calls; this rank's seconds per call."""
    comm.Barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        call()
    return (time.perf_counter() - t0) / iters


def slowest(comm: Any, *local: float) -> np.ndarray:
    """Element-wise MAX over ranks (the slowest rank's time is the honest one)."""
    send = np.array(local, np.float64)
    out = np.empty_like(send)
    comm.Allreduce(send, out, MPI.MAX)
    return out


def one_call_each(case: Case, comm: Any) -> np.ndarray:
    """Warm-up: one call of each impl, timed; the slowest rank's seconds ``[fcoll, raw]``."""
    return slowest(comm, timed(comm, case.first_call, 1), timed(comm, case.raw_call, 1))


def summarize(case: Case, f_times: list[float], r_times: list[float], iters: int,
              ok: bool) -> dict[str, Any]:
    tf, tr = statistics.median(f_times), statistics.median(r_times)
    # The ratio pairs each fcoll batch with the raw batch next to it, so slow drift in the
    # machine's load cancels; its median is steadier than the ratio of the two medians.
    ratio = statistics.median(f / r for f, r in zip(f_times, r_times, strict=True))
    return {
        "op": case.op,
        "bytes": case.nbytes,
        "fcoll_us": tf * 1e6,
        "raw_us": tr * 1e6,
        "ratio": ratio,
        "ratio_of_medians": tf / tr,
        "fcoll_busbw_GBps": case.bus_bytes / tf * case.bus_factor / 1e9,
        "raw_busbw_GBps": case.bus_bytes / tr * case.bus_factor / 1e9,
        "fcoll_algbw_GBps": case.bus_bytes / tf / 1e9,
        "raw_algbw_GBps": case.bus_bytes / tr / 1e9,
        "fcoll_us_min": min(f_times) * 1e6,
        "raw_us_min": min(r_times) * 1e6,
        "iters": iters,
        "batches": len(f_times),
        "correct": ok,
    }


def measure(case: Case, comm: Any, args: argparse.Namespace) -> dict[str, Any]:
    """Warm up, calibrate, then ``batches`` alternating timed batches of each impl.

    Every decision about call counts is taken from MAX-reduced times, so every rank makes
    the same calls. A cell whose calls are too slow for ``--max-cell-s`` (seen with 4
    ranks on 2 cores) gets fewer batches, or only its warm-up call as the measurement.
    """
    first = one_call_each(case, comm)  # warm-up: first touch of fresh pages etc.
    ok = bool(slowest(comm, 0.0 if case.check() else 1.0)[0] == 0.0)
    budget = args.max_cell_s
    calls = 3 if first.max() < 1e-3 else 1
    second = slowest(comm, timed(comm, case.fcoll_call, calls), timed(comm, case.raw_call, calls))
    if 2 * 3 * second.max() > budget:  # not even 3 batches of 1 call: one sample each
        return summarize(case, [float(second[0])], [float(second[1])], 1, ok)
    est = max(second.max(), 1e-9)
    iters = int(min(args.max_iters, max(1, args.batch_ms * 1e-3 / est)))
    batches = int(min(args.batches, max(3, budget / (2 * iters * est))))
    f_times, r_times = [], []
    for b in range(batches):  # alternate which impl goes first
        if b % 2 == 0:
            tf, tr = timed(comm, case.fcoll_call, iters), timed(comm, case.raw_call, iters)
        else:
            tr, tf = timed(comm, case.raw_call, iters), timed(comm, case.fcoll_call, iters)
        mf, mr = slowest(comm, tf, tr)
        f_times.append(float(mf))
        r_times.append(float(mr))
    return summarize(case, f_times, r_times, iters, ok)


def thread_level_name(level: int) -> str:
    names = {getattr(MPI, f"THREAD_{t.upper()}"): t for t in THREAD_LEVELS}
    return names.get(level, str(level))


def report(rows: list[dict[str, Any]], meta: dict[str, Any], path: Path, warning: str) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(width=120)
    table = Table(title=(f"fcoll vs raw mpi4py — n={meta['n']}, thread level "
                         f"{meta['thread_level']}, fcoll results {meta['fcoll_results']}, "
                         f"{meta['mpi_library']}"))
    for name in ("op", "bytes", "fcoll µs", "raw µs", "fcoll/raw",
                 "fcoll busbw GB/s", "raw busbw GB/s"):
        table.add_column(name, justify="left" if name == "op" else "right")
    for i, r in enumerate(rows):
        target = SMALL_TARGET if r["bytes"] < 64 else LARGE_TARGET if r["bytes"] >= LARGE else None
        ratio = f"{r['ratio']:.2f}"
        if target is not None:
            ratio = f"[{'green' if r['ratio'] <= target else 'red'}]{ratio}[/]"
        new_op = i == 0 or rows[i - 1]["op"] != r["op"]
        mark = ("" if r["correct"] else " ✗") + ("*" if r["batches"] == 1 else "")
        table.add_row(r["op"] if new_op else "", human(r["bytes"]) + mark,
                      f"{r['fcoll_us']:.1f}", f"{r['raw_us']:.1f}", ratio,
                      f"{r['fcoll_busbw_GBps']:.3f}", f"{r['raw_busbw_GBps']:.3f}",
                      end_section=i + 1 < len(rows) and rows[i + 1]["op"] != r["op"])
    console.print(table)
    if meta["mpi_env"]:
        console.print(f"environment: {meta['mpi_env']}", highlight=False)
    if any(r["batches"] == 1 for r in rows):
        console.print("* one call each (too slow for --max-cell-s); larger sizes of that op "
                      "skipped past --max-call-s", highlight=False)
    if warning:
        console.print(warning, highlight=False)
    for op in dict.fromkeys(r["op"] for r in rows):
        mine = [r for r in rows if r["op"] == op]
        small = min(mine, key=lambda r: r["bytes"])
        large = [r for r in mine if r["bytes"] >= LARGE]
        parts = []
        if small["bytes"] < 64:
            parts.append(f"at {human(small['bytes'])} B: {small['ratio']:.2f}x "
                         f"({'ok' if small['ratio'] <= SMALL_TARGET else 'MISS'} vs "
                         f"{SMALL_TARGET}x)")
        if large:
            worst = max(large, key=lambda r: r["ratio"])
            parts.append(f"worst >= 1 MiB: {worst['ratio']:.2f}x at {human(worst['bytes'])} "
                         f"({'ok' if worst['ratio'] <= LARGE_TARGET else 'MISS'} vs "
                         f"{LARGE_TARGET}x)")
        line = f"{op:<24} " + (";  ".join(parts) or "no size with a target")
        if not all(r["correct"] for r in mine):
            line += "  RESULTS DIFFER FROM RAW"
        console.print(line, highlight=False)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=[*rows[0], *meta])
        writer.writeheader()
        for r in rows:
            writer.writerow({**{k: (f"{v:.6g}" if isinstance(v, float) else v)
                                for k, v in r.items()}, **meta})
    console.print(f"wrote {path}", highlight=False)


def cores_per_node_check(comm: Any) -> str:
    """A warning when this node runs more ranks than it has cores (timings become noise)."""
    local = comm.Split_type(MPI.COMM_TYPE_SHARED)
    ranks, cores = local.Get_size(), _node_cpus()
    local.Free()
    if ranks <= cores:
        return ""
    return (f"warning: {ranks} ranks share {cores} cores on this node (oversubscribed): "
            "MPI busy-polls, so timings are dominated by the OS scheduler (bench/README.md)")


def main(args: argparse.Namespace) -> int:
    comm = MPI.COMM_WORLD.Dup()
    rank, n = comm.Get_rank(), comm.Get_size()
    mpi_env = " ".join(f"{k}={v}" for k, v in sorted(os.environ.items())
                       if k.startswith(("MPIR_CVAR_", "MPICH_", "OMPI_MCA_", "FCOLL_")))
    meta = {
        "n": n,
        "thread_level": thread_level_name(MPI.Query_thread()),
        "mpi4py": mpi4py.__version__,
        "mpi_library": " ".join(MPI.Get_library_version().splitlines()[0].split()),
        "fcoll": fcoll.__version__,
        "numpy": np.__version__,
        "mpi_env": mpi_env,
        "fcoll_results": "dropped" if args.drop_results else "kept",
    }
    warning = cores_per_node_check(comm)
    if rank == 0 and warning:
        print(warning, file=sys.stderr, flush=True)
    rows: list[dict[str, Any]] = []
    start = time.perf_counter()
    warm = make_case("all_reduce", 8, comm, rank, n, keep=True)
    for _ in range(200):  # wake the cores, fill caches and lazily built state
        warm.first_call()
        warm.raw_call()
    for op in args.ops:
        for nbytes in args.sizes:
            case = make_case(op, nbytes, comm, rank, n, keep=not args.drop_results)
            if rows and rows[-1]["op"] == op and rows[-1]["batches"] == 1 and \
                    max(rows[-1]["fcoll_us"], rows[-1]["raw_us"]) > args.max_call_s * 1e6:
                if rank == 0:
                    print(f"  {op} {human(nbytes)}: skipped (a smaller size took "
                          f"> {args.max_call_s} s per call)", file=sys.stderr, flush=True)
                continue
            rows.append(measure(case, comm, args))
            if rank == 0:
                r = rows[-1]
                print(f"  {op} {human(r['bytes'])}: fcoll {r['fcoll_us']:.1f} us, "
                      f"raw {r['raw_us']:.1f} us ({r['iters']} calls x {r['batches']})",
                      file=sys.stderr, flush=True)
    if rank == 0:
        suffix = "" if meta["thread_level"] == "serialized" else f"_{meta['thread_level']}"
        path = args.csv or Path(__file__).parent / "results" / f"core_n{n}{suffix}.csv"
        report(rows, meta, path, warning)
        print(f"total {time.perf_counter() - start:.0f} s", file=sys.stderr)
    comm.Free()
    return 0


if __name__ == "__main__":
    sys.exit(main(ARGS))
