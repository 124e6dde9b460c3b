"""fcoll.lax against jax.lax under shard_map, where JAX is installed: each rank runs JAX on
n virtual CPU devices over the whole data and compares its own device's result with what
fcoll computed over MPI. Skipped when JAX is not installed (it is not a dependency)."""

from __future__ import annotations

import os

import numpy as np
import pytest

import fcoll as fc
from fcoll import lax

N = fc.get_world_size()
os.environ.setdefault("XLA_FLAGS", f"--xla_force_host_platform_device_count={N}")
jax = pytest.importorskip("jax")
P = jax.sharding.PartitionSpec
shard_map = getattr(jax, "shard_map", None)
if shard_map is None:  # older JAX
    from jax.experimental.shard_map import shard_map


def jax_per_device(fn, full: np.ndarray) -> np.ndarray:
    """``fn`` under shard_map over axis "i" (axis 0 of ``full`` split across devices);
    returns this rank's device's output."""
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:N]), ("i",))
    mapped = shard_map(lambda x: fn(x)[None], mesh=mesh, in_specs=P("i"), out_specs=P("i"))
    return np.asarray(mapped(full))[fc.get_rank()]


def local(full: np.ndarray) -> np.ndarray:
    rows = full.shape[0] // N
    return full[fc.get_rank() * rows : (fc.get_rank() + 1) * rows]


def data(shape: tuple[int, ...]) -> np.ndarray:
    return np.random.default_rng(7).integers(0, 50, shape).astype(np.float32)


CASES = {
    "psum": (lambda x: jax.lax.psum(x, "i"), lambda x: lax.psum(x, "i"), (2, 3)),
    "pmax": (lambda x: jax.lax.pmax(x, "i"), lambda x: lax.pmax(x, "i"), (2, 3)),
    "all_gather": (lambda x: jax.lax.all_gather(x, "i", axis=1),
                   lambda x: lax.all_gather(x, "i", axis=1), (2, 3)),
    "all_gather tiled": (lambda x: jax.lax.all_gather(x, "i", axis=1, tiled=True),
                         lambda x: lax.all_gather(x, "i", axis=1, tiled=True), (2, 3)),
    "psum_scatter": (lambda x: jax.lax.psum_scatter(x, "i", scatter_dimension=1),
                     lambda x: lax.psum_scatter(x, "i", scatter_dimension=1), (2, N, 3)),
    "psum_scatter tiled": (lambda x: jax.lax.psum_scatter(x, "i", tiled=True),
                           lambda x: lax.psum_scatter(x, "i", tiled=True), (2 * N, 3)),
    "all_to_all 1->2": (lambda x: jax.lax.all_to_all(x, "i", 1, 2),
                        lambda x: lax.all_to_all(x, "i", 1, 2), (2, N, 3)),
    "all_to_all 2->0": (lambda x: jax.lax.all_to_all(x, "i", 2, 0),
                        lambda x: lax.all_to_all(x, "i", 2, 0), (2, 3, N)),
    "all_to_all tiled": (lambda x: jax.lax.all_to_all(x, "i", 1, 0, tiled=True),
                         lambda x: lax.all_to_all(x, "i", 1, 0, tiled=True), (2, 2 * N)),
    "ppermute": (lambda x: jax.lax.ppermute(x, "i", [(i, (i + 1) % N) for i in range(N)]),
                 lambda x: lax.ppermute(x, "i", [(i, (i + 1) % N) for i in range(N)]), (2, 3)),
}


@pytest.mark.parametrize("name", list(CASES))
def test_matches_jax(name):
    jax_fn, fcoll_fn, shape = CASES[name]
    full = data((N * shape[0], *shape[1:]))
    expected = jax_per_device(jax_fn, full)
    with fc.Mesh((N,), ("i",)):
        got = fcoll_fn(local(full))
    assert got.shape == expected.shape, (got.shape, expected.shape)
    np.testing.assert_array_equal(got, expected)
