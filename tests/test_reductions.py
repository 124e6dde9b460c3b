"""all_reduce, reduce, reduce_scatter_tensor, reduce_scatter: values for every dtype and op,
on every group, at every world size (expected values computed from the members' inputs)."""

from __future__ import annotations

import math

import numpy as np
import pytest

import fcoll as fc
from tests.helpers import (
    ALL_DTYPES,
    BF16,
    COMPLEX,
    data,
    layout_inputs,
    reduce_error,
    reference,
    same_bits,
)

OPS = ["sum", "avg", "product", "min", "max", "band", "bor", "bxor"]


CASES = [(d, op) for d in ALL_DTYPES for op in OPS if reduce_error(d, op) is None]
REFUSED = [(d, op, error) for d in ALL_DTYPES for op in OPS if (error := reduce_error(d, op))]


def _inputs(g, shape, dtype, salt, high=4):
    return [data(r, shape, dtype, salt, low=1 if high > 1 else 0, high=high) for r in g.members]


@pytest.mark.smoke
@pytest.mark.parametrize(("dtype", "op"), CASES, ids=[f"{d}-{op}" for d, op in CASES])
def test_all_reduce_every_dtype_and_op(group, dtype, op):
    inputs = _inputs(group, (3, 5), dtype, salt=1)
    x = inputs[group.rank]
    before = x.copy()
    y = fc.all_reduce(x, op, group=group.arg)
    assert same_bits(y, reference(inputs, op))
    assert same_bits(x, before) and y is not x and not np.shares_memory(x, y)


@pytest.mark.parametrize(("dtype", "op", "error"), REFUSED,
                         ids=[f"{d}-{op}" for d, op, _ in REFUSED])
def test_refused_pairs_raise_the_documented_error(group, dtype, op, error):
    """Every (dtype, op) the docs refuse raises exactly that type (not a subclass), before
    anything is sent; tests/helpers.reference raises the same (the GPU tests rely on it)."""
    x = data(group.rank, (2,), dtype)
    with pytest.raises(error) as raised:
        fc.all_reduce(x, op, group=group.arg)
    assert raised.type is error
    with pytest.raises(error):
        reference([x], op)


@pytest.mark.smoke
@pytest.mark.parametrize("op", ["sum", "product", "min", "max"])
def test_reduce_every_root(group, op):
    inputs = _inputs(group, (4,), np.int64, salt=2)
    for dst in range(group.size):
        y = fc.reduce(inputs[group.rank], dst=dst, op=op, group=group.arg)
        if group.rank == dst:
            assert same_bits(y, reference(inputs, op))
        else:
            assert y is None


def test_seed_table_simple_reduce(group):
    """torch's simple_reduce_tests: input [r+1] (r = group rank) on a group of n ranks."""
    n, r = group.size, group.rank
    x = np.array([r + 1.0], np.float32)
    expected = {"sum": n * (n + 1) / 2, "product": math.factorial(n), "min": 1, "max": n,
                "avg": (n + 1) / 2}
    for op, value in expected.items():
        assert fc.all_reduce(x, op, group=group.arg).tolist() == [value]
    for i in range(4):
        band = fc.all_reduce(np.array([r | (1 << i)], np.int32), "band", group=group.arg)
        assert band.tolist() == [1 << i]
    for i in range(1, 5):
        mine = [r * i + j for j in range(i)]
        everyone = list(range(n * i))
        bor = fc.all_reduce(np.array([np.bitwise_or.reduce(mine)], np.int32), "bor", group.arg)
        bxor = fc.all_reduce(np.array([np.bitwise_xor.reduce(mine)], np.int32), "BXOR", group.arg)
        assert bor.tolist() == [np.bitwise_or.reduce(everyone)]
        assert bxor.tolist() == [np.bitwise_xor.reduce(everyone)]
    c = fc.all_reduce(np.array([(r + 1) + (r + 1) * 1j], np.complex64), "avg", group.arg)
    assert c.tolist() == [complex((n + 1) / 2, (n + 1) / 2)]


def test_master_worker_table(group):
    """distributed_test's table: rank src holds the master value, the others the worker's."""
    n = group.size
    cases = {"sum": (2, 10, 2 + 10 * (n - 1)), "product": (2, 10, 2 * 10 ** (n - 1)),
             "min": (1010, 1, 1 if n > 1 else 1010), "max": (-1, 10, 10 if n > 1 else -1)}
    for src in range(n):
        for op, (master, worker, expected) in cases.items():
            x = np.full((src + 1,) * 3, master if group.rank == src else worker, np.float32)
            assert (fc.all_reduce(x, op, group.arg) == expected).all()


def test_bool_semantics(group):
    x = np.array([group.rank % 2 == 0] * 2)
    some_false = group.size > 1
    assert fc.all_reduce(x, "product", group.arg).tolist() == [not some_false] * 2
    assert fc.all_reduce(x, "min", group.arg).tolist() == [not some_false] * 2
    assert fc.all_reduce(x, "sum", group.arg).tolist() == [True, True]
    assert fc.all_reduce(x, "max", group.arg).tolist() == [True, True]
    assert fc.all_reduce(np.ones(2, bool), "product", group.arg).all()
    assert fc.all_reduce(x, "sum", group.arg).dtype == np.bool_


