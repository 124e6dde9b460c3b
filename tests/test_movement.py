"""broadcast, all_gather_into_tensor, all_to_all_single, barrier: bit-exact movement of every
dtype, on every group and world size."""

from __future__ import annotations

import time

import numpy as np
import pytest

import fcoll as fc
from tests.helpers import ALL_DTYPES, bits, same_bits

SEED_VALUES = [(np.float32, -1e-10), (np.float64, -1e-100), (np.float16, -0.1), (np.int8, -2),
               (np.uint8, 129), (np.int32, -100000), (np.int64, -10**15)]


@pytest.mark.smoke
@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
def test_broadcast_bit_exact_every_root(group, dtype):
    for src in range(group.size):
        inputs = [bits(r, (3, 4), dtype, salt=src) for r in group.members]
        x = inputs[group.rank]
        before = x.copy()
        y = fc.broadcast(x, src=src, group=group.arg)
        assert same_bits(y, inputs[src]) and same_bits(x, before)
        assert not np.shares_memory(x, y)


@pytest.mark.parametrize(("dtype", "value"), SEED_VALUES)
def test_broadcast_seed_values(group, dtype, value):
    for src in range(group.size):
        x = np.full((src + 1,) * 3, value if group.rank == src else 0, dtype)
        y = fc.broadcast(x, src, group.arg)
        assert same_bits(y, np.full((src + 1,) * 3, value, dtype))


