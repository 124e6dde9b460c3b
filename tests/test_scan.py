"""scan and exscan: every dtype and op of all_reduce, on every group and world size, in the
scan order of the group's size whatever the transport (MPI, the segment) and the size, the
identity on rank 0 of an exscan, with_total, async, layouts, ufuncs and the refused ops.
Expected values are numpy's reductions of the members' inputs in that order
(`tests.helpers.scan_tree`, written from the contract)."""

from __future__ import annotations

import os
from collections.abc import Iterator

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import fcoll as fc
from fcoll import runtime
from fcoll.backends import shm
from fcoll.backends.tree import doubling_limit
from tests.helpers import (
    ALL_DTYPES,
    BF16,
    data,
    layout_inputs,
    reduce_error,
    reference,
    same_bits,
    scan_tree,
    wire,
)

OPS = ["sum", "product", "min", "max", "band", "bor", "bxor"]
IDENTITY = {"sum": 0, "product": 1, "bor": 0, "bxor": 0}


def _set_shm(value: str | None) -> None:
    if value is None:
        os.environ.pop(shm.ENV, None)
    else:
        os.environ[shm.ENV] = value
    runtime.changed()


@pytest.fixture(params=["auto", "0", "1"])
def transport(request: pytest.FixtureRequest) -> Iterator[str]:
    """FCOLL_SHM as the suite runs it (auto), MPI only (0), the segment at every size (1)."""
    before = os.environ.get(shm.ENV)
    _set_shm(None if request.param == "auto" else request.param)
    yield request.param
    _set_shm(before)


def identity(dtype: np.dtype, op: str) -> np.ndarray:
    """What rank 0 of an exscan gets (API.md), written out per dtype kind."""
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return np.array(op in ("product", "min", "band"))
    if op in IDENTITY:
        return np.array(IDENTITY[op]).astype(dtype)
    if op == "band":
        return np.array(-1).astype(dtype)
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return np.array(info.min if op == "max" else info.max, dtype)
    return np.array(-np.inf if op == "max" else np.inf).astype(dtype)


def expected_scan(inputs, r, op, exclusive=False):
    """Rank r's scan (exscan: rank r - 1's scan, the identity on rank 0)."""
    if exclusive and r == 0:
        return np.broadcast_to(identity(inputs[0].dtype, op), inputs[0].shape).copy()
    return reference(inputs, op, prefix_of=r - 1 if exclusive else r)


def _inputs(group, shape, dtype, salt, high=4):
    return [data(r, shape, dtype, salt, low=1 if high > 1 else 0, high=high) for r in group.members]


CASES = [(d, op) for d in ALL_DTYPES for op in OPS if reduce_error(d, op) is None]


@pytest.mark.smoke
@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
def test_every_dtype_and_op(group, dtype):
    for op in OPS:
        if reduce_error(dtype, op) is not None:
            continue
        inputs = _inputs(group, (3, 5), dtype, salt=1)
        x = inputs[group.rank]
        before = x.copy()
        y = fc.scan(x, op, group.arg)
        assert same_bits(y, expected_scan(inputs, group.rank, op)), op
        e = fc.exscan(x, op, group.arg)
        assert same_bits(e, expected_scan(inputs, group.rank, op, exclusive=True)), op
        assert same_bits(x, before) and not np.shares_memory(x, y)


@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.float16, BF16, np.complex128,
                                   np.int32, np.bool_], ids=str)
@pytest.mark.parametrize("size", [7, 5000, 70_000])  # one message, several segment steps
def test_scan_order_at_every_size_and_transport(group, transport, dtype, size):
    """Arbitrary floats show the order of the fold in their low bits: every transport and
    size gives numpy's fold in the scan order (`tests.helpers.scan_tree`) in the wire dtype;
    the total is the all_reduce's bits."""
    rng = [np.random.default_rng([9, r]) for r in group.members]
    if np.dtype(dtype).kind in "iub":
        inputs = [g.integers(0, 50, size).astype(dtype) for g in rng]
    else:
        inputs = [(g.standard_normal(size) * 10.0 ** g.integers(-3, 3, size)).astype(dtype)
                  for g in rng]
        if np.dtype(dtype).kind == "c":
            inputs = [a + 1j * a[::-1] for a in inputs]
    ops = ("sum",) if np.dtype(dtype).kind == "c" else ("sum", "max")
    for op in ops:
        for exclusive in (False, True):
            fn = fc.exscan if exclusive else fc.scan
            prefix, total = fn(inputs[group.rank], op, group.arg, with_total=True)
            assert same_bits(prefix, expected_scan(inputs, group.rank, op, exclusive)), (op, fn)
            assert same_bits(total, reference(inputs, op))
            assert same_bits(total, fc.all_reduce(inputs[group.rank], op, group.arg))


