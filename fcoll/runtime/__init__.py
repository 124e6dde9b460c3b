"""Process-wide state: MPI start-up, the world group, and the settings of `fcoll.init`.

MPI is started the first time fcoll needs it, at the thread level chosen here (see
`docs/performance.md`): ``serialized`` unless ``FCOLL_MPI_THREAD_LEVEL`` says otherwise,
because ``multiple`` costs small messages 15-45 % with MPICH and fcoll never calls MPI from
two threads at once. If the program imported ``mpi4py.MPI`` first, its choice stands; the
malloc tuning is applied anyway, and what could not take effect is warned about when it
matters (`fcoll.runtime.mpi_settings`). `init` checks that the launcher and the MPI library agree
(`fcoll.runtime.launcher`).
"""

from __future__ import annotations

import contextlib
import datetime
import math
import os
import sys
import threading
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fcoll.runtime import launcher, memory, mpi_settings

_THREAD_LEVELS = mpi_settings.THREAD_LEVELS
_DEBUG_LEVELS = ("off", "info", "detail")

Timeout = float | datetime.timedelta | None


@dataclass
class _State:
    world: Any = None  # the default fcoll.groups.group.Group, made by fcoll.groups.group.init
    timeout: float | None = None
    debug: str = "off"
    checking: bool = False  # debug != "off": collectives call fcoll.groups.detail.checked
    # Run before every eager call while work issued earlier may still be running on another
    # thread: jitted JAX functions' collectives (fcoll.xla.order.wait_for_jitted), the
    # torch backend's engine (fcoll.calls.engine). None: no such wait. Set through
    # add_before_call / remove_before_call, which compose several.
    before_call: Callable[[], None] | None = None
    counting: bool = False  # fcoll.debug.traffic is open: no fast paths (fcoll.calls.traffic)


_state = _State()


_MPI: Any = None  # mpi4py.MPI once fcoll has seen MPI started (by itself or the program)


@dataclass(frozen=True)
class Startup:
    """How MPI was started, for ``python -m fcoll info``."""

    by_fcoll: bool  # False: the program imported mpi4py.MPI first
    requested: str  # the thread level fcoll asks for (or would have asked for)
    late: tuple[mpi_settings.Late, ...] = ()  # what could not take effect (mpi4py.MPI first)


_startup_facts: Startup | None = None


def mpi() -> Any:
    """Return the ``mpi4py.MPI`` module, starting MPI at fcoll's thread level if needed.

    Called on hot paths: after the first call it only returns the cached module.
    """
    return _MPI if _MPI is not None else _start_mpi()


def _start_mpi() -> Any:
    """Start MPI the way fcoll wants, or, if the program already did, apply what still can
    take effect and warn once about what cannot (`mpi_settings.late_settings`)."""
    global _MPI, _startup_facts
    level = os.environ.get("FCOLL_MPI_THREAD_LEVEL", mpi_settings.DEFAULT_THREAD_LEVEL).lower()
    if level not in _THREAD_LEVELS:
        raise ValueError(
            f"FCOLL_MPI_THREAD_LEVEL: expected one of {_THREAD_LEVELS}, got {level!r}"
        )
    memory.keep_freed_pages()  # a process setting: takes effect whenever it is made
    started = sys.modules.get("mpi4py.MPI")
    if started is None:
        import mpi4py

        mpi4py.rc.thread_level = level
        _yield_when_oversubscribed()
        from mpi4py import MPI

        _startup_facts = Startup(by_fcoll=True, requested=level)
    else:
        MPI = started
        _startup_facts = Startup(by_fcoll=False, requested=level, late=tuple(_late(MPI, level)))
        message = mpi_settings.late_warning(list(_startup_facts.late))
        if message is not None:
            warnings.warn(message, RuntimeWarning, stacklevel=_outside_fcoll())
    _MPI = MPI
    return MPI


def _late(MPI: Any, level: str) -> list[mpi_settings.Late]:
    """What fcoll could not set because the program started MPI; fcoll's own polling loops
    still learn that the node is oversubscribed."""
    global OVERSUBSCRIBED
    cpus = _node_cpus()
    OVERSUBSCRIBED = mpi_settings.oversubscribed(os.environ, cpus)
    provided = _THREAD_LEVELS[MPI.Query_thread()] if MPI.Is_initialized() else level
    return mpi_settings.late_settings(os.environ, cpus, str(MPI.get_vendor()[0]), provided)


def _outside_fcoll() -> int:
    """The ``stacklevel`` that points a warning at the first caller outside fcoll (the
    program's ``import fcoll`` or first call), skipping importlib's frames as `warnings` does."""
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep  # fcoll/
    frame, level = sys._getframe(2), 2  # the caller of the function that warns
    while frame.f_back is not None:
        name = frame.f_code.co_filename
        internal = "importlib" in name and "_bootstrap" in name
        if not internal and not name.startswith(package):
            break
        level += 0 if internal else 1
        frame = frame.f_back
    return level


def startup() -> Startup | None:
    """How MPI was started (None before fcoll first needed MPI)."""
    return _startup_facts


