"""What fcoll sets before MPI starts, and what is lost when the program started MPI first.

Pure functions of an environment mapping and facts passed in (tested without MPI);
`fcoll.runtime` applies them. fcoll tunes MPI before starting it: the thread level and,
when the node runs more ranks than cores, variables the MPI library reads at start-up
(`oversubscription_settings`). If the program imported ``mpi4py.MPI`` first, those can no
longer take effect: `late_settings` says which, and `late_warning` words the warning for
the ones that matter. (The malloc tuning, a process setting, is applied either way.)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

THREAD_LEVELS = ("single", "funneled", "serialized", "multiple")
DEFAULT_THREAD_LEVEL = "serialized"

# MPICH's shared-memory algorithms for these collectives spin without yielding below
# THREAD_MULTIPLE: with more ranks than cores, one 1 MiB all_reduce took seconds instead
# of milliseconds here (docs/performance.md). Its generic algorithms do not.
MPICH_SPINNING = ("MPIR_CVAR_ALLREDUCE_POSIX_INTRA_ALGORITHM",
                  "MPIR_CVAR_REDUCE_POSIX_INTRA_ALGORITHM",
                  "MPIR_CVAR_BCAST_POSIX_INTRA_ALGORITHM")
# usleep(1) after 4096 idle polls: lets the rank that holds the data run. The test suite
# at n=4 on 2 cores: 31 -> 25 s with -bind-to core (bench/oversubscription.py).
MPICH_THROTTLE = "MPIR_CVAR_CH4_PROGRESS_THROTTLE"
# Open MPI yields only when its launcher knows the node is oversubscribed (--oversubscribe);
# given more slots than cores (a hostfile's slots=4 on 2 cores) it spins: an 8-byte
# all_reduce on 4 ranks took 5.6 ms per call instead of 20 us with this set.
OPEN_MPI_YIELD = "OMPI_MCA_mpi_yield_when_idle"
_LOCAL_SIZES = ("MPI_LOCALNRANKS", "OMPI_COMM_WORLD_LOCAL_SIZE")


def _count(env: Mapping[str, str], name: str) -> int | None:
    value = env.get(name, "").strip()
    return int(value) if value.isdigit() else None


def local_ranks(env: Mapping[str, str]) -> int | None:
    """Ranks the launcher put on this node (MPICH's or Open MPI's variable), if it says."""
    for name in _LOCAL_SIZES:
        count = _count(env, name)
        if count is not None:
            return count
    return None


def oversubscribed(env: Mapping[str, str], cpus: int) -> bool:
    """Whether the launcher put more ranks on this node than ``cpus``."""
    local = local_ranks(env)
    return local is not None and local > cpus


def oversubscription_settings(env: Mapping[str, str], cpus: int) -> dict[str, str]:
    """The variables fcoll sets before MPI starts so that waiting ranks yield their core.

    Empty unless the node is oversubscribed; a variable already in ``env`` is left out
    (the user's choice stands). Each library ignores the other's variables.

    Example:
        >>> oversubscription_settings({"MPI_LOCALNRANKS": "4"}, cpus=2)["MPIR_CVAR_CH4_PROGRESS_THROTTLE"]
        '1'
        >>> oversubscription_settings({"MPI_LOCALNRANKS": "2"}, cpus=2)
        {}
    """
    if not oversubscribed(env, cpus):
        return {}
    wanted = {**dict.fromkeys(MPICH_SPINNING, "mpir"), MPICH_THROTTLE: "1", OPEN_MPI_YIELD: "1"}
    return {name: value for name, value in wanted.items() if name not in env}


@dataclass(frozen=True)
class Late:
    """A setting fcoll would have made, which cannot take effect once MPI has started."""

    name: str  # the variable (or "thread level")
    value: str  # what fcoll would have set
    why: str  # what is lost without it
    matters: bool  # worth a warning (else shown by ``python -m fcoll info`` only)


def _applies_to(name: str, vendor: str) -> bool:
    return name.startswith("OMPI_") == (vendor == "Open MPI")


def late_settings(env: Mapping[str, str], cpus: int, vendor: str, provided: str) -> list[Late]:
    """What fcoll could not set because MPI was already running when fcoll first needed it.

    ``vendor`` is mpi4py's ``MPI.get_vendor()[0]``; ``provided`` the thread level MPI gave.
    The thread level matters only when ``FCOLL_MPI_THREAD_LEVEL`` asked for another one
    (fcoll itself calls MPI from one thread at a time; ``multiple`` costs latency only).

    Example:
        >>> [s.name for s in late_settings({"OMPI_COMM_WORLD_LOCAL_SIZE": "4"}, 2, "Open MPI",
        ...                                "multiple")]
        ['thread level', 'OMPI_MCA_mpi_yield_when_idle']
    """
    late = []
    asked = env.get("FCOLL_MPI_THREAD_LEVEL", "").lower()
    wanted = asked if asked in THREAD_LEVELS else DEFAULT_THREAD_LEVEL
    if provided != wanted:
        why = (f"FCOLL_MPI_THREAD_LEVEL={asked} asked for it; MPI provides {provided}" if asked
               else f"MPI provides {provided}" + (", 15-45 % slower small messages with MPICH"
                                                  if provided == "multiple" else ""))
        late.append(Late("thread level", wanted, why, matters=bool(asked)))
    for name, value in oversubscription_settings(env, cpus).items():
        if _applies_to(name, vendor):
            late.append(Late(name, value, "more ranks than cores: waiting ranks spin", True))
    return late


def late_warning(late: list[Late]) -> str | None:
    """The warning for the settings that matter, or None when none does."""
    shown = [s for s in late if s.matters]
    if not shown:
        return None
    names = ", ".join(f"{s.name} = {s.value} ({s.why})" for s in shown)
    exports = " ".join(f"{s.name}={s.value}" for s in shown if s.name != "thread level")
    thread = [s for s in shown if s.name == "thread level"]
    fixes = ["import fcoll before mpi4py.MPI"]
    if exports:
        fixes.append(f"export {exports} before starting the program")
    if thread:
        fixes.append(f"set mpi4py.rc.thread_level = {thread[0].value!r} before importing mpi4py.MPI")
    return (f"fcoll: expected to start MPI itself, got mpi4py.MPI imported first, so these "
            f"settings could not take effect: {names}. Fix: {', or '.join(fixes)}.")