def test_seed_values(group):
    """Offsets of a parallel write: rank r holds r + 1 items."""
    n, r = group.size, group.rank
    counts = np.array(r + 1, np.int64)
    offset, total = fc.exscan(counts, group=group.arg, with_total=True)
    assert offset.shape == () and int(offset) == r * (r + 1) // 2
    assert int(total) == n * (n + 1) // 2
    assert int(fc.scan(counts, group=group.arg)) == (r + 1) * (r + 2) // 2
    assert fc.scan(np.array([r + 1.0]), "product", group.arg).tolist() == [float(np.prod(range(1, r + 2)))]


@pytest.mark.parametrize("layout", ["0d", "empty", "strided", "fortran", "readonly"])
@pytest.mark.parametrize("dtype", [np.float32, BF16, np.bool_, np.int16], ids=str)
def test_layouts(group, layout, dtype):
    inputs, x = layout_inputs(group.members, group.rank, layout, dtype)
    for op in ("sum", "max"):
        y = fc.scan(x, op, group.arg)
        assert isinstance(y, np.ndarray) and y.shape == x.shape and y.flags.writeable
        assert same_bits(y, expected_scan(inputs, group.rank, op))
        e = fc.exscan(x, op, group.arg)
        assert same_bits(e, expected_scan(inputs, group.rank, op, exclusive=True))


@pytest.mark.parametrize("size", [3, 9000])
def test_async(group, size):
    inputs = _inputs(group, (size,), np.float64, salt=7)
    x = inputs[group.rank].copy()
    works = [fc.scan(x, group=group.arg, async_op=True),
             fc.exscan(x, "max", group.arg, async_op=True),
             fc.exscan(x, group=group.arg, with_total=True, async_op=True),
             fc.scan(x.astype(np.int64), "bxor", group.arg, async_op=True)]
    x[...] = -1  # snapshotted at the call
    scanned, exmax, (offset, total), xor = fc.wait_all(works)
    assert same_bits(scanned, expected_scan(inputs, group.rank, "sum"))
    assert same_bits(exmax, expected_scan(inputs, group.rank, "max", exclusive=True))
    assert same_bits(offset, expected_scan(inputs, group.rank, "sum", exclusive=True))
    assert same_bits(total, reference(inputs, "sum"))
    ints = [a.astype(np.int64) for a in inputs]
    assert same_bits(xor, expected_scan(ints, group.rank, "bxor"))


UFUNCS = [np.logaddexp, np.hypot, np.subtract, np.fmax, np.arctan2]


@pytest.mark.parametrize("ufunc", UFUNCS, ids=lambda u: u.__name__)
@pytest.mark.parametrize("dtype", [np.float64, np.float16], ids=str)
def test_ufunc_ops_fold_in_the_scan_order(group, transport, ufunc, dtype):
    """A ufunc need not be commutative (subtract, arctan2): the scan order's bracketing, the
    lower rank on the left, is the contract."""
    for size in (4, 9000):
        inputs = [np.random.default_rng([5, r]).uniform(-3, 3, size).astype(dtype)
                  for r in group.members]
        w = wire(np.dtype(dtype))
        wires = [a.astype(w) for a in inputs]
        prefixes = [scan_tree(wires, k, ufunc) for k in range(group.size)]
        y = fc.scan(inputs[group.rank], ufunc, group.arg)
        assert same_bits(y, prefixes[group.rank].astype(dtype))
        e, total = fc.exscan(inputs[group.rank], ufunc, group.arg, with_total=True)
        assert same_bits(total, prefixes[-1].astype(dtype))
        if group.rank:
            assert same_bits(e, prefixes[group.rank - 1].astype(dtype))
        elif ufunc.identity is None:
            assert e is None
        else:
            assert same_bits(e, np.full(size, ufunc.identity, dtype))


def test_named_ufuncs_act_as_their_op(group):
    inputs = _inputs(group, (4,), np.float16, salt=3)
    x = inputs[group.rank]
    for ufunc, op in [(np.add, "sum"), (np.maximum, "max"), (np.minimum, "min"),
                      (np.multiply, "product")]:
        assert same_bits(fc.scan(x, ufunc, group.arg), fc.scan(x, op, group.arg))
        assert same_bits(fc.exscan(x, ufunc, group.arg), fc.exscan(x, op, group.arg))
    b = np.array([group.rank % 2 == 0, True])
    assert same_bits(fc.exscan(b, np.bitwise_and, group.arg), fc.exscan(b, "band", group.arg))


