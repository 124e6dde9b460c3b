"""Across nodes: fcoll against raw mpi4py on a cluster simulated on this machine.

    python bench/nodes.py [--layouts 2x2 2x1 4x1] [--launches 3] [--sizes 8 512 4K 64K 1M 8M]
                          [--tune] [--rate 10gbit] [--out bench/results/nodes]

Each layout ``KxM`` runs `bench/collectives.py` (fcoll and raw mpi4py interleaved in timed
batches, the slowest rank's time per batch, medians; ``raw``: MPICH's own MPI_Allreduce,
MPI_Allgather, ... on preallocated buffers) under ``scripts/cluster-sim.sh K M``: MPICH's
fake nodes, TCP between them on ``lo`` inside a private network namespace (``--rate``: tc
tbf caps its bandwidth). The whole set of layouts is launched ``--launches`` times, the
layouts interleaved, and each cell reports the median over launches of fcoll/raw (the
per-launch value is itself the median of paired batches): this machine's timings move 2-5x
between launches (4 ranks on 2 cores), so a cell's spread is printed beside it.

``--tune`` first measures the two sizes `fcoll.backends.nodes` ships: up to which size the
redundant all-reduce beats the multi-leader one (`nodes.REDUNDANT`), and which piece size
pipelines the multi-leader all-reduce best (`nodes.PIPELINE`), on 2 x 2 against raw.

Writes ``OUT.csv`` (every launch's rows, with the layout), ``OUT.md`` (the table with the
issue's targets: all_reduce <= 0.6x raw from 64 KiB on 2 x 2 and <= 1.0x everywhere; the
movement ops <= 1.0x) and ``docs/img/nodes.png`` (fcoll/raw against size, one panel per op).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
from common import CORE_OPS, human, parse_size  # noqa: E402

SIM = ROOT / "scripts" / "cluster-sim.sh"
MOVEMENT = ("all_gather_into_tensor", "reduce_scatter_tensor", "all_to_all_single", "broadcast")
ALL_REDUCE_FROM, ALL_REDUCE_TARGET, TARGET = 64 << 10, 0.6, 1.0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--layouts", nargs="+", default=["2x2", "2x1", "4x1"])
    p.add_argument("--launches", type=int, default=3)
    p.add_argument("--sizes", nargs="+", default=["8", "512", "4K", "64K", "1M", "8M"])
    p.add_argument("--ops", nargs="+", default=list(CORE_OPS), choices=CORE_OPS)
    p.add_argument("--batches", type=int, default=9)
    p.add_argument("--tune", action="store_true", help="measure REDUNDANT and PIPELINE first")
    p.add_argument("--rate", help="cap lo's bandwidth (tc tbf), e.g. 10gbit")
    p.add_argument("--out", type=Path, default=HERE / "results" / "nodes")
    p.add_argument("--plot", type=Path, default=ROOT / "docs" / "img" / "nodes.png")
    p.add_argument("--worker-tune", action="store_true", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def simulate(layout: str, args: list[str], rate: str | None) -> subprocess.CompletedProcess[str]:
    """``args`` on every rank of the simulated ``layout`` (``KxM``)."""
    k, m = layout.split("x")
    extra = ["--rate", rate] if rate else []
    env = {**os.environ, "MPIEXEC_TIMEOUT": "900", "FCOLL_STALL_WARN": "0"}
    return subprocess.run(["bash", str(SIM), k, m, *extra, "--", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=1200)


def one_launch(layout: str, a: argparse.Namespace) -> list[dict[str, str]]:
    """The rows of one run of bench/collectives.py on ``layout``."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "rows.csv"
        done = simulate(layout, [sys.executable, "-m", "mpi4py", str(HERE / "collectives.py"),
                                 "--csv", str(out), "--impls", "fcoll", "raw", "--ops", *a.ops,
                                 "--sizes", *a.sizes, "--batches", str(a.batches)], a.rate)
        if done.returncode != 0 or not out.exists():
            raise SystemExit(f"{layout}: the worker failed:\n{done.stdout[-2000:]}{done.stderr[-3000:]}")
        if "refused" in done.stderr:
            print(f"  note: {done.stderr.strip().splitlines()[-1]}", file=sys.stderr)
        with out.open() as f:
            return [{**r, "layout": layout} for r in csv.DictReader(f)]


def cells(rows: list[dict[str, str]]) -> dict[tuple[str, str, int], list[float]]:
    """(layout, op, bytes) -> fcoll/raw of every launch."""
    out: dict[tuple[str, str, int], list[float]] = defaultdict(list)
    for r in rows:
        if r["impl"] == "fcoll" and r.get("vs_raw"):
            out[(r["layout"], r["op"], int(r["bytes"]))].append(float(r["vs_raw"]))
    return out


def target(layout: str, op: str, nbytes: int) -> float:
    if op == "all_reduce" and layout == "2x2" and nbytes >= ALL_REDUCE_FROM:
        return ALL_REDUCE_TARGET
    return TARGET


def table(found: dict[tuple[str, str, int], list[float]], layouts: list[str]) -> str:
    """Markdown: one row per (op, size), one column per layout: median fcoll/raw [min-max],
    with a mark where the target is missed."""
    sizes = sorted({key[2] for key in found})
    ops = list(dict.fromkeys(key[1] for key in found))
    lines = ["| op | bytes per rank | " + " | ".join(layouts) + " |",
             "|---|---:|" + "---:|" * len(layouts)]
    for op in ops:
        for nbytes in sizes:
            row = []
            for layout in layouts:
                values = found.get((layout, op, nbytes))
                if not values:
                    row.append("")
                    continue
                med = statistics.median(values)
                miss = " **miss**" if med > target(layout, op, nbytes) else ""
                row.append(f"{med:.2f} [{min(values):.2f}-{max(values):.2f}]{miss}")
            lines.append(f"| {op} | {human(nbytes)} | " + " | ".join(row) + " |")
    return "\n".join(lines)


