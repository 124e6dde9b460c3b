"""The flight recorder: each rank's last calls, in a ring (``FCOLL_TRACE`` entries, default
64; ``0`` turns it off), for the reports made when a job stops (`fcoll.debug`).

An entry is made when a call first communicates (`fcoll.calls.work.Call.begin`, and the fast
paths): ``(group key, call number, op, argument summary, start time)``, or from a fast path
``(group key, call number, op, module, shape, dtype, start time)`` (the key: the group's
ranks and a serial its members agree on, `fcoll.groups.group.Group.key`). Its end time lives
beside it: older than its start while in flight, ``-1.0`` once it failed. So an entry's
state is ``sent`` (in flight: a blocking MPI call, an NCCL launch, or a poll), ``completed``,
or ``failed``. Calls that fail their local checks never communicate and keep no number.

Recording is one tuple and two clock reads per call; everything else (formatting, dtype
names) waits for a report (`bench/trace_overhead.py` measures it).
The gathering of every rank's record, with a deadline of its own, is in `fcoll.diagnostics.flight_report`.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from typing import Any

ENV = "FCOLL_TRACE"
DEFAULT = 64


def _size() -> int:
    value = os.environ.get(ENV, "").strip()
    if not value:
        return DEFAULT
    if not value.isdigit():
        raise ValueError(f"{ENV}: expected a number of calls to keep (0: off), got {value!r}")
    return int(value)


class Ring:
    """The last ``size`` entries (``size`` rounded up to a power of two; 0: recording off)."""

    def __init__(self, size: int) -> None:
        self.size = 1 << (size - 1).bit_length() if size > 0 else 0
        self.mask = max(self.size - 1, 0)
        self.calls: list[tuple[Any, ...] | None] = [None] * self.size
        self.ends: list[float] = [0.0] * self.size
        self.pos = [0]  # entries made so far (a list: the fast paths' closures share it)
        self.since = time.perf_counter()  # the record starts here (`SOURCES` too)

    def __bool__(self) -> bool:
        return self.size > 0

    def record(self, key: Any, seq: int, fn: str, args: Any) -> int:
        """A new entry in flight; its slot (for `end` and `fail`)."""
        i = self.pos[0]
        self.pos[0] = i + 1
        slot = i & self.mask
        self.calls[slot] = (key, seq, fn, args, time.perf_counter())
        return slot

    def entries(self) -> Iterator[tuple[Any, int, str, Any, float, float]]:
        """Every entry, oldest first: ``(group key, seq, fn, args, start, end)``."""
        total = self.pos[0]
        first = max(total - self.size, 0)
        for i in range(first, total):
            call, ended = self.calls[i & self.mask], self.ends[i & self.mask]
            if call is None:
                continue
            if len(call) == 7:  # a fast path's: (key, seq, fn, module, shape, dtype, start)
                call = (*call[:3], (call[3], call[4], call[5]), call[6])
            yield (*call, ended if ended < 0 or ended >= call[-1] else 0.0)


RING = Ring(_size())
# More entries for the reports, in `Ring.entries`' form, from recorders outside Python
# (`fcoll.xla.channel._records`: calls the compiled XLA handler served without the GIL); the
# reports keep those that started since the ring was made (`configure` starts afresh).
SOURCES: list[Callable[[], list[tuple[Any, int, str, Any, float, float]]]] = []


def configure(size: int) -> None:
    """Keep ``size`` entries from now on (0: off); the record so far is dropped."""
    global RING
    RING = Ring(size)


Recorder = tuple[Any, list[float], list[int], int, Any, Any]


def recorder(key: Any) -> Recorder:
    """What a fast path's closure records with, for the group of ``key``: ``(calls, ends,
    pos, mask, key, clock)`` of the ring (``calls`` None when recording is off). A closure
    records ``calls[i] = (key, seq, op, module, shape, dtype, clock())`` in slot
    ``i = pos[0] & mask`` (after ``pos[0] += 1``), then ``ends[i] = clock()`` when done
    (an end older than the start means in flight)."""
    ring = RING
    if not ring:
        return None, [], [0], 0, key, time.perf_counter
    return ring.calls, ring.ends, ring.pos, ring.mask, key, time.perf_counter


def end(slot: int) -> None:
    """The entry in ``slot`` completed now."""
    if 0 <= slot < RING.size:
        RING.ends[slot] = time.perf_counter()


def reopen(slot: int) -> None:
    """The entry in ``slot`` communicates again (a call's next message): in flight."""
    if 0 <= slot < RING.size:
        RING.ends[slot] = 0.0


def fail(slot: int) -> None:
    """The entry in ``slot`` failed (missed its deadline)."""
    if 0 <= slot < RING.size:
        RING.ends[slot] = -1.0


_PLAIN = (bool, int, float, str, type(None))


def summary(value: object) -> object:
    """What the record keeps of an argument: arrays as ``(type, shape, dtype)``, lists item
    by item (the first 4), numbers, strings and other objects as they are (formatted, and
    arrays' types named, only for a report)."""
    if value.__class__ in _PLAIN:
        return value
    shape = getattr(value, "shape", None)
    if shape is not None:
        return (value.__class__, shape, getattr(value, "dtype", None))
    if isinstance(value, (list, tuple)):
        return [summary(v) for v in value[:4]] + (["..."] if len(value) > 4 else [])
    return value


def summarize(fields: dict[str, object] | None) -> tuple[tuple[str, object], ...] | None:
    """`summary` of each named argument of a call."""
    if fields is None:
        return None
    return tuple([(name, value if value.__class__ in _PLAIN else summary(value))
                  for name, value in fields.items()])
