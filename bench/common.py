"""Shared by the benchmark worker and the launcher: sizes, ops, impls, bus-bandwidth factors."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

KiB, MiB = 1 << 10, 1 << 20
FULL_SIZES = [8, 64, 512, 4 * KiB, 32 * KiB, 256 * KiB, MiB, 4 * MiB, 16 * MiB, 64 * MiB]
QUICK_SIZES = [8, 4 * KiB, 256 * KiB, MiB, 16 * MiB]
OPS = ("all_reduce", "all_gather_into_tensor", "reduce_scatter_tensor", "all_to_all_single",
       "broadcast", "dp_average")
CORE_OPS = OPS[:5]
IMPLS = ("fcoll", "raw", "raw2", "pickle", "gloo")
DP_LEAVES = 100
# Targets of issue 7: fcoll/raw at the smallest size and at every size >= LARGE;
# gloo/fcoll at <= SMALL_GLOO and >= LARGE; dp_average/raw fused.
SMALL_TARGET, LARGE_TARGET, LARGE = 1.5, 1.05, MiB
GLOO_SMALL_TARGET, GLOO_LARGE_TARGET, SMALL_GLOO = 20.0, 2.0, 8 * KiB
DP_TARGET = 1.2
# Targets of issue 17 (on-node shared memory), all_reduce at n = 2: fcoll/raw <= SHM_TARGET
# from SHM_FROM bytes, <= SHM_MID_TARGET within SHM_MID (gloo >= 2x from LARGE: issue 7's).
SHM_TARGET, SHM_FROM, SHM_MID_TARGET, SHM_MID = 1.0, 32 * KiB, 0.6, (256 * KiB, MiB)


def bus_factor(op: str, n: int) -> float:
    """nccl-tests' busbw = algbw * factor (``S`` as in `bus_bytes`)."""
    if op in ("all_reduce", "dp_average"):
        return 2 * (n - 1) / n
    if op == "broadcast":
        return 1.0
    return (n - 1) / n


def bus_bytes(op: str, nbytes: int, n: int) -> int:
    """nccl-tests' ``S``: the larger of one rank's input and output."""
    return nbytes * n if op == "all_gather_into_tensor" else nbytes


def parse_size(text: str) -> int:
    """``"8"``, ``"4K"``, ``"1M"``, ``"64MiB"`` -> bytes (binary units)."""
    t = text.strip().upper().removesuffix("IB").removesuffix("B")
    scale = {"K": KiB, "M": MiB, "G": 1 << 30}.get(t[-1:], 1)
    return int(float(t[:-1] if scale > 1 else t) * scale)


def human(nbytes: int) -> str:
    for unit, scale in ((" MiB", MiB), (" KiB", KiB)):
        if nbytes >= scale and nbytes % scale == 0:
            return f"{nbytes // scale}{unit}"
    return f"{nbytes} B"


def append_rows(path: Path, rows: list[dict[str, object]]) -> None:
    """Append ``rows`` to the CSV at ``path`` (header first if it is new), each stamped with
    the UTC time in a leading ``date`` column."""
    import csv
    import datetime

    path.parent.mkdir(parents=True, exist_ok=True)
    new = not path.exists()
    with path.open("a", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=["date", *rows[0]])
        if new:
            writer.writeheader()
        stamp = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
        writer.writerows({"date": stamp, **row} for row in rows)


def batch(comm: Any, fn: Callable[[], Any], iters: int) -> float:
    """Seconds per call of ``iters`` calls of ``fn``, after a barrier: the slowest rank's."""
    from mpi4py import MPI

    comm.Barrier()
    start = time.perf_counter()
    for _ in range(iters):
        fn()
    return float(comm.allreduce(time.perf_counter() - start, op=MPI.MAX)) / iters


def rotating(comm: Any, impls: dict[str, Callable[[], Any]], batches: int, budget: float,
             most: int = 5000) -> dict[str, list[float]]:
    """``batches`` rounds of every implementation (`batch`), the order rotating per round;
    each one's calls per batch fill about ``budget`` seconds (at most ``most``, the same on
    every rank), after a warm-up call (fast paths, datatypes, pages)."""
    iters = {}
    for name, fn in impls.items():
        fn()
        once = batch(comm, fn, 1)
        iters[name] = int(comm.bcast(max(1, min(most, int(budget / max(once, 1e-7))))))
    times: dict[str, list[float]] = {k: [] for k in impls}
    names = list(impls)
    for b in range(batches):
        for name in names[b % len(names) :] + names[: b % len(names)]:
            times[name].append(batch(comm, impls[name], iters[name]))
    return times
