"""JAX training data-parallel with `fcoll.lax.pmean`, against one process on the whole batch.

    mpiexec -bind-to core -n 2 .venv/bin/python bench/bench_jax_pmean.py [--hidden 1024 2048]

JAX has no multi-process data parallelism on the CPU, so the reference is the same
training in one process. The model is examples/train_jax.py's MLP with 256 inputs and four
dense layers (2.37 M parameters at ``--hidden 1024``, 8.93 M at 2048), trained with plain
SGD on synthetic batches (labels from a fixed linear teacher). Data-parallel: each rank
computes the gradient of its slice's mean loss (jitted `jax.value_and_grad`), averages the
gradient pytree with ``fc.lax.pmean(grads, "dp")`` and steps. Reference: rank 0 alone,
afterwards, on the whole global batches. Each step is timed between barriers (the slowest
rank's time; the pmean's share measured inside it); the first ``--warmup`` steps (which
compile) are not counted. XLA's CPU runtime uses every core it may, whatever ``XLA_FLAGS``
says (here a step took 16.7 ms free and 29.7 ms on one core), so bind the ranks to cores
(MPICH's ``-bind-to core``): then the single process gets one core, as each rank does.

Reported per model: median step time of each, the pmean's median, the speed-up of
data-parallel over the single process, the largest absolute difference between the two
runs' final parameters, and, at the data-parallel run's final parameters, the largest
difference between the pmean of the slices' gradients and the whole batch's gradient
(relative to the gradient's largest entry; the median over the last five batches). The
gradients differ by float32 rounding only (the sums run in another order); the parameters
start the same way, but once a ReLU input within rounding of zero falls on different
sides in the two runs (it happened after 28 steps at 2.37 M parameters here), they differ
by that one unit's share of a step. Rows are appended to ``--csv``.
"""

from __future__ import annotations

import os

os.environ.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1")

import argparse
import statistics
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp

import fcoll as fc

fc.init()
from mpi4py import MPI  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))
sys.path.insert(0, str(ROOT / "bench"))
from common import append_rows  # noqa: E402
from train_jax import Params, grad_fn, init_params, max_difference, sgd  # noqa: E402

FEATURES, CLASSES, LR = 256, 10, 0.05


def batches(steps: int, batch: int) -> list[tuple[jax.Array, jax.Array]]:
    """The same synthetic global batches on every rank."""
    key = jax.random.PRNGKey(0)
    key, sub = jax.random.split(key)
    teacher = jax.random.normal(sub, (FEATURES, CLASSES))
    out = []
    for _ in range(steps):
        key, sub = jax.random.split(key)
        x = jax.random.normal(sub, (batch, FEATURES))
        out.append((x, jnp.argmax(x @ teacher, axis=1).astype(jnp.int32)))
    return out


def data_parallel(params: Params, data: list[tuple[jax.Array, jax.Array]], comm: MPI.Comm,
                  warmup: int) -> tuple[Params, list[float], list[float]]:
    """Train over the job; the per-step times (slowest rank) and pmean times after warm-up."""
    r, n = comm.Get_rank(), comm.Get_size()
    per_rank = len(data[0][1]) // n
    steps, comms = [], []
    with fc.Mesh((n,), ("dp",)):
        for i, (x, y) in enumerate(data):
            comm.Barrier()
            start = time.perf_counter()
            _, grads = grad_fn(params, x[r * per_rank : (r + 1) * per_rank],
                               y[r * per_rank : (r + 1) * per_rank])
            jax.block_until_ready(grads)
            before = time.perf_counter()
            grads = fc.lax.pmean(grads, "dp")
            after = time.perf_counter()
            params = jax.block_until_ready(sgd(params, grads, LR))
            elapsed = time.perf_counter() - start
            if i >= warmup:
                steps.append(float(comm.allreduce(elapsed, op=MPI.MAX)))
                comms.append(float(comm.allreduce(after - before, op=MPI.MAX)))
    return params, steps, comms


