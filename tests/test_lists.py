"""List forms: all_gather, gather, scatter, all_to_all (shapes may differ per rank)."""

from __future__ import annotations

import numpy as np
import pytest

import fcoll as fc
from tests.helpers import ALL_DTYPES, bits, same_bits


def _shape(rank: int) -> tuple[int, ...]:
    return (rank % 3, 2) if rank % 2 == 0 else (rank + 1,)


@pytest.mark.smoke
@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
def test_all_gather_shapes_differ(group, dtype):
    inputs = [bits(r, _shape(r), dtype, salt=1) for r in group.members]
    x = inputs[group.rank]
    before = x.copy()
    ys = fc.all_gather(x, group.arg)
    assert len(ys) == group.size
    assert all(same_bits(y, e) for y, e in zip(ys, inputs, strict=True))
    assert same_bits(x, before)


def test_all_gather_seed_values(group):
    for dest in range(group.size):
        ys = fc.all_gather(np.full((dest + 1,) * 3, float(group.rank)), group.arg)
        assert all(same_bits(y, np.full((dest + 1,) * 3, float(i))) for i, y in enumerate(ys))
    column = np.arange(12.0).reshape(4, 3)[:, 1] + group.rank
    ys = fc.all_gather(column, group.arg)
    assert all(same_bits(y, np.arange(12.0).reshape(4, 3)[:, 1] + i) for i, y in enumerate(ys))
    scalars = fc.all_gather(np.asarray(group.rank), group.arg)
    assert [s.shape for s in scalars] == [()] * group.size


@pytest.mark.smoke
@pytest.mark.parametrize("dtype", [np.bool_, np.float16, np.complex128])
def test_gather_every_root(group, dtype):
    inputs = [bits(r, _shape(r), dtype, salt=2) for r in group.members]
    for dst in range(group.size):
        ys = fc.gather(inputs[group.rank], dst, group.arg)
        if group.rank == dst:
            assert all(same_bits(y, e) for y, e in zip(ys, inputs, strict=True))
        else:
            assert ys is None


@pytest.mark.smoke
@pytest.mark.parametrize("dtype", [np.int8, np.float64, np.complex64])
def test_scatter_every_root(group, dtype):
    for src in range(group.size):
        chunks = [bits(src, _shape(i), dtype, salt=i) for i in range(group.size)]
        y = fc.scatter(chunks if group.rank == src else None, src, group.arg)
        assert same_bits(y, chunks[group.rank])


def test_scatter_default_src(group):
    chunks = [np.ones(1) * i for i in range(group.size)] if group.rank == 0 else None
    assert same_bits(fc.scatter(chunks, group=group.arg), np.ones(1) * group.rank)


@pytest.mark.smoke
def test_all_to_all(group):
    n, r = group.size, group.rank
    out = fc.all_to_all([np.ones((i + 1, n)) * r for i in range(n)], group.arg)
    assert all(same_bits(o, np.ones((r + 1, n)) * i) for i, o in enumerate(out))
    sent = {p: [bits(group.members[p], _shape(p + q), np.uint16, salt=q) for q in range(n)]
            for p in range(n)}
    got = fc.all_to_all(sent[r], group.arg)
    assert all(same_bits(got[p], sent[p][r]) for p in range(n))


def test_dtype_disagreement_raises_everywhere(group):
    dtype = np.float16 if group.rank == group.size - 1 else np.float32
    if group.size > 1:
        with pytest.raises(ValueError, match="tensors with different dtypes"):
            fc.all_gather(np.ones(2, dtype), group.arg)
        with pytest.raises(ValueError, match="tensors with different dtypes"):
            fc.gather(np.ones(2, dtype), 0, group.arg)
        with pytest.raises(ValueError, match="tensors with different dtypes"):
            fc.all_to_all([np.ones(1, dtype)] * group.size, group.arg)
    fc.barrier(group.arg)


def test_mixed_dtypes_in_one_list_raise_before_sending(group, rank, world_size):
    mixed = [np.ones(1, np.float32)] * (group.size - 1) + [np.ones(1, np.float16)]
    if group.rank == 0:  # only one rank calls: raising before sending means no hang
        for call in (lambda: fc.all_to_all(mixed, group.arg),
                     lambda: fc.reduce_scatter(mixed, "sum", group.arg),
                     lambda: fc.scatter(mixed, 0, group.arg)):
            if group.size > 1:
                with pytest.raises(ValueError, match="tensors with different dtypes"):
                    call()
    fc.barrier(group.arg)
