"""Coalesced forms: list in, list out, bit-identical to one call per array."""

from __future__ import annotations

import numpy as np
import pytest

import fcoll as fc
from fcoll.backends.tree import doubling_limit
from tests.helpers import BF16, same_bits, tree

SHAPES = [(5, 5), (0,), (), (10, 10), (15, 3), (1,)]
DTYPES = [np.float32, np.float64, BF16, np.int64, np.float32, np.complex64]


def _arrays(rank: int, n: int, scale_rows: bool = False) -> list[np.ndarray]:
    rng = np.random.default_rng([9, rank])
    out = []
    for shape, dtype in zip(SHAPES, DTYPES, strict=True):
        if scale_rows and shape:
            shape = (shape[0] * n, *shape[1:])
        values = rng.standard_normal(shape) * 1000
        if np.dtype(dtype).kind == "c":
            values = values + 1j * rng.standard_normal(shape)
        out.append(np.asarray(values).astype(dtype))
    return out


@pytest.mark.smoke
@pytest.mark.parametrize("op", ["sum", "avg", "max"])
def test_all_reduce_coalesced_bit_identical(group, op):
    xs = _arrays(group.members[group.rank], group.size)
    if op == "max":
        xs = [x for x in xs if x.dtype.kind != "c"]
    if op == "avg":
        xs = [x for x in xs if x.dtype.kind in "fcV"]
    ys = fc.all_reduce_coalesced(xs, op, group.arg)
    singles = [fc.all_reduce(x, op, group.arg) for x in xs]
    assert all(same_bits(y, s) for y, s in zip(ys, singles, strict=True))


def test_all_reduce_coalesced_seed_values(group):
    n, r = group.size, group.rank
    ys = fc.all_reduce_coalesced([np.array([r + 1.0]), np.array([(r + 1) ** 2])], "sum", group.arg)
    assert [y.tolist() for y in ys] == [[n * (n + 1) / 2], [n * (n + 1) * (2 * n + 1) // 6]]
    ys = fc.all_reduce_coalesced([np.array([r]), np.array([r + 1])], "min", group.arg)
    assert [y.tolist() for y in ys] == [[0], [1]]
    assert fc.all_reduce_coalesced([], group=group.arg) == []


def test_all_gather_into_tensor_coalesced(group):
    xs = _arrays(group.members[group.rank], group.size)
    ys = fc.all_gather_into_tensor_coalesced(xs, group.arg)
    singles = [fc.all_gather_into_tensor(x, group.arg) for x in xs]
    assert all(same_bits(y, s) for y, s in zip(ys, singles, strict=True))
    r = group.rank
    ins = [np.arange(r * (60 + i), (r + 1) * (60 + i)) for i in range(5)]
    outs = fc.all_gather_into_tensor_coalesced(ins, group.arg)
    assert all(same_bits(o, np.arange((60 + i) * group.size)) for i, o in enumerate(outs))


def test_reduce_scatter_tensor_coalesced(group):
    xs = [x for x in _arrays(group.members[group.rank], group.size, scale_rows=True) if x.ndim]
    ys = fc.reduce_scatter_tensor_coalesced(xs, "sum", group.arg)
    singles = [fc.reduce_scatter_tensor(x, "sum", group.arg) for x in xs]
    assert all(same_bits(y, s) for y, s in zip(ys, singles, strict=True))
    n = group.size
    ys = fc.reduce_scatter_tensor_coalesced([np.ones(n, np.int64), np.ones(n) + 1], "sum", group.arg)
    assert same_bits(ys[0], np.array([n])) and same_bits(ys[1], np.array([2.0 * n]))


def test_reduce_scatter_tensor_coalesced_checks_each_array():
    n = fc.get_world_size()
    with pytest.raises(ValueError, match=r"xs\[1\].shape\[0\] divisible"):
        fc.reduce_scatter_tensor_coalesced([np.ones(n), np.ones(n + 1) if n > 1 else np.ones(())])


@pytest.mark.parametrize("op", ["sum", "product", "max", "avg"])
def test_float_results_follow_the_tree_at_every_size(group, op):
    """Floating reductions equal numpy's fold along the canonical tree (`helpers.tree`), for
    messages on both sides of the doubling/halving switch, alone or fused."""
    sizes = [1, 7, 5000, doubling_limit(group.size) // 8 + 11]  # the last above the switch per rank
    inputs = {r: [np.random.default_rng([r, s]).standard_normal(s) for s in sizes]
              for r in group.members}
    mine = inputs[group.members[group.rank]]
    fused = fc.all_reduce_coalesced(mine, op, group.arg)
    ufunc = {"sum": np.add, "avg": np.add, "product": np.multiply, "max": np.maximum}[op]
    for i, y in enumerate(fused):
        expected = tree([inputs[r][i] for r in group.members], ufunc)
        if op == "avg":
            expected = expected / group.size
        assert same_bits(y, expected)
        assert same_bits(fc.all_reduce(mine[i], op, group.arg), expected)
        scattered = fc.reduce(mine[i], 0, op, group.arg)
        assert group.rank != 0 or same_bits(scattered, expected)
