"""The cost of fcoll's transformable collectives (issue 28): JAX inside jit, torch autograd.

    mpiexec -bind-to core -n 2 .venv/bin/python bench/bench_transforms.py [--sizes 8 4K 64K 1M]

Three tables, each the slowest rank's time (the median over ``--batches`` batches):

1. **A collective inside a jitted loop.** ``jax.lax.fori_loop`` of ``K`` steps, each
   ``c = psum(c) / n`` of one float32 array, timed per step: ``fcoll.lax.psum`` (fcoll's
   primitive, its FFI handler), the same step with ``jax.experimental.io_callback(ordered=True)``
   calling ``fc.all_reduce``, and ``mpi4jax.allreduce`` when mpi4jax imports (it is not a
   dependency; `pip install mpi4jax` builds it against the MPI in use). Beside them, the
   eager calls: ``fc.lax.psum`` on a JAX array and ``fc.all_reduce`` on numpy, one Python call
   per step; and one jitted call of a one-psum function per step (dispatch, the ordered
   effect's token and the handler).
2. **A whole training step** of examples/train_jax.py's MLP (64 -> 256 -> 256 -> 10, global
   batch 120): forward, backward, ``pmean`` of the gradients and the update in one
   ``jax.jit``, against the eager ``pmean`` between jitted gradient and update.
3. **torch forward + backward** of each differentiable collective on a float32 tensor that
   requires grad (``y = op(x); y.backward(g)``), against the forward alone under
   ``torch.no_grad()``.

Written to ``--out`` (default ``bench/results/<date>/``): ``transforms.csv``,
``transforms.md`` (the tables) and ``transforms.png`` (table 1). Timings taken on a
machine shared with other jobs are noisy: compare the columns of one run.
"""

from __future__ import annotations

import os

os.environ.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1")
os.environ.setdefault("OMP_NUM_THREADS", "1")  # one thread per rank, as bench/README.md says

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import fcoll as fc

fc.init()
from jax.experimental import io_callback  # noqa: E402
from mpi4py import MPI  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "examples"))
from common import human, parse_size  # noqa: E402

try:
    import mpi4jax
except ImportError as error:  # not a dependency
    mpi4jax, WHY_NO_MPI4JAX = None, f"mpi4jax does not import here ({error})"
else:
    WHY_NO_MPI4JAX = ""

COMM = MPI.COMM_WORLD.Dup()  # for the timing's own barriers and maxima


def slowest(seconds: float) -> float:
    return float(COMM.allreduce(seconds, op=MPI.MAX))


def timed(runs: dict[str, Callable[[], Any]], batches: int, per_batch: int) -> dict[str, float]:
    """Seconds per step of each run (``run()`` does ``per_batch`` steps): the median over
    batches of the slowest rank's time, the runs taking turns batch by batch (in an order
    that rotates), so that a busy moment of the machine falls on all of them alike. One
    untimed batch of each first (it compiles)."""
    for run in runs.values():
        jax.block_until_ready(run())
    names, times = list(runs), {name: [] for name in runs}  # type: ignore[var-annotated]
    for b in range(batches):
        for name in names[b % len(names):] + names[: b % len(names)]:
            COMM.Barrier()
            start = time.perf_counter()
            jax.block_until_ready(runs[name]())
            times[name].append(slowest(time.perf_counter() - start) / per_batch)
    return {name: statistics.median(t) for name, t in times.items()}


def jit_loops(x: jax.Array, steps: int) -> dict[str, Callable[[], Any]]:
    """The jitted loops of table 1, by implementation."""
    n = fc.get_world_size()
    shape = jax.ShapeDtypeStruct(x.shape, x.dtype)
    ops: dict[str, Callable[[Any], Any]] = {
        "fcoll jit": lambda c: fc.lax.psum(c, "x"),
        "io_callback": lambda c: io_callback(lambda a: fc.all_reduce(np.asarray(a)), shape, c,
                                             ordered=True),
    }
    if mpi4jax is not None:
        ops["mpi4jax jit"] = lambda c: mpi4jax.allreduce(c, op=MPI.SUM, comm=COMM)
    loops = {}
    for name, op in ops.items():
        loop = jax.jit(lambda v, op=op: jax.lax.fori_loop(0, steps, lambda i, c: op(c) / n, v))
        loops[name] = lambda loop=loop: loop(x)
    return loops


