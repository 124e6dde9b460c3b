"""The start of every public call: `member` resolves the group argument and readies the
group's one `fcoll.calls.work.Call` (communicator, deadline, call number) that the transports take.

Kept apart from `fcoll.groups.group` (what a group is, how one is made): this runs on the hot path of
every collective, and reads the job-wide deadline and the hooks of `fcoll.runtime`.
"""

from __future__ import annotations

import math
import time

from fcoll import runtime
from fcoll.calls.work import Call
from fcoll.groups.group import Group, resolve_group, world


def member(group: object, fn: str) -> tuple[Group, Call]:
    """`resolve_group` plus the call context passed down to the transport (communicator,
    deadline, call number: `fcoll.calls.work.Call`); `ValueError` unless a live member.

    Example:
        >>> g, call = member(None, "all_reduce")          # at the start of a public call
        >>> backend.allreduce(call, x, MPI.SUM)           # the transport takes the call
    """
    if runtime._state.before_call is not None:  # jitted collectives may be in flight
        runtime._state.before_call()
    g = (runtime._state.world or world()) if group is None else resolve_group(group, fn)
    if not g.usable:
        g.comm(fn)  # raises the documented error
    call = g.call
    call.fn, call.counted, call.slot, call.args = fn, False, -1, None  # counted once it communicates
    timeout = g.timeout if g.timeout is not None else runtime._state.timeout
    # math.inf: a group that waits forever under a job-wide deadline
    call.seconds = timeout = None if timeout == math.inf else timeout
    if timeout is not None:
        call.start = time.monotonic()
    return g, call
