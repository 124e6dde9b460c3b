"""Assertions that agree across ranks: `parallel_raises` and `parallel_assert`.

When one rank raises inside a test, the others usually block at the next collective.
These helpers first let every rank of the group say what happened (on a communicator of
their own, so a collective that timed out or was skipped on the group's own
communicator cannot get in the way), then pass or fail on every rank together, with one
message that names the ranks.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Literal

import pytest

from fcoll.groups.group import GroupArg, resolve_group
from fcoll.runtime import mpi

_SIDE: dict[tuple[int, ...], Any] = {}  # member ranks -> a private communicator


def _side_comm(ranks: tuple[int, ...]) -> Any:
    """A communicator of these global ranks that fcoll's collectives never use.

    The world one duplicates ``COMM_WORLD`` (which fcoll itself does not use); a group's
    is made from it with ``MPI_Comm_create_group``, collective over the members only.
    """
    comm = _SIDE.get(ranks)
    if comm is None:
        MPI = mpi()
        world = _SIDE.get(()) or _SIDE.setdefault((), MPI.COMM_WORLD.Dup())
        if ranks == tuple(range(world.Get_size())):
            comm = world
        else:
            comm = world.Create_group(world.Get_group().Incl(list(ranks)))
        _SIDE[ranks] = comm
    return comm


def _gather(outcome: object, group: GroupArg, fn: str) -> list[Any]:
    g = resolve_group(group, fn)
    if not g.is_member:
        raise ValueError(f"{fn}: expected this process (global rank "
                         f"{mpi().COMM_WORLD.Get_rank()}) to be in group {g.ranks}")
    return list(_side_comm(tuple(g.ranks)).allgather(outcome))


class RaisesInfo:
    """What `parallel_raises` yields: ``value`` is this rank's expected exception (None on a
    rank that did not raise); ``ranks`` the group ranks that raised it."""

    def __init__(self) -> None:
        self.value: BaseException | None = None
        self.ranks: list[int] = []


def _describe(outcomes: list[tuple[str, str]]) -> str:
    return "; ".join(f"rank {r}: {text or 'no exception'}" for r, (_, text) in enumerate(outcomes))


@contextmanager
def parallel_raises(expected: type[BaseException] | tuple[type[BaseException], ...],
                    match: str | None = None, *, on: Literal["any", "all"] = "any",
                    group: GroupArg = None) -> Iterator[RaisesInfo]:
    """Like `pytest.raises`, across the ranks of ``group``: passes on every rank when the
    block raised ``expected`` (matching ``match``, a regex searched in ``str(exc)``) on at
    least one rank (``on="any"``) or on every rank (``on="all"``), and no rank raised
    anything else; fails on every rank otherwise. Every rank of the group must enter it.

    Example:
        >>> with parallel_raises(ValueError, match="bad") as info:   # on each of 2 ranks
        ...     if fc.get_rank() == 1:
        ...         raise ValueError("bad input")
        >>> info.ranks                                               # on both ranks
        [1]
    """
    if on not in ("any", "all"):
        raise ValueError(f"parallel_raises: expected on='any' or 'all', got {on!r}")
    info, error = RaisesInfo(), None
    try:
        yield info
    except BaseException as raised:  # every exception is reported to the other ranks
        error = raised
    if error is None:
        mine = ("none", "")
    elif isinstance(error, expected) and (match is None or re.search(match, str(error))):
        mine = ("expected", f"{type(error).__name__}: {error}")
    else:
        mine = ("other", f"{type(error).__name__}: {error}")
    outcomes = _gather(mine, group, "parallel_raises")
    kinds = [kind for kind, _ in outcomes]
    info.ranks = [r for r, kind in enumerate(kinds) if kind == "expected"]
    names = (expected.__name__ if isinstance(expected, type)
             else " or ".join(e.__name__ for e in expected))
    wanted = f"{names}" + (f" matching {match!r}" if match is not None else "")
    if "other" in kinds:
        problem = f"expected {wanted} or no exception on each rank"
    elif on == "all" and len(info.ranks) != len(kinds):
        problem = f"expected {wanted} on every rank"
    elif not info.ranks:
        problem = f"expected {wanted} on at least one rank"
    else:
        info.value = error if mine[0] == "expected" else None
        return
    pytest.fail(f"parallel_raises: {problem}, got {_describe(outcomes)}", pytrace=False)


def parallel_assert(condition: object, message: str = "", *, group: GroupArg = None) -> None:
    """Fail on every rank of ``group`` when ``condition`` is false on any of them, naming
    the ranks where it was; pass on every rank otherwise. Every rank must call it.

    Example:
        >>> parallel_assert(fc.get_rank() != 1, "rank-dependent check")   # 2 ranks
        Failed: parallel_assert: rank-dependent check: false on ranks [1] of 2
    """
    flags = _gather(bool(condition), group, "parallel_assert")
    false = [r for r, ok in enumerate(flags) if not ok]
    if false:
        what = f"{message}: " if message else ""
        pytest.fail(f"parallel_assert: {what}false on ranks {false} of {len(flags)}",
                    pytrace=False)