def plot(found: dict[tuple[str, str, int], list[float]], layouts: list[str], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ops = list(dict.fromkeys(key[1] for key in found))
    fig, axes = plt.subplots(1, len(ops), figsize=(4.2 * len(ops), 3.6), squeeze=False)
    for ax, op in zip(axes[0], ops, strict=True):
        for layout in layouts:
            pts = sorted((b, statistics.median(v)) for (lay, o, b), v in found.items()
                         if lay == layout and o == op)
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", ms=3, label=layout)
        ax.axhline(1.0, color="gray", lw=0.8, ls="--")
        if op == "all_reduce":
            ax.axhline(ALL_REDUCE_TARGET, color="tab:red", lw=0.8, ls=":", label="0.6 (2x2 target)")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("bytes per rank")
        ax.set_ylabel("fcoll / raw mpi4py (median)")
        ax.set_title(op, fontsize=10)
        ax.legend(fontsize=7)
    fig.suptitle("Simulated cluster (MPICH fake nodes, TCP on lo): fcoll / raw, lower is better",
                 fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def worker_tune() -> None:
    """Under cluster-sim (2 x 2): fcoll/raw all_reduce with the redundant or the multi-leader
    schedule (4 KiB-1 MiB), and with pieces of 256 KiB-4 MiB or none (1-8 MiB); JSON lines."""
    import time

    import numpy as np

    import fcoll as fc
    from fcoll.backends import nodes
    from fcoll.runtime import mpi

    MPI = mpi()
    world = MPI.COMM_WORLD

    def timed(fn: Any, iters: int) -> float:
        world.Barrier()
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        return world.allreduce(time.perf_counter() - t0, op=MPI.MAX) / iters

    def sweep(kind: str, nbytes: int, settings: dict[str, tuple[str, int]]) -> None:
        x = np.ones(nbytes // 4, np.float32)
        out = np.empty_like(x)
        iters = max(2, min(200, (20 << 20) // nbytes))
        ratios: dict[str, list[float]] = {name: [] for name in settings}
        for _ in range(9):
            raw = timed(lambda: world.Allreduce(x, out), iters)
            for name, (attr, value) in settings.items():
                saved = getattr(nodes, attr)
                setattr(nodes, attr, value)
                fc.all_reduce(x)
                ratios[name].append(timed(lambda: fc.all_reduce(x), iters) / raw)
                setattr(nodes, attr, saved)
        if world.Get_rank() == 0:
            print(json.dumps({"kind": kind, "bytes": nbytes, **{k: statistics.median(v)
                                                                  for k, v in ratios.items()}}),
                  flush=True)

    fc.all_reduce(np.ones(4, np.float32))
    for nbytes in (4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20):
        sweep("redundant", nbytes, {"redundant": ("REDUNDANT", 1 << 40),
                                    "multi-leader": ("REDUNDANT", 0)})
    never = 1 << 40
    for nbytes in (1 << 20, 8 << 20):
        sweep("pipeline", nbytes, {"none": ("PIPELINE", never), "256K": ("PIPELINE", 256 << 10),
                                   "1M": ("PIPELINE", 1 << 20), "4M": ("PIPELINE", 4 << 20)})


def tune(a: argparse.Namespace) -> list[dict[str, Any]]:
    done = simulate("2x2", [sys.executable, str(Path(__file__).resolve()), "--worker-tune"],
                    a.rate)
    if done.returncode != 0:
        raise SystemExit(f"tuning failed:\n{done.stderr[-3000:]}")
    rows = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    for r in rows:
        values = "  ".join(f"{k} {v:.2f}" for k, v in r.items() if k not in ("kind", "bytes"))
        print(f"  {r['kind']:<10} {human(r['bytes']):>8}: {values}")
    return rows


def main(a: argparse.Namespace) -> int:
    if a.worker_tune:
        worker_tune()
        return 0
    a.sizes = [str(parse_size(s)) for s in a.sizes]
    a.out.parent.mkdir(parents=True, exist_ok=True)
    if a.tune:
        print("tuning on 2x2 (fcoll/raw all_reduce, median of 9 interleaved rounds):")
        tuned = tune(a)
        a.out.with_suffix(".tune.json").write_text(json.dumps(tuned, indent=1) + "\n")
    rows: list[dict[str, str]] = []
    for launch in range(a.launches):
        for layout in a.layouts:
            print(f"launch {launch + 1}/{a.launches}: {layout}", file=sys.stderr, flush=True)
            rows += [{**r, "launch": str(launch)} for r in one_launch(layout, a)]
    fields = list(dict.fromkeys(k for r in rows for k in r))
    with a.out.with_suffix(".csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields)
        writer.writeheader()
        writer.writerows(rows)
    found = cells(rows)
    text = table(found, a.layouts)
    a.out.with_suffix(".md").write_text(text + "\n")
    print(text)
    plot(found, a.layouts, a.plot)
    missed = sum(statistics.median(v) > target(*key) for key, v in found.items())
    print(f"\n{missed} of {len(found)} cells miss their target; wrote {a.out}.csv, .md, {a.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main(parse_args()))
