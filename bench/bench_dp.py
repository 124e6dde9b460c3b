"""fcoll.dp: fused gradient averaging against a per-leaf loop and one raw Allreduce, and
the gain from overlapping bucket all-reduces with backprop.

    mpiexec -n 2 .venv/bin/python -m mpi4py bench/bench_dp.py

1. 100 leaves of 10,000 float32 (4 MB): `fc.dp.average_gradients` (buckets of 25 MiB:
   one message) vs `fc.all_reduce(leaf, "avg")` per leaf vs one raw `comm.Allreduce` of a
   preallocated 4 MB buffer (the floor: same bytes, no packing, no result arrays).
2. Overlap: 8 layers whose backward step is a 384x384 matmul each, gradients of 1 MiB;
   averaging the whole tree after backprop vs pushing each gradient as it is computed
   (bucket cap 1 MiB, so each layer's all-reduce starts at once).
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # one core per rank: no BLAS threads
os.environ.setdefault("OMP_NUM_THREADS", "1")

import statistics
import time
from collections.abc import Callable

import numpy as np

import fcoll as fc

fc.init()
from mpi4py import MPI  # noqa: E402


def timed(fn: Callable[[], object], comm: MPI.Comm, repeat: int = 15, iters: int = 5) -> float:
    samples = []
    for _ in range(repeat):
        comm.Barrier()
        start = time.perf_counter()
        for _ in range(iters):
            fn()
        samples.append(comm.allreduce((time.perf_counter() - start) / iters, op=MPI.MAX))
    return float(statistics.median(samples)) * 1e3


def fused_vs_loop(comm: MPI.Comm) -> None:
    rng = np.random.default_rng(comm.rank)
    grads = {f"leaf{i:03d}": rng.standard_normal(10_000).astype(np.float32) for i in range(100)}
    flat = np.concatenate(list(grads.values()))
    out = np.empty_like(flat)
    rows = {
        "raw Allreduce (4 MB, preallocated)": lambda: comm.Allreduce(flat, out, MPI.SUM),
        "fc.dp.average_gradients (fused)": lambda: fc.dp.average_gradients(grads),
        "per-leaf fc.all_reduce loop": lambda: [fc.all_reduce(g, "avg") for g in grads.values()],
    }
    times = {name: timed(fn, comm) for name, fn in rows.items()}
    raw = times["raw Allreduce (4 MB, preallocated)"]
    if comm.rank == 0:
        print(f"100 leaves x 10,000 float32, n={comm.size}")
        for name, ms in times.items():
            print(f"  {name:38s} {ms:8.3f} ms  {ms / raw:5.2f}x raw")


def overlap(comm: MPI.Comm) -> None:
    rng = np.random.default_rng(0)
    act = rng.standard_normal((384, 384))
    layers = [f"layer{i}" for i in range(8)]
    grad = np.ones(1 << 18, np.float32)  # 1 MiB

    def backward(push: Callable[[str, np.ndarray], None] | None) -> dict[str, np.ndarray]:
        grads = {}
        for name in reversed(layers):
            act @ act  # the layer's backward compute
            grads[name] = grad
            if push is not None:
                push(name, grad)
        return grads

    at_end = fc.dp.GradientAverager(bucket_cap_mb=1)
    pushed = fc.dp.GradientAverager(bucket_cap_mb=1)
    end_ms = timed(lambda: at_end(backward(None)), comm)
    push_ms = timed(lambda: (backward(pushed.push), pushed.wait()), comm)
    compute_ms = timed(lambda: backward(None), comm)
    if comm.rank == 0:
        print(f"overlap, 8 layers x 1 MiB gradients, n={comm.size}")
        print(f"  backward compute alone           {compute_ms:8.3f} ms")
        print(f"  average after backprop            {end_ms:8.3f} ms")
        print(f"  push during backprop (overlap)    {push_ms:8.3f} ms  "
              f"({end_ms / push_ms:.2f}x faster)")


if __name__ == "__main__":
    world = MPI.COMM_WORLD.Dup()
    fused_vs_loop(world)
    overlap(world)
