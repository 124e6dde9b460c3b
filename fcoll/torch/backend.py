"""fcoll as a torch.distributed backend: `ProcessGroupFcoll` and its creator.

``import fcoll.torch`` registers the backend ``"fcoll"`` (`fcoll.torch.plugin`); torch then
calls `create` for every group it makes with that backend (``init_process_group``,
``new_group``, ``new_subgroups``, DeviceMesh), on the group's members only. Each torch group
is an fcoll `fcoll.Group`: the default one is fcoll's world group (or a duplicate of it with
its own deadline), a subgroup is ``fcoll.new_group`` of its global ranks, so its traffic
never mixes with another's. The process group is a Python subclass of torch's
``ProcessGroup`` (torch's C++ ``Backend`` cannot be subclassed from Python); its methods
are in `fcoll.torch._collectives` and `fcoll.torch._coalesced`.

A synchronous call (torch's ``async_op=False``) runs in the calling thread; what torch
starts asynchronously (``async_op=True``, DDP's buckets, FSDP) is queued on fcoll's engine
thread and runs in issue order while the caller computes (`fcoll.torch.work.issue`,
`fcoll.calls.engine`). A group's ``timeout`` (``init_process_group``/``new_group``)
becomes the fcoll group's deadline, except torch's default of 30 minutes, which leaves
fcoll's own default (no deadline; the stall report after ``FCOLL_STALL_WARN`` seconds); a
call past it raises torch's ``DistBackendError`` saying "Timed out" (`fcoll.torch.work.torch_error`).

Example:
    >>> import fcoll.torch, torch, torch.distributed as dist    # under mpiexec -n 2
    >>> dist.init_process_group("fcoll")
    >>> t = torch.tensor([dist.get_rank() + 1.0]); dist.all_reduce(t)
    >>> t                                                       # on both ranks
    tensor([3.])
"""

from __future__ import annotations

import datetime
from typing import Any

import torch.distributed as dist
from torch.distributed.constants import default_pg_timeout

from fcoll.groups.group import Group, new_group
from fcoll.groups.group import world as world_group
from fcoll.torch._coalesced import Coalesced
from fcoll.torch._collectives import Collectives

NAME = "fcoll"

# torch.distributed.ProcessGroup as a base class: torch's stubs make its methods'
# signatures clash with a Python subclass's, so mypy sees it as Any.
_ProcessGroup: Any = dist.ProcessGroup


class ProcessGroupFcoll(Collectives, Coalesced, _ProcessGroup):  # type: ignore[misc]
    """A torch process group whose collectives are fcoll's on ``fcoll_group``.

    Made by torch through `create`; use it through ``torch.distributed``'s functions. The
    fcoll group is at hand as ``fcoll_group`` (for fcoll's own functions on the same ranks).

    Example:
        >>> pg = dist.new_group([0, 1], backend="fcoll")     # every rank
        >>> pg.fcoll_group.ranks                             # on ranks 0 and 1
        (0, 1)
    """

    # torch asks a group for its backend per device (torch 2.14's batch_isend_irecv reads
    # ``supports_coalescing`` from it and does not catch the RuntimeError a Python group's
    # base method raises): this group is its own backend on every device, without torch's
    # coalescing or splitting.
    supports_coalescing = False
    supports_splitting = False

    def __init__(self, group: Group, owned: bool) -> None:
        super().__init__(group.rank, group.size)
        self.fcoll_group = group
        self._owned = owned  # made for this process group: destroyed with it
        self._name = ""
        self._desc = ""

    def _get_backend(self, device: Any) -> Any:
        """This group: its own backend for ``device`` (see ``supports_coalescing``)."""
        return self

    def getBackendName(self) -> str:
        """``"fcoll"`` (torch's ``pg.name()``, ``dist.get_backend``).

        Example:
            >>> dist.group.WORLD.name()
            'fcoll'
        """
        return NAME

    # The name and description accessors below are four of torch's ProcessGroup methods
    # (a getter and a setter each), alike on purpose: torch calls each by its own name.
    def getGroupName(self) -> str:
        """The name torch gave the group (functional collectives find it by this name).

        Example:
            >>> dist.group.WORLD.group_name
            '0'
        """
        return self._name

    def setGroupName(self, name: str) -> None:
        """Called by torch when it registers the group.

        Example:
            >>> pg._set_group_name("0")          # torch does this in new_group
        """
        self._name = name

    def getGroupDesc(self) -> str:
        """The description torch gave the group.

        Example:
            >>> dist.group.WORLD.group_desc
            'default_pg'
        """
        return self._desc

    def setGroupDesc(self, desc: str) -> None:
        """Called by torch when it registers the group.

        Example:
            >>> pg._set_group_desc("default_pg")  # torch does this in new_group
        """
        self._desc = desc

    def shutdown(self) -> None:
        """Free the fcoll group (torch's ``destroy_process_group``); fcoll's world group stays.

        Example:
            >>> g = dist.new_group([0, 1]); dist.destroy_process_group(g)   # calls shutdown
            >>> g.fcoll_group.usable                                         # on ranks 0, 1
            False
        """
        if self._owned and self.fcoll_group.is_member and self.fcoll_group.usable:
            self.fcoll_group.destroy()
        self._owned = False

    def abort(self) -> None:
        """As `shutdown`: fcoll has no communicator to tear down without its peers.

        Example:
            >>> pg.abort()
        """
        self.shutdown()

    def __repr__(self) -> str:
        return f"ProcessGroupFcoll(ranks={list(self.fcoll_group.ranks)}, rank={self.fcoll_group.rank})"


