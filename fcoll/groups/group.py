"""Groups of processes: `Group`, `new_group`, subgroups, and `resolve_group`.

A `Group` owns its own MPI communicator, so traffic on one group never matches messages
of another. `resolve_group` is the one place that turns a ``group=`` argument into a
`Group`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fcoll import runtime
from fcoll.backends import native
from fcoll.calls import notices
from fcoll.calls.work import Call
from fcoll.diagnostics import flight_report, watch
from fcoll.groups.active_meshes import axis_group, mesh_stack
from fcoll.runtime import Timeout, to_seconds

_SERIAL = [0]  # groups made by this process, as agreed with their members


def _agreed_serial(comm: Any) -> int:
    """A number for a new group, the same on each of its members (collective over ``comm``,
    which every member is creating at this moment)."""
    serial = int(comm.allreduce(_SERIAL[0], op=runtime.mpi().MAX))
    _SERIAL[0] = serial + 1
    return serial


class Group:
    """A set of processes that run collectives together.

    ``ranks[i]`` is the global rank of group rank ``i``. On a process outside the group,
    ``rank`` and ``size`` are ``-1`` while ``ranks`` and rank translation still work, and
    every collective on the group raises `ValueError`.

    Example:
        >>> g = fc.new_group([0, 2])          # every rank calls it; under mpiexec -n 4
        >>> (g.rank, g.size, g.ranks)         # on global rank 2
        (1, 2, (0, 2))
        >>> (g.rank, g.size)                  # on global rank 1
        (-1, -1)
    """

    def __init__(self, comm: Any, ranks: Sequence[int], timeout: float | None = None) -> None:
        self._comm = comm
        self._ranks = tuple(int(r) for r in ranks)
        self._rank = comm.Get_rank() if comm is not None else -1
        self._size = len(self._ranks) if comm is not None else -1
        self._destroyed = False
        self.usable = comm is not None  # member, not destroyed, not broken
        self.timeout = timeout
        self.plans: dict[Any, Any] = {}  # per-(op, dtype) reduction plans of fcoll.collectives
        self.pending: list[Any] = []  # operations in flight (fcoll.calls.work.Operation), oldest first
        self.seq = 0  # calls made on the group by this process
        self.broken: str | None = None  # why the group is unusable (a missed deadline)
        self.monitor_epoch = 0  # monitored_barrier calls made on the group
        # the public call in progress (refreshed by `fcoll.groups.membership.member`)
        self.call = Call(self, comm)
        # The flight recorder's name for the group, equal on its members: (ranks, an agreed serial).
        self.key = (self._ranks, _agreed_serial(comm) if comm is not None else -1)
        if comm is not None:
            watch.track(self)  # its call numbers, for the stall watch and the node board
        self.nccl: Any = None  # the NCCL communicator, made on the first GPU call (fcoll.backends.nccl)
        self.nccl_device = -1  # the GPU it was made on
        self.gpu_shared: list[list[int]] | None = None  # ranks sharing a GPU (None: not asked yet)
        self.side_comm: Any = None  # a Dup for tagged point-to-point steps (collectives.nonblocking)
        # The shared-memory segment (fcoll.backends.shm): None until the first call that
        # could use it, then the segment, or False when the group spans nodes.
        self.shm: Any = None
        # Its split into nodes (fcoll.backends.nodes): None until the first call that could
        # use it, then the Hierarchy, or False (one node, or a layout that does not allow one).
        self.nodes: Any = None

    @property
    def rank(self) -> int:
        """This process's rank in the group, or -1 when it is not a member."""
        return self._rank

    @property
    def size(self) -> int:
        """The number of processes in the group, or -1 on a non-member."""
        return self._size

    @property
    def ranks(self) -> tuple[int, ...]:
        """The global ranks of the members, in group-rank order."""
        return self._ranks

    @property
    def is_member(self) -> bool:
        """Whether this process belongs to the group."""
        return self._comm is not None

    def comm(self, fn: str) -> Any:
        """The group's own mpi4py communicator (for interop with mpi4py code).

        Raises `ValueError`, naming the calling function ``fn``, if the group was
        destroyed or this process is not a member.

        Example:
            >>> comm = fc.world().comm("my_code")      # an mpi4py.MPI.Intracomm
            >>> comm.allreduce(fc.get_rank())          # ranks 0 and 1 hold 0 and 1; both get
            1
        """
        if self._destroyed:
            raise ValueError(f"{fn}: expected a live group, got {self!r}, which was destroyed")
        if self.broken is not None:
            raise RuntimeError(f"{fn}: group {list(self._ranks)} is unusable: {self.broken}; "
                               "fcoll.abort() ends the job")
        if self._comm is None:
            me = world().rank
            raise ValueError(
                f"{fn}: expected a group this process belongs to, got {self!r}, "
                f"which does not contain global rank {me}"
            )
        return self._comm

    def group_rank(self, global_rank: int) -> int:
        """The group rank of ``global_rank``; `ValueError` if it is not part of the group.

        Example:
            >>> g = fc.new_group([1, 3])       # mpiexec -n 4; the same on every rank
            >>> g.group_rank(3)
            1
        """
        try:
            return self._ranks.index(global_rank)
        except ValueError:
            raise ValueError(
                f"group_rank: global rank {global_rank} is not part of group {list(self._ranks)}"
            ) from None

    def global_rank(self, group_rank: int) -> int:
        """The global rank of ``group_rank``; `ValueError` if it is not part of the group.

        Example:
            >>> g = fc.new_group([1, 3])       # mpiexec -n 4; the same on every rank
            >>> g.global_rank(0)
            1
        """
        if not isinstance(group_rank, int) or not 0 <= group_rank < len(self._ranks):
            raise ValueError(
                f"global_rank: group rank {group_rank!r} is not part of group "
                f"{list(self._ranks)} (expected 0 <= rank < {len(self._ranks)})"
            )
        return self._ranks[group_rank]

    @classmethod
    def from_comm(cls, comm: Any, *, timeout: Timeout = None) -> Group:
        """A `Group` over a duplicate of an existing communicator: an ``mpi4py.MPI.Intracomm``
        or an object with ``tompi4py()`` (petsc4py's). Collective over ``comm``; fcoll's
        traffic never mixes with the application's own on ``comm``; deadlines, debug checks
        and the flight recorder apply.

        Example:
            >>> g = fc.Group.from_comm(PETSc.COMM_WORLD)     # every rank of the communicator
            >>> g.ranks, fc.all_reduce(np.ones(1), group=g)  # mpiexec -n 2
            ((0, 1), array([2.]))
        """
        MPI, _ = runtime.mpi(), world()  # fcoll started: global ranks are COMM_WORLD's
        if not isinstance(comm, MPI.Comm) and callable(getattr(comm, "tompi4py", None)):
            comm = comm.tompi4py()
        if not isinstance(comm, MPI.Intracomm) or comm == MPI.COMM_NULL:
            raise TypeError(f"from_comm: expected an mpi4py.MPI.Intracomm or an object with "
                            f"tompi4py(), got {type(comm).__name__}")
        mine, everyone = comm.Get_group(), MPI.COMM_WORLD.Get_group()
        ranks = MPI.Group.Translate_ranks(mine, list(range(comm.Get_size())), everyone)
        mine.Free(), everyone.Free()
        if MPI.UNDEFINED in ranks:
            raise ValueError(f"from_comm: expected processes of this job's COMM_WORLD, got {ranks}")
        return cls(comm.Dup(), ranks, to_seconds(timeout))

    def split(self, color: int | None, key: int | None = None) -> Group:
        """Split into groups of the members that pass the same ``color`` (``MPI_Comm_split``).

        Collective over this group. Members are ordered by ``key`` (default: their rank
        here), ties by their rank here. ``color=None`` gives a group this process is not in.

        Example:
            >>> g = fc.world().split(color=fc.get_rank() % 2)   # mpiexec -n 4
            >>> g.ranks                                        # on ranks 1 and 3
            (1, 3)
        """
        comm = self.comm("split")
        if color is not None and (not isinstance(color, int) or color < 0):
            raise ValueError(f"split: expected color to be a non-negative int or None, "
                             f"got {color!r}")
        if key is not None and not isinstance(key, int):
            raise TypeError(f"split: expected key to be an int or None, got {key!r}")
        order = key if key is not None else self._rank
        entries = comm.allgather((color, order, self._rank))
        if color is None:
            comm.Split(runtime.mpi().UNDEFINED, 0)
            return Group(None, (), self.timeout)
        mine = sorted((o, r) for c, o, r in entries if c == color)
        new = comm.Split(color, order)
        return Group(new, [self._ranks[r] for _, r in mine], self.timeout)

    def destroy(self) -> None:
        """Free the group's communicator; later use of the group raises `ValueError`.

        Example:
            >>> g = fc.new_group([0, 1])       # every rank
            >>> g.destroy()
            >>> fc.barrier(group=g)            # on ranks 0 and 1
            Traceback (most recent call last):
            ValueError: barrier: expected a live group, got Group(ranks=[0, 1], rank=0, destroyed), ...
        """
        if self is runtime._state.world:
            raise ValueError("destroy: expected a group other than the world group")
        if self.nccl is not None:  # the NCCL communicator (cupy's object) frees itself
            self.nccl.destroy()
            self.nccl = None
        if self._comm is not None and not self._destroyed:
            if self.shm and self.broken is None:  # freeing is collective: not after a timeout
                self.shm.free()
            if self.nodes and self.broken is None:
                self.nodes.free()
            self.shm = self.nodes = False
            if self.side_comm is not None:
                self.side_comm.Free()
            self._comm.Free()
        self._destroyed = True
        self.usable = False
        if _LIST_GROUPS.get(self._ranks) is self:
            del _LIST_GROUPS[self._ranks]
        runtime.changed()  # fast paths learned for this group go

    def __repr__(self) -> str:
        state = ", destroyed" if self._destroyed else ""
        return f"Group(ranks={list(self._ranks)}, rank={self._rank}{state})"


