"""The numeric-code functions on cupy arrays: sendrecv and halo_exchange over NCCL (grouped
send/recv) and over MPI (staged), scan/exscan and ufunc ops (staged: NCCL has no scan and no
user ops), maxloc/minloc (two all-reduces on the device). Run on a GPU, or on the CPU
stand-in with ``FCOLL_FAKE_CUPY=1`` (scripts/test.sh's GPU pass); skipped otherwise."""

from __future__ import annotations

import functools

import numpy as np
import pytest

import fcoll as fc
from tests.helpers import bits, data, same_bits, tree
from tests.test_gpu import REASON, _cp, _np, device, transport  # noqa: F401  (fixtures)
from tests.test_neighbors import _blocks, _grid, _mesh_shape

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(REASON is not None, reason=str(REASON))]


@pytest.fixture
def nccl_calls(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many grouped NCCL exchanges the test made (none where MPI moves the data)."""
    from fcoll.backends import nccl

    calls: list[int] = []
    real = nccl.exchange
    monkeypatch.setattr(nccl, "exchange", lambda *a: (calls.append(1), real(*a))[1])
    return calls


@pytest.mark.parametrize("shape", [(), (4, 3), (5000,)], ids=str)
def test_sendrecv_ring(transport, group, shape, nccl_calls):  # noqa: F811
    n, r = group.size, group.rank
    x = _cp(bits(r, shape, "float32", salt=2))
    y = fc.sendrecv(x, (r + 1) % n, (r - 1) % n, group.arg)
    assert same_bits(_np(y), bits((r - 1) % n, shape, "float32", salt=2))
    end = fc.sendrecv(x, r + 1 if r + 1 < n else None, r - 1 if r else None, group.arg)
    assert end is None if r == 0 else same_bits(_np(end), bits(r - 1, shape, "float32", salt=2))
    assert bool(nccl_calls) == (transport == "nccl")


@pytest.mark.parametrize("shape", [(), (4, 3), (5000,)], ids=str)
def test_sendrecv_like(transport, group, shape, nccl_calls):  # noqa: F811
    """like=: no header first (over NCCL the data alone; staged over MPI, checked there)."""
    n, r = group.size, group.rank
    x = _cp(bits(r, shape, "float32", salt=6))
    for like in (x, (shape, np.float32)):
        y = fc.sendrecv(x, (r + 1) % n, (r - 1) % n, group.arg, like=like)
        assert same_bits(_np(y), bits((r - 1) % n, shape, "float32", salt=6))
    assert bool(nccl_calls) == (transport == "nccl")


@pytest.mark.parametrize("periodic", [False, True])
def test_halo_exchange(transport, periodic, nccl_calls):  # noqa: F811
    n = fc.get_world_size()
    mesh = fc.Mesh(_mesh_shape(n, 2), ("y", "x"))
    full = _grid((10, 9), mesh.shape, [0, 1])
    x, expected = _blocks(full, mesh.shape, mesh.coordinate(), [0, 1], [1, 2], [periodic, True])
    y = fc.halo_exchange(_cp(x), mesh, [1, 2], periodic=[periodic, True])
    assert same_bits(_np(y), expected)
    assert bool(nccl_calls) == (transport == "nccl")  # axis x wraps: always an exchange


def test_donated_halo_exchange(transport, nccl_calls):  # noqa: F811
    """donate=True: the cupy array itself, its ghost cells filled (in place over NCCL, copied
    back where MPI stages it)."""
    n = fc.get_world_size()
    mesh = fc.Mesh(_mesh_shape(n, 2), ("y", "x"))
    full = _grid((10, 9), mesh.shape, [0, 1])
    x, expected = _blocks(full, mesh.shape, mesh.coordinate(), [0, 1], [1, 2], [True, True])
    d = _cp(x)
    assert fc.halo_exchange(d, mesh, [1, 2], periodic=True, donate=True) is d
    assert same_bits(_np(d), expected)
    assert bool(nccl_calls) == (transport == "nccl")


def test_scan_and_exscan(transport, group):  # noqa: F811
    inputs = [data(r, (3, 4), "float32", salt=3) for r in group.members]
    x = _cp(inputs[group.rank])
    prefix, total = fc.exscan(x, group=group.arg, with_total=True)
    expected = functools.reduce(np.add, inputs[: group.rank], np.zeros((3, 4), np.float32))
    assert same_bits(_np(prefix), expected) and same_bits(_np(total), sum(inputs))
    assert same_bits(_np(fc.scan(x, "max", group.arg)), np.max(inputs[: group.rank + 1], axis=0))


def test_ufunc_op_and_maxloc(transport, group):  # noqa: F811
    inputs = [data(r, (6,), "float64", salt=4) for r in group.members]
    x = _cp(inputs[group.rank])
    got = fc.all_reduce(x, np.logaddexp, group.arg)
    assert same_bits(_np(got), tree(inputs, np.logaddexp))  # staged: the numpy path's tree
    values, ranks = fc.maxloc(x, group.arg)
    stacked = np.stack(inputs)
    assert same_bits(_np(values), stacked.max(0))
    assert same_bits(_np(ranks), np.argmax(stacked, 0).astype(np.int64))
