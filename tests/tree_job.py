"""Every float reduction against the canonical tree, in one job (run by tests/test_tree.py at
p = 4..8, oversubscribed, on each transport and node layout):

    mpiexec -n P python tests/tree_job.py [--oracle] [--traffic] [--nodes K] [--pipeline B]

Each rank derives every rank's input and checks, bit for bit, that ``all_reduce`` (blocking,
async, coalesced), ``reduce`` (to the last rank), ``reduce_scatter_tensor``, ``reduce_scatter``
(uneven blocks), ``scan`` and ``exscan(with_total=True)`` equal `fcoll.testing.reference_reduce`
and `reference_scan`, for float32, float64, bfloat16 and complex64, sum, avg, max, premul_sum
and a ufunc, at sizes on both sides of the doubling/halving switch (and the segment's steps).
``--oracle``: MPI's own ``MPI_Allreduce`` (run with MPICH's recursive-doubling or
reduce-scatter-allgather algorithm) equals it too. ``--traffic``: on the MPI path, an
all_reduce sends at most ``2 ceil(lg p) + 2`` messages, within its schedule's bytes, and
allocates at most ``3 n`` bytes (tracemalloc). ``--nodes K``: the world group split into K
nodes (`fcoll.backends.nodes`; 0: no split, the flat schedules), checked at the end;
``--pipeline B``: large hierarchical all-reduces in pieces of B bytes per rank. Prints ``ok``
per rank; any failure raises.
"""

from __future__ import annotations

import math
import sys
import tracemalloc
from typing import Any

import ml_dtypes
import numpy as np

import fcoll as fc
from fcoll.backends import nodes
from fcoll.backends.tree import doubling_limit
from fcoll.testing import reference_reduce, reference_scan

fc.init()
R, P = fc.get_rank(), fc.get_world_size()
Q = 1 << (P.bit_length() - 1)
DTYPES = [np.dtype(np.float32), np.dtype(np.float64), np.dtype(ml_dtypes.bfloat16),
          np.dtype(np.complex64)]
OPS: list[Any] = ["sum", "avg", "max", fc.premul_sum(0.5), np.logaddexp]
SIZES = [(), (0,), (7,), (2 * P, 3), (doubling_limit(P) // 8 + 2 * Q + 2,), (70001,)]


def inputs(shape: tuple[int, ...], dtype: np.dtype[Any], salt: int) -> list[np.ndarray]:
    """Every rank's input: magnitudes that make the order of the fold show in the low bits."""
    out = []
    for k in range(P):
        g = np.random.default_rng([salt, k])
        a = g.standard_normal(shape) * 10.0 ** g.integers(-4, 5, shape)
        if dtype.kind == "c":
            a = a + 1j * g.standard_normal(shape)
        out.append(np.asarray(a).astype(dtype))
    return out


def same(got: Any, want: Any, what: str) -> None:
    if got is None and want is None:
        return
    if got is None or want is None or got.dtype != want.dtype or got.shape != want.shape \
            or np.ascontiguousarray(got).tobytes() != np.ascontiguousarray(want).tobytes():
        raise AssertionError(f"rank {R} of {P}: {what}: got {got!r:.200} expected {want!r:.200}")


def check(shape: tuple[int, ...], dtype: np.dtype[Any], op: Any, salt: int) -> None:
    what = f"{dtype}{list(shape)} {getattr(op, '__name__', op)}"
    xs = inputs(shape, dtype, salt)
    x, want = xs[R], reference_reduce(xs, op)
    same(fc.all_reduce(x, op), want, "all_reduce " + what)
    same(fc.all_reduce(x, op, async_op=True).wait(), want, "async all_reduce " + what)
    same(fc.all_reduce_coalesced([x, x[..., :1] if x.ndim else x], op)[0], want, "coalesced " + what)
    same(fc.reduce(x, P - 1, op), want if R == P - 1 else None, "reduce " + what)
    if x.ndim and x.shape[0] % P == 0 and x.size:
        same(fc.reduce_scatter_tensor(x, op), np.split(want, P)[R], "reduce_scatter " + what)
    if x.ndim == 1 and x.size >= P * (P + 1) // 2:
        cuts = np.cumsum([k + 1 for k in range(P - 1)])
        blocks = np.split(x, cuts)
        same(fc.reduce_scatter(blocks, op), np.split(want, cuts)[R], "uneven reduce_scatter " + what)
    if op in ("sum", "max") or isinstance(op, np.ufunc):
        prefix, total = fc.exscan(x, op, with_total=True)
        same(total, want, "exscan total " + what)
        if R:
            same(prefix, reference_scan(xs, op, exclusive=True)[R], "exscan " + what)
        same(fc.scan(x, op), reference_scan(xs, op)[R], "scan " + what)


def oracle() -> None:
    """MPI's own MPI_Allreduce (the job runs MPICH's recursive doubling or Rabenseifner)."""
    comm = fc.world().comm("tree_job")
    for n in (8, 1000, 70000):
        xs = inputs((n,), np.dtype(np.float32), n)
        out = np.empty(n, np.float32)
        comm.Allreduce(xs[R], out)
        same(out, reference_reduce(xs), f"MPI_Allreduce float32[{n}]")
        same(fc.all_reduce(xs[R]), out, f"all_reduce against MPI_Allreduce float32[{n}]")


def traffic() -> None:
    """Messages, bytes and memory of one all_reduce on the MPI path (FCOLL_SHM=0)."""
    for n in (1000, doubling_limit(P) // 4 - 3, 1 << 19):
        x = np.ones(n, np.float32)
        fc.all_reduce(x)
        tracemalloc.start()
        with fc.debug.traffic() as t:
            fc.all_reduce(x)
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        doubling = x.nbytes <= doubling_limit(P)
        most = (math.log2(Q) + 1) * x.nbytes if doubling else 3 * x.nbytes + 64 * Q
        assert t.calls == 1 and 1 <= t.messages <= 2 * math.ceil(math.log2(P)) + 2, t.table()
        assert t.bytes <= most, (t.table(), most)
        if n >= 1 << 14:  # below, Python's own objects count
            assert peak <= 3 * x.nbytes, f"rank {R}: all_reduce of {x.nbytes} B allocated {peak} B"


def main() -> None:
    if "--pipeline" in sys.argv:
        nodes.PIPELINE = int(sys.argv[sys.argv.index("--pipeline") + 1])
    salt = 0
    for shape in SIZES:
        for dtype in DTYPES:
            for op in OPS:
                if dtype.kind == "c" and op not in ("sum", "avg"):
                    continue
                if isinstance(op, np.ufunc) and dtype.kind == "c":
                    continue
                salt += 1
                check(shape, dtype, op, salt)
    if "--oracle" in sys.argv:
        oracle()
    if "--traffic" in sys.argv:
        traffic()
    if "--nodes" in sys.argv:
        h, k = fc.world().nodes, int(sys.argv[sys.argv.index("--nodes") + 1])
        assert (h.k if h else 0) == k, f"rank {R}: expected {k} nodes, the world has {h}"
    print(f"rank {R} of {P}: ok", flush=True)


main()
