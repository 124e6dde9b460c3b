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
  difference between the two copies' final parameters. Four variants: gloo, fcoll (the
  engine runs the buckets' all-reduces while backward goes on), "inline" (fcoll with the
  engine off: each bucket all-reduced inside DDP's hook, as before issue 41) and "local"
  (the model without DDP: the step's computation). ``comm`` = inline - local is the
  communication a step waits for without overlap, ``hidden`` = inline - fcoll the part the
  engine hides (medians of per-step differences);
- an FSDP2 step (``fully_shard`` per linear layer) on gloo, fcoll and fcoll inline.

``--busy K`` starts K processes that keep a core busy beside the job (the outside load of a
shared machine). One thread per rank (``torch.set_num_threads(1)``). Rows are appended to
``--csv``; ``--plot PNG`` draws the latest rows.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

import argparse
import statistics
import subprocess
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
from fcoll.torch import work

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


def all_reduce_row(nbytes: int, groups: dict[str, Any], reps: int, rounds: int,
                   busy: int = 0) -> dict[str, object]:
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
    row: dict[str, object] = {"kind": "all_reduce", "n": dist.get_world_size(), "bytes": nbytes,
                              "busy": busy}
    for name, values in times.items():
        row[f"{name}_us"] = round(statistics.median(values) * 1e6, 2)
    row["ratio"] = round(float(str(row["fcoll_us"])) / float(str(row["gloo_us"])), 3)
    return row


def _stepper(name: str, step: Callable[[], object]) -> Callable[[], object]:
    """``step`` as the variant ``name`` runs it: "inline" with the engine off (every
    collective in the calling thread, as before the engine), the others as they are."""
    if name != "inline":
        return step

    def inline() -> object:
        work.DEFER = False
        try:
            return step()
        finally:
            work.DEFER = True

    return inline


def _in_turns(steps: dict[str, Callable[[int], object]], count: int, warmup: int) -> dict[str, list[float]]:
    """Each variant's step ``count`` times, in turns (a different one first each time),
    timed on the slowest rank; the first ``warmup`` left out."""
    times: dict[str, list[float]] = {name: [] for name in steps}
    names = list(steps)
    for i in range(warmup + count):
        k = i % len(names)
        for name in names[k:] + names[:k]:
            seconds = slowest(lambda name=name, i=i: _stepper(name, lambda: steps[name](i))())
            if i >= warmup:
                times[name].append(seconds)
    return times


def _train_in_turns(models: dict[str, torch.nn.Module], steps: int, warmup: int,
                    batch: int) -> dict[str, list[float]]:
    """Each model's training step (SGD with momentum, this rank's share of the same global
    batches) in turns (`_in_turns`)."""
    r, n = dist.get_rank(), dist.get_world_size()
    opts = {name: torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9) for name, m in models.items()}
    per = batch // n
    data = [(x[r * per : (r + 1) * per], y[r * per : (r + 1) * per])
            for x, y in batches(warmup + steps, batch)]
    return _in_turns({name: (lambda i, name=name: ddp_step(models[name], opts[name], *data[i]))
                      for name in models}, steps, warmup)


def _summary(row: dict[str, object], times: dict[str, list[float]]) -> dict[str, object]:
    """Medians per variant, the paired ratios to gloo, and what the engine hid: the
    communication of a step (inline - local) and the part of it no longer waited for
    (inline - fcoll), per step."""
    for name, values in times.items():
        row[f"{name}_ms"] = round(statistics.median(values) * 1e3, 2)
    pairs = {name: statistics.median(a / b for a, b in zip(times[name], times["gloo"], strict=True))
             for name in ("fcoll", "inline")}
    row["ratio"], row["inline_ratio"] = round(pairs["fcoll"], 3), round(pairs["inline"], 3)
    if "local" in times:
        row["comm_ms"] = round(statistics.median(
            a - b for a, b in zip(times["inline"], times["local"], strict=True)) * 1e3, 2)
    row["hidden_ms"] = round(statistics.median(
        a - b for a, b in zip(times["inline"], times["fcoll"], strict=True)) * 1e3, 2)
    return row


def ddp_row(hidden: int, steps: int, warmup: int, batch: int, cap: float,
            groups: dict[str, Any], busy: int) -> dict[str, object]:
    """DDP over each group on the same model and batches, step by step in turns: on gloo,
    on fcoll with the engine ("fcoll"), on fcoll with every call inline ("inline"), and
    the model alone without DDP ("local": the step's computation)."""
    n = dist.get_world_size()
    pgs = {"gloo": groups["gloo"], "fcoll": groups["fcoll"], "inline": groups["fcoll"]}
    nets: dict[str, torch.nn.Module] = {
        name: DistributedDataParallel(make_model(FEATURES, hidden, CLASSES, seed=0),
                                      process_group=pg, bucket_cap_mb=cap)
        for name, pg in pgs.items()}
    nets["local"] = make_model(FEATURES, hidden, CLASSES, seed=0)
    times = _train_in_turns(nets, steps, warmup, batch)
    diff = max(float((a.detach() - b.detach()).abs().max()) for a, b in
               zip(nets["fcoll"].parameters(), nets["gloo"].parameters(), strict=True))
    row: dict[str, object] = {"kind": "ddp", "n": n, "hidden": hidden, "busy": busy,
                              "params": sum(p.numel() for p in nets["local"].parameters())}
    row = _summary(row, times)
    row["max_abs_diff"] = float(fc.all_reduce(np.array([diff]), "max")[0])
    return row