_LIST_GROUPS: dict[tuple[int, ...], Group] = {}


# What every public function accepts as its ``group`` argument (`resolve_group`): a
# `Group`, a list of global ranks (a group made on first use, then cached), None for the
# whole job, or, inside ``with mesh:``, mesh axis names.
GroupArg = Group | Sequence[int] | str | None


def init(*, timeout: Timeout = None, debug: str | None = None) -> None:
    """Start fcoll: MPI (if not started) and the world group. Idempotent.

    Calling it is optional: the first collective calls it. Works under ``mpiexec -n N``
    and as a plain ``python script.py`` (world size 1).

    Args:
        timeout: default deadline (seconds or `datetime.timedelta`) for blocking calls;
            ``None`` waits forever. Later calls to `init` update it; ``None`` there keeps
            it (`init` is idempotent), ``math.inf`` clears it.
        debug: ``"off"``, ``"info"`` or ``"detail"``; default from ``FCOLL_DEBUG``.

    Example:
        >>> import fcoll as fc
        >>> fc.init(timeout=60)        # every rank
        >>> fc.get_world_size()        # under mpiexec -n 4, on every rank
        4
    """
    state = runtime.settings()
    if state.world is None:
        to_seconds(timeout)  # bad arguments raise before MPI starts
        runtime._debug_level(debug)
        MPI = runtime.mpi()
        runtime.check_launcher(MPI)  # a launcher of another MPI: every rank alone
        state.world = Group(MPI.COMM_WORLD.Dup(), tuple(range(MPI.COMM_WORLD.size)))
        flight_report.start(MPI.COMM_WORLD)  # the flight recorder's own communicator
        notices.start(MPI.COMM_WORLD)  # a rank that gives up at a deadline tells its peers
        watch.start(MPI.COMM_WORLD)  # the stall watch and the node board (fcoll.diagnostics.watch)
        native.agree(state.world._comm)  # the compiled shared-memory core: every rank or none
    runtime.configure(timeout, debug)