def numpy_eager(x: jax.Array, steps: int) -> Callable[[], Any]:
    host = np.asarray(x)

    def run() -> Any:
        for _ in range(steps):
            y = fc.all_reduce(host)
        return y
    return run


def eager_loops(x: jax.Array, steps: int) -> dict[str, Callable[[], Any]]:
    """The Python loops of table 1: eager calls, and one jitted call per step."""
    one = jax.jit(lambda v: fc.lax.psum(v, "x"))

    def lax_eager() -> Any:
        for _ in range(steps):
            y = fc.lax.psum(x, "x")
        return y

    def jitted_calls() -> Any:
        for _ in range(steps):
            y = one(x)
        return y

    return {"fcoll.lax eager (JAX)": lax_eager, "one jitted call per step": jitted_calls,
            "fc.all_reduce eager (numpy), after jit": numpy_eager(x, steps)}


def table_collectives(sizes: list[int], batches: int) -> list[dict[str, object]]:
    """Table 1. The eager numpy calls run first, before any jitted collective (which makes
    eager calls wait for jitted ones and turns the default group's fast paths off), and
    again after."""
    n, rows = fc.get_world_size(), []
    with fc.Mesh((n,), ("x",)):
        arrays = [(b, jnp.ones(max(b // 4, 1), jnp.float32), 200 if b <= 64 << 10 else 40)
                  for b in sizes]
        runs = [(b, s, {"fc.all_reduce eager (numpy)": numpy_eager(x, s)}) for b, x, s in arrays]
        runs += [(b, s, {**jit_loops(x, s), **eager_loops(x, s)}) for b, x, s in arrays]
        for nbytes, steps, loops in runs:
            for name, seconds in timed(loops, batches, steps).items():
                rows.append({"table": "collective", "n": n, "bytes": nbytes, "impl": name,
                             "us": round(seconds * 1e6, 2)})
    return rows


def table_training(batches: int) -> list[dict[str, object]]:
    import train_jax as ex

    x, y = ex.load()
    params = ex.init_params([x.shape[1], 256, 256, 10], seed=0)
    r, n = fc.get_rank(), fc.get_world_size()
    per = ex.GLOBAL_BATCH // n
    xs, ys = jnp.asarray(x[r * per : (r + 1) * per]), jnp.asarray(y[r * per : (r + 1) * per])
    runs = {}
    for name, step in (("whole step in one jit", ex.whole_step), ("eager pmean", ex.eager_step)):
        def run(step: Callable[..., Any] = step) -> Any:
            p = params
            for _ in range(20):
                p, _ = step(p, xs, ys)
            return p
        runs[name] = run
    with fc.Mesh((n,), ("dp",)):
        return [{"table": "training", "n": n, "bytes": 0, "impl": name, "us": round(sec * 1e6, 1)}
                for name, sec in timed(runs, batches, 20).items()]


def torch_ops(n: int) -> dict[str, Callable[[Any], Any]]:
    return {
        "all_reduce": lambda t: fc.all_reduce(t),
        "all_gather_into_tensor": lambda t: fc.all_gather_into_tensor(t),
        "reduce_scatter_tensor": lambda t: fc.reduce_scatter_tensor(t),
        "all_to_all_single": lambda t: fc.all_to_all_single(t),
        "broadcast": lambda t: fc.broadcast(t, 0),
        "permute_tensor": lambda t: fc.permute_tensor(t, [(i + 1) % n for i in range(n)]),
    }


def table_torch(sizes: list[int], batches: int) -> list[dict[str, object]]:
    import torch

    torch.set_num_threads(1)
    n, rows = fc.get_world_size(), []
    for nbytes in sizes:
        x = torch.ones(max(nbytes // 4 // n, 1) * n, requires_grad=True)
        steps = 100 if nbytes <= 64 << 10 else 20
        for op, f in torch_ops(n).items():
            grad = torch.ones_like(f(x.detach()))

            def forward(f: Callable[[Any], Any] = f, x: Any = x, steps: int = steps) -> None:
                with torch.no_grad():
                    for _ in range(steps):
                        f(x)

            def both(f: Callable[[Any], Any] = f, grad: Any = grad, x: Any = x,
                     steps: int = steps) -> None:
                for _ in range(steps):
                    f(x).backward(grad)

            got = timed({"forward": forward, "forward + backward": both}, batches, steps)
            rows += [{"table": "torch", "n": n, "bytes": nbytes, "impl": f"{op} {kind}",
                      "us": round(sec * 1e6, 2)} for kind, sec in got.items()]
    return rows


def markdown(rows: list[dict[str, object]]) -> str:
    """The three tables, as docs/performance.md shows them."""
    n, out = rows[0]["n"], []
    cells = {(r["table"], r["bytes"], r["impl"]): float(str(r["us"])) for r in rows}
    impls = list(dict.fromkeys(str(r["impl"]) for r in rows if r["table"] == "collective"))
    sizes = sorted({int(str(r["bytes"])) for r in rows if r["table"] == "collective"})
    if sizes:
        out += [f"µs per collective, n = {n} (median of the slowest rank)", "",
                "| bytes | " + " | ".join(impls) + " |", "|---:|" + "---:|" * len(impls)]
        out += [f"| {human(b)} | " + " | ".join(f"{cells.get(('collective', b, i), float('nan')):.1f}"
                                               for i in impls) + " |" for b in sizes]
        if WHY_NO_MPI4JAX:
            out += ["", f"mpi4jax: {WHY_NO_MPI4JAX}."]
        out.append("")
    training = [r for r in rows if r["table"] == "training"]
    if training:
        out += [f"training step, n = {n}", "", "| step | ms per step |", "|---|---:|"]
        out += [f"| {r['impl']} | {float(str(r['us'])) / 1e3:.2f} |" for r in training]
        out.append("")
    torch_rows = [r for r in rows if r["table"] == "torch"]
    if torch_rows:
        out += [f"torch, µs per call, n = {n}", "",
                "| op | bytes | forward | forward + backward | ratio |", "|---|---:|---:|---:|---:|"]
        for r in torch_rows:
            op, kind = str(r["impl"]).split(" ", 1)
            if kind == "forward":
                both = cells[("torch", r["bytes"], f"{op} forward + backward")]
                fwd = float(str(r["us"]))
                out.append(f"| {op} | {human(int(str(r['bytes'])))} | {fwd:.1f} | {both:.1f} | "
                           f"{both / fwd:.2f} |")
    return "\n".join(out) + "\n"


def plot(rows: list[dict[str, object]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series: dict[str, list[tuple[int, float]]] = {}
    for r in rows:
        if r["table"] == "collective":
            series.setdefault(str(r["impl"]), []).append((int(str(r["bytes"])), float(str(r["us"]))))
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, points in series.items():
        ax.plot([p[0] for p in points], [p[1] for p in points], "o-", ms=3, label=name)
    ax.set(xscale="log", yscale="log", xlabel="bytes per rank", ylabel="µs per collective",
           title=f"all-reduce inside and outside jax.jit, n={rows[0]['n']}")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--sizes", nargs="+", default=["8", "4K", "64K", "1M"])
    parser.add_argument("--batches", type=int, default=11)
    parser.add_argument("--tables", nargs="+", default=["collective", "training", "torch"])
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / time.strftime("%Y-%m-%d"))
    args = parser.parse_args()
    sizes = [parse_size(s) for s in args.sizes]
    rows: list[dict[str, object]] = []
    if "collective" in args.tables:
        rows += table_collectives(sizes, args.batches)
    if "training" in args.tables:
        rows += table_training(args.batches)
    if "torch" in args.tables:
        rows += table_torch(sizes, args.batches)
    if fc.get_rank() != 0 or not rows:
        return
    import csv

    args.out.mkdir(parents=True, exist_ok=True)
    with (args.out / "transforms.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    text = markdown(rows)
    (args.out / "transforms.md").write_text(text)
    if "collective" in args.tables:
        plot(rows, args.out / "transforms.png")
    print(text)


if __name__ == "__main__":
    main()
