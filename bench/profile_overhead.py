"""Where fcoll's per-call time goes for a tiny all_reduce (world size 1, no mpiexec).

    .venv/bin/python bench/profile_overhead.py [--calls 100000] [--bytes 8] [--cprofile]

Times, per call, each step that ``fcoll.all_reduce`` takes (the same calls, in the same
order, on the same objects), then the whole function and the raw ``comm.Allreduce`` into a
preallocated buffer; the steps' costs add up to roughly fcoll minus raw. ``--cprofile``
adds a cProfile listing of the whole call (its own overhead inflates small functions).
Also prints fcoll vs raw for the other three core collectives.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import time
from collections.abc import Callable

import numpy as np

import fcoll
from fcoll.backends import mpi as backend
from fcoll.collectives._plan import reduction_plan
from fcoll._validate import check_array
from fcoll.dtypes import to_wire
from fcoll.group import resolve_group

from mpi4py import MPI  # noqa: E402  (after fcoll: it picks the thread level)


def per_call(fn: Callable[[], object], calls: int, chunk: int = 2000) -> float:
    """ns per call: the fastest of ``calls // chunk`` timed chunks of ``chunk`` calls, less
    the cost of an empty loop. Short chunks and the minimum keep other processes on a busy
    machine (preemption) out of the number."""
    def loop(f: Callable[[], object]) -> float:
        t0 = time.perf_counter_ns()
        for _ in range(chunk):
            f()
        return (time.perf_counter_ns() - t0) / chunk

    def nothing() -> None:
        return None

    rounds = max(5, calls // chunk)
    empty = min(loop(nothing) for _ in range(rounds))
    return min(loop(fn) for _ in range(rounds)) - empty


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--calls", type=int, default=100_000)
    p.add_argument("--bytes", type=int, default=8)
    p.add_argument("--cprofile", action="store_true")
    args = p.parse_args()
    calls = args.calls
    fcoll.init()
    x = np.ones(max(1, args.bytes // 4), np.float32)
    g = fcoll.world()
    comm = g.comm("all_reduce")
    raw_comm = MPI.COMM_WORLD.Dup()
    out = np.empty_like(x)
    plan = reduction_plan(x, "sum", g.size, "all_reduce")
    wire = to_wire(x, plan.op)
    y = backend.allreduce(comm, wire, plan.mpi_op)
    finished = plan.finish(y)

    steps: list[tuple[str, Callable[[], object]]] = [
        ("resolve_group(None)", lambda: resolve_group(None, "all_reduce")),
        ("g.comm(fn)", lambda: g.comm("all_reduce")),
        ("check_array(x)", lambda: check_array(x, "all_reduce")),
        ("reduction_plan (lru_cache)", lambda: reduction_plan(x, "sum", 1, "all_reduce")),
        ("to_wire(x, op)", lambda: to_wire(x, plan.op)),
        ("np.empty_like(send)", lambda: np.empty_like(wire)),
        ("comm.Allreduce(send, out, op)", lambda: comm.Allreduce(wire, out, plan.mpi_op)),
        ("plan.finish(y)", lambda: plan.finish(y)),
        ("result.reshape(x.shape)", lambda: finished.reshape(x.shape)),
    ]
    print(f"fcoll {fcoll.__version__}, MPI thread level {MPI.Query_thread()}, "
          f"world size {g.size}, {x.nbytes} B float32, {calls} calls each, fastest 2000-call chunk")
    total_steps = 0.0
    for name, fn in steps:
        ns = per_call(fn, calls)
        total_steps += ns
        print(f"  {name:<34} {ns:8.0f} ns")
    print(f"  {'sum of steps':<34} {total_steps:8.0f} ns")
    t_f = per_call(lambda: fcoll.all_reduce(x), calls)
    t_r = per_call(lambda: raw_comm.Allreduce(x, out, MPI.SUM), calls)
    print(f"  {'fcoll.all_reduce(x)':<34} {t_f:8.0f} ns")
    print(f"  {'raw comm.Allreduce(x, out, SUM)':<34} {t_r:8.0f} ns   -> fcoll - raw = "
          f"{t_f - t_r:.0f} ns ({t_f / t_r:.2f}x)")

    # Cost of the finer pieces inside the steps above.
    f32, pickle_op = np.dtype(np.float32), plan.op
    fine: list[tuple[str, Callable[[], object]]] = [
        ("isinstance(x, np.ndarray)", lambda: isinstance(x, np.ndarray)),
        ("dtype in SUPPORTED (frozenset)", lambda: x.dtype in fcoll.dtypes.SUPPORTED),
        ("hash(x.dtype)", lambda: hash(x.dtype)),
        ("x.dtype == np.bool_", lambda: x.dtype == np.bool_),
        ("x.dtype == f32 (dtype objects)", lambda: x.dtype == f32),
        ("x.dtype is f32", lambda: x.dtype is f32),
        ("op == ReduceOp.AVG", lambda: pickle_op == fcoll.ReduceOp.AVG),
        ("np.ascontiguousarray(x, dtype=)", lambda: np.ascontiguousarray(x, dtype=f32)),
        ("x.reshape(-1)", lambda: x.reshape(-1)),
        ("comm.Get_size()", lambda: comm.Get_size()),
        ("np.empty(2, f32)", lambda: np.empty(2, f32)),
        ("raw Allreduce [buf, MPI.FLOAT]", lambda: comm.Allreduce([x, MPI.FLOAT],
                                                                  [out, MPI.FLOAT], MPI.SUM)),
    ]
    print("finer pieces:")
    for name, fn in fine:
        print(f"  {name:<34} {per_call(fn, calls):8.0f} ns")

    print("other core collectives (fcoll vs raw, preallocated):")
    others = [
        ("all_gather_into_tensor", lambda: fcoll.all_gather_into_tensor(x),
         lambda: raw_comm.Allgather(x, out)),
        ("reduce_scatter_tensor", lambda: fcoll.reduce_scatter_tensor(x),
         lambda: raw_comm.Reduce_scatter_block(x, out, MPI.SUM)),
        ("all_to_all_single", lambda: fcoll.all_to_all_single(x),
         lambda: raw_comm.Alltoall(x, out)),
    ]
    for name, f, r in others:
        tf, tr = per_call(f, calls), per_call(r, calls)
        print(f"  {name:<24} fcoll {tf:6.0f} ns  raw {tr:6.0f} ns  (+{tf - tr:.0f} ns, "
              f"{tf / tr:.2f}x)")

    if args.cprofile:
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(calls):
            fcoll.all_reduce(x)
        prof.disable()
        pstats.Stats(prof).sort_stats("tottime").print_stats(15)
    print(f"(FCOLL_MPI_THREAD_LEVEL={os.environ.get('FCOLL_MPI_THREAD_LEVEL', 'default')})")


if __name__ == "__main__":
    main()