def fsdp_row(hidden: int, steps: int, warmup: int, batch: int, groups: dict[str, Any],
             busy: int) -> dict[str, object]:
    """An FSDP2 step (``fully_shard`` per linear layer and the model) over each group, in
    turns: gloo, fcoll with the engine, fcoll inline."""
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard

    n = dist.get_world_size()
    pgs = {"gloo": groups["gloo"], "fcoll": groups["fcoll"], "inline": groups["fcoll"]}
    models: dict[str, torch.nn.Module] = {}
    for name, pg in pgs.items():
        mesh = DeviceMesh.from_group(pg, "cpu")
        model = make_model(FEATURES, hidden, CLASSES, seed=0)
        for layer in model:
            if isinstance(layer, torch.nn.Linear):
                fully_shard(layer, mesh=mesh)
        models[name] = fully_shard(model, mesh=mesh)
    times = _train_in_turns(models, steps, warmup, batch)
    row: dict[str, object] = {"kind": "fsdp2", "n": n, "hidden": hidden, "busy": busy,
                              "params": sum(p.numel() for p in make_model(FEATURES, hidden, CLASSES,
                                                                          seed=0).parameters())}
    return _summary(row, times)


def busy_processes(count: int) -> list[subprocess.Popen[bytes]]:
    """``count`` processes that each keep a core busy (rank 0 starts them): the outside
    load of a shared machine."""
    if count <= 0 or dist.get_rank() != 0:
        return []
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]


def plot(rows_csv: Path, out: Path) -> None:
    """Time on "fcoll" over gloo's (latest rows): all_reduce per message size, one line per
    world size (dashed: the 0.5 target), and the DDP and FSDP2 steps per model, world size
    and outside load, with the engine and inline (dashed: the 0.8 target)."""
    import csv

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    latest = {(r["kind"], int(r["n"]), int(r.get("bytes") or r.get("hidden") or 0),
               int(r.get("busy") or 0)): r
              for r in csv.DictReader(rows_csv.open())}
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 3.8), width_ratios=(2, 3))
    for n in sorted({k[1] for k in latest if k[0] == "all_reduce"}):
        rows = sorted((k[2], float(r["ratio"])) for k, r in latest.items()
                      if k[0] == "all_reduce" and k[1] == n and k[3] == 0)
        left.plot([b for b, _ in rows], [v for _, v in rows], "o-", label=f"n = {n}")
    left.axhline(0.5, color="black", lw=0.8, ls="--")
    left.set_xscale("log", base=2)
    left.set_xlabel("all_reduce message bytes per rank (float32)")
    left.set_ylabel('time on "fcoll" / on gloo')
    left.set_ylim(0, 1.1)
    left.legend(fontsize=8)
    steps = sorted((k[0], k[3], k[1], int(r["params"]), r) for k, r in latest.items()
                   if k[0] in ("ddp", "fsdp2") and r.get("inline_ratio"))
    x = range(len(steps))
    right.bar([i - 0.2 for i in x], [float(r["ratio"]) for *_, r in steps], 0.4,
              color="tab:green", label="engine")
    right.bar([i + 0.2 for i in x], [float(r["inline_ratio"]) for *_, r in steps], 0.4,
              color="tab:gray", label="inline (no engine)")
    right.set_xticks(list(x), [f"{kind}\nn={n}\n{p / 1e6:.1f}M\n{'busy' if busy else 'quiet'}"
                               for kind, busy, n, p, _ in steps], fontsize=6.5)
    right.axhline(0.8, color="black", lw=0.8, ls="--")
    right.set_ylim(0, 1.15)
    right.legend(fontsize=8)
    right.set_title("training step, fcoll / gloo", fontsize=9)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def report(rows: list[dict[str, object]]) -> None:
    print("| n | message | gloo µs | fcoll µs | fcoll / gloo |\n|---:|---:|---:|---:|---:|")
    for row in (r for r in rows if r["kind"] == "all_reduce"):
        print(f"| {row['n']} | {human(int(str(row['bytes'])))} | {row['gloo_us']} | "
              f"{row['fcoll_us']} | {row['ratio']:.2f} |")
    print("\n| step | n | busy | parameters | gloo ms | fcoll ms | inline ms | fcoll / gloo "
          "| inline / gloo | comm ms | hidden ms | final parameters |\n"
          "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for row in (r for r in rows if r["kind"] in ("ddp", "fsdp2")):
        diff = row.get("max_abs_diff", "")
        same = "" if diff == "" else "bit-identical" if diff == 0.0 else \
            f"max abs diff {float(str(diff)):.1e}"
        print(f"| {row['kind']} | {row['n']} | {row['busy']} | {int(str(row['params'])) / 1e6:.2f} M "
              f"| {row['gloo_ms']} | {row['fcoll_ms']} | {row['inline_ms']} | {row['ratio']:.2f} "
              f"| {row['inline_ratio']:.2f} | {row.get('comm_ms', '')} | {row['hidden_ms']} "
              f"| {same} |")


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
    parser.add_argument("--fsdp-hidden", type=int, nargs="*", default=[1024])
    parser.add_argument("--busy", type=int, default=0,
                        help="processes that keep a core busy beside the job (rank 0 starts them)")
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
    busy = busy_processes(args.busy)
    try:
        rows = [all_reduce_row(parse_size(s), groups, args.reps, args.rounds, args.busy)
                for s in args.sizes]
        rows += [ddp_row(h, args.steps, args.warmup, args.batch, args.bucket_cap_mb, groups,
                         args.busy) for h in args.hidden]
        rows += [fsdp_row(h, args.steps, args.warmup, args.batch, groups, args.busy)
                 for h in args.fsdp_hidden]
    finally:
        for p in busy:
            p.kill()
    dist.destroy_process_group()
    if fc.get_rank() == 0:
        report(rows)
        fields = list(dict.fromkeys(k for row in rows for k in row))  # both kinds in one CSV
        append_rows(args.csv, [{k: row.get(k, "") for k in fields} for row in rows])


if __name__ == "__main__":
    main()
