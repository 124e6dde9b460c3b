"""Groups: new_group, rank lists as group=, split, subgroups (c10d's errors), translation,
non-members, destroy."""

from __future__ import annotations

import numpy as np
import pytest

import fcoll as fc
from tests.conftest import list_ranks


def test_world_and_full_group(rank, world_size):
    assert fc.is_initialized()
    assert (fc.get_rank(), fc.get_world_size()) == (rank, world_size)
    g = fc.new_group()
    assert (g.rank, g.size, g.ranks) == (rank, world_size, tuple(range(world_size)))
    assert fc.all_reduce(np.array([1]), group=g).tolist() == [world_size]
    g.destroy()


def test_new_group_members_and_non_members(rank, world_size):
    ranks = [world_size - 1, 0] if world_size > 1 else [0]
    g = fc.new_group(ranks)
    assert g.ranks == tuple(sorted(ranks))
    if rank in ranks:
        assert fc.get_rank(g) == g.ranks.index(rank) and fc.get_world_size(g) == len(set(ranks))
        total = fc.all_reduce(np.array([rank + 1]), group=g)
        assert total.tolist() == [sum(r + 1 for r in set(ranks))]
    else:
        assert fc.get_rank(g) == fc.get_world_size(g) == -1
        for call in (lambda: fc.all_reduce(np.ones(1), group=g), lambda: fc.barrier(g),
                     lambda: fc.broadcast(np.ones(1), 0, g), lambda: fc.all_gather(np.ones(1), g)):
            with pytest.raises(ValueError, match="does not contain global rank"):
                call()
    assert g.group_rank(g.ranks[-1]) == len(g.ranks) - 1
    assert g.global_rank(0) == g.ranks[0]
    fc.barrier()


def test_rank_translation_errors(world_size):
    g = fc.new_group([world_size - 1])
    assert g.group_rank(world_size - 1) == 0 and g.global_rank(0) == world_size - 1
    with pytest.raises(ValueError, match="not part of group"):
        g.group_rank(world_size)
    with pytest.raises(ValueError, match="not part of group"):
        g.global_rank(1)


def test_rank_list_groups_are_cached(rank, world_size):
    ranks = list_ranks(world_size)
    if rank in ranks:
        first = fc.all_reduce(np.array([1]), group=ranks)
        assert first.tolist() == [len(ranks)]
        assert fc.all_reduce(np.array([1]), group=list(reversed(ranks))).tolist() == [len(ranks)]
        from fcoll.groups.group import resolve_group
        assert resolve_group(ranks, "t") is resolve_group(tuple(ranks), "t")
    else:
        with pytest.raises(ValueError, match="does not contain"):
            fc.all_reduce(np.array([1]), group=ranks)
    fc.barrier()


@pytest.mark.parametrize("bad", [[-1], [0, 0], "0"])
def test_bad_rank_lists(bad, world_size):
    error = TypeError if isinstance(bad, str) else ValueError
    with pytest.raises(error):
        fc.new_group(bad)
    with pytest.raises(error):
        fc.all_reduce(np.ones(1), group=bad)
    with pytest.raises(ValueError, match="world_size"):
        fc.new_group([world_size])


@pytest.mark.smoke
def test_split(rank, world_size):
    g = fc.world().split(color=rank % 2, key=-rank)
    expected = sorted((r for r in range(world_size) if r % 2 == rank % 2), reverse=True)
    assert g.ranks == tuple(expected) and g.rank == expected.index(rank)
    got = fc.all_gather(np.array([rank]), g)
    assert [int(a[0]) for a in got] == expected
    out = fc.world().split(None if rank == 0 else 1)
    assert (out.rank == -1) == (rank == 0)
    sub = g.split(0)  # splitting a split
    assert sub.ranks == g.ranks
    with pytest.raises(ValueError, match="color"):
        g.split(-2)


@pytest.mark.smoke
def test_new_subgroups(rank, world_size):
    size = 2 if world_size % 2 == 0 else 1
    cur, groups = fc.new_subgroups(size)
    assert cur.size == size and rank in cur.ranks and len(groups) == world_size // size
    assert [g.ranks for g in groups] == [tuple(range(i, i + size)) for i in range(0, world_size, size)]
    assert fc.all_reduce(np.array([rank]), group=cur).tolist() == [sum(cur.ranks)]
    inner, inner_all = fc.new_subgroups(1, group=cur)
    assert inner.ranks == (rank,) and len(inner_all) == size
    node, _ = fc.new_subgroups()
    assert node.size == world_size  # one node here
    with pytest.raises(ValueError, match="must not exceed"):
        fc.new_subgroups(world_size + 1)
    with pytest.raises(ValueError, match="must be positive"):
        fc.new_subgroups(0)
    if world_size == 4:
        with pytest.raises(ValueError, match=r"^new_subgroups: The world size \(4\) must be "
                           r"divisible by 'group_size=3'$"):
            fc.new_subgroups(3)


def test_new_subgroups_by_enumeration(rank, world_size):
    evens, odds = list(range(0, world_size, 2)), list(range(1, world_size, 2))
    lists = [evens, odds] if odds else [evens]
    cur, groups = fc.new_subgroups_by_enumeration(lists)
    assert cur is not None and cur.ranks == tuple(evens if rank % 2 == 0 else odds)
    assert [g.ranks for g in groups] == [tuple(x) for x in lists]
    partial, _ = fc.new_subgroups_by_enumeration([[0]])
    assert (partial is None) == (rank != 0)
    with pytest.raises(ValueError, match="The new group's rank should be within the world_size"):
        fc.new_subgroups_by_enumeration([[0], [world_size]])
    with pytest.raises(ValueError, match="The new group's rank should be within the world_size"):
        fc.new_subgroups_by_enumeration([[-1]])
    with pytest.raises(ValueError, match="Rank 0 has appeared in both subgroup"):
        fc.new_subgroups_by_enumeration([[0], [0]])


def test_destroy(rank):
    g = fc.new_group()
    g.destroy()
    with pytest.raises(ValueError, match="destroyed"):
        fc.all_reduce(np.ones(1), group=g)
    with pytest.raises(ValueError, match="world group"):
        fc.world().destroy()
