"""fcoll on cupy arrays over NCCL against raw ``cupy.cuda.nccl`` calls.

Run on a machine with one GPU per rank (world size 1 on a one-GPU box):

    mpiexec -n 1 .venv/bin/python bench/bench_gpu.py [--sizes 8,1M,1G] [--iters 20]

For each op and size: fcoll's call (fresh output each call) and the raw NCCL call on
preallocated buffers, timed with CUDA events on the same stream in alternating batches;
per-call time is the median batch. Bandwidth as nccl-tests: ``algbw = S / t``,
``busbw = algbw * factor`` (all_reduce ``2(n-1)/n``; all_gather, reduce_scatter,
all_to_all ``(n-1)/n``). ``return`` is the host time for fcoll's call to return (no host
sync: it only enqueues) against ``done``, the time to completion. Target: fcoll/raw <=
1.05 at >= 1 MiB. Exits with a message (status 0) where there is no GPU or NCCL.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

import fcoll as fc

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30
SIZES = [8, 64, 512, 4 * KiB, 32 * KiB, 256 * KiB, MiB, 8 * MiB, 64 * MiB, 256 * MiB, GiB]
TARGET, LARGE = 1.05, MiB


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
    from fcoll.gpu import nccl

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


Case = tuple[Callable[[], Any], Callable[[], Any], float]  # fcoll call, raw call, busbw factor


def _cases(cp: Any, comm: Any, n: int, size: int) -> dict[str, Case]:
    count = max(size // 4, n) // n * n
    x = cp.ones(count, np.float32)
    out, part = cp.empty_like(x), cp.empty(count // n, np.float32)
    big = cp.empty(count * n, np.float32)
    s = lambda: cp.cuda.get_current_stream().ptr  # noqa: E731
    f32, ssum = 7, 0
    return {
        "all_reduce": (lambda: fc.all_reduce(x),
                       lambda: comm.allReduce(x.data.ptr, out.data.ptr, count, f32, ssum, s()),
                       2 * (n - 1) / n),
        "all_gather_into_tensor": (lambda: fc.all_gather_into_tensor(x),
                                   lambda: comm.allGather(x.data.ptr, big.data.ptr, count, f32, s()),
                                   (n - 1) / n),
        "reduce_scatter_tensor": (lambda: fc.reduce_scatter_tensor(x),
                                  lambda: comm.reduceScatter(x.data.ptr, part.data.ptr, count // n,
                                                             f32, ssum, s()),
                                  (n - 1) / n),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=_parse, default=SIZES)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--batches", type=int, default=5)
    args = parser.parse_args()
    reason = _unavailable()
    if reason is not None:
        print(f"bench_gpu: skipped: {reason}; run it on a machine with one GPU per rank")
        return 0
    import cupy as cp

    import fcoll.gpu
    from fcoll.gpu import nccl

    fcoll.gpu.use_local_device()
    world, n = fc.world(), fc.get_world_size()
    comm = nccl.communicator(world, cp.cuda.Device().id, "bench_gpu")
    if fc.get_rank() == 0:
        print(f"{'op':24} {'bytes':>10} {'fcoll us':>10} {'raw us':>10} {'ratio':>6} "
              f"{'algbw GB/s':>10} {'busbw GB/s':>10} {'return us':>10}")
    for size in args.sizes:
        for name, (ours, raw, factor) in _cases(cp, comm, n, size).items():
            ours(), raw()  # warm up (and create the communicator)
            t_ours, t_raw, t_ret = [], [], []
            for _ in range(args.batches):
                gpu, host = _time(cp, ours, args.iters)
                t_ours.append(gpu)
                t_ret.append(host)
                t_raw.append(_time(cp, raw, args.iters)[0])
            mine, theirs = statistics.median(t_ours), statistics.median(t_raw)
            algbw = size / mine / 1e9
            flag = " !" if size >= LARGE and mine / theirs > TARGET else ""
            if fc.get_rank() == 0:
                print(f"{name:24} {size:>10} {mine * 1e6:>10.1f} {theirs * 1e6:>10.1f} "
                      f"{mine / theirs:>6.2f} {algbw:>10.2f} {algbw * factor:>10.2f} "
                      f"{statistics.median(t_ret) * 1e6:>10.1f}{flag}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
