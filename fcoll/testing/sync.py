"""The rank-synchronisation and hang detection behind `fcoll.testing`.

After each test every rank enters a nonblocking barrier on the plugin's own communicator
and sends rank 0 an "arrived" token. A watchdog thread per rank notices when a test runs
past its limit; it never calls MPI (fcoll runs MPI at ``serialized`` thread level), it only
reads the main thread's Python stack and writes a one-line state file into a directory
all ranks share. Rank 0 combines the tokens it received and those files into the report.
"""

from __future__ import annotations

import json
import linecache
import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

from fcoll.diagnostics import flight_report
from fcoll.groups.group import Group

_TESTING_DIR = Path(__file__).resolve().parent  # this plugin's own frames are not fcoll's
_FCOLL_DIR = _TESTING_DIR.parent
_ARRIVED_TAG = 7171
HANG_EXIT = 1  # pytest's "tests failed": a hang is reported as a failed test


def grace_seconds(limit: float) -> float:
    """How long rank 0 waits past the limit for late ranks and their state files."""
    return min(10.0, max(1.0, limit / 10))


def _in_fcoll(frame: FrameType) -> bool:
    name = str(Path(frame.f_code.co_filename).resolve())
    return name.startswith(str(_FCOLL_DIR)) and not name.startswith(str(_TESTING_DIR))


def _where(frame: FrameType) -> str:
    code = frame.f_code
    line = linecache.getline(code.co_filename, frame.f_lineno).strip()
    text = f"{os.path.relpath(code.co_filename)}:{frame.f_lineno} in {code.co_name}"
    return f"{text}: `{line}`" if line else text


# What a call is doing, by the file of the innermost Python frame (the compiled core's wait
# has no frame of its own: it shows as the fast path's closure or the segment's method).
_HOW = {"mpi.py": "blocked inside MPI", "work.py": "polling it until its deadline",
        "board.py": "blocked inside MPI (making the group's on-node shared-memory segment)",
        "segment.py": "waiting for its peers in the on-node shared-memory segment",
        "shm.py": "waiting for its peers in the on-node shared-memory segment",
        "_fast.py": "in its fast path (blocked inside MPI or waiting in the on-node segment)"}


def describe(frame: FrameType | None) -> str:
    """What the thread whose innermost frame is ``frame`` is doing, from fcoll's point of
    view: the fcoll call in progress (op, group, call number) or the code outside fcoll."""
    frames: list[FrameType] = []
    while frame is not None:
        frames.append(frame)
        frame = frame.f_back
    if not frames:
        return "no Python frame (the main thread has exited)"
    inside = [f for f in frames if _in_fcoll(f)]
    if not inside:
        return (f"outside fcoll (raw MPI or other blocking code) at {_where(frames[0])}")
    outer = inside[-1]
    groups = [v for f in inside for v in f.f_locals.values() if isinstance(v, Group)]
    on = f" (call #{groups[0].seq} on group ranks {list(groups[0].ranks)})" if groups else ""
    innermost = Path(frames[0].f_code.co_filename).name
    how = _HOW.get(innermost, f"at {_where(frames[0])}")
    caller = frames[frames.index(outer) + 1] if frames.index(outer) + 1 < len(frames) else None
    called = f", called at {_where(caller)}" if caller is not None else ""
    return f"in fcoll {outer.f_code.co_name}{on}, {how}{called}"


@dataclass
class Phase:
    """One watched stretch of the session: a test from setup to teardown, collection, or
    the end of the session."""

    label: str
    index: int
    limit: float
    deadline: float
    arrived: bool = False
    taken: bool = False  # the watchdog reports it (the main thread is stuck)
    notes: list[str] = field(default_factory=list)  # this rank's failures, one line each


