"""torch.distributed on the backend "fcoll" against gloo, in the same job (issue 29).

    mpiexec -n 2 .venv/bin/python bench/bench_torch_backend.py [--sizes 1KiB 1MiB] [--hidden 1024]

The default group is ``dist.init_process_group("fcoll")`` with no argument; a gloo group of
every rank is made beside it (``dist.new_group(backend="gloo")``, on the same store). Two
measurements:

- ``dist.all_reduce`` (float32, sum, in place) per message size on each group: rounds of
  ``--reps`` calls between barriers, the two backends in turns (each first in turn), the
  median over ``--rounds`` rounds of the slowest rank's time per call;
- a DDP step (bench/bench_torch_ddp.py's model, examples/train_torch.py's MLP, batch 128
  split over the ranks, SGD with momentum, ``--bucket-cap-mb`` buckets) with
  ``DistributedDataParallel`` over each group, step by step in turns; each step timed
  between barriers as the slowest rank's time, the ratio paired per step, and the largest
  difference between the two copies' final parameters.

One thread per rank. Rows are appended to ``--csv``; ``--plot PNG`` draws the latest rows.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import fcoll as fc
import fcoll.torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))
sys.path.insert(0, str(ROOT / "bench"))
from bench_torch_ddp import FEATURES, batches, ddp_step  # noqa: E402
from common import append_rows, human, parse_size  # noqa: E402
from train_torch import make_model  # noqa: E402

CLASSES = 10
SIZES = ["1KiB", "16KiB", "256KiB", "1MiB", "4MiB", "16MiB"]


def slowest(fn: Callable[[], object]) -> float:
    """Seconds ``fn`` took on the slowest rank (barriers outside the timed region)."""
    fc.barrier()
    start = time.perf_counter()
    fn()
    return float(fc.all_reduce(np.array([time.perf_counter() - start]), "max")[0])


def all_reduce_row(nbytes: int, groups: dict[str, Any], reps: int, rounds: int) -> dict[str, object]:
    """Per-call time of ``dist.all_reduce`` on each group, in turns."""
    t = torch.ones(max(1, nbytes // 4))
    times: dict[str, list[float]] = {name: [] for name in groups}
    for i in range(rounds + 1):
        order = list(groups.items())
        for name, pg in order[i % 2 :] + order[: i % 2]:
            seconds = slowest(lambda pg=pg: [dist.all_reduce(t, group=pg) for _ in range(reps)])
            if i:  # the first round warms up
                times[name].append(seconds / reps)
        t.fill_(1.0)
    row: dict[str, object] = {"kind": "all_reduce", "n": dist.get_world_size(), "bytes": nbytes}
    for name, values in times.items():
        row[f"{name}_us"] = round(statistics.median(values) * 1e6, 2)
    row["ratio"] = round(float(str(row["fcoll_us"])) / float(str(row["gloo_us"])), 3)
    return row


def ddp_row(hidden: int, steps: int, warmup: int, batch: int, cap: float,
            groups: dict[str, Any]) -> dict[str, object]:
    """DDP over each group on the same model and batches, step by step in turns."""
    r, n = dist.get_rank(), dist.get_world_size()
    nets = {name: DistributedDataParallel(make_model(FEATURES, hidden, CLASSES, seed=0),
                                          process_group=pg, bucket_cap_mb=cap)
            for name, pg in groups.items()}
    opts = {name: torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9) for name, m in nets.items()}
    times: dict[str, list[float]] = {name: [] for name in nets}
    per = batch // n
    for i, (x, y) in enumerate(batches(warmup + steps, batch)):
        xs, ys = x[r * per : (r + 1) * per], y[r * per : (r + 1) * per]
        order = list(nets)
        for name in order[i % 2 :] + order[: i % 2]:
            seconds = slowest(lambda name=name, xs=xs, ys=ys: ddp_step(nets[name], opts[name], xs, ys))
            if i >= warmup:
                times[name].append(seconds)
    diff = max(float((a.detach() - b.detach()).abs().max()) for a, b in
               zip(nets["fcoll"].parameters(), nets["gloo"].parameters(), strict=True))
    row: dict[str, object] = {"kind": "ddp", "n": n, "hidden": hidden,
                              "params": sum(p.numel() for p in nets["gloo"].parameters())}
    for name, values in times.items():
        row[f"{name}_ms"] = round(statistics.median(values) * 1e3, 2)
    row["ratio"] = round(statistics.median(a / b for a, b in
                                           zip(times["fcoll"], times["gloo"], strict=True)), 3)
    row["max_abs_diff"] = float(fc.all_reduce(np.array([diff]), "max")[0])
    return row


def plot(rows_csv: Path, out: Path) -> None:
    """Time on "fcoll" over gloo's (latest rows): all_reduce per message size, one line per
    world size (dashed: the 0.5 target), and the DDP step per model and world size (dashed:
    the 0.9 target)."""
    import csv

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    latest = {(r["kind"], int(r["n"]), int(r.get("bytes") or r.get("hidden") or 0)): r
              for r in csv.DictReader(rows_csv.open())}
    fig, (left, right) = plt.subplots(1, 2, figsize=(9.5, 3.6), width_ratios=(3, 2))
    for n in sorted({k[1] for k in latest if k[0] == "all_reduce"}):
        rows = sorted((k[2], float(r["ratio"])) for k, r in latest.items()
                      if k[0] == "all_reduce" and k[1] == n)
        left.plot([b for b, _ in rows], [v for _, v in rows], "o-", label=f"n = {n}")
    left.axhline(0.5, color="black", lw=0.8, ls="--")
    left.set_xscale("log", base=2)
    left.set_xlabel("all_reduce message bytes per rank (float32)")
    left.set_ylabel('time on "fcoll" / on gloo')
    left.set_ylim(0, 1.1)
    left.legend(fontsize=8)
    ddp = sorted((k[1], int(r["params"]), float(r["ratio"])) for k, r in latest.items()
                 if k[0] == "ddp")
    right.bar(range(len(ddp)), [v for _, _, v in ddp], color="tab:green")
    right.set_xticks(range(len(ddp)), [f"n = {n}\n{p / 1e6:.2f} M" for n, p, _ in ddp], fontsize=8)
    right.axhline(0.9, color="black", lw=0.8, ls="--")
    right.set_ylim(0, 1.1)
    right.set_title("DDP step", fontsize=9)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def report(rows: list[dict[str, object]]) -> None:
    print("| n | message | gloo µs | fcoll µs | fcoll / gloo |\n|---:|---:|---:|---:|---:|")
    for row in (r for r in rows if r["kind"] == "all_reduce"):
        print(f"| {row['n']} | {human(int(str(row['bytes'])))} | {row['gloo_us']} | "
              f"{row['fcoll_us']} | {row['ratio']:.2f} |")
    print("\n| n | parameters | DDP on gloo ms/step | DDP on fcoll ms/step | fcoll / gloo "
          "| final parameters |\n|---:|---:|---:|---:|---:|---|")
    for row in (r for r in rows if r["kind"] == "ddp"):
        same = "bit-identical" if row["max_abs_diff"] == 0.0 else \
            f"max abs diff {float(str(row['max_abs_diff'])):.1e}"
        print(f"| {row['n']} | {int(str(row['params'])) / 1e6:.2f} M | {row['gloo_ms']} | "
              f"{row['fcoll_ms']} | {row['ratio']:.2f} | {same} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--sizes", nargs="+", default=SIZES)
    parser.add_argument("--reps", type=int, default=20, help="all_reduce calls per round")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--hidden", type=int, nargs="*", default=[1024, 2048])
    parser.add_argument("--steps", type=int, default=30, help="timed DDP steps")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--bucket-cap-mb", type=float, default=25)
    parser.add_argument("--csv", type=Path, default=ROOT / "bench" / "results" / "torch_backend.csv")
    parser.add_argument("--plot", type=Path, metavar="PNG", help="only draw --csv into PNG")
    args = parser.parse_args()
    if args.plot is not None:
        plot(args.csv, args.plot)
        return
    torch.set_num_threads(1)
    dist.init_process_group("fcoll")
    if len(set(fc.all_gather_object(os.uname().nodename))) == 1:
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    groups = {"fcoll": dist.group.WORLD, "gloo": dist.new_group(backend="gloo")}
    rows = [all_reduce_row(parse_size(s), groups, args.reps, args.rounds) for s in args.sizes]
    rows += [ddp_row(h, args.steps, args.warmup, args.batch, args.bucket_cap_mb, groups)
             for h in args.hidden]
    dist.destroy_process_group()
    if fc.get_rank() == 0:
        report(rows)
        fields = list(dict.fromkeys(k for row in rows for k in row))  # both kinds in one CSV
        append_rows(args.csv, [{k: row.get(k, "") for k in fields} for row in rows])


if __name__ == "__main__":
    main()