@pytest.mark.parametrize("extra", [-1, 0, 4099])
def test_broadcast_large_goes_in_chunks(group, extra):
    """Around and above the size where broadcasts are pipelined (fcoll.backends.mpi)."""
    from fcoll.backends import mpi as backend

    nbytes = backend.PIPELINE_BYTES + extra * 8
    for src in {0, group.size - 1}:
        truth = bits(src, (nbytes // 8,), np.float64, salt=3)
        x = truth.copy() if group.rank == src else np.zeros_like(truth)
        x.flags.writeable = False
        y = fc.broadcast(x, src, group.arg)
        assert same_bits(y, truth) and not np.shares_memory(x, y)
    x3 = bits(group.rank, (2, backend.PIPELINE_BYTES // 16, 2), np.int32)  # 2-D rows, any root
    assert same_bits(fc.broadcast(x3, 0, group.arg), bits(0, x3.shape, np.int32))


@pytest.mark.parametrize("layout", ["strided", "fortran", "empty", "0d", "readonly"])
def test_broadcast_layouts(group, layout):
    src = group.size - 1
    view = {"strided": lambda a: a[::2, ::3], "fortran": np.asfortranarray,
            "empty": lambda a: a[:0], "0d": lambda a: np.asarray(a[1, 1]),
            "readonly": lambda a: a}[layout]
    truth = view(np.arange(24.0).reshape(4, 6))
    x = view(np.arange(24.0).reshape(4, 6) * (group.rank == src))
    x.flags.writeable = layout != "readonly"
    y = fc.broadcast(x, src, group.arg)
    assert same_bits(y, truth)
    assert y.flags.c_contiguous and y.flags.writeable


@pytest.mark.smoke
@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
@pytest.mark.parametrize("dim", [0, 1, 2, -1])
def test_all_gather_into_tensor(group, dtype, dim):
    inputs = [bits(r, (2, 3, 2), dtype, salt=1) for r in group.members]
    y = fc.all_gather_into_tensor(inputs[group.rank], group.arg, gather_dim=dim)
    assert same_bits(y, np.concatenate(inputs, axis=dim))


def test_all_gather_into_tensor_seed_layouts(group):
    n = group.size
    y = fc.all_gather_into_tensor(np.ones((2, 2)) * group.rank, group.arg)
    assert same_bits(y.reshape(n, 2, 2), np.stack([np.ones((2, 2)) * i for i in range(n)]))
    assert fc.all_gather_into_tensor(np.array(5.0), group.arg).shape == (n,)
    assert fc.all_gather_into_tensor(np.ones((0, 3)), group.arg).shape == (0, 3)
    strided = np.arange(12).reshape(3, 4)[:, ::2] + group.rank
    gathered = fc.all_gather_into_tensor(strided, group.arg, gather_dim=1)
    assert same_bits(gathered, np.concatenate(
        [np.arange(12).reshape(3, 4)[:, ::2] + r for r in range(n)], axis=1))


@pytest.mark.parametrize("how", ["list", "auto"])
@pytest.mark.parametrize("dim", [0, -1])
def test_all_gather_v(group, how, dim):
    lengths = [r + 1 if r % 2 == 0 else 0 for r in range(group.size)]
    shape = [3, 2]
    inputs = []
    for r in range(group.size):
        shape[dim] = lengths[r]
        inputs.append(bits(group.members[r], tuple(shape), np.float64, salt=2))
    sizes = lengths if how == "list" else "auto"
    y = fc.all_gather_into_tensor(inputs[group.rank], group.arg, gather_dim=dim, sizes=sizes)
    assert same_bits(y, np.concatenate(inputs, axis=dim))


def test_all_gather_v_disagreement_raises_everywhere(group):
    if group.size < 2:
        pytest.skip("needs two ranks")
    n = group.size
    lengths = [1] * n
    x = np.ones((1, 2))
    wrong = list(lengths)
    if group.rank == 0:
        wrong[n - 1] = 2  # rank 0 believes the last rank sends 2 rows
    with pytest.raises(ValueError, match="ranks disagree"):
        fc.all_gather_into_tensor(x, group.arg, sizes=wrong)
    other = np.ones((1, 3 if group.rank == n - 1 else 2))
    with pytest.raises(ValueError, match="only gather_dim may differ"):
        fc.all_gather_into_tensor(other, group.arg, sizes="auto")
    fc.barrier(group.arg)


@pytest.mark.smoke
@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
def test_all_to_all_single_even(group, dtype):
    n = group.size
    inputs = [bits(r, (2 * n, 3), dtype, salt=3) for r in group.members]
    y = fc.all_to_all_single(inputs[group.rank], group=group.arg)
    me = group.rank
    assert same_bits(y, np.concatenate([inputs[p][2 * me : 2 * me + 2] for p in range(n)]))


def test_all_to_all_single_seed_values(group):
    n, r = group.size, group.rank
    y = fc.all_to_all_single(np.ones((n, n)) * r, group=group.arg)
    assert same_bits(y, np.concatenate([np.ones((1, n)) * i for i in range(n)]))
    in_splits = [i + 1 for i in range(n)]
    out_splits = [r + 1] * n
    x = np.ones((n * (n + 1) // 2, n)) * r
    expected = np.concatenate([np.ones((r + 1, n)) * i for i in range(n)])
    assert same_bits(fc.all_to_all_single(x, out_splits, in_splits, group.arg), expected)
    assert same_bits(fc.all_to_all_single(x, None, in_splits, group.arg), expected)
    splits = [(i + 1) * (r + 1) for i in range(n)]
    x1 = np.full(n * (r + 1) * (n + 1) // 2, float(r + 1))
    y1 = fc.all_to_all_single(x1, None, splits, group.arg)
    assert same_bits(y1, np.concatenate([np.full((r + 1) * (i + 1), float(i + 1)) for i in range(n)]))


def test_all_to_all_single_uneven_with_empty_blocks(group):
    n, me = group.size, group.rank
    sends = {p: [(p + q) % 3 for q in range(n)] for p in range(n)}  # rows p sends to q
    inputs = {p: bits(group.members[p], (sum(sends[p]), 2), np.complex64, salt=4) for p in range(n)}
    recv = [sends[p][me] for p in range(n)]
    y = fc.all_to_all_single(inputs[me], recv, sends[me], group.arg)
    offsets = {p: np.cumsum([0, *sends[p]]) for p in range(n)}
    expected = np.concatenate([inputs[p][offsets[p][me] : offsets[p][me + 1]] for p in range(n)])
    assert same_bits(y, expected)
    noncontig = np.asfortranarray(inputs[me])
    assert same_bits(fc.all_to_all_single(noncontig, recv, sends[me], group.arg), expected)


def test_all_to_all_single_split_disagreement_raises_everywhere(group):
    n = group.size
    x = np.ones((n, 2))
    outs = [1] * n
    if group.rank == n - 1:
        outs[0] = 2  # expects 2 rows from rank 0, which sends 1
    with pytest.raises(ValueError, match="ranks disagree"):
        fc.all_to_all_single(x, outs, [1] * n, group.arg)
    fc.barrier(group.arg)


def test_barrier_orders(group):
    """Every rank leaves the barrier after the last one arrives."""
    for dest in range(group.size):
        t = fc.broadcast(np.array([time.time() + 0.2]), dest, group.arg)[0]
        if group.rank == dest:
            time.sleep(0.3)
        fc.barrier(group.arg)
        assert time.time() >= t
