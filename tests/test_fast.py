"""The default group's fast paths (fcoll/collectives/_fast.py) give the full path's results,
and stand aside whenever a deadline, debug checks or an unusual input is involved."""

from __future__ import annotations

import os

import numpy as np
import pytest

import fcoll as fc
from fcoll import runtime
from fcoll.collectives import _fast
from fcoll.collectives._fold import native_kernel
from fcoll.policy.plan import reduction_plan
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
        runtime._state.timeout = None
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


# -- fast paths of groups other than the default ----------------------------------------------

GROUP_CALLS = {
    "all_reduce": lambda x, g: fc.all_reduce(x, group=g),
    "all_reduce max": lambda x, g: fc.all_reduce(x, "max", group=g),
    "reduce_scatter_tensor": lambda x, g: fc.reduce_scatter_tensor(x, group=g),
    "all_gather_into_tensor": lambda x, g: fc.all_gather_into_tensor(x, group=g),
    "all_to_all_single": lambda x, g: fc.all_to_all_single(x, group=g),
    "broadcast": lambda x, g: fc.broadcast(x, src=g.size - 1, group=g),
}
TABLES = {"all_reduce": _fast.ALL_REDUCE, "all_reduce max": _fast.ALL_REDUCE,
          "reduce_scatter_tensor": _fast.REDUCE_SCATTER, "all_gather_into_tensor": _fast.ALL_GATHER,
          "all_to_all_single": _fast.ALL_TO_ALL, "broadcast": _fast.BROADCAST}


def _groups(world_size: int) -> dict[str, fc.Group]:
    """A split that reverses the ranks, and every other rank (other ranks: a non-member)."""
    rank = fc.get_rank()
    return {"reversed": fc.world().split(0, key=world_size - rank),
            "evens": fc.new_group(list(range(0, world_size, 2)))}


def _served(name: str, x: np.ndarray, g: fc.Group) -> bool:
    """Whether a fast path serves ``name`` on ``g``: data movement always; a reduction where
    MPI's op reduces ``x`` as it is (ints; floats at two ranks) or the compiled core folds it
    (with FCOLL_NATIVE=0 a float sum over three ranks, or a float max, has none)."""
    if not name.startswith(("all_reduce", "reduce_scatter")):
        return True
    plan = reduction_plan(x, "max" if "max" in name else "sum", g, name.split()[0])
    return bool(plan.direct) or native_kernel(plan) is not None


@pytest.mark.parametrize("dtype", ["int32", "float32"])
@pytest.mark.parametrize("name", list(GROUP_CALLS))
def test_a_group_passed_as_such_learns_its_own_fast_path(name, dtype, world_size):
    """The second call on a Group finds its own closure (keyed by the group) exactly where a
    fast path serves the call; results match numpy on every layout, and the default group's
    table is not touched."""
    for label, g in _groups(world_size).items():
        if g.rank < 0:
            continue
        n, me = g.size, g.rank
        inputs = [data(r, (2 * n, 3), dtype) for r in g.ranks]
        want = expected(name, inputs, me)
        x = inputs[me]
        default_keys = {k for k in TABLES[name] if type(k) is not tuple or type(k[0]) is not fc.Group}
        for variant in (x, x, np.asfortranarray(x), x.copy()):
            assert same_bits(GROUP_CALLS[name](variant, g), want), (label, name)
        learned = any(type(k) is tuple and k[0] is g for k in TABLES[name])
        assert learned == _served(name, x, g), (label, list(TABLES[name]))
        assert {k for k in TABLES[name] if type(k) is not tuple or type(k[0]) is not fc.Group} \
            == default_keys
        g.destroy()
        assert not any(type(k) is tuple and k[0] is g for k in TABLES[name])  # gone with it
        with pytest.raises(ValueError, match="live group"):
            GROUP_CALLS[name](x, g)


def test_rank_lists_and_groups_with_deadlines_learn_nothing(world_size):
    timed = fc.new_group(timeout=30)
    ranks = list(range(world_size))
    x = np.ones(3)
    fc.all_reduce(x)  # the default group's closure exists
    before = set(_fast.ALL_REDUCE)
    for _ in range(2):
        assert fc.all_reduce(x, group=ranks)[0] == world_size
        assert fc.all_reduce(x, group=timed)[0] == world_size
    assert set(_fast.ALL_REDUCE) == before
    timed.destroy()


# -- the compiled core's own callable ---------------------------------------------------------


def test_with_the_compiled_core_a_repeated_call_is_one_c_call(world_size):
    """Once a group's segment steps in C, its fast path is the core's `Fast`: it counts the
    call, records it in the flight record and returns the same result."""
    from fcoll.backends import native
    from fcoll.diagnostics import flight

    if world_size < 2 or not native.running() or os.environ.get("FCOLL_SHM", "auto") == "0":
        pytest.skip("needs the compiled core and the segment (2 or more ranks)")
    g = fc.world().split(0)
    x = np.arange(2 * world_size, dtype=np.float32) + fc.get_rank()
    calls = {"all_reduce": (_fast.ALL_REDUCE, (g, ("sum", x.dtype)), lambda: fc.all_reduce(x, group=g)),
             "reduce_scatter_tensor": (_fast.REDUCE_SCATTER, (g, ("sum", x.dtype)),
                                       lambda: fc.reduce_scatter_tensor(x, group=g)),
             "all_gather_into_tensor": (_fast.ALL_GATHER, (g, x.dtype),
                                        lambda: fc.all_gather_into_tensor(x, group=g)),
             "broadcast": (_fast.BROADCAST, (g, (1, x.dtype)), lambda: fc.broadcast(x, 1, group=g))}
    for name, (table, key, call) in calls.items():
        first, second = call(), call()  # the full path, then the closure that swaps itself
        if g.shm is False:
            pytest.skip("the group spans nodes (FCOLL_SHM_NODE_SIZE): MPI serves it")
        assert type(table[key]).__name__ == "Fast", name
        seq = g.seq
        third = call()
        assert g.seq == seq + 1 and same_bits(third, second) and same_bits(second, first), name
        if flight.RING:
            entry = flight.RING.calls[(flight.RING.pos[0] - 1) & flight.RING.mask]
            assert entry is not None and entry[1:3] == (g.seq, name), entry
    g.destroy()
