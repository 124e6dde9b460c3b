"""all_gather_into_tensor and broadcast through on-node shared memory (fcoll/backends/shm.py):
the same bytes as MPI (FCOLL_SHM=0) for every dtype, shape, layout, root and group kind with
FCOLL_SHM=1; messages over a step; the default group's fast path; the size window under
the default setting; mismatched sizes raising on every rank; async calls keeping MPI."""

from __future__ import annotations

import os

import numpy as np
import pytest

import fcoll as fc
from fcoll.backends import shm
from fcoll.groups.group import resolve_group
from tests.helpers import ALL_DTYPES, bits, same_bits
from tests.test_shm import _both, _set, forced  # noqa: F401  (the fixture)

SHAPES = [(), (0,), (5,), (3, 4), (2, 0, 3)]


def _gathered(group, shape, dtype, salt=0):
    """Every rank's input (arbitrary bit patterns) and numpy's all-gather of them."""
    xs = [bits(r, shape, dtype, salt) for r in range(group.size)]
    flat = [x.reshape(1) if x.ndim == 0 else x for x in xs]
    return xs[group.rank], np.concatenate(flat)


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
def test_all_gather_is_bit_identical(group, forced, dtype):  # noqa: F811
    for shape in SHAPES:
        x, truth = _gathered(group, shape, dtype)
        mpi, on_node = _both(fc.all_gather_into_tensor, x, group=group.arg)
        assert same_bits(mpi, on_node) and same_bits(on_node, truth), shape


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
def test_broadcast_is_bit_identical_from_every_root(group, forced, dtype):  # noqa: F811
    for shape in SHAPES:
        for src in {0, group.size - 1}:
            x = bits(group.rank, shape, dtype, salt=src)
            mpi, on_node = _both(fc.broadcast, x, src, group=group.arg)
            truth = bits(src, shape, dtype, salt=src)
            assert same_bits(mpi, on_node) and same_bits(on_node, truth), (shape, src)
            assert not np.shares_memory(on_node, x)


def test_layouts_and_gather_dim(group, forced):  # noqa: F811
    """Non-contiguous, Fortran-ordered and read-only inputs; gather_dim 1 (which goes
    through a dim-first copy)."""
    base = bits(group.rank, (12, 10), np.float64, salt=5)
    for x in (base[::2, 1::3], np.asfortranarray(base)):
        x.flags.writeable = False
        for dim in (0, 1):
            mpi, on_node = _both(fc.all_gather_into_tensor, x, group=group.arg, gather_dim=dim)
            assert same_bits(mpi, on_node), dim
        mpi, on_node = _both(fc.broadcast, x, group.size - 1, group=group.arg)
        assert same_bits(mpi, on_node) and on_node.flags.c_contiguous


@pytest.mark.parametrize("dtype", [np.float32, np.int8, np.complex128], ids=str)
def test_messages_over_a_step(group, forced, dtype):  # noqa: F811
    """2.3 steps (CHUNK bytes per rank each)."""
    count = int(2.3 * shm.CHUNK) // np.dtype(dtype).itemsize
    x, truth = _gathered(group, (count,), dtype, salt=9)
    mpi, on_node = _both(fc.all_gather_into_tensor, x, group=group.arg)
    assert same_bits(mpi, on_node) and same_bits(on_node, truth)
    for src in {0, group.size - 1}:
        mpi, on_node = _both(fc.broadcast, bits(group.rank, (count,), dtype, salt=src), src,
                             group=group.arg)
        assert same_bits(mpi, on_node) and same_bits(on_node, bits(src, (count,), dtype, salt=src))


def test_mesh_axis_group(world_size, forced):  # noqa: F811
    with fc.Mesh((world_size,), ("dp",)):
        x = bits(fc.get_rank(), (40,), np.float32)
        mpi, on_node = _both(fc.all_gather_into_tensor, x, group="dp")
        assert same_bits(mpi, on_node)
        mpi, on_node = _both(fc.broadcast, x, world_size - 1, group="dp")
        assert same_bits(mpi, on_node)


@pytest.mark.parametrize("shape", [(0,), (6,), (4, 3), (1000, 5)], ids=str)
def test_the_default_groups_fast_path_steps_through_the_segment(world_size, rank, forced,  # noqa: F811
                                                                monkeypatch, shape):
    """Once the world's segment exists, one-step calls of the default group go from the
    fast path straight to the segment: no full-path call, one step each."""
    if world_size == 1:
        pytest.skip("needs two ranks")
    x, truth = _gathered(fc.world(), shape, np.float32, salt=3)
    fc.all_gather_into_tensor(np.ones(8, np.float32))  # segment made, fast paths learned
    fc.broadcast(np.ones(8, np.float32), world_size - 1)
    monkeypatch.setattr(shm, "allgather", lambda *a: pytest.fail("the full path"))
    monkeypatch.setattr(shm, "broadcast", lambda *a: pytest.fail("the full path"))
    seg = fc.world().shm
    for _ in range(3):  # both step parities
        steps = seg.step
        y = fc.all_gather_into_tensor(x)
        z = fc.broadcast(x, world_size - 1)
        assert seg.step == steps + 2
        assert same_bits(y, truth)
        assert same_bits(z, bits(world_size - 1, shape, np.float32, salt=3))


