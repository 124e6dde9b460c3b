"""The compiled handler's side in Python: a group's channel for jitted calls, made when a
jitted function is lowered, and what the handler asks of Python.

A channel is the group's duplicate for jitted calls (`fcoll.xla.handler.jit_group`: its own
communicator, segment and step counter, so eager calls on the group keep their fast paths
and never meet jitted ones) registered with the compiled handler
(``fcoll.backends._shmcore.xla_handler``, `fcoll/backends/_shmxla.c`) by index. `prepare`
runs where JAX lowers a collective (on the main thread, at the same point on every rank:
every rank lowers the same program). The first call lowered on a group, of any kind, opens
its channel: an eager all-reduce of `CHUNK` bytes per rank on the duplicate, once jitted
calls in flight are done, makes its segment hold any step, so no jitted call ever grows
it. A psum of one dtype the compiled core folds, on a group on one node (or of one rank),
then gets the custom call's typed attributes; everything else ``channel = -1`` and the
Python handler (`fcoll.xla.handler`; eager calls then wait for jitted ones,
`fcoll.xla.order`).

Example:
    >>> prepare("psum", g, primitives.jit_of, [ShapedArray((4,), f32)], {"op": "sum"})
    {'channel': 0, 'wire': 10, 'fold': 0, 'flags': 0, 'fp': ...}        # g: 2 ranks, one node
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from fcoll import runtime
from fcoll.backends import native
from fcoll.backends.segment import CHUNK
from fcoll.calls.errors import timed_out
from fcoll.calls.fingerprint import mismatch
from fcoll.collectives import all_reduce
from fcoll.collectives._fold import native_kernel
from fcoll.diagnostics import flight
from fcoll.groups.group import Group
from fcoll.policy.plan import reduction_plan
from fcoll.xla import order

OFF = {"channel": np.int64(-1)}  # the attributes of a call the Python handler serves
TIMEOUT, MISMATCH = 1, 2  # the compiled handler's failures (STEP_TIMEOUT, STEP_MISMATCH)
CHANNELS = 256  # the compiled handler's table (_shmxla.c): later groups take the Python handler
_INDEX: dict[tuple[int, ...], int] = {}  # a jit group's channel, by ranks
_GROUPS: dict[int, Group] = {}  # and back
REFUSED: list[str] = []  # why XLA refused the compiled handler (`refuse`), if it did


def refuse(why: str) -> None:
    """XLA refused to register the compiled handler: the Python handler serves every call
    from now on (`compiled` is None); ``why`` is kept in `REFUSED`."""
    REFUSED[:] = [why]


def compiled() -> Any:
    """The compiled core with the handler, where this job's segments step in C and XLA took
    the handler; else None."""
    if REFUSED or not native.running():
        return None
    core = native.module()
    return core if core is not None and hasattr(core, "xla_handler") else None


def _timeout(user: Group) -> float:
    """The user group's deadline in seconds (0: none), as `fcoll.groups.membership.member`."""
    timeout = user.timeout if user.timeout is not None else runtime._state.timeout
    return 0.0 if timeout is None or timeout == math.inf else float(timeout)


def index(jit: Group) -> int:
    """The channel index of the jit group ``jit`` (made at its first use)."""
    found = _INDEX.get(jit.ranks)
    if found is None:
        found = _INDEX[jit.ranks] = len(_INDEX)
        _GROUPS[found] = jit
    return found


def register(jit: Group, user: Group) -> int:
    """Tell the compiled handler ``jit``'s segment core (None where it has none: one rank),
    ranks and deadline; its index. The channel is off (its calls go to the Python handler)
    where the group broke, has no segment in C, or the job checks calls (``debug="detail"``)
    or counts their traffic."""
    core, i = compiled(), index(jit)
    seg, s = jit.shm, runtime._state
    step_core = seg.core if seg else None
    on = jit.usable and not s.checking and not s.counting and (jit.size == 1 or step_core is not None)
    if i < CHANNELS:
        core.xla_channel(i, step_core if on else None, jit.size if on else 0, _timeout(user))
    return i


def _changed() -> None:
    """The settings changed (`fcoll.init`: the deadline, the debug level) or a group broke:
    tell the compiled handler every channel again; where its calls now go to the Python
    handler (debug checks, traffic counts), eager calls wait for jitted ones."""
    if not _GROUPS or compiled() is None:
        return
    for i, jit in _GROUPS.items():
        if i < CHANNELS:
            register(jit, order.USER_GROUPS.get(jit.ranks, jit))
    if runtime._state.checking or runtime._state.counting:
        order.arm()


