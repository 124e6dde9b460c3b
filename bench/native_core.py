"""The compiled shared-memory core against raw mpi4py, in rotating batches of one job.

    .venv/bin/python bench/native_core.py [-n 2 4] [--batches 9] [--sizes 8 1024 ...] [--out DIR]
                                          [--no-gloo]

For each world size, two jobs: the default (the core steps the segment) and
``FCOLL_NATIVE=0`` (fcoll's numpy path). In each, per case, the implementations take turns
in rotating batches (a barrier, back-to-back calls, the slowest rank's time per call):

- ``raw``: mpi4py's buffer call into an output allocated once (``Allreduce``,
  ``Reduce_scatter_block``, ``Allgather``; broadcast: ``Bcast`` in place), the strongest raw;
- ``call``: the public call, ``y = fc.all_reduce(x)`` (dict lookup and result included);
- ``step``: the core's own C call on the world's segment (default job only);
- ``gloo``: torch.distributed's gloo backend, outputs preallocated (where torch imports);
- ``memcpy``: every rank copying the message at once (large all_reduces): the model of a
  memory-bound all_reduce moves ``(n + 3) / 2`` times a copy's bytes per rank (copy in:
  read and write; fold: read this rank's input and ``n - 1`` slots, write the result).

Cases: float32 all_reduce 8 B to 64 MiB, bfloat16 all_reduce at the same byte counts,
float32 reduce_scatter, all_gather and broadcast 8 B to 64 KiB (n = 2) or 1 MiB (n = 4).
Each implementation's batch holds about 15 ms of calls (from a probe; 3 to 5,000 calls).
Ratios are medians of per-batch ratios. Writes ``native.csv``, ``native.md`` and
``native_latency_n{N}.png`` to ``--out`` (default ``bench/results/<date>``).
``FCOLL_BENCH_MPIEXEC`` names another launcher with its flags (default: the ``mpiexec``
beside this Python).
"""

from __future__ import annotations

import argparse
import csv
import datetime
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
SIZES = [8, 64, 1 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20]
SMALL = {2: 64 << 10, 4: 1 << 20}  # reduce_scatter, all_gather, broadcast up to this size
Fn = Callable[[], Any]