class Watchdog:
    """A daemon thread that, once a phase passes its limit, records this rank's state and,
    if this rank is stuck, reports (rank 0) or ends the job (other ranks)."""

    def __init__(self, comm: Any, hang_dir: Path | None,
                 emit: Callable[[str, dict[int, str]], None]) -> None:
        self.rank, self.size = comm.Get_rank(), comm.Get_size()
        self.comm, self.hang_dir, self.emit = comm, hang_dir, emit
        self.stderr = os.dup(2)  # pytest's capture redirects fd 2 during tests, not this one
        self.phase: Phase | None = None
        self.traces: dict[int, list[Any]] = {}  # the ranks' flight records, from their state files
        self._cond = threading.Condition()
        self._main = threading.get_ident()
        threading.Thread(target=self._run, name="fcoll.testing watchdog", daemon=True).start()

    def say(self, text: str) -> None:
        """Write ``[rank R] text`` to this rank's real stderr, even while pytest captures."""
        os.write(self.stderr, f"[rank {self.rank}] {text}\n".encode(errors="replace"))

    def arm(self, label: str, index: int, limit: float) -> None:
        with self._cond:
            self.phase = Phase(label, index, limit, time.monotonic() + limit)
            self._cond.notify()

    def arrive(self) -> bool:
        """Mark the main thread at the barrier; False if the watchdog already took over."""
        with self._cond:
            assert self.phase is not None
            if self.phase.taken:
                return False
            self.phase.arrived = True
            return True

    def disarm(self) -> None:
        with self._cond:
            self.phase = None
            self._cond.notify()

    def _wait_until(self, phase: Phase, when: float) -> bool:
        """Sleep until ``when``; False if the phase ended (disarmed or re-armed) first."""
        with self._cond:
            while self.phase is phase and time.monotonic() < when:
                self._cond.wait(when - time.monotonic())
            return self.phase is phase

    def _run(self) -> None:
        while True:
            with self._cond:
                while self.phase is None:
                    self._cond.wait()
                phase = self.phase
            if not self._wait_until(phase, phase.deadline):
                continue
            self._expired(phase)

    def _expired(self, phase: Phase) -> None:
        grace = grace_seconds(phase.limit)
        frame = sys._current_frames().get(self._main)
        state = ("finished it and is waiting for the others" if phase.arrived
                 else describe(frame))
        if phase.notes:
            state += "; it failed there: " + " | ".join(phase.notes)
        self._write_state(phase, finished=phase.arrived, state=state)
        if phase.arrived:
            self._wait_until(phase, float("inf"))  # the main thread handles it
            return
        self.say(f"{phase.label}: still running after {phase.limit:g} s: {state}")
        final = phase.deadline + (grace if self.rank == 0 else 3 * grace)
        if not self._wait_until(phase, final):
            return
        with self._cond:
            if phase.arrived:
                return
            phase.taken = True
        if self.rank == 0:
            missing, states = self.read_states(phase, {0})
            flight = self.flight_record(phase.label)
            self.emit(phase.label, {r: hang_report(phase.label, phase.limit, missing, states, r,
                                                   flight) for r in missing})
        os._exit(HANG_EXIT)  # MPI cannot be called here; mpiexec ends the other ranks

    def _write_state(self, phase: Phase, *, finished: bool, state: str) -> None:
        if self.hang_dir is None:
            return
        try:
            path = self.hang_dir / f"{phase.index}-rank{self.rank}.json"
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps({"finished": finished, "state": state,
                                       "trace": flight_report.snapshot()}))
            tmp.replace(path)
        except OSError:
            pass

    def read_states(self, phase: Phase, missing: set[int]) -> tuple[list[int], dict[int, str]]:
        """The ranks that did not finish (``missing`` plus those whose state file says so)
        and every rank's state as far as the files tell."""
        states: dict[int, str] = {}
        self.traces = {}
        if self.hang_dir is None:
            return sorted(missing), states
        for rank in range(self.size):
            try:
                data = json.loads((self.hang_dir / f"{phase.index}-rank{rank}.json").read_text())
            except (OSError, ValueError):
                continue
            states[rank] = str(data["state"])
            self.traces[rank] = [((tuple(e[0][0]), e[0][1]), *e[1:]) for e in data.get("trace", [])]
            if not data["finished"]:
                missing.add(rank)
        return sorted(missing), states

    def flight_record(self, label: str) -> str:
        """Every rank's flight record from its state file, side by side (`fcoll.debug`)."""
        if not self.traces:
            return ""
        silent = [r for r in range(self.size) if r not in self.traces]
        return flight_report.report(self.traces, silent, f"hang in {label}", 0.0)


