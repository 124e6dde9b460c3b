"""The stall watch: a thread per rank that reports a blocking fcoll call that does not return.

Started by `fcoll.init` in jobs of more than one process. About once a second (``tick``)
the thread looks at the main thread's Python stack: when its innermost frames are fcoll's
own, the main thread is in a blocking fcoll call (the outermost of those frames is the
public function). No call pays anything for this: the thread reads the stack, and the
flight recorder's last entry (`fcoll.diagnostics.flight`, which every call already writes) for the
call's group and number. It then

- publishes this rank's state on the node board (`fcoll.diagnostics.board`), so peers on the node can
  say what this rank does;
- after ``FCOLL_STALL_WARN`` seconds (default 60; 0: off) in one call, prints a report on
  this rank's stderr (`fcoll.diagnostics.stall_report`): the op, group, call number, time waited and
  what it knows of its peers, again at 2, 4, 8... times that (a line each);
- after ``FCOLL_STALL_ABORT`` seconds (default off) ends the job with the flight record;
- when a peer on this node has ended its script without making the call this rank waits in
  (its last call number on the group is lower), ends the job at once: that call can never
  complete (``FCOLL_ABORT_ON_ERROR=0`` turns this off, as it does for exceptions);
- when the process that started this rank (the launcher's: hydra's proxy, Open MPI's
  daemon, slurmstepd) is gone, ends this rank (exit status 1, `orphaned`): its job is over
  (an ``MPI_Abort`` that missed it, a launcher killed), and a rank left behind would wait,
  or spin in MPI's progress loop, forever (``FCOLL_ABORT_ON_ERROR=0`` turns this off too).

The thread never calls MPI (fcoll runs MPI at ``serialized``): to end the job it uses
`fcoll.runtime.end_job`. Frames are only read; the one kept between ticks (to know the
call is the same) keeps that call's locals alive at most one tick longer.

Example:
    >>> # FCOLL_STALL_WARN=2, mpiexec -n 2; rank 1 sleeps before its all_reduce
    >>> fc.all_reduce(np.ones(4))       # rank 0, after 2 s, on its stderr:
    [rank 0] fcoll: stalled 2 s in all_reduce (call #1 on group [0, 1]: float64[4]), waiting for ...
"""

from __future__ import annotations

import os
import sys
import threading
import time
import weakref
from dataclasses import dataclass
from types import FrameType
from typing import Any

from fcoll import runtime
from fcoll.diagnostics import board as _board
from fcoll.diagnostics import flight, mpi_errors, stall_report
from fcoll.runtime import finalize, launcher

WARN_ENV, ABORT_ENV = "FCOLL_STALL_WARN", "FCOLL_STALL_ABORT"
DEFAULT_WARN = 60.0
_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep  # fcoll/
# fcoll's code that runs around the user's (the job runner, the pytest plugin, the CLI)
_AROUND = tuple(_PACKAGE + p for p in ("testing" + os.sep, "cli" + os.sep, "run.py", "__main__.py"))
_GROUPS: weakref.WeakValueDictionary[int, Any] = weakref.WeakValueDictionary()


def seconds_setting(name: str, default: float) -> float:
    """A setting in seconds from the environment (0: off)."""
    value = os.environ.get(name, "").strip()
    if not value:
        return default
    try:
        seconds = float(value)
    except ValueError:
        seconds = -1.0
    if not seconds >= 0:
        raise ValueError(f"{name}: expected seconds >= 0 (0: off), got {value!r}")
    return seconds


def track(group: Any) -> None:
    """Watch ``group``'s call numbers and errors inside MPI (its members call this when they
    make it)."""
    _GROUPS[group.key[1]] = group
    mpi_errors.attach(group)


def group_seqs() -> list[tuple[int, int]]:
    """``(serial, last call number)`` of every live group this rank belongs to."""
    return [(serial, g.seq) for serial, g in sorted(_GROUPS.items())]


def _library(code: Any, cache: dict[Any, bool] = {}) -> bool:  # noqa: B006 - a memo
    known = cache.get(code)
    if known is None:
        name = code.co_filename
        known = cache[code] = name.startswith(_PACKAGE) and not name.startswith(_AROUND)
    return known


