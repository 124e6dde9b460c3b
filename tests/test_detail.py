"""debug="detail" keeps the errors of debug="off": local checks run first, the cross-rank
fingerprint never holds a process-dependent ``repr`` (API.md, "Dtypes, ops and errors").

- every rank fails its local check the same way: every rank raises that error;
- only some ranks fail: they raise theirs, the others `CollectiveMismatchError` naming them;
- a property over the generated calls of tests/strategies.py (good and bad): the same
  exception type on every rank as under ``off``, at every world size.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fcoll as fc
from fcoll.groups.detail import describe
from tests.strategies import CASES, arrays


@pytest.fixture
def detail():
    fc.init(debug="detail")
    yield
    fc.init(debug="off")


def _world_bad(name: str) -> Callable[[Any], object]:
    """Calls whose argument holds an object whose repr differs between processes."""
    return {
        "all_reduce_coalesced": lambda g: fc.all_reduce_coalesced([object()], group=g),
        "all_gather_into_tensor_coalesced": lambda g: fc.all_gather_into_tensor_coalesced(
            [object()], group=g),
        "reduce_scatter_tensor_coalesced": lambda g: fc.reduce_scatter_tensor_coalesced(
            [np.ones(2), object()], group=g),
        "all_reduce": lambda g: fc.all_reduce(object(), group=g),  # type: ignore[call-overload]
        "all_to_all": lambda g: fc.all_to_all([object()], group=g),
        "permute_tensor": lambda g: fc.permute_tensor(np.ones(1), [object()], group=g),
    }[name]


BAD_EVERYWHERE = ["all_reduce_coalesced", "all_gather_into_tensor_coalesced",
                  "reduce_scatter_tensor_coalesced", "all_reduce", "all_to_all", "permute_tensor"]


def test_describe_never_holds_a_process_address():
    thing = object()
    assert describe([thing, np.ones((2, 3), np.float32)]) == "[object, float32[2, 3]]"
    assert hex(id(thing))[2:] not in describe({"k": thing})
    assert describe((1, None, "sum", 2.5)) == "(1, None, 'sum', 2.5)"
    assert describe(fc.ReduceOp.MAX) == "ReduceOp.MAX" and describe(np.int64(3)) == "int64[]"


@pytest.mark.parametrize("name", BAD_EVERYWHERE)
def test_the_same_bad_argument_everywhere_raises_its_own_error(group, detail, name):
    """The single-process error (TypeError naming the argument), not a false mismatch."""
    call = _world_bad(name)
    with pytest.raises((TypeError, ValueError)) as info:
        call(group.arg)
    assert not isinstance(info.value, fc.CollectiveMismatchError), str(info.value)
    fc.init(debug="off")
    with pytest.raises(type(info.value)):
        call(group.arg)
    fc.init(debug="detail")
    assert fc.all_reduce(np.ones(2), group=group.arg).tolist() == [group.size] * 2


@pytest.mark.parametrize("bad_rank", ["first", "last"])
def test_only_the_failing_ranks_raise_their_own_error(group, detail, bad_rank):
    if group.size < 2:
        pytest.skip("needs two ranks")
    bad = group.rank == (0 if bad_rank == "first" else group.size - 1)
    xs = [object()] if bad else [np.ones(2)]
    if bad:
        with pytest.raises(TypeError, match=r"xs\[0\]"):
            fc.all_reduce_coalesced(xs, group=group.arg)
    else:
        with pytest.raises(fc.CollectiveMismatchError, match="failed their local") as info:
            fc.all_reduce_coalesced(xs, group=group.arg)
        failed = 0 if bad_rank == "first" else group.size - 1
        assert f"group rank(s) [{failed}]" in str(info.value)
        assert "TypeError" in str(info.value)
    assert fc.all_reduce(np.ones(2), group=group.arg).tolist() == [group.size] * 2


def test_a_bad_root_on_one_rank(group, detail):
    if group.size < 2:
        pytest.skip("needs two ranks")
    bad = group.rank == 0
    if bad:
        with pytest.raises(ValueError, match="invalid root rank") as info:
            fc.broadcast(np.ones(3), src=group.size, group=group.arg)
        assert not isinstance(info.value, fc.CollectiveMismatchError)
    else:
        with pytest.raises(fc.CollectiveMismatchError, match=r"group rank\(s\) \[0\]"):
            fc.broadcast(np.ones(3), src=0, group=group.arg)
    fc.barrier(group.arg)


# --- the property: detail raises what off raises, on every rank --------------------------

# Calls that communicate point to point (an unmatched isend) or are not collectives.
_SKIP = {"isend dst", "new_group", "premul_sum"}
# Good calls, and one that is bad on one rank only.
GOOD: dict[str, Callable[[np.ndarray], object]] = {
    "all_reduce": lambda x: fc.all_reduce(x, "max"),
    "reduce": lambda x: fc.reduce(x, dst=fc.get_world_size() - 1),
    "broadcast": lambda x: fc.broadcast(x, src=fc.get_world_size() - 1),
    "all_gather_into_tensor": lambda x: fc.all_gather_into_tensor(x, gather_dim=-1),
    "all_gather_v": lambda x: fc.all_gather_into_tensor(x, sizes="auto"),
    "reduce_scatter_tensor": lambda x: fc.reduce_scatter_tensor(
        np.concatenate([x] * fc.get_world_size()), "min"),
    "all_to_all_single": lambda x: fc.all_to_all_single(np.concatenate([x] * fc.get_world_size())),
    "all_gather": lambda x: fc.all_gather(x),
    "gather": lambda x: fc.gather(x, dst=0),
    "all_to_all": lambda x: fc.all_to_all([x] * fc.get_world_size()),
    "reduce_scatter": lambda x: fc.reduce_scatter([x] * fc.get_world_size()),
    "all_reduce_coalesced": lambda x: fc.all_reduce_coalesced([x, x[:1]]),
    "all_gather_into_tensor_coalesced": lambda x: fc.all_gather_into_tensor_coalesced([x]),
    "permute_tensor": lambda x: fc.permute_tensor(
        x, [(i + 1) % fc.get_world_size() for i in range(fc.get_world_size())]),
    "all_gather_object": lambda x: fc.all_gather_object(x.shape),
    "broadcast_object": lambda x: fc.broadcast_object(x.dtype, src=0),
    "scatter": lambda x: fc.scatter([x] * fc.get_world_size() if fc.get_rank() == 0 else None),
    # bad on the last rank only: its entry of sizes disagrees with its own x
    "all_gather_v, last rank bad": lambda x: fc.all_gather_into_tensor(
        x, sizes=[x.shape[0]] * (fc.get_world_size() - 1) + [x.shape[0] + 1]),
}


@st.composite
def calls(draw: st.DrawFn) -> tuple[str, Callable[[], object]]:
    x = arrays(draw)
    if draw(st.booleans()):
        name = draw(st.sampled_from(sorted(GOOD)))
        return name, lambda: GOOD[name](x)
    name = draw(st.sampled_from(sorted(set(CASES) - _SKIP)))
    bad = draw(CASES[name][0])
    return name, lambda: CASES[name][1](x, bad)


def _outcome(call: Callable[[], object], debug: str) -> type[BaseException] | None:
    fc.init(debug=debug)
    try:
        call()
    except (TypeError, ValueError, NotImplementedError) as error:
        return type(error)
    finally:
        fc.init(debug="off")
    return None


def _agree(ok: bool, what: str) -> None:
    """Fail on every rank (naming the ranks) when ``ok`` is false on any: no rank left behind."""
    bad = [r for r, good in enumerate(fc.all_gather_object(ok)) if not good]
    assert not bad, f"{what}: wrong on ranks {bad}"


@settings(max_examples=120, deadline=None, suppress_health_check=list(HealthCheck))
@given(calls())
def test_detail_raises_what_off_raises(case):
    name, call = case
    detailed = _outcome(call, "detail")
    outcomes = fc.all_gather_object(None if detailed is None else detailed.__name__)
    if "CollectiveMismatchError" in outcomes:
        # some ranks failed their local checks: they raise their own TypeError/ValueError
        mine_failed = detailed is not fc.CollectiveMismatchError
        _agree(not mine_failed or detailed in (TypeError, ValueError), f"{name}: {outcomes}")
        _agree(any(o not in (None, "CollectiveMismatchError") for o in outcomes),
               f"{name}: a mismatch with no failing rank: {outcomes}")
        return
    # every rank agrees that the call is good or bad: off is safe to run and must match
    _agree(_outcome(call, "off") is detailed, f"{name}: detail {detailed}")
