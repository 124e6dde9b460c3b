"""The internal ``out=`` path (`fcoll.collectives._into`, the torch backend's): every dtype
and op into a given buffer and in place, equal to the public function bit for bit, on every
group; and where the transport fills the buffer, no copy is made (issue 29). scripts/test.sh's
passes with FCOLL_SHM=0/1 and FCOLL_NATIVE=0 take these through MPI, the compiled core and
the numpy segment."""

from __future__ import annotations

import numpy as np
import pytest

import fcoll as fc
from fcoll.backends import shm
from fcoll.collectives import _fold, _into
from fcoll.groups.group import resolve_group
from tests.conftest import G
from tests.helpers import ALL_DTYPES, BF16, data, reduce_error, same_bits

OPS = ["sum", "avg", "product", "min", "max", "band", "bor", "bxor"]
CASES = [(d, op) for d in ALL_DTYPES for op in OPS if reduce_error(d, op) is None]
SIZES = [5, 40_000]  # below and above the on-node segment's window (docs/performance.md)


@pytest.mark.parametrize(("dtype", "op"), CASES, ids=[f"{d}-{op}" for d, op in CASES])
def test_all_reduce_into_and_in_place(group: G, dtype: np.dtype, op: str) -> None:
    for size in SIZES:
        x = data(group.rank, (size,), dtype, salt=3, low=1, high=4)
        expected = fc.all_reduce(x, op, group.arg)
        out = np.empty_like(x)
        _into.all_reduce(x, out, op, group.arg)
        assert same_bits(out, expected)
        _into.all_reduce(x, x, op, group.arg)  # in place
        assert same_bits(x, expected)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "int64", "complex128"])
def test_movement_into(group: G, dtype: str) -> None:
    n, r = group.size, group.rank
    for size in SIZES:
        x = data(r, (n * size,), BF16 if dtype == "bfloat16" else np.dtype(dtype), salt=5)
        out = np.empty(x.size * n, x.dtype)
        _into.all_gather(x, out, group.arg)
        assert same_bits(out, fc.all_gather_into_tensor(x, group.arg))
        out = np.empty(x.size, x.dtype)
        _into.all_to_all(x, out, group.arg)
        assert same_bits(out, fc.all_to_all_single(x, group=group.arg))
        out = np.empty(size, x.dtype)
        _into.reduce_scatter(x, out, "sum", group.arg)
        assert same_bits(out, fc.reduce_scatter_tensor(x, "sum", group.arg))
        for root in range(n):
            buf = x.copy()
            _into.broadcast(buf, root, group.arg)
            assert same_bits(buf, fc.broadcast(x, root, group.arg))


def test_overlapping_gather_input(group: G) -> None:
    """FSDP's all-gather input is its own block of the output."""
    n, r = group.size, group.rank
    out = np.zeros(3 * n)
    out[3 * r : 3 * r + 3] = r + 1.0
    _into.all_gather(out[3 * r : 3 * r + 3], out, group.arg)
    assert out.tolist() == [q + 1.0 for q in range(n) for _ in range(3)]


def test_no_copy_where_the_transport_fills_out(group: G, monkeypatch: pytest.MonkeyPatch) -> None:
    """An integer all-reduce (MPI's op) and a float32 sum (MPI at two ranks, the compiled
    core or the numpy segment within the window) fill ``out`` themselves; the broken copy
    below would fail the test if they did not."""

    def no_copy(out: np.ndarray | None, y: np.ndarray) -> np.ndarray:
        assert out is None or y is out, "the result was copied into out"
        return y

    monkeypatch.setattr(_fold, "_put", no_copy)
    for dtype in ("int32", "float32"):
        for size in SIZES:
            x = np.full(size, group.rank + 1, dtype)
            if dtype == "float32" and group.size > 2 and \
                    x.nbytes < shm.limit(resolve_group(group.arg, "test")):
                continue  # a float fold over MPI (n > 2, below the window) copies
            _into.all_reduce(x, x, "sum", group.arg)
            assert x[0] == group.size * (group.size + 1) / 2


def test_wrong_out_is_refused(group: G) -> None:
    with pytest.raises(ValueError, match="expected out to be a writable C-contiguous numpy array"):
        _into.all_reduce(np.ones(4), np.empty(5), "sum", group.arg)
    with pytest.raises(ValueError, match="expected out to be a writable C-contiguous"):
        _into.all_gather(np.ones(4), np.empty((2, 4 * group.size))[:, ::2], group.arg)
    assert fc.all_reduce(np.ones(1), group=group.arg)[0] == group.size  # nothing was sent
