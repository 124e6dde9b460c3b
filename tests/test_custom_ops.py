"""op= as a binary numpy ufunc on every reduction (all_reduce, reduce, reduce_scatter_tensor,
reduce_scatter, the coalesced forms, async), folded along the canonical tree and bit-identical across
transports (MPI, the segment) and sizes; named ufuncs act as their op; the refusals; and the
located reductions maxloc/minloc."""

from __future__ import annotations

import os
from collections.abc import Iterator

import ml_dtypes
import numpy as np
import pytest

import fcoll as fc
from fcoll import runtime
from fcoll.backends import shm
from tests.helpers import BF16, data, layout_inputs, same_bits, tree, wire

UFUNCS = [np.logaddexp, np.hypot, np.subtract, np.arctan2, np.fmin, np.copysign]


@pytest.fixture(params=["0", "1"], ids=["mpi", "segment"])
def transport(request: pytest.FixtureRequest) -> Iterator[str]:
    before = os.environ.get(shm.ENV)
    os.environ[shm.ENV] = request.param
    runtime.changed()
    yield request.param
    if before is None:
        os.environ.pop(shm.ENV, None)
    else:
        os.environ[shm.ENV] = before
    runtime.changed()


def _inputs(group, size, dtype, salt=0):
    return [np.random.default_rng([salt, r]).uniform(-4, 4, size).astype(dtype)
            for r in group.members]


def folded(inputs, ufunc):
    """numpy's fold along the canonical tree in the wire dtype (float32 for half types),
    cast back."""
    dtype = inputs[0].dtype
    return tree([a.astype(wire(dtype)) for a in inputs], ufunc).astype(dtype)


@pytest.mark.parametrize("ufunc", UFUNCS, ids=lambda u: u.__name__)
@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.float16, BF16], ids=str)
def test_every_reduction_folds_along_the_tree(group, transport, ufunc, dtype):
    n, r = group.size, group.rank
    for size in (5 * n, 6000 * n):  # gathered and blocked on MPI, one or several segment steps
        inputs = _inputs(group, size, dtype, salt=size)
        x, total = inputs[r], folded(inputs, ufunc)
        assert same_bits(fc.all_reduce(x, ufunc, group.arg), total)
        assert same_bits(fc.all_reduce(x, ufunc, group.arg, async_op=True).wait(), total)
        y = fc.reduce(x, 0, ufunc, group.arg)
        assert same_bits(y, total) if r == 0 else y is None
        block = np.split(total, n)[r]
        assert same_bits(fc.reduce_scatter_tensor(x, ufunc, group.arg), block)
        assert same_bits(fc.reduce_scatter(np.split(x, n), ufunc, group.arg), block)
        ys = fc.all_reduce_coalesced([x, x[:3]], ufunc, group.arg)
        assert same_bits(ys[0], total) and same_bits(ys[1], total[:3])
        assert same_bits(fc.reduce_scatter_tensor_coalesced([x], ufunc, group.arg)[0], block)


@pytest.mark.parametrize("ufunc,dtype", [(np.gcd, np.int64), (np.lcm, np.int16),
                                         (np.logical_xor, np.bool_), (np.right_shift, np.uint8),
                                         (np.fmod, np.float32), (np.subtract, np.complex128)],
                         ids=lambda v: getattr(v, "__name__", str(v)))
def test_integer_bool_and_complex_ufuncs(group, ufunc, dtype):
    inputs = [data(r, (7,), dtype, salt=3, low=1, high=9) for r in group.members]
    x = inputs[group.rank]
    assert same_bits(fc.all_reduce(x, ufunc, group.arg), folded(inputs, ufunc))


def test_bit_identical_across_transports_and_sizes(group):
    """The same elements folded alone, in a big message, fused with others, through MPI or
    the segment: one result."""
    inputs = _inputs(group, 20000, np.float32, salt=5)
    x = inputs[group.rank]
    results = []
    for value in ("0", "1"):
        os.environ[shm.ENV] = value
        runtime.changed()
        results += [fc.all_reduce(x, np.logaddexp, group.arg)[:10],
                    fc.all_reduce(x[:10], np.logaddexp, group.arg),
                    fc.all_reduce_coalesced([np.ones(3, np.float32), x[:10]], np.logaddexp,
                                            group.arg)[1]]
    os.environ.pop(shm.ENV, None)
    runtime.changed()
    assert all(same_bits(a, results[0]) for a in results)


def test_named_ufuncs_act_as_their_op(group):
    inputs = [data(r, (6,), np.float16, salt=2) for r in group.members]
    x = inputs[group.rank]
    for ufunc, op in [(np.add, "sum"), (np.multiply, "product"), (np.maximum, "max"),
                      (np.minimum, "min")]:
        assert same_bits(fc.all_reduce(x, ufunc, group.arg), fc.all_reduce(x, op, group.arg))
    b = np.array([group.rank % 2 == 0, True, False])
    for ufunc, op in [(np.bitwise_and, "band"), (np.bitwise_or, "bor"), (np.bitwise_xor, "bxor"),
                      (np.add, "sum")]:
        assert same_bits(fc.all_reduce(b, ufunc, group.arg), fc.all_reduce(b, op, group.arg))
    with pytest.raises(TypeError, match="integer or bool"):  # bitwise on floats, as "band"
        fc.all_reduce(x, np.bitwise_and, group.arg)


