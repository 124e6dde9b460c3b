"""fcoll on cupy arrays over NCCL against raw ``cupy.cuda.nccl`` calls and torch.distributed.

Run on a machine with one GPU per rank (world size 1 on a one-GPU box):

    python bench/bench_gpu.py [--sizes 8,1M,1G] [--iters 20] [--out DIR]   # or under mpiexec

For each op (all_reduce, all_gather_into_tensor, reduce_scatter_tensor, all_to_all_single,
broadcast) and size, in the same process and on the same stream, per call:

- ``fcoll``: the fcoll function (a fresh result each call, dropped at the next);
- ``raw``: the raw ``cupy.cuda.nccl`` call into preallocated buffers (NCCL's own cost);
- ``raw+new``: the raw call into a fresh ``cupy.ndarray`` each call: the floor of any function
  that returns a new array;
- ``torch``: torch.distributed's in-place NCCL call on preallocated tensors (when torch
  with CUDA is importable; ``torch.distributed`` started on a TCP store);
- ``graph``/``graph raw``: the same calls captured in a CUDA graph (cupy stream capture),
  replayed: time per call, results checked after the replay.

Timing: CUDA events around a loop of calls (as many as fill about 5 ms of raw NCCL, at least
``--iters``), implementations alternating within each batch, their order rotating from batch to
batch; the median batch. Targets (issue 15): fcoll/raw <= 1.3 and fcoll < torch at every
size. ``return`` is the host time for fcoll's loop to return. Exits with a message (status
0) where there is no GPU or NCCL.
"""

from __future__ import annotations

import argparse
import csv
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

import fcoll as fc

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30
SIZES = [8, 4 * KiB, 64 * KiB, MiB, 16 * MiB, 256 * MiB, GiB]
GRAPH_SIZES = (8, 4 * KiB, MiB)
TARGET = 1.3
OPS = ("all_reduce", "all_gather_into_tensor", "reduce_scatter_tensor", "all_to_all_single",
       "broadcast")
F32, SUM, U8 = 7, 0, 1  # ncclFloat32, ncclSum, ncclUint8


def _parse(text: str) -> list[int]:
    units = {"K": KiB, "M": MiB, "G": GiB}
    return [int(t[:-1]) * units[t[-1].upper()] if t[-1].upper() in units else int(t)
            for t in text.split(",")]


def _unavailable() -> str | None:
    try:
        import cupy

        if cupy.cuda.runtime.getDeviceCount() < 1:
            return "no CUDA device"
    except Exception as error:
        return f"no usable cupy/GPU ({type(error).__name__}: {error})"
    from fcoll.backends import nccl

    return None if nccl.available() else f"no NCCL ({nccl.why_unavailable()})"


def _time(cp: Any, fn: Callable[[], Any], iters: int) -> tuple[float, float]:
    """(seconds per call on the GPU, seconds per call for the host to return)."""
    stream = cp.cuda.get_current_stream()
    start, end = cp.cuda.Event(), cp.cuda.Event()
    stream.synchronize()
    t0 = time.perf_counter()
    start.record(stream)
    for _ in range(iters):
        fn()
    end.record(stream)
    host = (time.perf_counter() - t0) / iters
    end.synchronize()
    return cp.cuda.get_elapsed_time(start, end) / 1e3 / iters, host


Calls = dict[str, Callable[[], Any]]  # implementation -> one call


