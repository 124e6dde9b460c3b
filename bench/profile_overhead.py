"""Where fcoll's per-call time goes for tiny collectives (world size 1, no mpiexec).

    .venv/bin/python bench/profile_overhead.py [--calls 100000] [--bytes 8] [--cprofile]

1. fcoll vs the raw mpi4py call (preallocated output) for the four core collectives.
2. ``all_reduce`` taken apart: each step it takes, timed alone on the same objects (this
   part reads fcoll internals and is skipped with a note if they have moved).
3. The price of the Python/numpy primitives those steps are made of, and a "lean" all_reduce
   (cached plan lookup, ``np.empty``, ``Allreduce``): the floor for a function that returns
   a fresh array.
4. ``--cprofile``: a cProfile listing of ``fcoll.all_reduce`` (inflates small functions).

Times are the fastest of many short chunks, less the empty-loop cost, so other processes on
a busy machine stay out of the numbers.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import time
from collections.abc import Callable
from typing import Any

import numpy as np

import fcoll

fcoll.init()  # fcoll starts MPI at its thread level; mpi4py.MPI only after that
from mpi4py import MPI  # noqa: E402

Step = tuple[str, Callable[[], object]]


def per_call(fn: Callable[[], object], calls: int, chunk: int = 2000) -> float:
    """ns per call: the fastest of ``calls // chunk`` chunks of ``chunk`` calls, less the
    cost of an empty loop."""

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


def show(title: str, steps: list[Step], calls: int) -> None:
    print(title)
    for name, fn in steps:
        print(f"  {name:<40} {per_call(fn, calls):7.0f} ns")


def internal_steps(x: np.ndarray, out: np.ndarray) -> list[Step]:
    """The steps of fcoll.all_reduce as of this writing (group and comm, cached plan, wire
    data, move, finish); raises ImportError/AttributeError if fcoll's internals have moved.
    Names starting with a space or "(" are parts of a step, left out of the sum."""
    from fcoll.backends import mpi as backend
    from fcoll.collectives import _fold
    from fcoll.groups.membership import member
    from fcoll.policy.plan import reduction_plan

    g, call = member(None, "all_reduce")
    plan = reduction_plan(x, "sum", g, "all_reduce")
    wire = plan.wire(x)
    y = _fold.allreduce(call, plan, wire)
    return [
        ("member(None) -> (group, call)", lambda: member(None, "all_reduce")),
        ("g.size (property)", lambda: g.size),
        ("reduction_plan (dict cache)", lambda: reduction_plan(x, "sum", g, "all_reduce")),
        ("plan.wire(x)", lambda: plan.wire(x)),
        ("_fold.allreduce(call, plan, wire)", lambda: _fold.allreduce(call, plan, wire)),
        ("  of which backend.allreduce", lambda: backend.allreduce(call, wire, plan.op)),
        ("  of which np.empty_like(wire)", lambda: np.empty_like(wire)),
        ("  of which comm.Allreduce(wire, out, op)",
         lambda: call.comm.Allreduce(wire, out, plan.op)),
        ("plan.finish(y)", lambda: plan.finish(y)),
    ]


def primitives(x: np.ndarray, out: np.ndarray, comm: Any) -> list[Step]:
    f32 = np.dtype(np.float32)
    op = fcoll.ReduceOp.SUM
    avg = fcoll.ReduceOp.AVG
    table = {(f32, "sum"): 1}

    def empty_fn(a: object, b: object = None) -> None:
        return None

    return [
        ("python call f(a, b) (no work)", lambda: empty_fn(x, op)),
        ("isinstance(x, np.ndarray)", lambda: isinstance(x, np.ndarray)),
        ("x.dtype in frozenset", lambda: x.dtype in fcoll.policy.dtypes.SUPPORTED),
        ("dict.get((x.dtype, 'sum'))", lambda: table.get((x.dtype, "sum"))),
        ("x.dtype == np.bool_ (vs type)", lambda: x.dtype == np.bool_),
        ("x.dtype is f32 (identity)", lambda: x.dtype is f32),
        ("x.dtype.kind == 'b'", lambda: x.dtype.kind == "b"),
        ("op == ReduceOp.AVG (enum ==)", lambda: op == fcoll.ReduceOp.AVG),
        ("op is fcoll.ReduceOp.AVG (enum is)", lambda: op is fcoll.ReduceOp.AVG),
        ("op is AVG (module-level constant)", lambda: op is avg),
        ("x.flags.c_contiguous", lambda: x.flags.c_contiguous),
        ("np.ascontiguousarray(x, dtype=f32)", lambda: np.ascontiguousarray(x, dtype=f32)),
        ("x.reshape(-1)", lambda: x.reshape(-1)),
        ("x.reshape(x.shape)", lambda: x.reshape(x.shape)),
        ("np.empty_like(x)", lambda: np.empty_like(x)),
        ("np.empty(x.shape, x.dtype)", lambda: np.empty(x.shape, x.dtype)),
        ("comm.Get_size()", lambda: comm.Get_size()),
        ("comm.Allreduce(x, out, SUM)", lambda: comm.Allreduce(x, out, MPI.SUM)),
        ("comm.Allreduce([x, FLOAT], [out, FLOAT])",
         lambda: comm.Allreduce([x, MPI.FLOAT], [out, MPI.FLOAT], MPI.SUM)),
    ]


def lean_all_reduce(comm: Any) -> Callable[[np.ndarray], np.ndarray]:
    """What a minimal fresh-output all_reduce costs: one dict lookup stands for resolving
    the group, checking x and finding the (dtype, op) plan; then np.empty and Allreduce."""
    plans = {(np.dtype(np.float32), "sum"): MPI.SUM}

    def all_reduce(x: np.ndarray, op: str = "sum", group: object = None) -> np.ndarray:
        mpi_op = plans.get((x.dtype, op)) if group is None else None
        if mpi_op is None or not x.flags.c_contiguous:
            raise NotImplementedError  # the slow, general path would go here
        out = np.empty(x.shape, x.dtype)
        comm.Allreduce(x, out, mpi_op)
        return out

    return all_reduce


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--calls", type=int, default=100_000)
    p.add_argument("--bytes", type=int, default=8)
    p.add_argument("--cprofile", action="store_true")
    args = p.parse_args()
    calls = args.calls
    x = np.ones(max(1, args.bytes // 4), np.float32)
    out = np.empty_like(x)
    raw_comm = MPI.COMM_WORLD.Dup()
    print(f"fcoll {fcoll.__version__}, MPI thread level {MPI.Query_thread()}, world size "
          f"{fcoll.get_world_size()}, {x.nbytes} B float32; ns per call, fastest 2000-call "
          f"chunk of {calls}")

    print("1. fcoll vs raw (preallocated output):")
    pairs = [
        ("all_reduce", lambda: fcoll.all_reduce(x), lambda: raw_comm.Allreduce(x, out, MPI.SUM)),
        ("all_gather_into_tensor", lambda: fcoll.all_gather_into_tensor(x),
         lambda: raw_comm.Allgather(x, out)),
        ("reduce_scatter_tensor", lambda: fcoll.reduce_scatter_tensor(x),
         lambda: raw_comm.Reduce_scatter_block(x, out, MPI.SUM)),
        ("all_to_all_single", lambda: fcoll.all_to_all_single(x),
         lambda: raw_comm.Alltoall(x, out)),
    ]
    t_fcoll = t_raw = 0.0
    for name, f, r in pairs:
        tf, tr = per_call(f, calls), per_call(r, calls)
        if name == "all_reduce":
            t_fcoll, t_raw = tf, tr
        print(f"  {name:<24} fcoll {tf:6.0f}  raw {tr:6.0f}  extra {tf - tr:6.0f} ns "
              f"({tf / tr:.2f}x)")

    try:
        steps = internal_steps(x, out)
    except (ImportError, AttributeError) as error:
        print(f"2. skipped: fcoll's internals have moved ({error})")
    else:
        print("2. fcoll.all_reduce step by step:")
        times = {name: per_call(fn, calls) for name, fn in steps}
        for name, ns in times.items():
            print(f"  {name:<40} {ns:7.0f} ns")
        top = sum(ns for name, ns in times.items() if not name.startswith(("  ", "(")))
        print(f"  {'sum of the top-level steps':<40} {top:7.0f} ns (whole call {t_fcoll:.0f}; "
              "the rest is call and attribute overhead)")

    show("3. primitives:", primitives(x, out, raw_comm), calls)
    lean = lean_all_reduce(raw_comm)
    t_lean = per_call(lambda: lean(x), calls)
    print(f"  {'lean fresh-output all_reduce':<40} {t_lean:7.0f} ns "
          f"(raw {t_raw:.0f}, extra {t_lean - t_raw:.0f}; fcoll extra {t_fcoll - t_raw:.0f})")

    if args.cprofile:
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(calls):
            fcoll.all_reduce(x)
        prof.disable()
        pstats.Stats(prof).sort_stats("tottime").print_stats(15)
    print(f"(FCOLL_MPI_THREAD_LEVEL={os.environ.get('FCOLL_MPI_THREAD_LEVEL', 'unset')})")


if __name__ == "__main__":
    main()