# Kept for tests and callers: the variables now live in fcoll.runtime.mpi_settings.
_MPICH_SPINNING = mpi_settings.MPICH_SPINNING
_OPEN_MPI_YIELD = mpi_settings.OPEN_MPI_YIELD


# More ranks than cores on this node (set when MPI starts): fcoll's own polling loops
# then yield the core between polls (fcoll.calls.work.backoff).
OVERSUBSCRIBED = False


def _yield_when_oversubscribed() -> None:
    """Make waiting ranks yield their core when this node runs more ranks than cores.

    Sets MPICH's non-spinning algorithms and throttled progress polling, and Open MPI's
    ``mpi_yield_when_idle`` (each library ignores the other's variables), unless the user
    set them (`mpi_settings.oversubscription_settings`). Runs before MPI starts, since both
    libraries read their settings from the environment at start-up.
    """
    global OVERSUBSCRIBED
    cpus = _node_cpus()
    OVERSUBSCRIBED = mpi_settings.oversubscribed(os.environ, cpus)
    os.environ.update(mpi_settings.oversubscription_settings(os.environ, cpus))


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
        _state.timeout = None if seconds == math.inf else seconds  # inf: wait forever again
    if debug is not None or "FCOLL_DEBUG" in os.environ:
        _state.debug = level
    _state.checking = _state.debug != "off"
    changed()  # e.g. the fast paths assume no deadline and no debug checks


def check_launcher(MPI: Any) -> None:
    """Raise (or warn, with ``FCOLL_ALLOW_SINGLETON=1``) when the launcher announced N > 1
    processes but MPI started this one alone: the launcher belongs to another MPI."""
    if MPI.COMM_WORLD.Get_size() != 1:
        return
    announced = launcher.launcher_world(os.environ)
    if announced is None:
        return
    library = " ".join(MPI.Get_library_version().replace("\0", "").splitlines()[0].split())
    library += f" ({launcher.loaded_library(MPI.__file__)})"
    where = launcher.describe_launchers(launcher.launchers())
    message = launcher.singleton_message(announced, library, where)
    if not launcher.allowed(os.environ):
        raise RuntimeError(message)
    warnings.warn(message, RuntimeWarning, stacklevel=_outside_fcoll())


def abort(code: int = 1) -> None:
    """End the whole job now (``MPI_Abort`` on every process), e.g. after a timeout.

    Example:
        >>> try:
        ...     fc.all_reduce(x)
        ... except fc.CollectiveTimeoutError:
        ...     fc.abort(3)           # mpiexec exits non-zero, every rank stops
    """
    mpi().COMM_WORLD.Abort(code)


def end_job(code: int, text: str = "") -> None:
    """Write ``text`` to stderr and end the whole job with exit status ``code``, from any
    thread: ``MPI_Abort``, after a moment for the launcher to forward what was written.

    A process that ``MPI_Abort`` has not ended within 3 s (an MPI library that cannot abort
    from a second thread while the main one is inside MPI) exits by itself with ``code``;
    mpiexec then ends the other ranks.

    Example:
        >>> end_job(1, "[rank 0] fcoll: rank 1 ended its script; ...")   # never returns
    """
    if text:
        sys.stderr.write(text if text.endswith("\n") else text + "\n")
        sys.stderr.flush()

    def fallback() -> None:
        time.sleep(3.0)
        os._exit(code)

    threading.Thread(target=fallback, name="fcoll end_job", daemon=True).start()
    time.sleep(0.2)  # the launcher forwards what was written before the abort kills it
    abort(code)
    os._exit(code)


def ends_jobs() -> bool:
    """``FCOLL_ABORT_ON_ERROR`` (default on): end the whole job when a rank's script fails,
    ends while another rank waits for it, or an fcoll call fails inside MPI."""
    return os.environ.get("FCOLL_ABORT_ON_ERROR", "1").strip().lower() not in ("0", "off", "false", "no")


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


_BEFORE: list[Callable[[], None]] = []  # the waits composed into _state.before_call


def _run_before() -> None:
    for wait in tuple(_BEFORE):
        wait()


def add_before_call(wait: Callable[[], None]) -> None:
    """Run ``wait()`` before every eager call from now on (once, however often added): for
    work another thread runs that eager calls must follow (see `_State.before_call`). The
    default group's fast paths are dropped while any is set.

    Example:
        >>> add_before_call(engine.drain)     # fc.all_reduce now waits for the engine first
    """
    if wait in _BEFORE:
        return
    _BEFORE.append(wait)
    _state.before_call = _BEFORE[0] if len(_BEFORE) == 1 else _run_before
    changed()


def remove_before_call(wait: Callable[[], None]) -> None:
    """Undo `add_before_call` (nothing if ``wait`` is not set).

    Example:
        >>> remove_before_call(engine.drain)
    """
    if wait not in _BEFORE:
        return
    _BEFORE.remove(wait)
    _state.before_call = None if not _BEFORE else _BEFORE[0] if len(_BEFORE) == 1 else _run_before
    changed()


def changed() -> None:
    """The settings changed (`fcoll.init`) or a group became unusable: drop dependent caches."""
    for listener in _LISTENERS:
        listener()
