"""Notices that a rank gave up on a group's call at its deadline, for the ranks that come later.

A call that misses its deadline leaves the group unusable on the rank that raised
(`fcoll.calls.errors.timed_out`), which never takes part in that group again. A peer that
arrives later would otherwise match what the rank left behind: its late ``MPI_Iallreduce``
completes against the abandoned one (data from a buffer the rank gave up on), its segment
step sees the rank's arrival flag, and a first call on the group goes from the deadline's
``Ibarrier`` into the blocking node split, where it waits forever. So the rank that gives
up sends each other member of the group a notice ``(group serial, call number, its rank,
deadline in µs)`` on a communicator of its own (a duplicate of ``COMM_WORLD`` made at
`fcoll.init`), and a rank checks what has arrived:

- when a call with a deadline has completed its messages (`fcoll.calls.work.Call.end`),
  before the call returns or goes on to a blocking step;
- while any wait polls or sleeps (`fcoll.calls.work.wait_request`, the segment's waits).

A notice for call ``q`` of a group stops this rank's calls number ``q`` and later on that
group: that rank will never make them. Messages: one per other member, once per group that
breaks (``p - 1`` of 32 bytes at a timeout, none on a healthy call); a check is one
``MPI_Iprobe``. Calls without a deadline check only while they poll or sleep.

Example:
    >>> # rank 0 gave up on call #1 of group g; rank 1 comes 4 s later:
    >>> fc.all_reduce(np.ones(4), group=g)           # rank 1, at once
    CollectiveTimeoutError: all_reduce (call #1 on the group): rank 0 gave up on this call ...
"""

from __future__ import annotations

import sys
import time
from typing import Any

import numpy as np

from fcoll import runtime
from fcoll.runtime import finalize

TAG = 30612
_COMM: list[Any] = []  # the notices' communicator, made by `start`
_SENT: list[tuple[Any, np.ndarray]] = []  # (request, message) until it completes
_HEARD: dict[int, tuple[int, int, float]] = {}  # group serial -> (lowest call number, rank, seconds)


def start(comm_world: Any) -> None:
    """Make the notices' communicator (collective over ``comm_world``, at `fcoll.init`), in
    jobs of more than one process."""
    if not _COMM and comm_world.Get_size() > 1:
        _COMM.append(comm_world.Dup())
        finalize.on_exit(finalize.AGREE, all_here)
        finalize.on_exit(finalize.LAST, close)


def send(group: Any, seq: int, seconds: float) -> None:
    """Tell every other member of ``group`` that this rank gave up on its call ``seq``."""
    if not _COMM or group.key[1] < 0:
        return
    comm = _COMM[0]
    me = comm.Get_rank()
    message = np.array([group.key[1], seq, me, int(seconds * 1e6)], np.int64)
    _SENT[:] = [(r, m) for r, m in _SENT if not r.Test()]
    for peer in group.ranks:
        if peer != me:
            _SENT.append((comm.Isend(message, dest=peer, tag=TAG), message))


# An MPI_Iprobe advances MPI's progress once: a notice that reached this process while it ran
# no MPI (asleep, computing) may sit behind other messages and need a few (2 in a job where
# the rank that gave up then sent its flight record). Probing stops after this many misses.
MISSES = 8


def _receive() -> None:
    comm = _COMM[0]
    MPI = runtime.mpi()
    message = np.empty(4, np.int64)
    misses = 0
    while misses < MISSES:
        if not comm.Iprobe(source=MPI.ANY_SOURCE, tag=TAG):
            misses += 1
            continue
        comm.Recv(message, source=MPI.ANY_SOURCE, tag=TAG)
        serial, seq, rank, micros = (int(v) for v in message)
        if serial not in _HEARD or seq < _HEARD[serial][0]:
            _HEARD[serial] = (seq, rank, micros / 1e6)


def heard(group: Any) -> tuple[int, int, float] | None:
    """``(call number, rank, deadline s)`` of a peer that gave up on ``group`` at a call this
    rank has reached (``group.seq`` or lower), or None."""
    if not _COMM:
        return None
    _receive()
    notice = _HEARD.get(group.key[1])
    return notice if notice is not None and notice[0] <= group.seq else None


def all_here() -> bool:
    """At exit: whether every rank of the job reached the end of its script within
    `fcoll.runtime.finalize.wait_seconds` (an ``MPI_Ibarrier``, polled with sleeps)."""
    limit = finalize.wait_seconds()
    request = _COMM[0].Ibarrier()
    started = time.monotonic()
    pause = 1e-5
    while not request.Test():
        if time.monotonic() - started > limit:
            sys.stderr.write(f"[rank {_COMM[0].Get_rank()}] fcoll: some rank had not ended its "
                             f"script {limit:g} s after this one ({finalize.WAIT_ENV}); fcoll's "
                             "shared windows are left to MPI_Finalize\n")
            return False
        time.sleep(pause)
        pause = min(2 * pause, 1e-3)
    return True


def close() -> None:
    """At exit: take what arrived; sends still in flight are left to MPI (`MPI_Request_free`)."""
    if not _COMM:
        return
    _receive()
    for request, _ in _SENT:
        if not request.Test():
            request.Free()
    _SENT.clear()