def single_process(params: Params, data: list[tuple[jax.Array, jax.Array]],
                   warmup: int) -> tuple[Params, list[float]]:
    """The same training in this process alone, on the whole batches; per-step times."""
    times = []
    for i, (x, y) in enumerate(data):
        start = time.perf_counter()
        params = jax.block_until_ready(sgd(params, grad_fn(params, x, y)[1], LR))
        if i >= warmup:
            times.append(time.perf_counter() - start)
    return params, times


def gradient_difference(params: Params, data: list[tuple[jax.Array, jax.Array]],
                        comm: MPI.Comm) -> float | None:
    """The median over ``data``'s batches of max |pmean of the slices' gradients - the whole
    batch's gradient| / max |gradient|, at ``params`` (on rank 0; None elsewhere): one
    step's rounding, without the drift. The median leaves out a batch where a ReLU input
    within rounding of zero falls on different sides in the two computations."""
    r, n = comm.Get_rank(), comm.Get_size()
    found = []
    for x, y in data:
        per_rank = len(y) // n
        with fc.Mesh((n,), ("dp",)):
            averaged = fc.lax.pmean(grad_fn(params, x[r * per_rank : (r + 1) * per_rank],
                                            y[r * per_rank : (r + 1) * per_rank])[1], "dp")
        if r == 0:
            whole = grad_fn(params, x, y)[1]
            top = max(float(jnp.max(jnp.abs(g))) for g in jax.tree_util.tree_leaves(whole))
            found.append(max_difference(averaged, whole) / top)
    return float(statistics.median(found)) if r == 0 else None


def compare(hidden: int, steps: int, warmup: int, batch: int, comm: MPI.Comm) -> dict[str, object]:
    start = init_params([FEATURES, hidden, hidden, hidden, CLASSES], seed=0)
    data = batches(warmup + steps, batch)
    params, dp_times, pmean_times = data_parallel(start, data, comm, warmup)
    grad_diff = gradient_difference(params, data[-5:], comm)
    row: dict[str, object] = {
        "n": comm.Get_size(), "params": sum(leaf.size for leaf in jax.tree_util.tree_leaves(start)),
        "hidden": hidden, "batch": batch, "steps": steps,
        "dp_ms": round(statistics.median(dp_times) * 1e3, 2),
        "pmean_ms": round(statistics.median(pmean_times) * 1e3, 2)}
    if comm.Get_rank() == 0:  # the others wait, sleeping, in quiet_barrier
        ref, ref_times = single_process(start, data, warmup)
        row["single_ms"] = round(statistics.median(ref_times) * 1e3, 2)
        row["speedup"] = round(statistics.median(ref_times) / statistics.median(dp_times), 3)
        row["max_abs_diff"] = max_difference(params, ref)
        row["grad_rel_diff"] = grad_diff
    quiet_barrier(comm)
    return row


def quiet_barrier(comm: MPI.Comm) -> None:
    """A barrier that sleeps while it waits (MPICH's spins, taking a core from rank 0's
    single-process run)."""
    request = comm.Ibarrier()
    while not request.Test():
        time.sleep(1e-3)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--hidden", type=int, nargs="+", default=[1024, 2048])
    parser.add_argument("--steps", type=int, default=30, help="timed steps")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps first (they compile)")
    parser.add_argument("--batch", type=int, default=128, help="global batch")
    parser.add_argument("--csv", type=Path, default=ROOT / "bench" / "results" / "jax_pmean.csv")
    args = parser.parse_args()
    comm = MPI.COMM_WORLD.Dup()
    rows = [compare(h, args.steps, args.warmup, args.batch, comm) for h in args.hidden]
    if comm.Get_rank() != 0:
        return
    print("| n | parameters | data-parallel ms/step | of which pmean | one process ms/step | "
          "speed-up | final parameters: max abs diff | one step's gradient: max rel diff |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for row in rows:
        print(f"| {row['n']} | {int(str(row['params'])) / 1e6:.2f} M | {row['dp_ms']:.1f} | "
              f"{row['pmean_ms']:.1f} | {row['single_ms']:.1f} | {row['speedup']:.2f}x | "
              f"{float(str(row['max_abs_diff'])):.1e} | {float(str(row['grad_rel_diff'])):.1e} |")
    append_rows(args.csv, rows)


if __name__ == "__main__":
    main()
