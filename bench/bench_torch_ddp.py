"""torch training data-parallel: `fcoll.dp` on tensors against torch DDP over gloo, same job.

    mpiexec -n 2 .venv/bin/python bench/bench_torch_ddp.py [--hidden 1024 2048] [--steps 30]

The model is examples/train_torch.py's MLP with 256 inputs (four linear layers: 2.37 M
parameters at ``--hidden 1024``, 8.93 M at 2048), built from the same seed four times on
every rank and trained four ways: wrapped in `torch.nn.parallel.DistributedDataParallel`
over gloo; with `fc.dp.average_gradients` on its tensors after backward
(examples/train_torch.py's ``train_step``); and with a `fc.dp.GradientAverager` that hooks
push each gradient to during backward (``OverlappedAverager``, DDP's overlap); and, for
scale, with one blocking `fc.all_reduce_coalesced` of the gradients (no `fcoll.dp`). All run
torch's SGD (momentum 0.9) on the same synthetic batches (each rank its slice of a global
batch of ``--batch``), step by step in turns (each going first in turn), so machine noise
falls on all alike. Each step is timed between barriers, as the slowest rank's time; the
first ``--warmup`` steps are not counted. DDP and fcoll use the same ``--bucket-cap-mb``.

Reported per model: the median step time of each, the ratios to DDP (the median over
steps of the step's time over DDP's in the same step: paired, as bench/run.py's), and
the largest absolute difference between DDP's final parameters and each fcoll copy's
(0: bit-identical).
One thread per rank (``torch.set_num_threads(1)``). Rows are appended to ``--csv``.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")  # one core per rank: no intra-op threads

import argparse
import csv
import functools
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import fcoll as fc

fc.init()
from mpi4py import MPI  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))
sys.path.insert(0, str(ROOT / "bench"))
from common import append_rows  # noqa: E402
from impls import start_gloo  # noqa: E402
from train_torch import OverlappedAverager, broadcast_model, make_model, train_step  # noqa: E402

FEATURES, CLASSES = 256, 10
VARIANTS = ("ddp", "fcoll", "overlap", "coalesced")


def batches(steps: int, batch: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The same synthetic global batches on every rank (labels from a fixed linear teacher)."""
    g = torch.Generator().manual_seed(0)
    teacher = torch.randn(FEATURES, CLASSES, generator=g)
    out = []
    for _ in range(steps):
        x = torch.randn(batch, FEATURES, generator=g)
        out.append((x, (x @ teacher).argmax(1)))
    return out


def ddp_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, x: torch.Tensor,
             y: torch.Tensor) -> float:
    """One DDP step: backward all-reduces the gradients (gloo, overlapped, divided by n)."""
    optimizer.zero_grad()
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    optimizer.step()
    return loss.item()


def coalesced_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, x: torch.Tensor,
                   y: torch.Tensor) -> float:
    """A step averaging with one blocking `fc.all_reduce_coalesced` (no `fcoll.dp`): what
    the averaging costs without the nonblocking buckets `fc.dp` waits on."""
    optimizer.zero_grad()
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    params = [p for p in model.parameters() if p.grad is not None]
    for p, grad in zip(params, fc.all_reduce_coalesced([p.grad for p in params], "avg"), strict=True):
        p.grad = grad
    optimizer.step()
    return loss.item()


def timed(step: Callable[[], object], comm: MPI.Comm) -> float:
    """Seconds one step took on the slowest rank (barriers outside the timed region)."""
    comm.Barrier()
    start = time.perf_counter()
    step()
    elapsed = time.perf_counter() - start
    return float(comm.allreduce(elapsed, op=MPI.MAX))


def compare(hidden: int, steps: int, warmup: int, batch: int, cap: float,
            comm: MPI.Comm) -> dict[str, object]:
    """Train the three copies side by side; their median step times and final differences."""
    r, n = comm.Get_rank(), comm.Get_size()
    models = {name: make_model(FEATURES, hidden, CLASSES, seed=0) for name in VARIANTS}
    ddp = DistributedDataParallel(models["ddp"], bucket_cap_mb=cap)  # broadcasts rank 0's
    broadcast_model(models["fcoll"])
    broadcast_model(models["overlap"])
    broadcast_model(models["coalesced"])
    overlapped = OverlappedAverager(models["overlap"], bucket_cap_mb=cap)
    opts = {name: torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9) for name, m in models.items()}
    per_rank = batch // n
    times: dict[str, list[float]] = {name: [] for name in VARIANTS}
    for i, (x, y) in enumerate(batches(warmup + steps, batch)):
        xs, ys = x[r * per_rank : (r + 1) * per_rank], y[r * per_rank : (r + 1) * per_rank]
        runs: list[tuple[str, Callable[[], object]]] = [
            ("ddp", functools.partial(ddp_step, ddp, opts["ddp"], xs, ys)),
            ("fcoll", functools.partial(train_step, models["fcoll"], opts["fcoll"], xs, ys)),
            ("overlap", functools.partial(train_step, models["overlap"], opts["overlap"], xs, ys,
                                          overlapped)),
            ("coalesced", functools.partial(coalesced_step, models["coalesced"], opts["coalesced"],
                                            xs, ys))]
        k = i % len(runs)
        for name, step in runs[k:] + runs[:k]:  # each goes first in turn
            t = timed(step, comm)
            if i >= warmup:
                times[name].append(t)
    row: dict[str, object] = {"n": n, "params": sum(p.numel() for p in models["ddp"].parameters()),
                              "hidden": hidden, "batch": batch, "steps": steps, "bucket_cap_mb": cap}
    ddp_ms = statistics.median(times["ddp"]) * 1e3
    row["ddp_ms"] = round(ddp_ms, 2)
    for name in VARIANTS[1:]:
        ms = statistics.median(times[name]) * 1e3
        diff = max(float((a.detach() - b.detach()).abs().max()) for a, b in
                   zip(models["ddp"].parameters(), models[name].parameters(), strict=True))
        row[f"{name}_ms"] = round(ms, 2)
        # Paired: the median over steps of this copy's time over DDP's in the same step.
        row[f"{name}_ratio"] = round(statistics.median(
            a / b for a, b in zip(times[name], times["ddp"], strict=True)), 3)
        row[f"{name}_max_abs_diff"] = float(comm.allreduce(diff, op=MPI.MAX))
    return row