def deadline(timeout: object) -> float | None:
    """The fcoll deadline (seconds) of torch's group ``timeout``: None for torch's default
    (30 minutes) or none given.

    Example:
        >>> deadline(datetime.timedelta(seconds=20)), deadline(default_pg_timeout)
        (20.0, None)
    """
    if timeout is None or timeout == default_pg_timeout:
        return None
    if not isinstance(timeout, datetime.timedelta):
        raise TypeError(f"init_process_group: expected timeout to be a datetime.timedelta, "
                        f"got {type(timeout).__name__}")
    seconds = timeout.total_seconds()
    return seconds if seconds > 0 else None


def _world(seconds: float | None, opts: Any) -> tuple[Group, bool]:
    """The fcoll group of torch's default group, checked against torch's rank and size."""
    world = world_group()
    if opts.group_size != world.size or opts.group_rank != world.rank:
        raise RuntimeError(
            f"init_process_group: backend 'fcoll' takes rank and world size from MPI "
            f"(rank {world.rank} of {world.size}), but torch was given rank {opts.group_rank} of "
            f"{opts.group_size} (RANK, WORLD_SIZE or the arguments); launch every process with "
            f"mpiexec -n {opts.group_size} (or srun), which sets both alike, or leave RANK and "
            "WORLD_SIZE unset")
    if seconds is None:
        return world, False
    return new_group(timeout=seconds), True


def create(opts: Any, pg_options: Any = None) -> ProcessGroupFcoll:
    """The creator torch calls (``Backend.register_backend(..., extended_api=True)``) with
    its ``_DistributedBackendOptions``: the group's global ranks (empty for the default
    group), this rank and the size, the timeout. Runs on the group's members only.

    Example:
        >>> dist.new_group([1, 3], backend="fcoll")   # torch calls create on ranks 1 and 3
    """
    if pg_options is not None:
        raise TypeError(f"backend 'fcoll': expected pg_options=None, got "
                        f"{type(pg_options).__name__}; fcoll takes its settings from fcoll.init "
                        "and FCOLL_* variables")
    seconds = deadline(opts.timeout)
    ranks = list(opts.global_ranks_in_group)
    if not ranks:
        group, owned = _world(seconds, opts)
    else:
        group, owned = new_group(ranks, timeout=seconds), True
        if group.rank != opts.group_rank:
            raise RuntimeError(f"new_group: torch gives this process rank {opts.group_rank} in "
                               f"group {ranks}, fcoll rank {group.rank}")
    return ProcessGroupFcoll(group, owned)


# torch's own dist.monitored_barrier (before `fcoll.torch.plugin.register` puts
# `monitored_barrier` in its place): it accepts only gloo's groups.
_TORCH_MONITORED_BARRIER = dist.distributed_c10d.monitored_barrier


def monitored_barrier(group: Any = None, timeout: datetime.timedelta | float | None = None,
                      wait_all_ranks: bool = False) -> None:
    """``dist.monitored_barrier`` that also takes "fcoll" groups (torch's own takes only
    gloo's, by name; ``import fcoll.torch`` puts this one in its place, and it hands other
    groups to torch's): a barrier that raises on group rank 0, naming the ranks that did
    not arrive within ``timeout``, in gloo's words. A process outside ``group`` returns.

    Example:
        >>> dist.monitored_barrier(timeout=datetime.timedelta(seconds=10))  # every rank
    """
    dc = dist.distributed_c10d
    if group is not None and dc._rank_not_in_group(group):
        _TORCH_MONITORED_BARRIER(group, timeout, wait_all_ranks=wait_all_ranks)  # warns
        return
    pg = group if group is not None else dc._get_default_group()
    if not isinstance(pg, ProcessGroupFcoll):
        _TORCH_MONITORED_BARRIER(group, timeout, wait_all_ranks=wait_all_ranks)
        return
    if isinstance(timeout, (int, float)):
        timeout = datetime.timedelta(seconds=timeout)
    pg.monitored_barrier(timeout, wait_all_ranks)