def entry_frame(frame: FrameType | None) -> FrameType | None:
    """The public fcoll function the thread whose innermost frame is ``frame`` waits in (the
    outermost of its innermost fcoll frames), or None when it is not in fcoll."""
    if frame is None or not _library(frame.f_code):
        return None
    while frame.f_back is not None and _library(frame.f_back.f_code):
        frame = frame.f_back
    return frame


@dataclass
class Wait:
    """The blocking call the main thread is in, as the watch knows it."""

    frame: FrameType
    op: str
    since: float  # time.monotonic() when it began (to within a tick)
    after: float  # the last tick that saw the main thread elsewhere
    key: tuple[tuple[int, ...], int] | None = None  # its group's flight-recorder key
    seq: int = 0  # its call number on the group (0: not recorded)
    args: str = ""
    reports: int = 0


def _recorded(wait: Wait, now: float) -> None:
    """Take the call's group, number and arguments from the flight recorder's last entry
    when that entry is in flight and began after ``wait.after`` (so it is this call's)."""
    ring = flight.RING
    i = ring.pos[0] - 1 if ring else -1
    if i < 0:
        return
    entry, ended = ring.calls[i & ring.mask], ring.ends[i & ring.mask]
    if entry is None or not 0 <= ended < entry[-1]:
        return
    began = now - (time.perf_counter() - entry[-1])
    if began >= wait.after:
        wait.key, wait.seq, wait.since = entry[0], entry[1], min(wait.since, began)
        wait.args = stall_report.arguments(entry)


class Watch:
    """The watch thread of this rank (`start`)."""

    def __init__(self, board: _board.Board | None, warn: float, stall_abort: float,
                 ends: bool) -> None:
        self.board, self.warn, self.stall_abort, self.ends = board, warn, stall_abort, ends
        limits = [s for s in (warn, stall_abort) if s > 0]
        self.tick = min([1.0, *(s / 4 for s in limits)])
        self.rank = runtime.mpi().COMM_WORLD.Get_rank()
        # the launcher's process that started this rank; a rank started otherwise is left be
        self.parent = os.getppid() if ends and launcher.launched(os.environ) else None
        self.main = threading.main_thread().ident
        self.wait: Wait | None = None
        self.free_since = time.monotonic()  # last tick that saw the main thread outside fcoll
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, name="fcoll stall watch", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stopping.wait(self.tick):
            try:
                self.check()
            except Exception as error:  # the watch must never take the job down by itself
                sys.stderr.write(f"[rank {self.rank}] fcoll: the stall watch stopped: {error!r}\n")
                return

    def stop(self) -> None:
        """End the thread (at exit, before the board it writes is freed); a tick in
        progress finishes first."""
        self.stopping.set()
        if self.thread is not threading.current_thread():
            self.thread.join(timeout=5.0)

    def check(self) -> None:
        """One tick: what the main thread waits in; publish; report or end the job."""
        if self.parent is not None and os.getppid() != self.parent:
            orphaned(self.rank, self.parent)
        now = time.monotonic()
        entry = entry_frame(sys._current_frames().get(self.main))  # type: ignore[arg-type]
        if entry is None:
            self.wait, self.free_since = None, now
            self._publish(None, now)
            return
        if self.wait is None or self.wait.frame is not entry:
            self.wait = Wait(entry, entry.f_code.co_name, now, after=self.free_since)
            self.free_since = now
        wait = self.wait
        if wait.key is None:  # the call may record itself after its checks: look each tick
            _recorded(wait, now)
        self._publish(wait, now)
        peers = self.board.lines() if self.board is not None else []
        if self.ends and (text := stall_report.hopeless(wait, peers, self.rank)) is not None:
            runtime.end_job(1, text + "\n" + _trace_report_local(wait))
        waited, due = now - wait.since, self.warn * 2 ** wait.reports
        if self.warn and waited >= due:  # reported as the threshold it passed: 1, 2, 4... x warn
            sys.stderr.write(stall_report.stalled(wait, due, peers, self))
            sys.stderr.flush()
            wait.reports += 1
        if self.stall_abort and waited >= self.stall_abort:
            text = stall_report.stalled(wait, self.stall_abort, peers, self, final=True)
            runtime.end_job(1, text + _trace_report_local(wait))

    def _publish(self, wait: Wait | None, now: float) -> None:
        if self.board is None:
            return
        published = None
        if wait is not None:
            serial = wait.key[1] if wait.key is not None else -1
            published = (serial, wait.seq, time.time() - (now - wait.since), wait.op)
        self.board.publish(_board.RUNNING, published, group_seqs())