def _known(jit: Group) -> int | None:
    """``jit``'s channel index where the compiled handler has it, else None."""
    i = _INDEX.get(jit.ranks)
    return i if i is not None and i < CHANNELS and compiled() is not None else None


def enter(jit: Group) -> None:
    """Before Python calls on ``jit``: its call number from the compiled handler's count (the
    calls it served count on the group too)."""
    if (i := _known(jit)) is not None:
        jit.seq = max(jit.seq, compiled().xla_calls(i))


def leave(jit: Group, user: Group) -> None:
    """After Python used ``jit`` (its segment may have grown): tell the compiled handler
    again, with the group's call number, where it knows the channel."""
    if (i := _known(jit)) is not None:
        compiled().xla_calls(i, jit.seq)
        register(jit, user)


def prepare(kind: str, user: Group, jit_group: Any, avals: list[Any], params: dict[str, Any]
            ) -> dict[str, Any]:
    """The typed attributes of a lowered call: the compiled handler's channel and fold for a
    psum it can serve (see the module's docstring), else `OFF`. ``jit_group(user)`` gives
    the duplicate; the first call lowered on a group sets its channel up (`_open`), whatever
    its kind and dtype, so that every rank does so at the same point."""
    s = runtime._state
    if compiled() is None or s.checking or s.counting or not user.usable:
        return OFF
    jit = jit_group(user)
    i = _open(jit, user)
    dtypes = {np.dtype(a.dtype) for a in avals}
    if kind != "psum" or i >= CHANNELS or len(dtypes) != 1 or not _live(jit):
        return OFF
    dtype = dtypes.pop()
    plan = reduction_plan(np.empty((0,), dtype), params["op"], user, "psum")
    kernel = native_kernel(plan)
    if kernel is None or kernel[2] & ~native.F_AVG:  # (as the eager call: x in its own dtype)
        return OFF
    wire, fold, flags, _ = kernel
    return {"channel": np.int64(register(jit, user)), "wire": np.int32(wire),
            "fold": np.int32(fold), "flags": np.int32(flags), "fp": np.int64(plan.fp)}


def _live(jit: Group) -> bool:
    """Whether the compiled handler can step ``jit``: one rank, or a segment in C that holds
    a whole step (`CHUNK` bytes per rank)."""
    seg = jit.shm
    return jit.size == 1 or bool(seg and seg.core is not None and seg.capacity >= CHUNK)


def _open(jit: Group, user: Group) -> int:
    """The channel of ``jit``, set up at the first call lowered on it (collective over the
    group: once jitted calls in flight are done, an eager all-reduce of `CHUNK` bytes per
    rank on the duplicate makes its segment that size, so no jitted call ever grows it)."""
    if jit.ranks in _INDEX:
        return _INDEX[jit.ranks]
    i = index(jit)
    if jit.size > 1 and i < CHANNELS:
        order.wait_for_jitted()
        enter(jit)
        all_reduce(np.zeros(CHUNK // 4, np.float32), "sum", jit)
    leave(jit, user)
    return i


def told(i: int, failed: int, step: int, call: int) -> str:
    """The compiled handler's call number ``call`` on channel ``i`` failed (`TIMEOUT`, or
    `MISMATCH` at the segment's ``step``): fcoll's error for it, as the eager call raises it,
    as its text. A timeout breaks the duplicate (`timed_out`), which turns the channel off
    (`_changed`): later calls reach the Python handler, which says the group is unusable;
    after a mismatch the group stays usable, as an eager call's."""
    jit = _GROUPS[i]
    jit.seq = max(jit.seq, call)
    if failed == MISMATCH:
        error: BaseException = mismatch("psum", jit.ranks, jit.shm.announced(step))
    else:
        user = order.USER_GROUPS.get(jit.ranks, jit)
        error = timed_out("psum", jit, _timeout(user), call)
    return f"fcoll: {type(error).__name__}: {error}"


def _records() -> list[tuple[Any, int, str, Any, float, float]]:
    """The compiled handler's recent calls, as the flight recorder's entries ``(group key,
    call number, op, args, start, end)`` (times on ``time.monotonic``'s clock)."""
    core = compiled()
    if core is None:
        return []
    names = {code: dtype for dtype, code in native.TYPES.items() if dtype != np.dtype(bool)}
    out = []
    for i, jit in _GROUPS.items():
        if i >= CHANNELS:
            continue
        for seq, count, kind, start, end in core.xla_records(i):
            out.append((jit.key, seq, "psum", ("numpy", (count,), names[kind]), start, end))
    return out


flight.SOURCES.append(_records)
runtime.on_change(_changed)