def _short(state: str) -> str:
    return state.split(", called at")[0]


def hang_report(label: str, limit: float, missing: list[int], states: dict[int, str],
                rank: int, flight: str = "") -> str:
    """The failure text for ``rank``, one of the ``missing`` ranks that did not finish a
    phase in time; its first line is the one-line summary."""
    lines = [f"did not finish within {limit:g} s: {_short(states.get(rank, 'state unknown'))}", "",
             f"{label}: not finished within the {limit:g} s limit (mpi_timeout) on ranks "
             f"{missing}.", "What each rank was doing when the limit passed:"]
    for other in sorted(set(states) | set(missing)):
        lines.append(f"  rank {other}: " + states.get(
            other, "did not report its state (no shared filesystem, or the rank died); "
                   "see its stderr"))
    if flight:
        lines += ["", flight]
    lines += ["", "A rank blocked inside a blocking MPI call cannot be interrupted: the job "
              "is ended with MPI_Abort. Set a deadline (fcoll.init(timeout=...)) to turn a "
              "stuck fcoll call into a CollectiveTimeoutError instead."]
    return "\n".join(lines)


@dataclass
class Hang:
    """Some ranks did not finish a phase in time: which, and the failure text of each."""

    missing: list[int]
    texts: dict[int, str]


def sync(watch: Watchdog) -> Hang | None:
    """Wait, without blocking in MPI, until every rank reaches this point of the phase.

    Returns None once all ranks arrived. If the phase's limit (plus a grace) passes first,
    rank 0 returns the `Hang`; the other ranks keep waiting for rank 0 to end the job, and
    abort it themselves if rank 0 does not.
    """
    phase = watch.phase
    assert phase is not None
    if not watch.arrive():
        while True:  # the watchdog reports and ends this process
            time.sleep(1)
    comm, rank, size = watch.comm, watch.rank, watch.size
    token = bytearray(phase.index.to_bytes(8, "little"))
    barrier = comm.Ibarrier()
    if rank == 0:
        buffers = [bytearray(8) for _ in range(size)]
        tokens = [comm.Irecv([buffers[r], _byte()], r, _ARRIVED_TAG) for r in range(1, size)]
    else:
        tokens = [comm.Isend([token, _byte()], 0, _ARRIVED_TAG)]
    grace = grace_seconds(phase.limit)
    end = phase.deadline + grace
    pause = 1e-5
    while not barrier.Test():
        now = time.monotonic()
        if now > end:
            if rank == 0:
                arrived = {0} | {r for r, t in zip(range(1, size), tokens, strict=True) if t.Test()}
                if len(arrived) == size:
                    barrier.Wait()
                    break
                missing, states = watch.read_states(phase, set(range(size)) - arrived)
                flight = watch.flight_record(phase.label)
                return Hang(missing, {r: hang_report(phase.label, phase.limit, missing, states, r,
                                                     flight) for r in missing})
            if now > phase.deadline + 4 * grace:
                watch.say(f"{phase.label}: rank 0 did not end the job after the hang; aborting it")
                comm.Abort(HANG_EXIT)
        time.sleep(pause)
        pause = min(2 * pause, 1e-2)
    for request in tokens:
        request.Wait()
    watch.disarm()
    return None


def _byte() -> Any:
    from fcoll.runtime import mpi

    return mpi().BYTE