@pytest.mark.parametrize("bad,dtype,match", [
    (np.negative, np.int32, "binary ufunc .*np.negative with 1 input"),
    (np.divmod, np.int32, "binary ufunc .*np.divmod with 2 input.*2 output"),
    (lambda a, b: a + b, np.int32, "binary numpy ufunc, got function"),
    (np.add.reduce, np.int32, "binary numpy ufunc, got builtin_function_or_method"),
    (np.arctan2, np.int32, r"map two int32 arrays to int32 .*arctan2 with float64"),
    (np.gcd, np.float32, r"map two float32 arrays to float32 .*gcd with no loop"),
    (np.logical_and, np.int8, r"map two int8 arrays to int8 .*bool"),
], ids=["unary", "divmod", "lambda", "method", "promotes", "no-loop", "to-bool"])
def test_refused_ops_raise_type_error_before_sending(bad, dtype, match):
    n = fc.get_world_size()
    x = np.ones(n, dtype)
    for call in (lambda: fc.all_reduce(x, bad), lambda: fc.reduce(x, 0, bad),
                 lambda: fc.reduce_scatter_tensor(x, bad), lambda: fc.reduce_scatter([x[:1]] * n, bad),
                 lambda: fc.all_reduce_coalesced([x], bad), lambda: fc.scan(x, bad),
                 lambda: fc.exscan(x, bad), lambda: fc.all_reduce(x, bad, async_op=True)):
        with pytest.raises(TypeError, match=match):
            call()


# --- maxloc / minloc ------------------------------------------------------------------


def _located_reference(inputs, find):
    stacked = np.stack([a.astype(np.float64) if a.dtype == BF16 else a for a in inputs])
    ranks = (np.argmax if find == "max" else np.argmin)(stacked, axis=0)
    values = np.take_along_axis(np.stack(inputs), ranks[None], 0)[0]
    return values, ranks.astype(np.int64)


@pytest.mark.parametrize("dtype", [np.float64, np.float16, BF16, np.int8, np.uint32, np.bool_],
                         ids=str)
@pytest.mark.parametrize("fn", [fc.maxloc, fc.minloc], ids=lambda f: f.__name__)
def test_located_values_and_lowest_ranks(group, fn, dtype):
    """Small integers: many ties, which go to the lowest rank; NaNs count as the extreme
    (the first rank holding one), as numpy's argmax/argmin have it."""
    inputs = [data(r, (4, 5), dtype, salt=8, low=0, high=3) for r in group.members]
    if np.dtype(dtype).kind == "f" or dtype == BF16:
        for k, a in enumerate(inputs):
            a[0, k % 5] = np.nan
    values, ranks = fn(inputs[group.rank], group.arg)
    expected_values, expected_ranks = _located_reference(inputs, fn.__name__[:3])
    assert same_bits(values, expected_values) and same_bits(ranks, expected_ranks)


@pytest.mark.parametrize("layout", ["0d", "empty", "strided", "fortran"])
def test_located_layouts(group, layout):
    inputs, x = layout_inputs(group.members, group.rank, layout, np.float32)
    values, ranks = fc.maxloc(x, group.arg)
    assert values.shape == ranks.shape == inputs[0].shape and ranks.dtype == np.int64
    expected_values, expected_ranks = _located_reference(inputs, "max")
    assert same_bits(values, expected_values) and same_bits(ranks, expected_ranks)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "float64"])
@pytest.mark.parametrize("fn", [fc.maxloc, fc.minloc])
def test_located_zero_keeps_the_lowest_ranks_sign(group, fn, dtype):
    """Every transport (MPI's fold in any order, the segment's) gives the zero of the lowest
    rank holding one: -0.0 where that rank has it, 0.0 where it has 0.0 and others -0.0."""
    r, dt = group.rank, np.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else np.dtype(dtype)
    x = np.array([-0.0 if r == 0 else 0.0, 0.0 if r == 0 else -0.0, -0.0 if r % 2 else 0.0], dt)
    values, ranks = fn(x, group.arg)
    assert np.signbit(values.astype(np.float32)).tolist() == [True, False, False]
    assert ranks.tolist() == [0, 0, 0] and values.dtype == dt


def test_located_signed_zero_and_seed(group):
    """-0.0 and 0.0 tie: the value and the rank are the lowest rank's."""
    r = group.rank
    values, ranks = fc.maxloc(np.array([-0.0 if r == 0 else 0.0, float(r), 5.0 - r]), group.arg)
    assert np.signbit(values[0]) and ranks.tolist() == [0, group.size - 1, 0]
    values, ranks = fc.minloc(np.array([float(r % 2), -1.0 * r]), group.arg)
    assert values.tolist() == [0.0, -(group.size - 1.0)]
    assert ranks.tolist() == [0, group.size - 1]


def test_located_refuses_complex_and_non_arrays():
    for fn in (fc.maxloc, fc.minloc):
        expected = "expected op sum, avg or premul_sum for complex64"
        with pytest.raises(ValueError, match=rf"^{fn.__name__}: {expected}"):
            fn(np.ones(2, np.complex64))
        with pytest.raises(TypeError, match=rf"^{fn.__name__}: expected x to be a numpy.ndarray"):
            fn([1.0])
