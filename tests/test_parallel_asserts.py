"""fcoll.testing's cross-rank assertions: every rank passes or fails together, whichever
ranks raised, and no rank is left waiting (run at every world size, on several groups)."""

from __future__ import annotations

import numpy as np
import pytest

import fcoll as fc
from fcoll.testing import parallel_assert, parallel_raises

Failed = pytest.fail.Exception


def test_one_rank_raising_is_enough_by_default(group):
    with parallel_raises(ValueError, match="bad", group=group.arg) as info:
        if group.rank == group.size - 1:
            raise ValueError("bad input")
    assert info.ranks == [group.size - 1]
    assert (info.value is not None) == (group.rank == group.size - 1)
    fc.barrier(group.arg)  # the group's own communicator still works afterwards


def test_every_rank_raising(group):
    with parallel_raises((KeyError, ValueError), on="all", group=group.arg) as info:
        raise ValueError(f"from {group.rank}")
    assert info.ranks == list(range(group.size))


def test_on_all_fails_everywhere_when_one_rank_did_not_raise(group):
    if group.size == 1:
        pytest.skip("needs two ranks: one raises, one does not")
    with (
        pytest.raises(Failed, match=r"expected ValueError on every rank, got rank 0: "
                                     r"ValueError: only 0; rank 1: no exception"),
        parallel_raises(ValueError, on="all", group=group.arg),
    ):
        if group.rank == 0:
            raise ValueError("only 0")


def test_no_rank_raising_fails_everywhere(group):
    with (
        pytest.raises(Failed, match="expected RuntimeError on at least one rank"),
        parallel_raises(RuntimeError, group=group.arg),
    ):
        pass


def test_another_exception_on_one_rank_fails_everywhere(group):
    last = group.size - 1
    with (
        pytest.raises(Failed, match=rf"rank {last}: TypeError: wrong kind"),
        parallel_raises(ValueError, group=group.arg),
    ):
        if group.rank == last:
            raise TypeError("wrong kind")
        if group.rank == 0:
            raise ValueError("right kind")


def test_match_is_searched_in_the_message(group):
    with (
        pytest.raises(Failed, match=r"expected ValueError matching 'nope'"),
        parallel_raises(ValueError, match="nope", group=group.arg),
    ):
        raise ValueError("something else")


def test_a_rank_that_skipped_a_collective_does_not_hang_the_others(group):
    """Rank 0 raises before a collective the others started under a deadline."""
    if group.size == 1:
        pytest.skip("needs a rank to skip the collective")
    g = fc.new_group(list(group.members), timeout=0.5)
    with parallel_raises((RuntimeError, fc.CollectiveTimeoutError), group=group.arg) as info:
        if group.rank == 0:
            raise RuntimeError("rank 0 gives up")
        fc.all_reduce(np.ones(1), group=g)
    assert 0 in info.ranks


def test_parallel_assert_passes_when_true_everywhere(group):
    parallel_assert(fc.all_reduce(np.ones(1), group=group.arg)[0] == group.size,
                    "sum of ones", group=group.arg)


def test_parallel_assert_fails_on_every_rank_naming_the_ranks(group):
    last = group.size - 1
    with pytest.raises(Failed, match=rf"parallel_assert: odd: false on ranks \[{last}\] "
                                     rf"of {group.size}"):
        parallel_assert(group.rank != last, "odd", group=group.arg)


def test_bad_arguments():
    with (
        pytest.raises(ValueError, match="expected on='any' or 'all', got 'some'"),
        parallel_raises(ValueError, on="some"),  # type: ignore[arg-type]
    ):
        pass
