"""What a call raises when its ranks disagree or it misses its deadline.

`CollectiveMismatchError` and `CollectiveTimeoutError` are public (``fcoll.X``); `timed_out`
builds the latter for every transport that polls against a deadline, marks the group
unusable and gathers the ranks' flight records for the report.
"""

from __future__ import annotations

from typing import Any

from fcoll import runtime
from fcoll.calls import notices
from fcoll.diagnostics import flight, flight_report


class CollectiveTimeoutError(TimeoutError):
    """An operation did not complete before its deadline.

    The message names the operation, the group's ranks, the deadline and the call's
    sequence number on the group. The group is unusable afterwards. ``flight_record``
    holds every answering rank's last calls side by side (`fcoll.debug`), also printed by
    the lowest of them.

    Example:
        >>> fc.init(timeout=5)                        # every rank; mpiexec -n 2
        >>> if fc.get_rank() == 0:                    # rank 1 never joins
        ...     fc.all_reduce(np.ones(3))
        Traceback (most recent call last):            # on rank 0, after 5 s
        CollectiveTimeoutError: all_reduce (call #1 on the group) ... 5 s deadline on group ranks [0, 1]
    """

    flight_record: str = ""
    op: str = ""  # the operation, the group's ranks, the deadline and the call's number
    ranks: tuple[int, ...] = ()
    seconds: float = 0.0
    seq: int = 0


class CollectiveMismatchError(ValueError):
    """The ranks of a group made different calls (op, shapes, dtypes, roots, sizes, order).

    Raised on every rank of the group, before anything is sent, when ``debug="detail"``
    (`fcoll.init` or ``FCOLL_DEBUG``); a `ValueError`, with a table of each rank's call.
    On the on-node shared-memory path it is raised even with debug off, from each call's
    fingerprint (op, dtype, element count, root, kind of call; `fcoll.calls.fingerprint`).
    When some ranks' own arguments failed their local checks, those ranks raise their own
    `TypeError`/`ValueError` and the others this error, naming them.

    Example:
        >>> fc.init(debug="detail")                  # every rank; mpiexec -n 2
        >>> fc.all_reduce(np.ones(3 if fc.get_rank() == 0 else 4))
        Traceback (most recent call last):           # on ranks 0 and 1 alike
        CollectiveMismatchError: all_reduce: the ranks of group [0, 1] made different calls ...
    """


def sizes_differ(fn: str, comm: Any, peer: int, got: int | None, want: int
                 ) -> CollectiveMismatchError:
    """The error of a rank whose point-to-point step of a collective received ``got`` bytes
    (None: more than fit, MPI's truncation) from ``peer`` of ``comm`` where it expected
    ``want``: the ranks passed different sizes. Its peer, receiving the other size, raises
    it too.

    Example:
        >>> print(sizes_differ("all_reduce", comm, 1, 16, 20))
        all_reduce: global rank 0 received 16 bytes from global rank 1 where it expected 20 ...
    """
    MPI = runtime.mpi()
    me, them = MPI.Group.Translate_ranks(comm.Get_group(), [comm.Get_rank(), peer],
                                         MPI.COMM_WORLD.Get_group())
    amount = "more bytes than fit" if got is None else f"{got} bytes"
    return CollectiveMismatchError(
        f"{fn}: global rank {me} received {amount} from global rank {them} where it expected "
        f"{want}: the ranks passed different sizes (debug=\"detail\" compares every rank's "
        "call before anything is sent)")


def sizes_differ_end(fn: str, comm: Any, peer: int, got: int | None, want: int
                     ) -> CollectiveMismatchError:
    """`sizes_differ`, or with ``FCOLL_ABORT_ON_ERROR`` on (the default) the end of the job
    with its text, as fcoll's handler of MPI's own errors ends it at a truncated message
    (`fcoll.diagnostics.mpi_errors`): the rank's peers are in the middle of the same
    schedule and may wait for it, or have folded what it sent."""
    error = sizes_differ(fn, comm, peer, got, want)
    if runtime.ends_jobs():
        rank = runtime.mpi().COMM_WORLD.Get_rank()
        runtime.end_job(1, f"[rank {rank}] fcoll: {error}. Other ranks may wait for this one "
                           "or have returned a wrong result: ending the job "
                           "(FCOLL_ABORT_ON_ERROR=0 turns this off)")
    return error


def timed_out(fn: str, group: Any, seconds: float, seq: int) -> CollectiveTimeoutError:
    """Mark ``group`` unusable and build the error for a call that missed its deadline."""
    reason = (f"{fn} (call #{seq} on the group) did not complete within its "
              f"{seconds:g} s deadline")
    _break(group, reason)
    notices.send(group, seq, seconds)  # the peers that come later raise too
    error = CollectiveTimeoutError(
        f"{reason} on group ranks {list(group.ranks)}; some rank did not make the matching "
        "call, or died. The group is now unusable; fcoll.abort() ends the job")
    error.op, error.ranks, error.seconds, error.seq = fn, tuple(group.ranks), seconds, seq
    if flight.RING:  # every rank's last calls, side by side (printed by the lowest rank)
        error.flight_record = flight_report.collect(
            f"{fn} missed its deadline on group {list(group.ranks)}", REPORT_SECONDS)
    return error


def _break(group: Any, reason: str) -> None:
    group.broken = reason
    group.usable = False
    runtime.changed()  # caches that assume a healthy group drop it


def check_notices(call: Any) -> None:
    """`CollectiveTimeoutError` if a peer gave up on ``call``'s group at this call or an
    earlier one (`fcoll.calls.notices`): the call can never complete, or completed against
    what that peer left behind. The group becomes unusable here too; the error carries the
    flight record, as a missed deadline's does."""
    notice = notices.heard(call.group)
    if notice is None:
        return
    seq, rank, seconds = notice
    group = call.group
    flight.fail(call.slot)
    reason = (f"{call.fn} (call #{group.seq} on the group) cannot complete: rank {rank} gave up "
              f"on call #{seq} at its {seconds:g} s deadline")
    _break(group, reason)
    error = CollectiveTimeoutError(
        f"{reason} on group ranks {list(group.ranks)}. The group is now unusable; "
        "fcoll.abort() ends the job")
    error.op, error.ranks, error.seconds, error.seq = call.fn, tuple(group.ranks), seconds, group.seq
    if flight.RING:
        error.flight_record = flight_report.collect(
            f"{call.fn}: rank {rank} gave up on group {list(group.ranks)}", REPORT_SECONDS)
    raise error


# How long the ranks' records are gathered for a missed deadline's report: a small fixed
# budget, so the error arrives within half a second of the deadline whatever it is (ranks
# polling in an fcoll call answer within a millisecond; one blocked in MPI never does).
REPORT_SECONDS = 0.3