def orphaned(rank: int, parent: int) -> None:
    """End this rank, whose launcher's process (pid ``parent``) is gone: its job is over.

    Not `fcoll.runtime.end_job`: ``MPI_Abort`` needs the launcher. The line may find stderr
    closed with the launcher; the rank ends either way.

    Example:
        >>> orphaned(1, 4242)       # hydra's proxy (pid 4242) was killed; on stderr, then exit 1
        [rank 1] fcoll: the launcher's process that started this rank (pid 4242) is gone ...
    """
    try:
        sys.stderr.write(f"[rank {rank}] fcoll: the launcher's process that started this rank "
                         f"(pid {parent}) is gone, and the job with it: this rank ends "
                         "(exit status 1; FCOLL_ABORT_ON_ERROR=0 turns this off)\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass
    os._exit(1)


def _trace_report_local(wait: Wait) -> str:
    from fcoll.diagnostics import flight_report  # the report's text helpers; no message is sent

    if not flight.RING:
        return ""
    return flight_report.local(f"this rank's record, stalled in {wait.op}")


WATCH: list[Watch] = []


def start(comm_world: Any) -> None:
    """Start this rank's watch and the node board (collective over ``comm_world``, at
    `fcoll.init`), in jobs of more than one process, unless every part of it is off."""
    warn = seconds_setting(WARN_ENV, DEFAULT_WARN)
    stall_abort = seconds_setting(ABORT_ENV, 0.0)
    ends = runtime.ends_jobs()
    if WATCH or comm_world.Get_size() == 1 or not (warn or stall_abort or ends):
        return
    node = _board.split_node(comm_world, _board.node_size_setting())
    board = _board.Board(node)
    board.publish(_board.RUNNING)
    WATCH.append(Watch(board, warn, stall_abort, ends))
    finalize.on_exit(finalize.BOARD, _stop)


def _stop() -> None:
    """At exit (`fcoll.runtime.finalize`): stop the thread, then free the board
    (collective over the node's ranks)."""
    watch = WATCH.pop()
    watch.stop()
    if watch.board is not None and not watch.thread.is_alive():
        watch.board.free()


def ended(reason: str, failed: bool) -> None:
    """This rank's script ended (``reason``): publish it with the last call number of each
    group, and end the job if a peer on this node waits in a call this rank never made."""
    if not WATCH or WATCH[0].board is None:
        return
    watch, board = WATCH[0], WATCH[0].board
    watch.stop()  # its ticks would publish RUNNING again while this rank waits at exit
    board.publish(_board.FAILED if failed else _board.ENDED, None, group_seqs(), reason)
    mine = {serial: (g.seq, g.ranks) for serial, g in list(_GROUPS.items())}
    if not watch.ends or stall_report.abandoned(mine, board.lines(), watch.rank, reason) is None:
        return
    # A line is as old as its rank's last tick: judge again on lines written since.
    if (text := stall_report.abandoned(mine, _fresh(board, watch.tick), watch.rank, reason)) is not None:
        runtime.end_job(1, text)


def _fresh(board: _board.Board, tick: float) -> list[_board.Line]:
    """The node's lines, each waiting one written after this call began: a line is as old as
    its rank's last tick, so a wait its rank has since left (a call that timed out, say) may
    still show. A rank that really waits writes its line again within a tick; the wait for
    that is bounded (three ticks), and taken only when the lines as they were found would
    end the job."""
    asked, until = time.time(), time.monotonic() + 3 * tick
    lines = board.lines()
    while any(line.waiting and line.written <= asked for line in lines) and time.monotonic() < until:
        time.sleep(min(0.02, tick))
        lines = board.lines()
    return lines