def _same(diff: object) -> str:
    return "bit-identical" if diff == 0.0 else f"max abs diff {float(str(diff)):.1e}"


def plot(rows_csv: Path, out: Path) -> None:
    """Bars of the step time of each copy, from the last row of ``rows_csv`` for every
    (world size, model size), relative to DDP's."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    latest = {(r["n"], r["params"]): r for r in csv.DictReader(rows_csv.open())}
    labels = [f"n={n}, {int(p) / 1e6:.2f} M" for n, p in latest]
    fig, ax = plt.subplots(figsize=(7.5, 3.6))
    width = 0.8 / len(VARIANTS)
    names = {"ddp": "DDP (gloo)", "fcoll": "fc.dp.average_gradients", "overlap": "overlapped push",
             "coalesced": "blocking coalesced"}
    for k, name in enumerate(VARIANTS):
        values = [1.0 if name == "ddp" else float(r[f"{name}_ratio"]) for r in latest.values()]
        ax.bar([i + (k - 1.5) * width for i in range(len(labels))], values, width, label=names[name])
    ax.axhline(0.9, color="black", lw=0.8, ls="--")
    ax.set_xticks(range(len(labels)), labels)
    ax.set_ylabel("step time / DDP's (paired)")
    ax.set_ylim(0, 1.25)
    ax.legend(fontsize=8, ncol=4, loc="upper center")
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--hidden", type=int, nargs="+", default=[1024, 2048])
    parser.add_argument("--steps", type=int, default=30, help="timed steps")
    parser.add_argument("--warmup", type=int, default=5, help="untimed steps first")
    parser.add_argument("--batch", type=int, default=128, help="global batch")
    parser.add_argument("--bucket-cap-mb", type=float, default=25, help="DDP's and fcoll's")
    parser.add_argument("--csv", type=Path, default=ROOT / "bench" / "results" / "torch_ddp.csv")
    parser.add_argument("--plot", type=Path, metavar="PNG",
                        help="only draw the latest rows of --csv as bars into PNG, and exit")
    args = parser.parse_args()
    if args.plot is not None:
        plot(args.csv, args.plot)
        return
    torch.set_num_threads(1)
    comm = MPI.COMM_WORLD.Dup()
    why = start_gloo(comm)
    if why is not None:
        raise SystemExit(f"bench_torch_ddp: {why}")
    rows = [compare(h, args.steps, args.warmup, args.batch, args.bucket_cap_mb, comm)
            for h in args.hidden]
    dist.destroy_process_group()  # join gloo's threads before exit
    if comm.Get_rank() == 0:
        print("| n | parameters | DDP (gloo) ms/step | fcoll.dp ms/step | fcoll / DDP | "
              "overlapped ms/step | overlapped / DDP | coalesced ms/step | coalesced / DDP | "
              "final parameters vs DDP |")
        print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
        for row in rows:
            same = _same(row["fcoll_max_abs_diff"])
            for other in ("overlap", "coalesced"):
                if row[f"{other}_max_abs_diff"] != row["fcoll_max_abs_diff"]:
                    same += f" ({other}: {_same(row[f'{other}_max_abs_diff'])})"
            print(f"| {row['n']} | {int(str(row['params'])) / 1e6:.2f} M | {row['ddp_ms']:.1f} | "
                  f"{row['fcoll_ms']:.1f} | {row['fcoll_ratio']:.2f} | {row['overlap_ms']:.1f} | "
                  f"{row['overlap_ratio']:.2f} | {row['coalesced_ms']:.1f} | "
                  f"{row['coalesced_ratio']:.2f} | {same} |")
        append_rows(args.csv, rows)


if __name__ == "__main__":
    main()
