"""A group's shared-memory segment: one MPI-3 shared window over its ranks on one node.

The window (``MPI.Win.Allocate_shared`` on the group's node communicator) holds, from
its start, 64-byte aligned:

- a control area: one 64-byte line per rank, written only by that rank (no two ranks
  write one cache line): ``ARRIVED`` is the number of the last step whose data the rank
  has copied in; ``ANNOUNCE + 2 * parity`` and the word after it the call's fingerprint
  (`fcoll.calls.fingerprint`: kind of call, op, dtype, root) and element count that it announced
  at that step;
- the slots: two sets (by the parity of the step number) of ``n`` slots of ``capacity``
  bytes, slot ``j`` written only by rank ``j``.

A step is numbered the same on every rank (every rank takes every step, in order). Step
``s`` writes the slots of parity ``s % 2``; a rank can only reach step ``s + 2`` after
every rank arrived at step ``s + 1``, that is after every rank finished reading step
``s``'s slots. So one arrival per step is the only synchronisation: no second flag, no
barrier. Writes are plain stores in program order (data, then the flag), which x86-64's
memory model (TSO) keeps in order for the other cores; elsewhere ``MPI.Win.Sync`` fences
them.

Waiting polls the flags (`Segment.exchange`): ``SPINS`` polls of a busy spin, then for
``YIELD_SECONDS`` a yield of the core and the GIL at every poll (``time.sleep(0)``), then
sleeps between polls, doubling from 10 µs to 1 ms (the compiled core sleeps on a futex
instead, woken by the arriving rank: `fcoll.backends._shmcore`);
a call with a deadline raises `fcoll.calls.errors.CollectiveTimeoutError` once it passes, as the
MPI path does.
"""

from __future__ import annotations

import platform
import time
from typing import Any

import numpy as np

from fcoll import runtime
from fcoll.backends import native, shm_window
from fcoll.calls import fingerprint, traffic
from fcoll.calls.errors import check_notices, timed_out
from fcoll.calls.work import Call
from fcoll.diagnostics import flight, flight_report
from fcoll.runtime import finalize

LINE = 192  # control bytes per rank (the C core's PER_RANK): the numpy path uses the first 64-byte
#            line, the C core all three (a step line per parity, then the futex line)
ARRIVED, ANNOUNCE = 0, 2  # int64 words of a rank's control line (ANNOUNCE + 2 * parity: fp, count)
CHUNK = 1 << 20  # bytes per rank per step (a step's n slots stay in the 32 MiB L3 here)
ALIGN = 4096
ROWS_KEPT = 64  # (size, dtype) views kept per segment
SPINS = 64  # polls before the first yield
YIELD_SECONDS = 2e-4  # then yield the core (and the GIL) at every poll this long, then sleep
FENCE = platform.machine().lower() not in ("x86_64", "amd64", "i386", "i686")


