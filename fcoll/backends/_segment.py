"""A group's shared-memory segment: one MPI-3 shared window over its ranks on one node.

The window (``MPI.Win.Allocate_shared`` on the group's node communicator) holds, from
its start, 64-byte aligned:

- a control area: one 64-byte line per rank, written only by that rank (no two ranks
  write one cache line): ``ARRIVED`` is the number of the last step whose data the rank
  has copied in; ``NBYTES + parity`` the byte count it announced for that step's call;
- the slots: two sets (by the parity of the step number) of ``n`` slots of ``capacity``
  bytes, slot ``j`` written only by rank ``j``.

A step is numbered the same on every rank (every rank takes every step, in order). Step
``s`` writes the slots of parity ``s % 2``; a rank can only reach step ``s + 2`` after
every rank arrived at step ``s + 1``, that is after every rank finished reading step
``s``'s slots. So one arrival per step is the only synchronisation: no second flag, no
barrier. Writes are plain stores in program order (data, then the flag), which x86-64's
memory model (TSO) keeps in order for the other cores; elsewhere ``MPI.Win.Sync`` fences
them.

Waiting polls the flags (`Segment.exchange`): a busy spin that, with more ranks than cores,
yields the core at every poll (`os.sched_yield`) so the peer it waits for can run, as the
MPI path's polls do (`fcoll.work.backoff`); after ``YIELD_SECONDS`` it sleeps between polls;
a call with a deadline raises `fcoll.work.CollectiveTimeoutError` once it passes, as the
MPI path does.
"""

from __future__ import annotations

import os
import platform
import time
from typing import Any

import numpy as np

from fcoll import _runtime, _trace, _trace_report
from fcoll.work import Call, timed_out

LINE = 64  # bytes per control line (one cache line)
ARRIVED, NBYTES = 0, 2  # int64 words of a rank's control line (NBYTES + parity)
ALIGN = 4096
ROWS_KEPT = 64  # (size, dtype) views kept per segment
SPINS = 64  # polls before the first yield
YIELD_SECONDS = 0.05  # then yield the core at every poll this long, then sleep
FENCE = platform.machine().lower() not in ("x86_64", "amd64", "i386", "i686")


def round_up(nbytes: int, to: int = ALIGN) -> int:
    return -(-nbytes // to) * to


class Segment:
    """The shared window of one group on one node, its flags and slots.

    Made collectively by every rank of ``node`` (the group's ranks, in group order);
    `grow` and `free` are collective too.

    Example:
        >>> seg = Segment(node, 1 << 20)           # every rank of a 2-rank group
        >>> seg.exchange(np.full(2, r + 1.0), call)[0]     # rank r: rank 0's slot
        array([1., 1.])
    """

    def __init__(self, node: Any, capacity: int) -> None:
        self.node = node
        self.n, self.rank = node.Get_size(), node.Get_rank()
        self.step = 0  # the last step taken (equal on every rank)
        self.win: Any = None
        self._allocate(round_up(max(capacity, 1)))

    def _allocate(self, capacity: int) -> None:
        MPI = _runtime.mpi()
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
        self.step = 0

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

    def exchange(self, data: np.ndarray, call: Call, total: int | None = None, send: bool = True
                 ) -> list[np.ndarray]:
        """One whole step for ``data`` that fits a slot: copy it in, arrive announcing
        ``total`` (default: its size), wait for every rank, check that every rank announced
        the same (`ValueError` on every rank alike); return every rank's slot as ``data``'s
        dtype (by rank, ``data.size`` elements each). ``data`` is 1-D, or 2-D with one row
        per rank's block: then this rank's own block is not copied (only it reads that).
        ``send=False``: nothing is copied in (a broadcast's non-root announces its size).
        Every step of every call is one `exchange` (a step that only announces passes empty
        ``data`` and ``send=False``); what it looks up is kept in locals, for the default
        group's fast path.

        Example:
            >>> rows = seg.exchange(np.full(2, r + 1.0), call)     # rank r of 2
            >>> [row.tolist() for row in rows]
            [[1.0, 1.0], [2.0, 2.0]]
        """
        nbytes, ctl, me = data.nbytes, self.ctl, self.rank
        total = nbytes if total is None else total
        step = self.step = self.step + 1
        parity = NBYTES + (step & 1)
        row = self.rows(nbytes, data.dtype)[step & 1]
        if send and data.ndim == 1:
            row[me][...] = data
        elif send:
            blocks = row[me].reshape(data.shape)
            for j in range(data.shape[0]):
                if j != me:
                    blocks[j] = data[j]
        if FENCE:
            self.win.Sync()
        ctl[self._mine + parity] = total
        ctl[self._mine] = step
        same = True
        for word in self._words:
            if ctl[word] < step:
                self._wait_for(word, step, call)
            same = same and ctl[word + parity] == total
        if FENCE:
            self.win.Sync()
        if not same:
            self.agree(step, total, call)
        return row

    def announced(self, step: int) -> list[int]:
        """The byte counts every rank announced at ``step`` (once all arrived)."""
        words = LINE // 8
        return [self.ctl[j * words + NBYTES + (step & 1)] for j in range(self.n)]

    def agree(self, step: int, nbytes: int, call: Call) -> None:
        """`ValueError` (on every rank alike) unless every rank announced ``nbytes`` at
        ``step`` (once all arrived)."""
        ctl, word = self.ctl, NBYTES + (step & 1)
        for j in range(self.n):
            if ctl[j * (LINE // 8) + word] != nbytes:
                raise ValueError(f"{call.fn}: expected the same number of bytes on every rank "
                                 f"of group {list(call.group.ranks)}, got {self.announced(step)} "
                                 "(by group rank)")

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
                _trace.fail(call.slot)
                raise timed_out(call.fn, call.group, seconds, call.group.seq)
            if now - started < YIELD_SECONDS:
                if _runtime.OVERSUBSCRIBED:  # the peer we wait for may need this core
                    os.sched_yield()
                continue
            time.sleep(pause)
            pause = min(2 * pause, 1e-3)
            _trace_report.serve()  # a report in progress elsewhere gets this rank's record

    def grow(self, capacity: int) -> None:
        """Replace the window by one with ``capacity`` bytes per slot (collective; every
        rank must have finished reading the old one: call it right after an `exchange`)."""
        self._release()
        self._allocate(round_up(capacity))

    def _release(self) -> None:
        if self.win is None:
            return
        if FENCE:
            self.win.Unlock_all()
        self.ctl.release()
        del self.mem, self.slots, self._rows
        self.win.Free()
        self.win = None

    def free(self) -> None:
        """Free the window and the node communicator (collective over the group)."""
        self._release()
        self.node.Free()
