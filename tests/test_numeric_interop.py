"""torch tensors and JAX arrays (CPU) through scan, exscan, maxloc/minloc, ufunc ops,
sendrecv and halo_exchange: each result equals the numpy call's bit for bit, with the
input's array type, at any world size."""

from __future__ import annotations

import numpy as np
import pytest

import fcoll as fc
from tests.helpers import data
from tests.test_interop import kind, same, to_kind  # noqa: F401  (the fixture)
from tests.test_neighbors import _blocks, _grid, _mesh_shape


def test_scan_exscan_and_ufuncs(kind, group):  # noqa: F811
    x = data(group.rank, (3, 4), "float32", salt=1)
    t = to_kind(x, kind)
    same(kind, fc.scan(t, group=group.arg), fc.scan(x, group=group.arg))
    prefix, total = fc.exscan(t, "max", group.arg, with_total=True)
    expected = fc.exscan(x, "max", group.arg, with_total=True)
    same(kind, prefix, expected[0]), same(kind, total, expected[1])
    same(kind, fc.scan(t, group=group.arg, async_op=True).wait(), fc.scan(x, group=group.arg))
    same(kind, fc.all_reduce(t, np.logaddexp, group.arg), fc.all_reduce(x, np.logaddexp, group.arg))


def test_located(kind, group):  # noqa: F811
    x = data(group.rank, (5,), "int32", salt=2)
    values, ranks = fc.minloc(to_kind(x, kind), group.arg)
    expected, expected_ranks = fc.minloc(x, group.arg)
    if kind == "jax":
        import jax

        if not jax.config.jax_enable_x64:  # JAX keeps 64-bit ints as int32 unless enabled
            expected_ranks = expected_ranks.astype(np.int32)
    same(kind, values, expected), same(kind, ranks, expected_ranks)


def test_sendrecv_and_halo(kind):  # noqa: F811
    r, n = fc.get_rank(), fc.get_world_size()
    x = data(r, (2, 3), "int16", salt=3)
    same(kind, fc.sendrecv(to_kind(x, kind), (r + 1) % n, (r - 1) % n),
         fc.sendrecv(x, (r + 1) % n, (r - 1) % n))
    mesh = fc.Mesh(_mesh_shape(n, 2), ("y", "x"))
    full = _grid((8, 9), mesh.shape, [0, 1], dtype="float32")
    block, expected = _blocks(full, mesh.shape, mesh.coordinate(), [0, 1], [1, 1], [True, False])
    same(kind, fc.halo_exchange(to_kind(block, kind), mesh, 1, periodic=[True, False]), expected)


def test_donated_halo(kind):  # noqa: F811
    """donate=True: a torch tensor is filled in place and returned itself (also bfloat16, a
    transposed view, an inference tensor inside inference_mode); one that requires grad, an
    expanded one or an inference tensor outside inference_mode raises naming x; a JAX array
    (immutable) gets a new array, as without donate, and keeps its values."""
    n = fc.get_world_size()
    mesh = fc.Mesh(_mesh_shape(n, 2), ("y", "x"))
    full = _grid((8, 9), mesh.shape, [0, 1], dtype="float32")
    block, expected = _blocks(full, mesh.shape, mesh.coordinate(), [0, 1], [1, 1], [True, False])
    x = to_kind(block, kind)
    y = fc.halo_exchange(x, mesh, 1, periodic=[True, False], donate=True)
    same(kind, y, expected)
    if kind == "jax":
        assert y is not x
        same(kind, x, block)
        return
    import torch

    assert y is x
    t = to_kind(np.ascontiguousarray(block.T), kind).T  # a view of another layout
    assert fc.halo_exchange(t, mesh, 1, periodic=[True, False], donate=True) is t
    same(kind, t, expected)
    b = to_kind(block, kind).to(torch.bfloat16)
    assert fc.halo_exchange(b, mesh, 1, periodic=[True, False], donate=True) is b
    same(kind, b.float(), expected)
    g = to_kind(block, kind).requires_grad_()
    with pytest.raises(ValueError, match="expected x not to require grad with donate=True"):
        fc.halo_exchange(g, mesh, 1, periodic=[True, False], donate=True)
    # what torch's own in-place ops refuse, refused on every rank before anything is sent
    wide = to_kind(block[:1], kind).expand(*block.shape)
    with pytest.raises(ValueError, match="expected x's elements to have memory of their own"):
        fc.halo_exchange(wide, mesh, 1, periodic=[True, False], donate=True)
    with torch.inference_mode():
        frozen = to_kind(block, kind)
    with pytest.raises(ValueError, match="got an inference tensor outside"):
        fc.halo_exchange(frozen, mesh, 1, periodic=[True, False], donate=True)
    with torch.inference_mode():  # inside inference_mode it may be written
        assert fc.halo_exchange(frozen, mesh, 1, periodic=[True, False], donate=True) is frozen
    same(kind, frozen, expected)


def test_sendrecv_like(kind):  # noqa: F811
    """like= with a tensor (array) or a (shape, dtype) pair: the caller's array type back,
    also where only like says it (x None on a receiving end)."""
    r, n = fc.get_rank(), fc.get_world_size()
    x = data(r, (2, 3), "int16", salt=5)
    expected = data((r - 1) % n, (2, 3), "int16", salt=5)
    t = to_kind(x, kind)
    same(kind, fc.sendrecv(t, (r + 1) % n, (r - 1) % n, like=t), expected)
    same(kind, fc.sendrecv(t, (r + 1) % n, (r - 1) % n, like=((2, 3), np.int16)), expected)
    if n > 1:
        y = fc.sendrecv(t if r == 0 else None, 1 if r == 0 else None, 0 if r == 1 else None,
                        like=t)
        if r == 1:
            same(kind, y, data(0, (2, 3), "int16", salt=5))
        else:
            assert y is None
