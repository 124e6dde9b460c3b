"""2-D parallel linear layer on a (data x model) mesh, checked against one process.

    mpiexec -n 4 .venv/bin/python -m fcoll.run examples/mesh_matmul.py

The mesh is 2 x 2 over 4 ranks, axes ("dp", "tp"). The batch X (12 x 6) is split by rows
over "dp"; the weight W (6 x 4) by columns over "tp" (a tensor-parallel linear layer).
Each rank computes its block X_dp @ W_tp, then `lax.all_gather(..., "tp", axis=1,
tiled=True)` assembles its rows of Y and `lax.all_gather(..., "dp", tiled=True)` the whole
Y. The gradient of sum(Y) with respect to W is summed over "dp" with `lax.psum`. Both are
compared with the single-process result on every rank. Runs on any world size n: the mesh
is then n x 1.
"""

from __future__ import annotations

import numpy as np

import fcoll as fc
from fcoll import lax


def main() -> None:
    n = fc.get_world_size()
    shape = (2, 2) if n == 4 else (n, 1)
    rng = np.random.default_rng(0)  # the same full X and W on every rank
    x_full = rng.standard_normal((12, 6))
    w_full = rng.standard_normal((6, 4))
    with fc.Mesh(shape, ("dp", "tp")) as mesh:
        dp, tp = mesh.coordinate()
        x = np.split(x_full, shape[0], axis=0)[dp]  # my rows of the batch
        w = np.split(w_full, shape[1], axis=1)[tp]  # my columns of the weight
        y_block = x @ w
        y_rows = lax.all_gather(y_block, "tp", axis=1, tiled=True)
        y = lax.all_gather(y_rows, "dp", axis=0, tiled=True)
        grad_w = lax.psum(x.T @ np.ones_like(y_block), "dp")  # d sum(Y) / d W_tp
    assert np.allclose(y, x_full @ w_full), "Y differs from the single-process result"
    expected = (x_full.T @ np.ones((12, 4)))[:, tp * w.shape[1] : (tp + 1) * w.shape[1]]
    assert np.allclose(grad_w, expected), "dW differs from the single-process result"
    checks = fc.all_gather_object(True)
    if fc.get_rank() == 0:
        print(f"mesh {mesh.shape} {mesh.names}: Y = X @ W ({y.shape}) and dW match the "
              f"single-process result on all {len(checks)} ranks")


if __name__ == "__main__":
    main()