def test_refused_ops():
    x = np.ones(3)
    for fn in (fc.scan, fc.exscan):
        with pytest.raises(ValueError, match=rf"^{fn.__name__}: expected a prefix op.*avg"):
            fn(x, "avg")
        with pytest.raises(ValueError, match="premul_sum"):
            fn(x, fc.premul_sum(2.0))
        with pytest.raises(ValueError, match="avg"):
            fn(np.ones(2, np.int32), "mean")
        with pytest.raises(ValueError, match=r"expected op sum, avg or premul_sum for complex64"):
            fn(np.ones(2, np.complex64), "max")
        with pytest.raises(TypeError, match="binary ufunc"):
            fn(x, np.negative)
        with pytest.raises(TypeError, match="function"):
            fn(x, lambda a, b: a + b)
        with pytest.raises(TypeError, match=r"numpy\.ndarray"):
            fn([1.0, 2.0])
        with pytest.raises(TypeError, match="with_total"):
            fn(x, with_total=1)
        with pytest.raises(TypeError, match=r"map two int32 arrays to int32.*arctan2"):
            fn(np.ones(2, np.int32), np.arctan2)


def test_prefixes_do_not_depend_on_the_length(group):
    """Around the all-reduce's doubling/halving switch (per rank) and through the segment's
    steps, a prefix of the same elements is the same, alone or in a longer message."""
    count = doubling_limit(group.size) // 8
    for size in (count, count + 1):
        inputs = [np.random.default_rng([11, r]).standard_normal(size) for r in group.members]
        y = fc.scan(inputs[group.rank], group=group.arg)
        assert same_bits(y, expected_scan(inputs, group.rank, "sum"))
        assert same_bits(fc.scan(inputs[group.rank][:5], group=group.arg), y[:5])


def test_mismatched_calls_raise_on_the_segment(world_size, rank):
    """The segment's fingerprint check (debug off): a scan against an exscan."""
    if world_size < 2:
        pytest.skip("needs two ranks")
    before = os.environ.get(shm.ENV)
    _set_shm("1")
    try:
        from fcoll.backends import native

        if not native.running():
            pytest.skip("scans use the segment only with the compiled core")
        fn = fc.scan if rank == 0 else fc.exscan
        with pytest.raises(fc.CollectiveMismatchError, match="scan"):
            fn(np.ones(4))
        assert same_bits(fc.scan(np.ones(4)), np.full(4, rank + 1.0))  # still usable
    finally:
        _set_shm(before)


@settings(max_examples=25)
@given(st.lists(st.integers(-50, 50), min_size=0, max_size=6),
       st.sampled_from(["sum", "max", "min", "bxor"]), st.booleans())
def test_property_matches_numpy(values, op, exclusive):
    """Random small integer arrays (every rank derives every rank's): the prefix is numpy's."""
    n, r = fc.get_world_size(), fc.get_rank()
    inputs = [np.array(values, np.int64) * (k + 1) - k for k in range(n)]
    fn = fc.exscan if exclusive else fc.scan
    assert same_bits(fn(inputs[r], op), expected_scan(inputs, r, op, exclusive))


@pytest.mark.parametrize("fn", [fc.scan, fc.exscan])
def test_deadline(fn, world_size):
    """A deadline bounds the call (here everyone arrives, so it completes)."""
    fc.init(timeout=30)
    try:
        assert fn(np.ones(3)).shape == (3,)
    finally:
        fc.init(timeout=float("inf"))
    _ = world_size


def test_non_members_and_detail(world_size, rank):
    """A group this rank is not in raises ValueError; under debug="detail" ranks that pass
    another op (or with_total) raise CollectiveMismatchError on every rank, nothing sent."""
    g = fc.new_group([0])
    if rank == 0:
        assert fc.exscan(np.ones(2), group=g).tolist() == [0.0, 0.0]
    else:
        with pytest.raises(ValueError, match="does not contain global rank"):
            fc.scan(np.ones(2), group=g)
    g.destroy()
    if world_size < 2:
        return
    fc.init(debug="detail")
    try:
        with pytest.raises(fc.CollectiveMismatchError, match="exscan"):
            fc.exscan(np.ones(2), "max" if rank == 0 else "sum")
        with pytest.raises(fc.CollectiveMismatchError, match="with_total"):
            fc.scan(np.ones(2), with_total=rank == 0)
        assert fc.scan(np.ones(2)).tolist() == [rank + 1.0] * 2
    finally:
        fc.init(debug="off")
