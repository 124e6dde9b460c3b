"""The default group's fast paths (fcoll/collectives/_fast.py) give the full path's results,
and stand aside whenever a deadline, debug checks or an unusual input is involved."""

from __future__ import annotations

import numpy as np
import pytest

import fcoll as fc
from fcoll import _runtime
from fcoll.collectives import _fast
from tests.helpers import data, reference, same_bits

CALLS = {
    "all_reduce": lambda x: fc.all_reduce(x),
    "all_reduce max": lambda x: fc.all_reduce(x, "max"),
    "reduce_scatter_tensor": lambda x: fc.reduce_scatter_tensor(x),
    "all_gather_into_tensor": lambda x: fc.all_gather_into_tensor(x),
    "all_to_all_single": lambda x: fc.all_to_all_single(x),
    "broadcast": lambda x: fc.broadcast(x, src=fc.get_world_size() - 1),
}


def expected(name: str, inputs: list[np.ndarray], rank: int) -> np.ndarray:
    n = len(inputs)
    if name.startswith("all_reduce"):
        return reference(inputs, "max" if "max" in name else "sum")
    if name == "reduce_scatter_tensor":
        return np.split(reference(inputs, "sum"), n)[rank]
    if name == "all_gather_into_tensor":
        return np.concatenate(inputs)
    if name == "all_to_all_single":
        return np.concatenate([np.split(x, n)[rank] for x in inputs])
    return inputs[-1]


@pytest.mark.parametrize("dtype", ["int32", "float32", "float64", "uint8"])
@pytest.mark.parametrize("name", list(CALLS))
def test_repeated_calls_match_the_full_path(name, dtype, rank, world_size):
    """The first call learns the fast path; later ones (any layout) must agree with numpy."""
    shape = (2 * world_size, 3)
    inputs = [data(r, shape, dtype) for r in range(world_size)]
    want = expected(name, inputs, rank)
    x = inputs[rank]
    layouts = [x, x, np.asfortranarray(x), x[::-1][::-1], x.copy()[:, :],
               np.ascontiguousarray(x)]
    for variant in layouts:
        before = variant.copy()
        y = CALLS[name](variant)
        assert same_bits(y, want), name
        assert not np.shares_memory(y, variant)
        assert same_bits(variant, before)  # the input is never written


def test_results_are_fresh_arrays_every_call():
    x = np.arange(4.0)
    a, b = fc.all_reduce(x), fc.all_reduce(x)
    assert a is not b and not np.shares_memory(a, b)
    c, d = fc.broadcast(x), fc.broadcast(x)
    assert not np.shares_memory(c, d) and not np.shares_memory(c, x)


def test_debug_and_deadlines_turn_fast_paths_off(world_size):
    x = np.ones(3, np.int64)
    fc.all_reduce(x)
    assert _fast.ALL_REDUCE, "a plain call on the world group should leave a fast path"
    fc.init(debug="info")
    try:
        assert not _fast.ALL_REDUCE
        fc.all_reduce(x)
        assert not _fast.ALL_REDUCE  # never learned while debug checks are on
    finally:
        fc.init(debug="off")
    fc.init(timeout=60)
    try:
        assert fc.all_reduce(x).tolist() == [world_size] * 3
        assert not _fast.ALL_REDUCE
    finally:
        _runtime._state.timeout = None
    fc.all_reduce(x)
    assert _fast.ALL_REDUCE


def test_detail_still_catches_a_mismatch_after_fast_calls(world_size, rank):
    if world_size < 2:
        pytest.skip("needs two ranks")
    for _ in range(3):
        fc.all_reduce(np.ones(3))
    fc.init(debug="detail")
    try:
        last = rank == world_size - 1
        with pytest.raises(fc.CollectiveMismatchError):
            fc.all_reduce(np.ones(4 if last else 3))
    finally:
        fc.init(debug="off")


def test_bad_arguments_still_raise_after_fast_calls(world_size):
    fc.all_gather_into_tensor(np.ones(2))
    fc.all_to_all_single(np.ones(world_size))
    if world_size > 1:
        with pytest.raises(ValueError, match="divisible"):
            fc.reduce_scatter_tensor(np.ones(world_size + 1))
    with pytest.raises(TypeError, match=r"numpy\.ndarray"):
        fc.all_reduce([1.0, 2.0])  # type: ignore[call-overload]
    with pytest.raises(ValueError, match="src"):
        fc.broadcast(np.ones(2), src=world_size)
    assert fc.all_gather_into_tensor(np.ones(())).shape == (world_size,)  # 0-d: full path
