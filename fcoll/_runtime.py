"""Process-wide state: MPI start-up, the world group, and the settings of `fcoll.init`.

MPI is started the first time fcoll needs it, at the thread level chosen here (see
`docs/performance.md`): ``serialized`` unless ``FCOLL_MPI_THREAD_LEVEL`` says otherwise,
because ``multiple`` costs small messages 15-45 % with MPICH and fcoll never calls MPI from
two threads at once. If the program imported ``mpi4py.MPI`` first, its choice stands.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fcoll import _memory

_THREAD_LEVELS = ("single", "funneled", "serialized", "multiple")
_DEBUG_LEVELS = ("off", "info", "detail")

Timeout = float | datetime.timedelta | None


@dataclass
class _State:
    world: Any = None  # the default fcoll.group.Group, made by fcoll.group.init
    timeout: float | None = None
    debug: str = "off"
    checking: bool = False  # debug != "off": collectives call fcoll._debug.checked


_state = _State()


def mpi() -> Any:
    """Return the ``mpi4py.MPI`` module, starting MPI at fcoll's thread level if needed."""
    module = sys.modules.get("mpi4py.MPI")
    if module is not None:
        return module
    import mpi4py

    level = os.environ.get("FCOLL_MPI_THREAD_LEVEL", "serialized").lower()
    if level not in _THREAD_LEVELS:
        raise ValueError(
            f"FCOLL_MPI_THREAD_LEVEL: expected one of {_THREAD_LEVELS}, got {level!r}"
        )
    mpi4py.rc.thread_level = level
    _memory.keep_freed_pages()
    _yield_when_oversubscribed()
    from mpi4py import MPI

    return MPI


# MPICH's shared-memory algorithms for these collectives spin without yielding below
# THREAD_MULTIPLE: with more ranks than cores, one 1 MiB all_reduce took seconds instead
# of milliseconds here (docs/performance.md). Its generic algorithms do not.
_MPICH_SPINNING = ("MPIR_CVAR_ALLREDUCE_POSIX_INTRA_ALGORITHM",
                   "MPIR_CVAR_REDUCE_POSIX_INTRA_ALGORITHM",
                   "MPIR_CVAR_BCAST_POSIX_INTRA_ALGORITHM")
# Open MPI yields only when its launcher knows the node is oversubscribed (--oversubscribe);
# given more slots than cores (a hostfile's slots=4 on 2 cores) it spins: an 8-byte
# all_reduce on 4 ranks took 5.6 ms per call instead of 20 us with this set.
_OPEN_MPI_YIELD = "OMPI_MCA_mpi_yield_when_idle"


# More ranks than cores on this node (set before MPI starts): fcoll's own polling loops
# then yield the core between polls (fcoll.work.backoff).
OVERSUBSCRIBED = False


def _yield_when_oversubscribed() -> None:
    """Make waiting ranks yield their core when this node runs more ranks than cores.

    Sets MPICH's non-spinning algorithms and throttled progress polling, and Open MPI's
    ``mpi_yield_when_idle`` (each library ignores the other's variables), unless the user
    set them. Runs before MPI starts, since both libraries read their settings from the
    environment at start-up.
    """
    local = os.environ.get("MPI_LOCALNRANKS") or os.environ.get("OMPI_COMM_WORLD_LOCAL_SIZE")
    if local is None or not local.isdigit():
        return
    if int(local) > _node_cpus():
        global OVERSUBSCRIBED
        OVERSUBSCRIBED = True
        for name in _MPICH_SPINNING:
            os.environ.setdefault(name, "mpir")
        # usleep(1) after 4096 idle polls: lets the rank that holds the data run. The test
        # suite at n=4 on 2 cores: 31 -> 25 s with -bind-to core (bench/oversubscription.py).
        os.environ.setdefault("MPIR_CVAR_CH4_PROGRESS_THROTTLE", "1")
        os.environ.setdefault(_OPEN_MPI_YIELD, "1")


def _node_cpus() -> int:
    """How many CPUs this node's ranks share: this process's affinity joined with its launcher's.

    Open MPI binds each rank to a core of its own when there are enough, so a rank alone
    would see one CPU; the launcher (its parent process) still has the whole set.
    """
    cpus = os.sched_getaffinity(0)
    with contextlib.suppress(OSError):
        cpus |= os.sched_getaffinity(os.getppid())
    return len(cpus)


def to_seconds(timeout: Timeout, name: str = "timeout") -> float | None:
    """Normalise a timeout given as seconds or `datetime.timedelta` to float seconds."""
    if timeout is None:
        return None
    if isinstance(timeout, datetime.timedelta):
        seconds = timeout.total_seconds()
    elif isinstance(timeout, (int, float)) and not isinstance(timeout, bool):
        seconds = float(timeout)
    else:
        raise TypeError(
            f"{name}: expected seconds (float) or datetime.timedelta, "
            f"got {type(timeout).__name__}"
        )
    if not seconds > 0:
        raise ValueError(f"{name}: expected a positive duration, got {seconds} s")
    return seconds


def _debug_level(debug: str | None) -> str:
    name = "init: expected debug" if debug is not None else "FCOLL_DEBUG: expected"
    value = debug if debug is not None else os.environ.get("FCOLL_DEBUG", "off")
    if not isinstance(value, str) or value.lower() not in _DEBUG_LEVELS:
        raise ValueError(f"{name} one of {_DEBUG_LEVELS} (any case), got {value!r}")
    return value.lower()


def configure(timeout: Timeout, debug: str | None) -> None:
    """Apply `fcoll.init`'s settings: a given value replaces the current one; the debug
    level falls back to ``FCOLL_DEBUG``. Tells the caches that depend on them (`changed`)."""
    seconds = to_seconds(timeout)
    level = _debug_level(debug)
    if timeout is not None or _state.timeout is None:
        _state.timeout = seconds
    if debug is not None or "FCOLL_DEBUG" in os.environ:
        _state.debug = level
    _state.checking = _state.debug != "off"
    changed()  # e.g. the fast paths assume no deadline and no debug checks


def abort(code: int = 1) -> None:
    """End the whole job now (``MPI_Abort`` on every process), e.g. after a timeout.

    Example:
        >>> try:
        ...     fc.all_reduce(x)
        ... except fc.CollectiveTimeoutError:
        ...     fc.abort(3)           # mpiexec exits non-zero, every rank stops
    """
    mpi().COMM_WORLD.Abort(code)


def settings() -> _State:
    """The live settings (default timeout, debug level)."""
    return _state


# Called by `changed`: caches above this layer that depend on the settings or on a group's
# health (the default group's fast paths, fcoll.collectives._fast) subscribe here, so that
# nothing below them imports them to reset them.
_LISTENERS: list[Callable[[], None]] = []


def on_change(listener: Callable[[], None]) -> None:
    """Call ``listener()`` whenever the settings change or a group breaks (see `changed`)."""
    _LISTENERS.append(listener)


def changed() -> None:
    """The settings changed (`fcoll.init`) or a group became unusable: drop dependent caches."""
    for listener in _LISTENERS:
        listener()