@pytest.mark.parametrize("dtype", [np.float16, BF16])
def test_half_accumulates_in_float32(group, dtype):
    """Each rank adds 1 to 2048: in float16 arithmetic 2048 + 1 rounds back to 2048 every
    step; accumulated in float32 and rounded once, the result is exact for even n-1."""
    x = np.array([2048.0 if group.rank == 0 else 1.0], dtype)
    expected = np.array([2048.0 + group.size - 1], np.float32).astype(dtype)
    assert same_bits(fc.all_reduce(x, "sum", group.arg), expected)


def test_fp16_accuracy_against_gathered(group):
    """torch's fp16 test: random fp16 in ±65504/n summed matches the sum of the gathered."""
    rng = np.random.default_rng(group.rank)
    bound = 65504 / group.size
    x = rng.uniform(-bound, bound, 200).astype(np.float16)
    y = fc.all_reduce(x, group=group.arg)
    gathered = fc.all_gather_into_tensor(x, group.arg).reshape(group.size, -1)
    np.testing.assert_allclose(y.astype(np.float32), gathered.astype(np.float32).sum(0),
                               rtol=1e-2, atol=1e-3)


@pytest.mark.parametrize("factor", [0.5, 3])
def test_premul_sum(group, factor):
    inputs = _inputs(group, (6,), np.float64, salt=3)
    y = fc.all_reduce(inputs[group.rank], fc.premul_sum(factor), group.arg)
    np.testing.assert_allclose(y, sum(x * factor for x in inputs))
    c = fc.all_reduce(np.ones(2, np.complex64), fc.premul_sum(1j), group.arg)
    assert c.tolist() == [group.size * 1j] * 2


@pytest.mark.parametrize("layout", ["0d", "empty", "strided", "fortran", "readonly"])
@pytest.mark.parametrize("dtype", [np.float32, BF16, np.bool_, np.complex128])
def test_layouts(group, layout, dtype):
    inputs, x = layout_inputs(group.members, group.rank, layout, dtype)
    for op in ("sum", "avg") if np.dtype(dtype).kind == "c" else ("sum", "max"):
        y = fc.all_reduce(x, op, group.arg)
        assert isinstance(y, np.ndarray) and y.shape == x.shape
        assert same_bits(y, reference(inputs, op))
    assert fc.all_reduce(x, "sum", group.arg).flags.writeable


@pytest.mark.smoke
@pytest.mark.parametrize("dim", [0, 1, -1])
@pytest.mark.parametrize("dtype", [np.int32, np.float16, np.complex64])
def test_reduce_scatter_tensor(group, dim, dtype):
    n = group.size
    shape = [2, 3, 2]
    shape[dim] *= n
    inputs = [data(r, shape, dtype, salt=5) for r in group.members]
    total = reference(inputs, "sum")
    y = fc.reduce_scatter_tensor(inputs[group.rank], group=group.arg, scatter_dim=dim)
    assert same_bits(y, np.split(total, n, axis=dim)[group.rank])


def test_reduce_scatter_tensor_seed_values(group):
    n, r = group.size, group.rank
    y = fc.reduce_scatter_tensor(np.arange(2 * n, dtype=np.int64), group=group.arg)
    assert y.tolist() == (np.arange(2 * r, 2 * r + 2) * n).tolist()
    y = fc.reduce_scatter_tensor(np.ones((3, 3 * n)), "avg", group.arg, scatter_dim=1)
    assert same_bits(y, np.ones((3, 3)))


def test_reduce_scatter_variable_sizes(group):
    """Chunk i has i elements: rank 0 receives a 0-length array."""
    n = group.size
    inputs = [[data(r, (i,), np.float64, salt=6 + i) for i in range(n)] for r in group.members]
    y = fc.reduce_scatter(inputs[group.rank], "sum", group.arg)
    assert same_bits(y, reference([chunks[group.rank] for chunks in inputs], "sum"))
    assert y.shape == (group.rank,)


def test_reduce_scatter_list_2d_avg(group):
    n = group.size
    chunks = [np.full((i + 1, 2), float(group.rank + i)) for i in range(n)]
    y = fc.reduce_scatter(chunks, "avg", group.arg)
    i = group.rank
    assert same_bits(y, np.full((i + 1, 2), (n - 1) / 2 + i))


@pytest.mark.parametrize("dtype", COMPLEX)
@pytest.mark.parametrize("op", ["product", "min", "max", "band", "bor", "bxor"])
def test_complex_rejects_ordered_and_bitwise(dtype, op):
    expected = rf"expected op sum, avg or premul_sum for {dtype}.*got {op}"
    with pytest.raises(ValueError, match=r"^all_reduce: " + expected):
        fc.all_reduce(np.ones(2, dtype), op)
    with pytest.raises(ValueError, match=r"^all_reduce_coalesced: " + expected):
        fc.all_reduce_coalesced([np.ones(2, dtype)], op)
    with pytest.raises(ValueError, match=r"^reduce: " + expected):
        fc.reduce(np.ones(2, dtype), 0, op)
