"""2-D Poisson problem on a grid split over a mesh of ranks, solved by conjugate gradients.

    mpiexec -n 4 .venv/bin/python -m fcoll.run examples/poisson.py [--size 96] [--rtol 1e-12]

-Laplace(u) = f on the unit square, u = 0 on its edge, discretised on an N x N grid of
interior points with the 5-point stencil: A u = f with A = (4 u[i,j] - u[i-1,j] - u[i+1,j]
- u[i,j-1] - u[i,j+1]) / h^2. The grid is split over an ``fc.Mesh`` of the ranks (rows
over axis "y", columns over "x", uneven where N does not divide); each rank keeps its block
with one ghost cell on each side. Each CG iteration fills the ghosts of the search
direction with `fc.halo_exchange` (the domain edge keeps the zeros of u = 0), applies the
stencil locally, and sums its two dot products over the job with `fc.all_reduce` (in rank
order: the same iterations on every run at a given world size). Rank 0 then checks the
solution against ``scipy.sparse.linalg.spsolve`` of the whole system on one process.
"""

from __future__ import annotations

import argparse
import math
import time

import numpy as np

import fcoll as fc


def mesh_shape(n: int) -> tuple[int, int]:
    """The most square ``rows x cols`` layout of ``n`` ranks."""
    rows = max(d for d in range(1, math.isqrt(n) + 1) if n % d == 0)
    return n // rows, rows


def bounds(length: int, parts: int, i: int) -> tuple[int, int]:
    """Block ``i`` of ``length`` points split into ``parts`` (the first ones one larger)."""
    base, extra = divmod(length, parts)
    start = i * base + min(i, extra)
    return start, start + base + (i < extra)


def source(size: int) -> np.ndarray:
    """The right-hand side on the whole grid (every rank makes the same)."""
    h = 1.0 / (size + 1)
    y, x = np.meshgrid(np.arange(1, size + 1) * h, np.arange(1, size + 1) * h, indexing="ij")
    return np.sin(np.pi * x) * np.sin(2 * np.pi * y) + 4 * x * (1 - x) * y


def stencil(p: np.ndarray, h: float) -> np.ndarray:
    """A p on a block's interior, from ``p`` with its ghost cells filled."""
    inner = p[1:-1, 1:-1]
    return (4 * inner - p[:-2, 1:-1] - p[2:, 1:-1] - p[1:-1, :-2] - p[1:-1, 2:]) / (h * h)


def dot(a: np.ndarray, b: np.ndarray) -> float:
    """The dot product of two distributed vectors (this rank's blocks)."""
    return float(fc.all_reduce(np.array(np.vdot(a, b)))[()])


def solve(size: int = 96, rtol: float = 1e-12, max_iter: int = 10_000
          ) -> tuple[np.ndarray, tuple[slice, slice], int, float]:
    """CG on this rank's block: ``(u block, its rows and columns in the grid, iterations,
    seconds per iteration)``."""
    mesh = fc.Mesh(mesh_shape(fc.get_world_size()), ("y", "x"))
    (r0, r1), (c0, c1) = (bounds(size, parts, i) for parts, i in zip(mesh.shape, mesh.coordinate(),
                                                                        strict=True))
    h = 1.0 / (size + 1)
    b = source(size)[r0:r1, c0:c1]
    u = np.zeros_like(b)
    r = b.copy()
    p = np.zeros((r1 - r0 + 2, c1 - c0 + 2))  # with ghost cells: zero at the domain's edge
    p[1:-1, 1:-1] = r
    rr, bb = dot(r, r), dot(b, b)
    start, it = time.perf_counter(), 0
    while it < max_iter and math.sqrt(rr) > rtol * math.sqrt(bb):
        ap = stencil(fc.halo_exchange(p, mesh, 1, donate=True), h)  # p's ghosts, in place
        alpha = rr / dot(p[1:-1, 1:-1], ap)
        u += alpha * p[1:-1, 1:-1]
        r -= alpha * ap
        rr, previous = dot(r, r), rr
        p[1:-1, 1:-1] = r + (rr / previous) * p[1:-1, 1:-1]
        it += 1
    seconds = (time.perf_counter() - start) / max(it, 1)
    return u, (slice(r0, r1), slice(c0, c1)), it, seconds


def reference(size: int) -> np.ndarray:
    """The whole grid's solution by one process: scipy.sparse's direct solve."""
    import scipy.sparse as sp
    from scipy.sparse.linalg import spsolve

    h = 1.0 / (size + 1)
    t = sp.diags([-1.0, 2.0, -1.0], [-1, 0, 1], shape=(size, size))
    eye = sp.identity(size)
    a = (sp.kron(t, eye) + sp.kron(eye, t)) / (h * h)
    return spsolve(a.tocsc(), source(size).ravel()).reshape(size, size)


def error(u: np.ndarray, where: tuple[slice, slice], size: int) -> float:
    """max |u - u_ref| / max |u_ref| over the whole grid (every rank's block)."""
    ref = reference(size)
    mine = float(np.max(np.abs(u - ref[where]), initial=0.0))
    return float(fc.all_reduce(np.array(mine), "max")[()]) / float(np.max(np.abs(ref)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=96, help="interior points per side")
    parser.add_argument("--rtol", type=float, default=1e-12, help="CG's relative residual")
    args = parser.parse_args()
    u, where, iterations, seconds = solve(args.size, args.rtol)
    err = error(u, where, args.size)
    if fc.get_rank() == 0:
        print(f"poisson: {args.size}x{args.size} grid on a {mesh_shape(fc.get_world_size())} mesh: "
              f"{iterations} CG iterations, {seconds * 1e6:.1f} us per iteration, "
              f"max error against scipy.sparse {err:.2e}")


if __name__ == "__main__":
    main()