def is_initialized() -> bool:
    """Whether `init` has run (explicitly or through a first collective).

    Example:
        >>> fc.is_initialized()               # every rank, before any call
        False
        >>> fc.barrier(); fc.is_initialized()
        True
    """
    return runtime._state.world is not None


def world() -> Group:
    """The default group: every process of the job (fcoll's own duplicate of COMM_WORLD).

    Example:
        >>> fc.world().size    # under mpiexec -n 4
        4
    """
    state = runtime.settings()
    if state.world is None:
        init()
    world: Group = state.world
    return world


def _check_ranks(ranks: object, fn: str, world_size: int) -> tuple[int, ...]:
    if isinstance(ranks, (str, bytes)) or not isinstance(ranks, Sequence):
        raise TypeError(f"{fn}: expected ranks to be a list of ints, got {type(ranks).__name__}")
    if not all(isinstance(r, int) and not isinstance(r, bool) for r in ranks):
        raise TypeError(f"{fn}: expected ranks to be a list of ints, got {list(ranks)!r}")
    bad = [r for r in ranks if not 0 <= r < world_size]
    if bad:
        raise ValueError(f"{fn}: expected ranks in [0, {world_size}), got {bad}; The new "
                         "group's rank should be within the world_size set by init")
    if len(set(ranks)) != len(ranks):
        raise ValueError(f"{fn}: expected distinct ranks, got {list(ranks)}")
    return tuple(sorted(ranks))


