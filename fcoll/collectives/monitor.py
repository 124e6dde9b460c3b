"""`monitored_barrier`: a barrier that names the ranks that did not arrive.

Every rank reports to group rank 0 with a point-to-point message; rank 0 waits for all
reports until the deadline, then sends each rank that reported a verdict. Unlike a
collective barrier, a missing rank cannot make the others hang past the deadline.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from fcoll import runtime
from fcoll.calls.work import Call
from fcoll.collectives.p2p import BYTE, MONITOR_TAG
from fcoll.groups.group import Group, GroupArg
from fcoll.groups.membership import member
from fcoll.runtime import Timeout, to_seconds

_OK, _FAILED = 1, 0


class MonitoredBarrierError(RuntimeError):
    """`monitored_barrier` failed on this rank: ``late`` holds the group ranks that did not
    arrive (on group rank 0), ``kind`` says which failure (``"late"``: some rank did not
    arrive, on rank 0; ``"no verdict"``: rank 0 sent none in time; ``"failed"``: rank 0
    reported a failure), ``seconds`` the timeout. Its text is fcoll's; the torch backend
    words it as gloo does (`fcoll.torch`).

    Example:
        >>> try: fc.monitored_barrier(timeout=1)       # rank 0; rank 1 never comes
        ... except MonitoredBarrierError as e: e.late
        [1]
    """

    def __init__(self, text: str, kind: str, rank: int, seconds: float,
                 late: list[int] | None = None) -> None:
        super().__init__(text)
        self.kind, self.rank, self.seconds, self.late = kind, rank, seconds, late or []


def _poll(requests: dict[int, Any], seconds: float, wait_all: bool,
          accept: Any = None) -> list[int]:
    """Wait until every request completes (and ``accept(rank)`` agrees), or the deadline
    passes; return the late ranks (only the first when ``wait_all`` is False)."""
    deadline = time.monotonic() + seconds
    pause = 1e-5
    while requests and time.monotonic() < deadline:
        for rank in [r for r, req in requests.items() if req.Test()]:
            if accept is None or accept(rank):
                del requests[rank]
        time.sleep(pause)
        pause = min(2 * pause, 1e-2)
    late = sorted(requests)
    return late if wait_all else late[:1]


def _names(ranks: list[int]) -> str:
    return (f"Rank {ranks[0]}" if len(ranks) == 1
            else "Ranks " + ", ".join(str(r) for r in ranks))


def monitored_barrier(group: GroupArg = None, timeout: Timeout = None, *,
                      wait_all_ranks: bool = False) -> None:
    """A barrier that fails, instead of hanging, when some rank does not arrive in time.

    On group rank 0 a missing rank raises ``RuntimeError("Rank 1 failed to pass
    monitored_barrier ...")`` (with ``wait_all_ranks=True``: every missing rank, "Ranks 1,
    2 ..."); the ranks that did arrive raise saying rank 0 reported a failure. ``timeout``
    defaults to the group's, then `fcoll.init`'s, then 30 s.

    Example:
        >>> fc.monitored_barrier(timeout=5)      # every rank; returns once all arrived
    """
    fn = "monitored_barrier"
    g, call = member(group, fn)
    seconds = to_seconds(timeout, "timeout")
    seconds = seconds or g.timeout or runtime.settings().timeout or 30.0
    tag = MONITOR_TAG
    g.monitor_epoch += 1  # reports carry it, so a late report of an earlier call is skipped
    if g.rank == 0:
        _gather_reports(g, call, tag, seconds, wait_all_ranks)
    else:
        _report(g, call, tag, seconds)


def _gather_reports(g: Group, call: Call, tag: int, seconds: float, wait_all: bool) -> None:
    flags = {r: np.zeros(1, np.int64) for r in range(1, g.size)}
    requests = {r: call.comm.Irecv([flag, BYTE], r, tag) for r, flag in flags.items()}

    def current(rank: int) -> bool:
        if flags[rank][0] == g.monitor_epoch:
            return True
        requests[rank] = call.comm.Irecv([flags[rank], BYTE], rank, tag)  # a stale report
        return False

    late = _poll(requests, seconds, wait_all, current)
    for request in requests.values():
        request.Cancel()
    verdict = np.array([_FAILED if late else _OK], np.int8)
    arrived = [r for r in flags if r not in requests]
    for rank in arrived:
        call.comm.Isend([verdict, BYTE], rank, tag + 1).Wait()
    if late:
        raise MonitoredBarrierError(f"{_names(late)} failed to pass monitored_barrier in "
                                    f"{seconds:g} s (group ranks {list(g.ranks)})",
                                    "late", 0, seconds, late)


def _report(g: Group, call: Call, tag: int, seconds: float) -> None:
    send = call.comm.Isend([np.array([g.monitor_epoch], np.int64), BYTE], 0, tag)
    verdict = np.zeros(1, np.int8)
    receive = call.comm.Irecv([verdict, BYTE], 0, tag + 1)
    if _poll({0: receive}, seconds * 2, True):
        receive.Cancel()
        send.Cancel()
        raise MonitoredBarrierError(f"Rank {g.rank} timed out in monitored_barrier: rank 0 "
                                    f"sent no verdict within {2 * seconds:g} s", "no verdict",
                                    g.rank, seconds)
    send.Wait()
    if verdict[0] != _OK:
        raise MonitoredBarrierError(f"Rank {g.rank}: rank 0 reported a failure in "
                                    "monitored_barrier (some rank did not arrive in time); see "
                                    "rank 0's error", "failed", g.rank, seconds)
