"""fcoll's all-to-alls against raw mpi4py on one node, in the same processes (issue 42).

    mpiexec -n 2 .venv/bin/python bench/alltoall.py [--batches 9] [--out bench/results/x]
    .venv/bin/python bench/alltoall.py --plot bench/results/x   # after runs at n = 2 and 4

Per case and size (bytes of one rank's input, 8 B .. 8 MiB of float32), in rotating batches
(a batch's time is the slowest rank's; the median of per-batch ratios is reported):

- ``even``: ``fc.all_to_all_single(x)`` against ``comm.Alltoall(x, out)`` into an output
  allocated once (``FCOLL_SHM=0`` in the environment: fcoll on MPI's path, for comparison);
- ``uneven``: ``fc.all_to_all_single(x, outs, ins)`` with splits that differ per rank (both
  given, as a mixture-of-experts layer knows them) against ``comm.Alltoallv`` with the counts
  and offsets made once;
- ``lists``: ``fc.all_to_all(chunks)`` (n arrays of different lengths) against
  ``comm.Alltoallv`` of the packed chunks (counts made once).

Writes ``alltoall.csv`` (appends a run per world size) and prints the table; ``--plot`` draws
``alltoall.png`` (fcoll/raw against size, a panel per case) and ``alltoall.md``.
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from common import human, rotating  # noqa: E402

SIZES = [8, 64, 512, 4 << 10, 32 << 10, 256 << 10, 1 << 20, 4 << 20, 8 << 20]
CASES = ("even", "uneven", "lists")
TARGET = 0.8  # issue 42: fcoll/raw at 8 B .. 8 MiB, n = 2 and 4
Fn = Callable[[], Any]


def splits(n: int, rank: int, count: int) -> list[list[int]]:
    """Every rank's input split sizes (elements): ``count`` in all per rank, uneven."""
    table = []
    for p in range(n):
        weights = [1 + (p + j) % 3 for j in range(n)]
        sizes = [count * w // sum(weights) for w in weights]
        sizes[p] += count - sum(sizes)
        table.append(sizes)
    return table


def cells(comm: Any, size: int, batches: int, budget: float) -> dict[str, dict[str, list[float]]]:
    from mpi4py import MPI

    import fcoll as fc

    n, r = comm.Get_size(), comm.Get_rank()
    count = max(n, size // 4 // n * n)
    x = np.arange(count, dtype=np.float32) + r
    out = np.empty_like(x)
    even = {"fcoll": lambda: fc.all_to_all_single(x), "raw": lambda: comm.Alltoall(x, out)}
    table = splits(n, r, count)
    ins, outs = table[r], [table[p][r] for p in range(n)]
    recv = np.empty(sum(outs), np.float32)
    send_spec = [x, (ins, list(np.cumsum([0, *ins[:-1]]))), MPI.FLOAT]
    recv_spec = [recv, (outs, list(np.cumsum([0, *outs[:-1]]))), MPI.FLOAT]
    uneven = {"fcoll": lambda: fc.all_to_all_single(x, outs, ins),
              "raw": lambda: comm.Alltoallv(send_spec, recv_spec)}
    chunks = np.split(x, np.cumsum(ins)[:-1])
    lists = {"fcoll": lambda: fc.all_to_all(chunks),
             "raw": lambda: comm.Alltoallv(send_spec, recv_spec)}
    return {case: rotating(comm, impls, batches, budget, most=3000)
            for case, impls in (("even", even), ("uneven", uneven), ("lists", lists))}


def run(args: argparse.Namespace) -> None:
    import fcoll as fc

    fc.init()
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    n = comm.Get_size()
    rows = []
    for size in args.sizes:
        for case, times in cells(comm, size, args.batches, args.budget).items():
            for impl, values in times.items():
                ratio = statistics.median(a / b for a, b in zip(values, times["raw"], strict=True))
                rows.append({"n": n, "case": case, "size": size, "impl": impl,
                             "median_us": statistics.median(values) * 1e6, "ratio": ratio})
            if comm.Get_rank() == 0:
                print(f"n={n} {case:7} {human(size):>8}  " + "  ".join(
                    f"{r['impl']} {r['median_us']:9.1f} us ({r['ratio']:.2f})"
                    for r in rows if r["case"] == case and r["size"] == size), flush=True)
    if comm.Get_rank() == 0 and args.out:
        path = Path(args.out) / "alltoall.csv"
        path.parent.mkdir(parents=True, exist_ok=True)
        new = not path.exists()
        with path.open("a", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            if new:
                writer.writeheader()
            writer.writerows(rows)


def report(folder: Path) -> None:
    """``alltoall.md`` (fcoll/raw per case, size and n) and ``alltoall.png``."""
    with (folder / "alltoall.csv").open() as f:
        rows = list(csv.DictReader(f))
    cell: dict[tuple[str, int, int], dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for r in rows:
        cell[(r["case"], int(r["n"]), int(r["size"]))][r["impl"]].append(float(r["ratio"]))
    ns = sorted({int(r["n"]) for r in rows})
    lines = [f"fcoll/raw (median of per-batch ratios; target <= {TARGET})", "",
             "| case | size | " + " | ".join(f"n = {n}" for n in ns) + " |",
             "|---|---:|" + "---:|" * len(ns)]
    for case in CASES:
        for size in SIZES:
            ratios = [cell.get((case, n, size), {}).get("fcoll") for n in ns]
            if any(ratios):
                lines.append(f"| {case} | {human(size)} | " + " | ".join(
                    f"{statistics.median(v):.2f}" if v else "-" for v in ratios) + " |")
    (folder / "alltoall.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(CASES), figsize=(4 * len(CASES), 3.4), sharey=True)
    for ax, case in zip(axes, CASES, strict=True):
        for n in ns:
            points = [(s, statistics.median(cell[(case, n, s)]["fcoll"])) for s in SIZES
                      if (case, n, s) in cell]
            ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=f"n = {n}")
        ax.axhline(TARGET, color="gray", linestyle="--", linewidth=1)
        ax.axhline(1.0, color="black", linewidth=0.5)
        ax.set_xscale("log", base=2)
        ax.set_title(f"{case}: fcoll / raw mpi4py")
        ax.set_xlabel("bytes per rank")
    axes[0].set_ylabel("time ratio (lower is faster)")
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(folder / "alltoall.png", dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=9)
    parser.add_argument("--budget", type=float, default=0.03, help="seconds per batch")
    parser.add_argument("--sizes", type=int, nargs="+", default=SIZES)
    parser.add_argument("--out", default="")
    parser.add_argument("--plot", default="", help="a folder with alltoall.csv: write the report")
    args = parser.parse_args()
    if args.plot:
        report(Path(args.plot))
    else:
        run(args)


if __name__ == "__main__":
    main()