def _create(ranks: tuple[int, ...], timeout: float | None) -> Group:
    """A group of ``ranks``; collective over those ranks only (``MPI_Comm_create_group``)."""
    everyone = world()
    if everyone.rank not in ranks:
        return Group(None, ranks, timeout)
    parent = everyone.comm("new_group")
    mpi_group = parent.Get_group().Incl(list(ranks))
    try:
        return Group(parent.Create_group(mpi_group), ranks, timeout)
    finally:
        mpi_group.Free()


def new_group(ranks: Sequence[int] | None = None, *, timeout: Timeout = None) -> Group:
    """A group of the given global ranks (all of them when ``None``), sorted, as in c10d.

    Every process of the job calls it, members or not.

    Example:
        >>> g = fc.new_group([1, 3])     # on every rank
        >>> fc.get_rank(g)               # on rank 3: 1; on rank 0: -1
        1
    """
    everyone = world()
    seconds = to_seconds(timeout)
    if ranks is None:
        return Group(everyone.comm("new_group").Dup(), everyone.ranks, seconds)
    return _create(_check_ranks(ranks, "new_group", everyone.size), seconds)


def resolve_group(group: object, fn: str) -> Group:
    """Turn a ``group=`` argument (None, `Group`, list of global ranks, or mesh axis
    name(s) inside ``with mesh:``) into a `Group`."""
    if group is None:
        return world()
    if isinstance(group, Group):
        return group
    names = isinstance(group, str) or (isinstance(group, tuple) and group
                                       and all(isinstance(name, str) for name in group))
    if names and mesh_stack():  # mesh axis names, inside `with mesh:`
        found: Group = axis_group(group, fn)  # type: ignore[arg-type]
        return found
    if isinstance(group, (list, tuple)):
        key = _check_ranks(group, fn, world().size)
        cached = _LIST_GROUPS.get(key)
        if cached is None:
            cached = _LIST_GROUPS[key] = _create(key, None)
        return cached
    raise TypeError(f"{fn}: expected group to be None, a fcoll.Group, a list of ranks or "
                    f"(inside `with fc.Mesh(...)`) mesh axis names, got {type(group).__name__}")


def get_rank(group: GroupArg = None) -> int:
    """This process's rank in ``group`` (the job when ``None``); -1 on a non-member.

    Example:
        >>> fc.get_rank()        # on the third process of mpiexec -n 4
        2
    """
    return resolve_group(group, "get_rank").rank


def get_world_size(group: GroupArg = None) -> int:
    """The number of processes in ``group`` (the job when ``None``); -1 on a non-member.

    Example:
        >>> fc.get_world_size()  # under mpiexec -n 4
        4
    """
    return resolve_group(group, "get_world_size").size
