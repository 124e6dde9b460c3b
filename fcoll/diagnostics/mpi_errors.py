"""MPI's own errors on fcoll's communicators, told as fcoll errors.

mpi4py sets ``MPI_ERRORS_RETURN`` on every communicator it makes, so an error inside MPI
(a message truncated because ranks passed different sizes, say) would come back as a bare
``mpi4py.MPI.Exception`` on the ranks that see it, while the others may already have
returned a wrong result. fcoll's communicators get an error handler of their own instead
(`attach`): it names the fcoll call in progress (op, call number, group) and the likely
cause, and ends the job, since no other rank can be trusted to have a right result. With
``FCOLL_ABORT_ON_ERROR=0`` the communicators keep mpi4py's handler (``MPI.Exception``).

MPICH treats some of these errors as fatal whatever the handler (a truncated
``MPI_Allreduce`` aborts the job with its own error stack before fcoll hears of it); on one
node fcoll's shared-memory path compares every call's fingerprint first, so such a call
raises `fcoll.CollectiveMismatchError` there instead.

Example:
    >>> attach(group)               # at a group's creation, on its members
    >>> # a broadcast whose ranks pass 4 and 5 elements, through MPI: the rank that sees
    >>> # the error prints "[rank 1] fcoll: broadcast (call #3 on group [0, 1]) failed in MPI ..."
"""

from __future__ import annotations

import weakref
from typing import Any

from fcoll import runtime
from fcoll.diagnostics import flight

_HANDLER: list[Any] = []
_GROUPS: weakref.WeakSet[Any] = weakref.WeakSet()  # live groups, to name the call in progress
# While TOLERATE[0] > 0 (a receive whose size the caller gave is in flight: `fcoll.sendrecv`
# with ``like=``), a truncated message is counted in TRUNCATED[0] and MPI goes on: the caller
# raises its own ValueError, the communicator stays usable.
TOLERATE = [0]
TRUNCATED = [0]


def attach(group: Any) -> None:
    """Give ``group``'s communicator fcoll's error handler (made once per process), unless
    ``FCOLL_ABORT_ON_ERROR=0``: mpi4py then raises its ``MPI.Exception`` (a handler of the
    program's own that returns makes MPI return as if nothing happened)."""
    if not runtime.ends_jobs():
        return
    if not _HANDLER:
        _HANDLER.append(runtime.mpi().Comm.Create_errhandler(_on_error))
    group._comm.Set_errhandler(_HANDLER[0])
    _GROUPS.add(group)


def _call(comm: Any, groups: Any) -> str:
    """The fcoll call in progress on ``comm``, as the flight recorder and the group know it."""
    group = next((g for g in groups if getattr(g, "_comm", None) == comm), None)
    if group is None:
        return "a call on one of fcoll's communicators"
    ring, fn = flight.RING, group.call.fn or "a call"
    if ring and ring.pos[0]:
        entry = ring.calls[(ring.pos[0] - 1) & ring.mask]
        if entry is not None and entry[0] == group.key:
            fn = entry[2]
    return f"{fn} (call #{group.seq} on group {list(group.ranks)})"


def _on_error(comm: Any, code: int) -> None:
    MPI = runtime.mpi()
    if TOLERATE[0] and MPI.Get_error_class(code) == MPI.ERR_TRUNCATE:
        TRUNCATED[0] += 1
        return
    what = MPI.Get_error_string(code).splitlines()[0].removesuffix(", error stack:")
    rank = MPI.COMM_WORLD.Get_rank()
    text = (f"[rank {rank}] fcoll: {_call(comm, list(_GROUPS))} failed in MPI: {what}. "
            "Likely cause: the ranks passed different sizes, dtypes, ops or roots to this call "
            "(fcoll compares them before MPI only with debug=\"detail\", and always on one node's "
            "shared-memory path). Other ranks may have returned a wrong result")
    runtime.end_job(1, text + ": ending the job (FCOLL_ABORT_ON_ERROR=0 turns this off)")
