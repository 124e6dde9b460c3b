"""The worker of bench/numeric.py (run under mpiexec): fcoll's numeric-code functions against
the mpi4py code a careful user writes, in the same processes, in rotating batches.

    mpiexec -n 2 .venv/bin/python bench/numeric_worker.py --csv out.csv [--batches 7] [--quick]

Sections (the raw side preallocates every buffer and writes in place):

- ``scan``/``exscan``: ``fc.scan(x)`` against ``comm.Scan(x, out, MPI.SUM)`` (float64 sum);
- ``sendrecv``: a ring, ``fc.sendrecv(x, r + 1, r - 1)`` (and ``like=x``: the data alone, as
  ``fcoll-like``) against ``comm.Sendrecv(x, ..., out, ...)``;
- ``halo``: a 2-D periodic grid on a mesh of the ranks, blocks of m x m plus ``w`` ghost cells,
  ``fc.halo_exchange`` against four ``Sendrecv`` per call (rows sent as they are, columns
  packed into preallocated buffers), in place (``raw``) and on a copy of the block, as a pure
  function has to (``raw+copy``); ``fcoll-donate``: ``donate=True`` on a block kept across
  calls (filled in place, as ``raw``);
- ``cg``: one iteration of examples/poisson.py's conjugate gradients on an N x N grid (its
  donated halos), against the same solver with those raw halos and
  ``Allreduce(MPI.IN_PLACE, buf)`` dot products.

A batch's time is the slowest rank's per call; each cell reports the median per
implementation and the median of per-batch ratios against ``raw``.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

import fcoll as fc

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from common import append_rows, human, rotating  # noqa: E402

fc.init()
from mpi4py import MPI  # noqa: E402

Fn = Callable[[], Any]
RUN = [0]  # which run of bench/numeric.py this job is (--run)


def _poisson() -> Any:
    spec = importlib.util.spec_from_file_location("poisson", HERE.parent / "examples" / "poisson.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def record(comm: Any, rows: list[dict[str, object]], section: str, case: str, size: int,
           times: dict[str, list[float]]) -> None:
    n = comm.Get_size()
    line = [f"{section:9} {case:8} {human(size) if section in ('scan', 'exscan', 'sendrecv') else size:>9}"]
    for name, values in times.items():
        ratio = statistics.median(a / b for a, b in zip(values, times["raw"], strict=True))
        q1, _, q3 = statistics.quantiles(values, n=4) if len(values) > 1 else (values[0],) * 3
        rows.append({"n": n, "run": RUN[0], "section": section, "case": case, "size": size,
                     "impl": name,
                     "median_us": statistics.median(values) * 1e6, "q1_us": q1 * 1e6,
                     "q3_us": q3 * 1e6, "ratio": ratio, "batches": len(values)})
        line.append(f"{name} {statistics.median(values) * 1e6:10.1f} us ({ratio:.2f})")
    if comm.Get_rank() == 0:
        print("  ".join(line), flush=True)


def prefix_cells(comm: Any, sizes: list[int], args: argparse.Namespace, rows: list[Any]) -> None:
    for fn, ours, raw in (("scan", fc.scan, comm.Scan), ("exscan", fc.exscan, comm.Exscan)):
        for size in sizes:
            x = np.full(max(1, size // 8), comm.Get_rank() + 1.0)
            out = np.empty_like(x)
            impls = {"fcoll": lambda f=ours, x=x: f(x),
                     "raw": lambda raw=raw, x=x, out=out: raw(x, out, MPI.SUM)}
            record(comm, rows, fn, "float64", size, rotating(comm, impls, args.batches, args.budget))


def sendrecv_cells(comm: Any, sizes: list[int], args: argparse.Namespace, rows: list[Any]) -> None:
    r, n = comm.Get_rank(), comm.Get_size()
    dst, src = (r + 1) % n, (r - 1) % n
    for size in sizes:
        x = np.full(max(1, size // 8), r + 1.0)
        out = np.empty_like(x)
        impls = {"fcoll": lambda x=x: fc.sendrecv(x, dst, src),
                 "fcoll-like": lambda x=x: fc.sendrecv(x, dst, src, like=x),
                 "raw": lambda x=x, out=out: comm.Sendrecv(x, dst, 0, out, src, 0)}
        record(comm, rows, "sendrecv", "ring", size, rotating(comm, impls, args.batches, args.budget))


class RawHalo:
    """The careful mpi4py halo exchange on a periodic Cartesian communicator: in place,
    rows sent as they are (contiguous), columns packed into preallocated buffers."""

    def __init__(self, cart: Any, shape: tuple[int, int], w: int) -> None:
        self.cart, self.w = cart, w
        rows, cols = shape
        self.row_recv = [np.empty((w, cols)) for _ in range(2)]
        self.col = [np.empty((rows, w)) for _ in range(4)]  # send up, send down, recv x2
        self.shifts = [cart.Shift(0, 1), cart.Shift(1, 1)]

    def __call__(self, a: np.ndarray) -> np.ndarray:
        w, cart = self.w, self.cart
        (src, dst), (left, right) = self.shifts
        n = a.shape[0]
        cart.Sendrecv(a[n - 2 * w : n - w], dst, 0, self.row_recv[0], src, 0)
        cart.Sendrecv(a[w : 2 * w], src, 1, self.row_recv[1], dst, 1)
        a[:w], a[n - w :] = self.row_recv
        m = a.shape[1]
        up, down, got_low, got_high = self.col
        up[...] = a[:, m - 2 * w : m - w]
        down[...] = a[:, w : 2 * w]
        cart.Sendrecv(up, right, 2, got_low, left, 2)
        cart.Sendrecv(down, left, 3, got_high, right, 3)
        a[:, :w], a[:, m - w :] = got_low, got_high
        return a


def layout(n: int) -> tuple[int, int]:
    return (2, n // 2) if n % 2 == 0 and n > 2 else (n, 1)


def halo_cells(comm: Any, sides: list[int], args: argparse.Namespace, rows: list[Any]) -> None:
    shape = layout(comm.Get_size())
    mesh = fc.Mesh(shape, ("y", "x"))
    cart = comm.Create_cart(shape, periods=[True, True])
    for w in (1, 4):
        for m in sides:
            x = np.random.default_rng(comm.Get_rank()).random((m + 2 * w, m + 2 * w))
            a, d = x.copy(), x.copy()
            raw = RawHalo(cart, x.shape, w)
            impls = {"fcoll": lambda x=x, w=w: fc.halo_exchange(x, mesh, w, periodic=True),
                     "fcoll-donate": lambda d=d, w=w: fc.halo_exchange(d, mesh, w, periodic=True,
                                                                       donate=True),
                     "raw": lambda a=a, raw=raw: raw(a),
                     "raw+copy": lambda x=x, raw=raw: raw(x.copy())}
            record(comm, rows, "halo", f"w={w}", m, rotating(comm, impls, args.batches, args.budget))


def cg_cells(comm: Any, sizes: list[int], args: argparse.Namespace, rows: list[Any]) -> None:
    """One CG iteration (examples/poisson.py's) per call, fcoll against raw mpi4py."""
    ex = _poisson()
    shape = ex.mesh_shape(comm.Get_size())
    mesh = fc.Mesh(shape, ("y", "x"))
    cart = comm.Create_cart(shape, periods=[False, False])
    buf = np.empty(1)

    def raw_dot(a: np.ndarray, b: np.ndarray) -> float:
        buf[0] = np.vdot(a, b)
        comm.Allreduce(MPI.IN_PLACE, buf)
        return float(buf[0])

    for size in sizes:
        (r0, r1), (c0, c1) = (ex.bounds(size, parts, i)
                              for parts, i in zip(shape, mesh.coordinate(), strict=True))
        h, b = 1.0 / (size + 1), ex.source(size)[r0:r1, c0:c1]
        raw_halo = RawHalo(cart, (r1 - r0 + 2, c1 - c0 + 2), 1)
        impls = {"fcoll": _cg_step(b, h, lambda p: fc.halo_exchange(p, mesh, 1, donate=True), ex.dot,
                                   ex.stencil),
                 "raw": _cg_step(b, h, raw_halo, raw_dot, ex.stencil)}
        record(comm, rows, "cg", "poisson", size, rotating(comm, impls, args.batches, args.budget))


def _cg_step(b: np.ndarray, h: float, halo: Callable[[np.ndarray], np.ndarray],
             dot: Callable[[np.ndarray, np.ndarray], float], stencil: Any) -> Fn:
    """A closure making one CG iteration on its own state (restarted when it converges)."""
    state: dict[str, Any] = {}

    def reset() -> None:
        p = np.zeros((b.shape[0] + 2, b.shape[1] + 2))
        p[1:-1, 1:-1] = b
        state.update(u=np.zeros_like(b), r=b.copy(), p=p, rr=dot(b, b), rr0=dot(b, b))

    def step() -> None:  # restarted once converged (every rank sees the same rr)
        if not state or not state["rr"] > 1e-24 * state["rr0"]:
            reset()
        p, r, u = state["p"], state["r"], state["u"]
        ap = stencil(halo(p), h)
        alpha = state["rr"] / dot(p[1:-1, 1:-1], ap)
        u += alpha * p[1:-1, 1:-1]
        r -= alpha * ap
        rr, previous = dot(r, r), state["rr"]
        p[1:-1, 1:-1] = r + (rr / previous) * p[1:-1, 1:-1]
        state["rr"] = rr

    return step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--csv", type=Path, required=True)
    parser.add_argument("--batches", type=int, default=7)
    parser.add_argument("--budget", type=float, default=0.02, help="seconds per batch")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--sections", nargs="+", default=["scan", "sendrecv", "halo", "cg"])
    parser.add_argument("--run", type=int, default=0)
    args = parser.parse_args()
    RUN[0] = args.run
    comm, rows = fc.world().comm("bench"), []
    sizes = [8, 4096, 1 << 20] if args.quick else [8, 512, 4096, 65536, 1 << 20, 4 << 20]
    if "scan" in args.sections:
        prefix_cells(comm, sizes, args, rows)
    if "sendrecv" in args.sections:
        sendrecv_cells(comm, sizes, args, rows)
    if "halo" in args.sections:
        halo_cells(comm, [64, 512] if args.quick else [64, 256, 1024, 2048], args, rows)
    if "cg" in args.sections:
        cg_cells(comm, [128] if args.quick else [128, 512, 1024], args, rows)
    if comm.Get_rank() == 0:
        append_rows(args.csv, rows)


if __name__ == "__main__":
    main()