def _cupy_calls(cp: Any, comm: Any, n: int, op: str, x: Any) -> Calls:
    """fcoll, raw and raw+new for ``op`` on ``x`` (float32, size divisible by n)."""
    count, nbytes, s = x.size, x.nbytes, lambda: cp.cuda.get_current_stream().ptr
    shapes = {"all_gather_into_tensor": (count * n,), "reduce_scatter_tensor": (count // n,)}
    out = cp.empty(shapes.get(op, (count,)), np.float32)
    p, o = x.data.ptr, out.data.ptr
    from cupy.cuda import nccl

    def a2a(dst: int) -> None:
        block = nbytes // n
        nccl.groupStart()
        for peer in range(n):
            comm.send(p + peer * block, block, U8, peer, s())
            comm.recv(dst + peer * block, block, U8, peer, s())
        nccl.groupEnd()

    raw: dict[str, Callable[[int], None]] = {
        "all_reduce": lambda dst: comm.allReduce(p, dst, count, F32, SUM, s()),
        "all_gather_into_tensor": lambda dst: comm.allGather(p, dst, count, F32, s()),
        "reduce_scatter_tensor": lambda dst: comm.reduceScatter(p, dst, count // n, F32, SUM, s()),
        "all_to_all_single": a2a,
        "broadcast": lambda dst: comm.broadcast(p, dst, nbytes, U8, 0, s()),
    }
    fn = getattr(fc, op)

    def fresh() -> Any:
        y = cp.ndarray(out.shape, out.dtype)
        raw[op](y.data.ptr)
        return y

    return {"fcoll": lambda: fn(x), "raw": lambda: raw[op](o), "raw+new": fresh}


def _torch_calls(op: str, count: int, n: int) -> Calls:
    """torch.distributed's in-place NCCL call on preallocated tensors ({} without torch)."""
    try:
        import torch
        import torch.distributed as dist
    except ImportError:
        return {}
    if not dist.is_initialized():
        return {}
    t = torch.ones(count, device="cuda")
    sizes = {"all_gather_into_tensor": count * n, "reduce_scatter_tensor": count // n}
    out = torch.empty(sizes.get(op, count), device="cuda")
    calls: dict[str, Callable[[], Any]] = {
        "all_reduce": lambda: dist.all_reduce(t),
        "all_gather_into_tensor": lambda: dist.all_gather_into_tensor(out, t),
        "reduce_scatter_tensor": lambda: dist.reduce_scatter_tensor(out, t),
        "all_to_all_single": lambda: dist.all_to_all_single(out, t),
        "broadcast": lambda: dist.broadcast(t, 0),
    }
    return {"torch": calls[op]}


def _start_torch() -> str:
    """torch.distributed on NCCL over the job's ranks, or why not."""
    try:
        import torch
        import torch.distributed as dist
    except ImportError as error:
        return f"no torch ({error})"
    if not torch.cuda.is_available():
        return "torch has no CUDA"
    port = fc.broadcast_object(29500 + os.getpid() % 1000)
    torch.cuda.set_device(torch.device("cuda", _device()))
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}",
                            rank=fc.get_rank(), world_size=fc.get_world_size(),
                            device_id=torch.device("cuda", _device()))
    return f"torch {torch.__version__} (NCCL {'.'.join(map(str, torch.cuda.nccl.version()))})"


def _device() -> int:
    import cupy

    return int(cupy.cuda.Device().id)


def _time_torch(fn: Callable[[], Any], iters: int) -> float:
    import torch

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    end.synchronize()
    return float(start.elapsed_time(end)) / 1e3 / iters


def _graph(cp: Any, fn: Callable[[], Any], iters: int, batches: int) -> tuple[float, list[Any]]:
    """Capture ``iters`` calls of ``fn`` in a CUDA graph; (seconds per replayed call, the
    results of the captured calls, valid after each replay)."""
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        fn()  # warm up on this stream
        stream.synchronize()
        stream.begin_capture()
        results = [fn() for _ in range(iters)]
        graph = stream.end_capture()
        graph.launch()
        times = []
        for _ in range(batches):
            start, end = cp.cuda.Event(), cp.cuda.Event()
            start.record(stream)
            graph.launch()
            end.record(stream)
            end.synchronize()
            times.append(cp.cuda.get_elapsed_time(start, end) / 1e3 / iters)
    return statistics.median(times), results


def _iters(cp: Any, raw: Callable[[], Any], least: int) -> int:
    """Calls per batch: enough raw calls to fill about 5 ms of GPU time, at least ``least``."""
    per_call = _time(cp, raw, least)[0]
    return max(least, min(int(5e-3 / max(per_call, 1e-9)), 2000))


def _expected(cp: Any, op: str, x: Any, n: int) -> Any:
    """What every implementation must produce from all-ones inputs on every rank."""
    size = {"all_gather_into_tensor": x.size * n, "reduce_scatter_tensor": x.size // n}
    value = n if op in ("all_reduce", "reduce_scatter_tensor") else 1
    return cp.full(size.get(op, x.size), value, np.float32)


def _row(cp: Any, comm: Any, n: int, op: str, size: int, args: argparse.Namespace) -> dict[str, Any]:
    count = max(size // 4 // n, 1) * n
    x = cp.ones(count, np.float32)
    calls = {**_cupy_calls(cp, comm, n, op, x), **_torch_calls(op, count, n)}
    first = calls["fcoll"]()
    if not bool(cp.array_equal(first, _expected(cp, op, x, n))):
        raise SystemExit(f"bench_gpu: fcoll.{op} gave a wrong result at {size} B")
    for call in calls.values():
        call()  # warm up
    iters = _iters(cp, calls["raw"], args.iters)
    times: dict[str, list[float]] = {name: [] for name in calls}
    returns: list[float] = []
    names = list(calls)
    for batch in range(args.batches):
        for name in names[batch % len(names):] + names[: batch % len(names)]:  # rotate the order
            if name == "torch":
                times[name].append(_time_torch(calls[name], iters))
                continue
            gpu, host = _time(cp, calls[name], iters)
            times[name].append(gpu)
            if name == "fcoll":
                returns.append(host)
    row: dict[str, Any] = {"op": op, "bytes": count * 4}
    for name, values in times.items():
        row[name] = statistics.median(values) * 1e6
    row["return"] = statistics.median(returns) * 1e6
    if size in GRAPH_SIZES and not args.no_graph:
        for name in ("fcoll", "raw"):
            t, results = _graph(cp, calls[name], iters, args.batches)
            row[f"graph {name}"] = t * 1e6
            if name == "fcoll" and not all(bool(cp.array_equal(r, _expected(cp, op, x, n)))
                                           for r in results):
                raise SystemExit(f"bench_gpu: fcoll.{op} replayed from a CUDA graph gave a "
                                 f"wrong result at {size} B")
    return row


COLUMNS = ("fcoll", "raw", "raw+new", "torch", "graph fcoll", "graph raw", "return")


def _print(row: dict[str, Any]) -> None:
    cells = "".join(f"{row[c]:>12.1f}" if c in row else f"{'—':>12}" for c in COLUMNS)
    ratio = row["fcoll"] / row["raw"]
    torch = f"{row['fcoll'] / row['torch']:>9.2f}" if "torch" in row else f"{'—':>9}"
    flag = " !" if ratio > TARGET or ("torch" in row and row["fcoll"] >= row["torch"]) else ""
    print(f"{row['op']:24}{row['bytes']:>11}{cells}{ratio:>10.2f}"
          f"{row['fcoll'] / row['raw+new']:>9.2f}{torch}{flag}", flush=True)


def _markdown(rows: list[dict[str, Any]]) -> str:
    """The table as markdown (µs per call; ratios of fcoll to raw, raw+new and torch)."""
    shown = ("fcoll", "raw", "raw+new", "torch", "graph fcoll", "graph raw")
    lines = ["| op | bytes | " + " | ".join(shown) + " | fcoll/raw | fcoll/raw+new | fcoll/torch |",
             "|---|---:|" + "---:|" * (len(shown) + 3)]
    for r in rows:
        cells = [f"{r[c]:.1f}" if c in r else "—" for c in shown]
        torch = f"{r['fcoll'] / r['torch']:.2f}" if "torch" in r else "—"
        lines.append(f"| {r['op']} | {r['bytes']} | " + " | ".join(cells)
                     + f" | {r['fcoll'] / r['raw']:.2f} | {r['fcoll'] / r['raw+new']:.2f} | {torch} |")
    return "\n".join(lines) + "\n"


def _write(rows: list[dict[str, Any]], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "gpu.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, ["op", "bytes", *COLUMNS])
        writer.writeheader()
        writer.writerows(rows)
    (out / "gpu.md").write_text(_markdown(rows))
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, axes = plt.subplots(1, len(OPS), figsize=(4 * len(OPS), 3.6), sharey=True)
    for ax, op in zip(axes, OPS, strict=True):
        mine = [r for r in rows if r["op"] == op]
        for column in ("fcoll", "raw", "raw+new", "torch", "graph fcoll"):
            points = [(r["bytes"], r[column]) for r in mine if column in r]
            if points:
                ax.plot(*zip(*points, strict=True), marker="o", label=column)
        ax.set(xscale="log", yscale="log", title=op, xlabel="bytes")
    axes[0].set_ylabel("µs per call (GPU time)")
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "gpu_latency.png", dpi=110)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=_parse, default=SIZES)
    parser.add_argument("--ops", nargs="+", default=list(OPS), choices=OPS)
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--batches", type=int, default=7)
    parser.add_argument("--no-torch", action="store_true", help="leave the torch column out")
    parser.add_argument("--no-graph", action="store_true", help="leave the graph columns out")
    parser.add_argument("--out", type=Path, help="write gpu.csv, gpu.md and gpu_latency.png here")
    args = parser.parse_args()
    reason = _unavailable()
    if reason is not None:
        print(f"bench_gpu: skipped: {reason}; run it on a machine with one GPU per rank")
        return 0
    import cupy as cp

    import fcoll.gpu
    from fcoll.backends import nccl

    fcoll.gpu.use_local_device()
    n = fc.get_world_size()
    comm = nccl.communicator(fc.world(), cp.cuda.Device().id, "bench_gpu")
    peer = "torch: left out" if args.no_torch else _start_torch()
    rows = []
    if fc.get_rank() == 0:
        print(f"world size {n}, cupy {cp.__version__}, NCCL {nccl.version()}, {peer}")
        print(f"{'op':24}{'bytes':>11}" + "".join(f"{c + ' us':>12}" for c in COLUMNS)
              + f"{'fcoll/raw':>10}{'/raw+new':>9}{'/torch':>9}")
    for op in args.ops:
        for size in args.sizes:
            row = _row(cp, comm, n, op, size, args)
            rows.append(row)
            if fc.get_rank() == 0:
                _print(row)
    if args.out is not None and fc.get_rank() == 0:
        _write(rows, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