def _raw(op: str, comm: Any, x: np.ndarray) -> Fn:
    from mpi4py import MPI

    n = comm.Get_size()
    if op == "all_reduce":
        out = np.empty_like(x)
        return lambda: comm.Allreduce(x, out, MPI.SUM)
    if op == "reduce_scatter_tensor":
        out = np.empty(x.size // n, x.dtype)
        return lambda: comm.Reduce_scatter_block(x, out, MPI.SUM)
    if op == "all_gather_into_tensor":
        out = np.empty(x.size * n, x.dtype)
        return lambda: comm.Allgather([x, MPI.BYTE], [out, MPI.BYTE])
    buf = x.copy()
    return lambda: comm.Bcast([buf, MPI.BYTE], 0)


def _call(op: str, x: np.ndarray) -> Fn:
    import fcoll as fc

    fn, kept = getattr(fc, op), [None]

    def call() -> None:
        kept[0] = fn(x)

    return call


def _step(op: str, x: np.ndarray) -> Fn | None:
    """The core's own call (the world's segment made by the public call's first use)."""
    import fcoll as fc
    from fcoll.backends import native
    from fcoll.calls import fingerprint

    seg = fc.world().shm
    if not native.running() or not seg or seg.core is None:
        return None
    core, kept = seg.core, [None]
    if op in ("all_reduce", "reduce_scatter_tensor"):
        kernel = native.kernel(x.dtype, np.add, False, None)
        assert kernel is not None
        fp = fingerprint.of(op, "sum", x.dtype)
        method = core.allreduce if op == "all_reduce" else core.reduce_scatter
        args: tuple[Any, ...] = (*kernel, fp, -1.0)
    elif op == "all_gather_into_tensor":
        method, args = core.allgather, (None, fingerprint.of(op, "", x.dtype), -1.0)
    else:
        method, args = core.broadcast, (0, fingerprint.of(op, "", x.dtype, 0), -1.0)

    def step() -> None:
        kept[0] = method(x, *args)

    return step


def _gloo(op: str, comm: Any, x: np.ndarray) -> Fn | None:
    if x.dtype != np.float32:
        return None
    sys.path.insert(0, str(HERE))
    from impls import make_gloo

    return make_gloo(op, x, comm).call


def _memcpy(x: np.ndarray) -> Fn:
    out = np.empty_like(x)
    return lambda: np.copyto(out, x)


def _batch(comm: Any, fn: Fn, iters: int) -> float:
    from mpi4py import MPI

    comm.Barrier()
    start = time.perf_counter()
    for _ in range(iters):
        fn()
    return float(comm.allreduce(time.perf_counter() - start, op=MPI.MAX)) / iters


def _iterations(comm: Any, fn: Fn, batch_seconds: float = 0.015) -> int:
    """Calls per batch for ``fn``: about ``batch_seconds`` of them (3 to 5,000), from a probe
    (the slowest rank's), so slow peers such as gloo do not stretch the run."""
    fn()
    probe = _batch(comm, fn, 5)
    return max(3, min(5000, int(batch_seconds / max(probe, 1e-7))))


def _cases(n: int, sizes: list[int]) -> list[tuple[str, str, int]]:
    cases = [("all_reduce", "float32", s) for s in sizes]
    cases += [("all_reduce", "bfloat16", s) for s in sizes]
    for op in ("reduce_scatter_tensor", "all_gather_into_tensor", "broadcast"):
        cases += [(op, "float32", s) for s in sizes if s <= SMALL.get(n, 1 << 20)]
    return cases


def worker(batches: int, gloo: bool, sizes: list[int]) -> None:
    """One job: every case, every implementation, rows of CSV on rank 0's stdout."""
    import ml_dtypes

    import fcoll as fc

    comm, engine = fc.world()._comm, "native" if os.environ.get("FCOLL_NATIVE") != "0" else "numpy"
    n, rank = comm.Get_size(), comm.Get_rank()
    if gloo:
        sys.path.insert(0, str(HERE))
        from impls import start_gloo

        gloo = start_gloo(comm) is None
    for op, dtype, size in _cases(n, sizes):
        kind = np.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else np.dtype(dtype)
        count = max(n, size // kind.itemsize // n * n)
        x = np.full(count, 0.0 if op == "all_reduce" else rank + 1.0, kind)
        impls: dict[str, Fn | None] = {"raw": _raw(op, comm, x) if dtype == "float32" else None,
                                       "call": _call(op, x)}
        impls["call"]()  # makes the segment, learns the fast path
        impls["step"] = _step(op, x) if engine == "native" else None
        impls["gloo"] = _gloo(op, comm, x) if gloo else None
        impls["memcpy"] = _memcpy(x) if op == "all_reduce" and size >= 16 << 20 else None
        run = {k: f for k, f in impls.items() if f is not None}
        iters = {k: _iterations(comm, f) for k, f in run.items()}
        times: dict[str, list[float]] = {k: [] for k in run}
        for b in range(batches):
            names = list(run)[b % len(run):] + list(run)[: b % len(run)]
            for k in names:
                times[k].append(_batch(comm, run[k], iters[k]))
        if rank == 0:
            for k, ts in times.items():
                versus = times.get("raw") or times.get("call")
                ratio = statistics.median(a / b for a, b in zip(ts, versus, strict=True))
                print(f"{engine},{n},{op},{dtype},{size},{k},{statistics.median(ts) * 1e6:.3f},"
                      f"{ratio:.4f}", flush=True)


def _launch(n: int, native: bool, args: argparse.Namespace) -> list[list[str]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "HYDRA_"))}
    env.update({"FCOLL_NATIVE": "auto" if native else "0", "OMP_NUM_THREADS": "1"})
    launcher = os.environ.get("FCOLL_BENCH_MPIEXEC", "").split()  # e.g. another MPI's, with flags
    if not launcher:
        launcher = [str(Path(sys.executable).parent / "mpiexec")]
        launcher += ["-bind-to", "core"] if n > (os.cpu_count() or 1) else []
    cmd = [*launcher, "-n", str(n), sys.executable, __file__, "--worker",
           "--batches", str(args.batches), "--sizes", *map(str, args.sizes)] + (
               [] if args.gloo else ["--no-gloo"])
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=3600, check=False)
    if done.returncode:
        sys.exit(f"bench/native_core.py: the job at n={n} failed:\n{done.stdout}\n{done.stderr}")
    return [line.split(",") for line in done.stdout.splitlines() if line.count(",") == 7]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("-n", nargs="+", type=int, default=[2, 4])
    p.add_argument("--batches", type=int, default=9)
    p.add_argument("--out", type=Path, default=HERE / "results" / str(datetime.date.today()))
    p.add_argument("--no-gloo", dest="gloo", action="store_false")
    p.add_argument("--sizes", nargs="+", type=int, default=SIZES, help="bytes per rank")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        worker(args.batches, args.gloo, args.sizes)
        return
    args.out.mkdir(parents=True, exist_ok=True)
    rows: list[list[str]] = []
    for n in args.n:
        for native in (True, False):
            rows += _launch(n, native, args)
            with open(args.out / "native.csv", "w", newline="") as f:  # each job's rows as it ends
                csv.writer(f).writerows([["engine", "n", "op", "dtype", "bytes", "impl", "us", "ratio"],
                                         *rows])
    sys.path.insert(0, str(HERE))
    from native_report import report

    text = report(rows, args.out)
    (args.out / "native.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