def test_mismatched_sizes_raise_on_every_rank(group, forced):  # noqa: F811
    """Through the full path (a split group) and the fast path (the world), in one step
    and in a step that makes the segment grow first on some rank."""
    if group.size == 1:
        pytest.skip("needs two ranks")
    fc.all_gather_into_tensor(np.ones(8, np.int64), group=group.arg)  # segment made
    capacity = resolve_group(group.arg, "test").shm.capacity
    for other in (16, capacity // 8 + 1):
        x = np.ones(8 if group.rank == 0 else other, np.int64)
        with pytest.raises(fc.CollectiveMismatchError, match="differ in elements"):
            fc.all_gather_into_tensor(x, group=group.arg)
        with pytest.raises(fc.CollectiveMismatchError, match="differ in elements"):
            fc.broadcast(x, 0, group=group.arg)
        assert (fc.all_reduce(np.ones(3, np.int64), group=group.arg) == group.size).all()


def test_the_size_window_under_the_default_setting(world_size, rank):
    """FCOLL_SHM unset: all_gather through the segment from its window's start (MIN_BYTES;
    the first byte with the compiled core) up to MAX_BYTES (exclusive), broadcast likewise;
    MPI outside, and for async calls."""
    if world_size == 1 or os.environ.get(shm.ENV, "auto") != "auto":
        pytest.skip("needs two ranks and the default setting")
    g = fc.new_group()
    try:
        fc.all_gather_into_tensor(np.ones(shm.CHUNK // 8), group=g)  # made, grown: one window
        seg = g.shm
        for op, call in (("all_gather", lambda x: fc.all_gather_into_tensor(x, group=g)),
                         ("broadcast", lambda x: fc.broadcast(x, 0, group=g))):
            lo, hi = int(shm.limit(g, op)), int(shm.ceiling(op))
            cases = [(lo - 8, False)] if lo >= 8 else []
            for nbytes, through in (*cases, (max(lo, 8), True), (hi - 8, True), (hi, False)):
                x = np.full(nbytes // 8, rank + 1.0)
                before = seg.taken
                y = call(x)
                assert (seg.taken > before) == through, (op, nbytes)
                assert y.size == (x.size * world_size if op == "all_gather" else x.size)
                assert (y[: x.size] == 1.0).all()
        before, x = seg.taken, np.ones(shm.MAX_BYTES["all_gather"] // 16)
        works = [fc.all_gather_into_tensor(x, group=g, async_op=True),
                 fc.broadcast(x, 0, group=g, async_op=True)]
        assert [w.wait().size for w in works] == [x.size * world_size, x.size]
        assert seg.taken == before
    finally:
        g.destroy()


def test_all_gather_coalesced_through_the_segment(group, forced, monkeypatch):  # noqa: F811
    """The coalesced form gathers its one fused buffer through the segment too."""
    fc.all_gather_into_tensor(np.ones(8), group=group.arg)  # the segment made
    seg = resolve_group(group.arg, "test").shm
    before = seg.taken if seg else 0
    xs = [bits(group.rank, s, d, salt=21) for s, d in [((3, 2), np.float32), ((), np.int8),
                                                        ((0, 4), np.float64), ((7,), np.uint16)]]
    mpi, on_node = _both(fc.all_gather_into_tensor_coalesced, xs, group=group.arg)
    assert all(same_bits(a, b) for a, b in zip(mpi, on_node, strict=True))
    for x, y in zip(xs, on_node, strict=True):
        parts = [bits(r, x.shape, x.dtype, salt=21) for r in range(group.size)]
        assert same_bits(y, np.concatenate([p.reshape(1) if p.ndim == 0 else p for p in parts]))
    assert bool(seg and seg.taken > before) == (group.size > 1)


def test_a_world_that_spans_nodes_keeps_the_mpi_fast_path(world_size, rank, forced,  # noqa: F811
                                                           monkeypatch):
    """Once the world group is known to span nodes (shm False), its calls of shared-memory
    sizes take the MPI fast path, not the full path every time."""
    from fcoll.collectives import movement, reductions

    world = fc.world()
    monkeypatch.setattr(world, "shm", None)
    monkeypatch.setenv(shm.NODE_ENV, "1")  # one rank per simulated node: the world spans
    _set("1")  # read the settings again
    x = np.full(4 * world_size, rank + 1, np.int64)
    calls = [lambda: fc.all_reduce(x), lambda: fc.reduce_scatter_tensor(x),
             lambda: fc.all_gather_into_tensor(x), lambda: fc.broadcast(x, world_size - 1)]
    first = []
    for call in calls:  # each learns its fast path before the group finds that it spans
        world.shm = None
        first.append(call())
        assert world.shm is (None if world_size == 1 else False)
    full = []
    for module in (reductions, movement):
        member = module.member
        monkeypatch.setattr(module, "member", lambda *a, _m=member: full.append(a) or _m(*a))
    again = [call() for call in calls]
    assert all(same_bits(a, b) for a, b in zip(first, again, strict=True))
    assert not full, full
