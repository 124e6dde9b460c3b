"""fcoll.lax inside jax.jit against mpi4jax, and eager calls before and after (issue 40).

    python bench/jit.py [--sizes 1 2] [--bytes 8 64K 1M] [--launches 3] [--out bench/results/jit]

For each world size it launches ``mpiexec -n N`` of this file (``--worker``) ``--launches``
times, the sizes interleaved; each launch measures, in one job, float32 sums of 8 B, 64 KiB
and 1 MiB per rank:

- ``loop``: per collective inside one ``jax.lax.fori_loop`` of ``c = psum(c) / n``
  (fcoll.lax.psum; ``mpi4jax.allreduce`` on a duplicate of the world; ``none``: the loop of
  ``c / n`` alone), the implementations interleaved batch by batch in a rotating order;
- ``call``: per call of a jitted function holding one such collective, and of the same
  function without it (``none``);
- ``eager``: ``fc.all_reduce`` of 8 B numpy, before the job's first jitted collective and
  after every jitted call above (the ratio is ``eager after / before``);
- ``dispatch``: per call of ``jax.jit(lambda v: v / n)`` beside the same function with an
  unordered effect (``jax.debug.callback`` of nothing) and with an ordered one
  (``jax.experimental.io_callback(ordered=True)``, and fcoll's psum on one rank, whose handler
  copies): what JAX's dispatch costs a function with an effect, whatever the collective; and
  fcoll's compiled psum called without an effect or token (``jax.ffi.ffi_call``, a sequence
  of calls that is the same on every rank), what the call would cost if JAX kept the order
  of collectives without an effect (it does not: docs/performance.md, "Inside jit").

Each cell is the median over batches of the slowest rank's time; the table reports, per
cell, the median over launches, and fcoll/mpi4jax beside it (mpi4jax is not a dependency:
``MPI4JAX_BUILD_MPICC=$(which mpicc) pip install --no-build-isolation mpi4jax``, with nanobind
first and nvcc off PATH, builds it against the MPI in use; without it those columns are
empty). Writes ``OUT.csv`` (every launch's rows), ``OUT.md`` (the tables) and
``docs/img/jit.png``.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
from common import human, parse_size  # noqa: E402

KINDS = ("loop", "call")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", nargs="+", type=int, default=[1, 2])
    p.add_argument("--bytes", nargs="+", default=["8", "64K", "1M"])
    p.add_argument("--launches", type=int, default=3)
    p.add_argument("--batches", type=int, default=9)
    p.add_argument("--out", type=Path, default=HERE / "results" / "jit")
    p.add_argument("--plot", type=Path, default=ROOT / "docs" / "img" / "jit.png")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    return p.parse_args(argv)


# ---- the worker (under mpiexec) ---------------------------------------------------------------

def worker(args: argparse.Namespace) -> None:
    os.environ.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1")
    import jax
    import jax.numpy as jnp
    import numpy as np

    import fcoll as fc

    fc.init()
    from mpi4py import MPI

    try:
        import mpi4jax
    except ImportError:
        mpi4jax = None
    comm, n = MPI.COMM_WORLD.Dup(), fc.get_world_size()
    m4j_comm = MPI.COMM_WORLD.Dup()

    def timed(runs: dict[str, Callable[[], Any]], per_batch: int) -> dict[str, float]:
        for run in runs.values():  # compile, warm
            jax.block_until_ready(run())
        names, times = list(runs), defaultdict(list)
        for b in range(args.batches):
            for name in names[b % len(names):] + names[: b % len(names)]:
                comm.Barrier()
                start = time.perf_counter()
                jax.block_until_ready(runs[name]())
                times[name].append(comm.allreduce(time.perf_counter() - start, op=MPI.MAX) / per_batch)
        return {name: statistics.median(t) for name, t in times.items()}

    host = np.ones(2, np.float32)

    def eager() -> float:  # the median of 9 blocks of 1000 calls, the slowest rank's
        for _ in range(200):
            fc.all_reduce(host)
        blocks = []
        for _ in range(9):
            comm.Barrier()
            start = time.perf_counter()
            for _ in range(1000):
                fc.all_reduce(host)
            blocks.append(comm.allreduce(time.perf_counter() - start, op=MPI.MAX) / 1000)
        return float(statistics.median(blocks))

    rows: list[dict[str, Any]] = []

    def add(kind: str, nbytes: int, impl: str, seconds: float) -> None:
        rows.append({"kind": kind, "n": n, "bytes": nbytes, "impl": impl, "us": seconds * 1e6})

    before = eager()
    add("eager", 8, "before", before)
    ops: dict[str, Callable[[Any], Any]] = {"fcoll": lambda c: fc.lax.psum(c, "x"),
                                            "none": lambda c: c}
    if mpi4jax is not None:
        ops["mpi4jax"] = lambda c: mpi4jax.allreduce(c, op=MPI.SUM, comm=m4j_comm)
    with fc.Mesh((n,), ("x",)):
        for text in args.bytes:
            nbytes = parse_size(text)
            x = jnp.ones(max(nbytes // 4, 1), jnp.float32)
            steps = 200 if nbytes <= 64 << 10 else 40
            loops, calls = {}, {}
            for name, op in ops.items():
                loop = jax.jit(lambda v, op=op, k=steps: jax.lax.fori_loop(0, k, lambda i, c: op(c) / n, v))
                loops[name] = lambda loop=loop, x=x: loop(x)
                one = jax.jit(lambda v, op=op: op(v) / n)

                def call(one: Any = one, x: Any = x, k: int = steps) -> Any:
                    for _ in range(k):
                        y = one(x)
                    return y
                calls[name] = call
            for name, seconds in timed(loops, steps).items():
                add("loop", nbytes, name, seconds)
            for name, seconds in timed(calls, steps).items():
                add("call", nbytes, name, seconds)
            add("eager", 8, f"after {human(nbytes)}", eager())
        add("eager", 8, "after", eager())
        rows += dispatch(jax, jnp, fc, n, timed)
    if fc.get_rank() == 0:
        print(json.dumps(rows))


def dispatch(jax: Any, jnp: Any, fc: Any, n: int, timed: Callable[..., dict[str, float]]
             ) -> list[dict[str, Any]]:
    """The ``dispatch`` rows: one jitted call, without and with an effect."""
    from jax.experimental import io_callback

    x = jnp.ones(2, jnp.float32)
    spec = jax.ShapeDtypeStruct(x.shape, x.dtype)
    from fcoll.xla import channel, handler, primitives

    user = fc.new_group(list(range(n))) if n > 1 else None
    world = user or primitives.group_of(tuple(range(n)))
    target = handler.register("cpu")
    attrs = channel.prepare("psum", world, primitives.jit_of, [jax.core.ShapedArray(x.shape, x.dtype)],
                            {"op": "sum"})
    bare = jax.ffi.ffi_call(target, spec, has_side_effect=True)  # no effect, no token
    fns = {"no effect": jax.jit(lambda v: v / n),
           "no effect, fcoll's compiled psum (unordered: not shipped)": jax.jit(
               lambda v: bare(v, **attrs, fcoll=handler.describe("psum", world.ranks, {"op": "sum"})) / n),
           "unordered effect (debug.callback)": jax.jit(
               lambda v: (jax.debug.callback(lambda *a: None, v), v / n)[1]),
           "ordered effect (io_callback)": jax.jit(
               lambda v: io_callback(lambda a: a, spec, v, ordered=True) / n),
           "ordered effect (fcoll psum)": jax.jit(lambda v: fc.lax.psum(v, "x") / n)}
    steps, runs = 200, {}
    for name, f in fns.items():
        def run(f: Any = f) -> Any:
            for _ in range(steps):
                y = f(x)
            return y
        runs[name] = run
    return [{"kind": "dispatch", "n": n, "bytes": 8, "impl": name, "us": s * 1e6}
            for name, s in timed(runs, steps).items()]


# ---- the driver ------------------------------------------------------------------------------

def launch(n: int, args: argparse.Namespace) -> list[dict[str, Any]]:
    mpiexec = Path(sys.executable).parent / "mpiexec"
    command = [str(mpiexec), *(["-bind-to", "core"] if n > (os.cpu_count() or 1) else []), "-n", str(n),
               sys.executable, __file__, "--worker", "--batches", str(args.batches), "--bytes", *args.bytes]
    env = {**os.environ, "PYTHONPATH": f"{ROOT}:{os.environ.get('PYTHONPATH', '')}"}
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=1800, check=False)
    lines = [line for line in done.stdout.splitlines() if line.startswith("[{")]
    if done.returncode != 0 or not lines:
        raise SystemExit(f"bench/jit.py: n={n} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    rows: list[dict[str, Any]] = json.loads(lines[-1])
    return rows


def medians(rows: list[dict[str, Any]]) -> dict[tuple[str, int, int, str], float]:
    cells: dict[tuple[str, int, int, str], list[float]] = defaultdict(list)
    for r in rows:
        cells[(r["kind"], r["n"], r["bytes"], r["impl"])].append(float(r["us"]))
    return {key: statistics.median(v) for key, v in cells.items()}


def markdown(rows: list[dict[str, Any]], launches: int) -> str:
    cells = medians(rows)
    sizes = sorted({r["n"] for r in rows})
    nbytes = sorted({r["bytes"] for r in rows if r["kind"] in KINDS})
    out = [f"µs, median over {launches} launches of the median over batches of the slowest rank; "
           "ratio: fcoll / mpi4jax", "",
           "| what | n | bytes | fcoll | mpi4jax | fcoll / mpi4jax | without the collective |",
           "|---|---:|---:|---:|---:|---:|---:|"]
    for kind in KINDS:
        for n in sizes:
            for b in nbytes:
                f, m = cells.get((kind, n, b, "fcoll")), cells.get((kind, n, b, "mpi4jax"))
                none = cells.get((kind, n, b, "none"))
                if f is None or none is None:
                    continue
                what = "per collective in a jitted loop" if kind == "loop" else "per jitted call"
                versus = f"{m:.1f} | {f / m:.2f}x" if m else "- | -"
                out.append(f"| {what} | {n} | {human(b)} | {f:.1f} | {versus} | {none:.1f} |")
    out += ["", "| eager fc.all_reduce 8 B | n | before jit | after jit | after / before |",
            "|---|---:|---:|---:|---:|"]
    for n in sizes:
        b, a = cells.get(("eager", n, 8, "before")), cells.get(("eager", n, 8, "after"))
        if b and a:
            out.append(f"| µs per call | {n} | {b:.2f} | {a:.2f} | {a / b:.2f}x |")
    out += ["", "| one jitted call of `v / n` | n | µs per call |", "|---|---:|---:|"]
    for (kind, n, _, impl), us in sorted(cells.items()):
        if kind == "dispatch":
            out.append(f"| {impl} | {n} | {us:.1f} |")
    return "\n".join(out) + "\n"


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cells = medians(rows)
    sizes = sorted({r["n"] for r in rows})
    fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
    for ax, kind in zip(axes, KINDS, strict=True):
        for n in sizes:
            for impl, style in (("fcoll", "o-"), ("mpi4jax", "s--"), ("none", ":")):
                points = sorted((b, us) for (k, m, b, i), us in cells.items()
                                if k == kind and m == n and i == impl)
                if points:
                    ax.plot([p[0] for p in points], [p[1] for p in points], style, ms=4,
                            label=f"{impl}, n={n}")
        ax.set(xscale="log", yscale="log", xlabel="bytes per rank",
               title="per collective in a jitted loop" if kind == "loop" else "per jitted call")
        ax.grid(True, alpha=0.3)
    axes[0].set_ylabel("µs")
    axes[1].legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.worker:
        worker(args)
        return
    rows: list[dict[str, Any]] = []
    for k in range(args.launches):
        for n in args.sizes:
            got = launch(n, args)
            rows += [{**r, "launch": k} for r in got]
            print(f"launch {k + 1}/{args.launches}, n={n}: done", flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with open(args.out.with_suffix(".csv"), "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    text = markdown(rows, args.launches)
    args.out.with_suffix(".md").write_text(text)
    plot(rows, args.plot)
    print(text)


if __name__ == "__main__":
    main()
