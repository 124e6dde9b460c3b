"""Many groups at once: `new_subgroups` and `new_subgroups_by_enumeration` (as in c10d)."""

from __future__ import annotations

from collections.abc import Sequence

from fcoll import runtime
from fcoll.groups.group import Group, GroupArg, resolve_group, world


def _split_into(parent: Group, blocks: list[tuple[int, ...]], fn: str) -> Group | None:
    """Groups of ``blocks`` (global ranks); collective over ``parent``. Returns this
    process's group, or ``None`` when it is in no block."""
    comm = parent.comm(fn)
    me = world().rank
    for color, block in enumerate(blocks):
        if me in block:
            return Group(comm.Split(color, block.index(me)), block, parent.timeout)
    comm.Split(runtime.mpi().UNDEFINED, 0)
    return None


def _groups(blocks: list[tuple[int, ...]], mine: Group | None) -> list[Group]:
    return [
        mine if mine is not None and mine.ranks == block else Group(None, block)
        for block in blocks
    ]


def new_subgroups(
    group_size: int | None = None, group: GroupArg = None
) -> tuple[Group, list[Group]]:
    """Split ``group`` (the job when ``None``) into consecutive blocks of ``group_size``.

    ``group_size=None`` takes the number of processes on this node. Collective over
    ``group``. Returns ``(my_group, all_groups)``.

    Example:
        >>> cur, groups = fc.new_subgroups(2)     # mpiexec -n 4, on rank 3
        >>> cur.ranks, [g.ranks for g in groups]
        ((2, 3), [(0, 1), (2, 3)])
    """
    parent = resolve_group(group, "new_subgroups")
    comm = parent.comm("new_subgroups")
    if group_size is None:
        group_size = comm.Split_type(runtime.mpi().COMM_TYPE_SHARED).Get_size()
    if not isinstance(group_size, int) or isinstance(group_size, bool):
        raise TypeError(f"new_subgroups: expected group_size to be an int, got {group_size!r}")
    size = parent.size
    if group_size <= 0:
        raise ValueError(f"new_subgroups: The arg 'group_size' ({group_size}) must be positive")
    if group_size > size:
        raise ValueError(f"new_subgroups: The arg 'group_size' ({group_size}) must not exceed "
                         f"the world size ({size})")
    if size % group_size != 0:
        raise ValueError(f"new_subgroups: The world size ({size}) must be divisible by "
                         f"'group_size={group_size}'")
    blocks = [parent.ranks[i : i + group_size] for i in range(0, size, group_size)]
    mine = _split_into(parent, blocks, "new_subgroups")
    assert mine is not None
    return mine, _groups(blocks, mine)


def _check_enumeration(ranks_per_subgroup_list: object, world_size: int) -> list[tuple[int, ...]]:
    fn = "new_subgroups_by_enumeration"
    if not isinstance(ranks_per_subgroup_list, Sequence) or not all(
        isinstance(b, Sequence) and all(isinstance(r, int) for r in b)
        for b in ranks_per_subgroup_list
    ):
        raise TypeError(f"{fn}: expected a list of lists of ints, got {ranks_per_subgroup_list!r}")
    if not ranks_per_subgroup_list:
        raise ValueError(f"{fn}: expected a non-empty list of subgroups, got []")
    seen: dict[int, int] = {}
    for index, block in enumerate(ranks_per_subgroup_list):
        for rank in block:
            if not 0 <= rank < world_size:
                raise ValueError(f"{fn}: The new group's rank should be within the world_size "
                                 f"set by init_process_group (expected 0 <= rank < "
                                 f"{world_size}, got {rank})")
            if rank in seen:
                raise ValueError(f"{fn}: Rank {rank} has appeared in both subgroup "
                                 f"{list(ranks_per_subgroup_list[seen[rank]])} and "
                                 f"{list(block)}")
            seen[rank] = index
    return [tuple(sorted(b)) for b in ranks_per_subgroup_list]


def new_subgroups_by_enumeration(
    ranks_per_subgroup_list: Sequence[Sequence[int]],
) -> tuple[Group | None, list[Group]]:
    """One group per list of global ranks; every process of the job calls it.

    Returns ``(my_group or None, all_groups)``; a process in no list gets ``None``.

    Example:
        >>> cur, groups = fc.new_subgroups_by_enumeration([[0, 2], [1, 3]])  # on rank 2
        >>> cur.ranks
        (0, 2)
    """
    everyone = world()
    blocks = _check_enumeration(ranks_per_subgroup_list, everyone.size)
    mine = _split_into(everyone, blocks, "new_subgroups_by_enumeration")
    return mine, _groups(blocks, mine)