def round_up(nbytes: int, to: int = ALIGN) -> int:
    return -(-nbytes // to) * to


class Segment:
    """The shared window of one group on one node, its flags and slots.

    Made collectively by every rank of ``node`` (the group's ranks, in group order);
    `grow` and `free` are collective too.

    Example:
        >>> seg = Segment(node, 1 << 20)           # every rank of a 2-rank group
        >>> seg.exchange(np.full(2, r + 1.0), call, fp, 2)[0]     # rank r: rank 0's slot
        array([1., 1.])
    """

    def __init__(self, node: Any, capacity: int, core: Any = None, owner: Any = None) -> None:
        self.node = node
        self.owner = owner  # the group
        self.n, self.rank = node.Get_size(), node.Get_rank()
        self._step = 0  # the last step taken (equal on every rank), when the core does not step
        self._earlier = 0  # steps taken in the windows before this one (`taken`)
        self.win: Any = None
        self._native = core  # the compiled core's module (fcoll.backends.native), or None
        self.core: Any = None  # its Core for this window: every step goes through it
        self._allocate(round_up(max(capacity, 1)))
        self._forget = finalize.on_exit(finalize.SEGMENTS, self._at_exit)

    @property
    def step(self) -> int:
        """The last step taken in this window (equal on every rank; a grown window starts
        again at 0)."""
        return int(self.core.step) if self.core is not None else self._step

    @property
    def taken(self) -> int:
        """Every step this segment has taken, in all its windows."""
        return self._earlier + self.step

    def _allocate(self, capacity: int) -> None:
        MPI = runtime.mpi()
        self.capacity = capacity
        self.head = round_up(self.n * LINE, ALIGN)
        total = self.head + 2 * self.n * capacity
        self.win = MPI.Win.Allocate_shared(total if self.rank == 0 else 0, 1, comm=self.node)
        buf, _ = self.win.Shared_query(0)
        self.mem = np.frombuffer(buf, np.uint8, count=total)
        if self.rank == 0:
            self.mem[: self.head] = 0
        self.ctl = memoryview(self.mem[: self.head]).cast("q")  # type: ignore[arg-type]
        self.slots = [[self.mem[self.head + (p * self.n + j) * capacity :][:capacity]
                       for j in range(self.n)] for p in (0, 1)]  # by parity, then rank
        self._rows: dict[tuple[int, np.dtype[Any]], list[list[np.ndarray]]] = {}
        self._words = range(0, self.n * (LINE // 8), LINE // 8)  # every rank's ARRIVED word
        self._mine = self.rank * (LINE // 8)
        if FENCE:
            self.win.Lock_all(MPI.MODE_NOCHECK)
        self.node.Barrier()  # the zeroed flags are seen by all before any step
        self._step = 0
        if self._native is not None:
            self.core = self._native.Core(self.mem, self.n, self.rank, capacity, self.head, CHUNK,
                                          0, runtime.OVERSUBSCRIBED)
            self.core.programs(*native.programs(self.n, self.rank))  # its reduction orders
            if not shm_window.direct():
                self.core.direct = 0  # all-to-alls' blocks through the slots only
            self.core.serve = self.serve  # now and then while the core sleeps

    def serve(self) -> None:
        """Now and then while a wait sleeps: a report in progress elsewhere gets this rank's
        record, and a peer's notice that it gave up on this call ends the wait
        (`fcoll.calls.notices`)."""
        flight_report.serve()
        if self.owner is not None:
            check_notices(self.owner.call)

    def rows(self, nbytes: int, dtype: np.dtype[Any]) -> list[list[np.ndarray]]:
        """The first ``nbytes`` of every slot as ``dtype``, by parity then rank (kept: a
        view costs about 0.3 us to make, and a call makes ``n`` of them)."""
        key = (nbytes, dtype)
        rows = self._rows.get(key)
        if rows is None:
            if len(self._rows) >= ROWS_KEPT:
                self._rows.clear()
            rows = self._rows[key] = [[slot[:nbytes].view(dtype) for slot in parity]
                                      for parity in self.slots]
        return rows

    def exchange(self, data: np.ndarray, call: Call, fp: int, count: int, send: bool = True
                 ) -> list[np.ndarray]:
        """One whole step for ``data`` that fits a slot: copy it in, arrive announcing the
        call's fingerprint ``fp`` and element count ``count``, wait for every rank, check that
        every rank announced the same (`fcoll.calls.errors.CollectiveMismatchError` on every rank
        alike, the table of what each rank called); return every rank's slot as ``data``'s
        dtype (by rank, ``data.size`` elements each). ``data`` is 1-D, or 2-D with one row
        per rank's block: then this rank's own block is not copied (only it reads that).
        ``send=False``: nothing is copied in (a broadcast's non-root; a step that only
        announces passes empty ``data``). Every step of every call is one `exchange`; what
        it looks up is kept in locals, for the default group's fast path.

        Example:
            >>> fp = fingerprint.of("all_gather_into_tensor", "", np.dtype("float64"))
            >>> rows = seg.exchange(np.full(2, r + 1.0), call, fp, 2)     # rank r of 2
            >>> [row.tolist() for row in rows]
            [[1.0, 1.0], [2.0, 2.0]]
        """
        if self.core is not None:
            return self._exchange_native(data, call, fp, count, send)
        ctl, me = self.ctl, self.rank
        step = self._step = self._step + 1
        word = ANNOUNCE + 2 * (step & 1)
        row = self.rows(data.nbytes, data.dtype)[step & 1]
        if send and data.ndim == 1:
            row[me][...] = data
        elif send:
            blocks = row[me].reshape(data.shape)
            for j in range(data.shape[0]):
                if j != me:
                    blocks[j] = data[j]
        if FENCE:
            self.win.Sync()
        if traffic.ACTIVE:
            traffic.sent(call, data.nbytes if send else 0)
        mine = self._mine + word
        ctl[mine] = fp
        ctl[mine + 1] = count
        ctl[self._mine] = step
        same = True
        for at in self._words:
            if ctl[at] < step:
                self._wait_for(at, step, call)
            same = same and ctl[at + word] == fp and ctl[at + word + 1] == count
        if FENCE:
            self.win.Sync()
        if not same:
            raise fingerprint.mismatch(call.fn, call.group.ranks, self.announced(step))
        return row

    def barrier(self, call: Call, fp: int) -> None:
        """Wait until every rank arrived: one step that only announces ``fp`` (a rank in
        another call raises `fcoll.calls.errors.CollectiveMismatchError` on every rank); a
        long wait sleeps rather than spins.

        Example:
            >>> seg.barrier(call, fingerprint.of("barrier", "", np.dtype("uint8")))  # every rank
        """
        if self.core is not None:
            self.native(call, self.core.announce, fp, 0)
        else:
            self.exchange(np.empty(0, np.uint8), call, fp, 0, send=False)

    def _exchange_native(self, data: np.ndarray, call: Call, fp: int, count: int, send: bool
                         ) -> list[np.ndarray]:
        """`exchange` with the core stepping: the data goes into this rank's slot (never its
        control line: calls that take this path take it on every rank), the core announces,
        waits and compares."""
        row = self.rows(data.nbytes, data.dtype)[(self.core.step + 1) & 1]
        if send:
            mine = row[self.rank]
            if data.ndim == 1:
                mine[...] = data
            else:
                blocks = mine.reshape(data.shape)
                for j in range(data.shape[0]):
                    if j != self.rank:
                        blocks[j] = data[j]
        self.native(call, self.core.announce, fp, count)
        return row

    def native(self, call: Call, method: Any, *args: Any) -> Any:
        """``method(*args, deadline)`` of the core, its two errors told as fcoll's: a
        disagreement (`fcoll.calls.errors.CollectiveMismatchError`, every rank) and a missed deadline
        (`fcoll.calls.errors.CollectiveTimeoutError`). Under `fcoll.debug.traffic` the steps it
        took count as messages, its array argument's bytes as sent."""
        if traffic.ACTIVE:  # the steps this call takes, and the bytes of its array argument
            before = self.core.step
            try:
                return self._native_call(call, method, *args)
            finally:
                sent = next((a.nbytes for a in args if isinstance(a, np.ndarray)), 0)
                traffic.sent(call, sent, int(self.core.step - before))
        return self._native_call(call, method, *args)

    def _native_call(self, call: Call, method: Any, *args: Any) -> Any:
        seconds = call.seconds
        try:
            return method(*args, -1.0 if seconds is None else call.start + seconds)
        except self._native.Mismatch as error:
            raise fingerprint.mismatch(call.fn, call.group.ranks,
                                        self.announced(error.args[0])) from None
        except self._native.Timeout:
            flight.fail(call.slot)
            assert seconds is not None  # the core only times out with a deadline
            raise timed_out(call.fn, call.group, seconds, call.group.seq) from None

    def announced(self, step: int) -> list[tuple[int, int]]:
        """What every rank announced at ``step`` (once all arrived): ``(fp, count)`` by rank."""
        if self.core is not None:
            return [(int(fp), int(count)) for fp, count in self.core.announced(step)]
        words, word = LINE // 8, ANNOUNCE + 2 * (step & 1)
        return [(self.ctl[j * words + word], self.ctl[j * words + word + 1]) for j in range(self.n)]

    def _wait_for(self, word: int, step: int, call: Call) -> None:
        ctl = self.ctl
        for _ in range(SPINS):
            if ctl[word] >= step:
                return
        started = time.monotonic()
        seconds = call.seconds
        pause = 1e-5
        while ctl[word] < step:
            now = time.monotonic()
            if seconds is not None and now - call.start > seconds:
                flight.fail(call.slot)
                raise timed_out(call.fn, call.group, seconds, call.group.seq)
            if now - started < YIELD_SECONDS:
                time.sleep(0)  # a yield that lets the process's other threads take the GIL
                continue
            time.sleep(pause)
            pause = min(2 * pause, 1e-3)
            self.serve()

    def grow(self, capacity: int) -> None:
        """Replace the window by one with ``capacity`` bytes per slot (collective; every
        rank must have finished reading the old one: call it right after an `exchange`)."""
        self._earlier += self.step
        self._release()
        self._allocate(round_up(capacity))

    def _release(self) -> None:
        if self.win is None:
            return
        self.core = None  # it holds the window's memory
        if FENCE:
            self.win.Unlock_all()
        self.ctl.release()
        del self.mem, self.slots, self._rows
        self.win.Free()
        self.win = None

    def free(self) -> None:
        """Free the window and the node communicator (collective over the group)."""
        self._forget()
        self._release()
        self.node.Free()

    def _at_exit(self) -> None:
        """At exit (`fcoll.runtime.finalize`, once every rank is there): free the window."""
        if self.win is not None:
            self.free()
