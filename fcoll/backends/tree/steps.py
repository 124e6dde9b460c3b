"""How the tree schedules run: a schedule is a generator that posts point-to-point messages
and yields their requests; the driver completes them and resumes it.

- Blocking (`run`): each yielded list of requests is completed (MPI's ``Waitall`` without a
  deadline and with nothing else of the group in flight; else polled against the call's
  deadline, with peers' notices checked and the group's pending operations advanced, since
  they only move when this process moves them), then the schedule folds and posts its next
  step.
- Nonblocking (`Scheduled`): the same generator as a `fcoll.calls.work.Operation`, advanced
  by ``Work.test``/``wait`` (and by any wait on the group).

Messages travel on the group's communicator with a tag of their own (`tag`), from the top
of MPI's tag range: below it lie the tags of `fcoll.send`/`fcoll.recv` and fcoll's other
point-to-point steps, which never match these. A tag per call number lets calls in flight
together (async) keep their messages apart. Every send is counted for
`fcoll.debug.traffic`.

The fold of two buffers (`combine`) runs in the compiled core where it serves the dtype and
op (``_shmcore.combine``, the GIL released), else in numpy's ufunc loop.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Generator
from typing import Any, TypeVar

import numpy as np

from fcoll import runtime
from fcoll.backends import native
from fcoll.calls import traffic
from fcoll.calls.errors import check_notices, sizes_differ_end, timed_out
from fcoll.calls.work import ABANDONED, Call, Operation, backoff
from fcoll.diagnostics import flight, flight_report

T = TypeVar("T")
Requests = list[Any]
Schedule = Generator[Requests, None, T]

MPI = runtime.mpi()
BYTE = MPI.BYTE
TAGS = 1024  # tags for calls in flight together on one group
TOP = int(MPI.COMM_WORLD.Get_attr(MPI.TAG_UB))


def tag(seq: int) -> int:
    """The tag of the messages of call number ``seq`` of a group.

    Example:
        >>> tag(3) - tag(2)
        1
    """
    return TOP - TAGS + 1 + seq % TAGS


class Link:
    """One call's messages: its communicator, tag and (for `fcoll.debug.traffic`) call.

    ``eager``: a blocking call with no deadline and nothing else of its group in flight
    makes MPI's blocking calls at once (``Send``, ``Recv``, ``Sendrecv``: one call where the
    nonblocking form takes three) and hands the driver nothing to wait for. Every schedule
    orders its steps so that this is deadlock-free: a rank receives before it sends to a
    peer that sends to it first."""

    __slots__ = ("call", "comm", "eager", "tag")

    def __init__(self, call: Call, seq: int, eager: bool = False) -> None:
        self.call, self.comm, self.tag, self.eager = call, call.comm, tag(seq), eager

    def send(self, buf: np.ndarray, peer: int) -> Any:
        """Post the send of C-contiguous ``buf`` to group rank ``peer``."""
        if traffic.ACTIVE:
            traffic.sent(self.call, buf.nbytes)
        if self.eager:
            self.comm.Send([buf, BYTE], peer, self.tag)
            return None
        return self.comm.Isend([buf, BYTE], peer, self.tag)

    def recv(self, buf: np.ndarray, peer: int) -> Any:
        """Post the receive into C-contiguous ``buf`` from group rank ``peer``."""
        if self.eager:
            try:
                self.comm.Recv([buf, BYTE], peer, self.tag, STATUS)
            except MPI.Exception as error:
                raise truncated(self.call.fn, self.comm, peer, buf.nbytes, error) from None
            check_size(self.call, self.comm, peer, buf.nbytes)
            return None
        request = self.comm.Irecv([buf, BYTE], peer, self.tag)
        EXPECTED[id(request)] = (self.call.fn, self.comm, peer, buf.nbytes, request)
        return request

    def exchange(self, send: np.ndarray, recv: np.ndarray, peer: int) -> Requests:
        """Post both ways with ``peer``: receive first (MPI matches it as the send arrives)."""
        if self.eager:
            if traffic.ACTIVE:
                traffic.sent(self.call, send.nbytes)
            try:
                self.comm.Sendrecv([send, BYTE], peer, self.tag, [recv, BYTE], peer, self.tag,
                                   STATUS)
            except MPI.Exception as error:
                raise truncated(self.call.fn, self.comm, peer, recv.nbytes, error) from None
            check_size(self.call, self.comm, peer, recv.nbytes)
            return []
        return [self.recv(recv, peer), self.send(send, peer)]


STATUS = MPI.Status()  # of the last blocking receive (one thread calls MPI: serialized)
# What each posted receive expects, by id of its request (held here, so the id stays its
# own until the receive completes): (fn, comm, peer, bytes, request); see `checked`.
EXPECTED: dict[int, tuple[str, Any, int, int, Any]] = {}
_STATUSES: list[Any] = []


def checked(requests: Requests, test: bool = False) -> bool:
    """``Waitall`` (``test``: ``Testall``) on ``requests``, then every receive among them
    checked against the bytes it expected: `fcoll.calls.errors.sizes_differ` where a peer
    sent another size (more than fit: MPI's truncation). Whether they completed."""
    while len(_STATUSES) < len(requests):
        _STATUSES.append(MPI.Status())
    statuses = _STATUSES[: len(requests)]
    try:
        if test:
            if not MPI.Request.Testall(requests, statuses):
                return False
        else:
            MPI.Request.Waitall(requests, statuses)
    except MPI.Exception:
        wants = [EXPECTED.pop(id(request), None) for request in requests]
        for want, status in zip(wants, statuses, strict=True):
            if want is not None and MPI.Get_error_class(status.Get_error()) == MPI.ERR_TRUNCATE:
                raise sizes_differ_end(want[0], want[1], want[2], None, want[3]) from None
        raise
    wants = [EXPECTED.pop(id(request), None) for request in requests]
    for want, status in zip(wants, statuses, strict=True):
        if want is not None and status.Get_count(BYTE) != want[3]:
            raise sizes_differ_end(want[0], want[1], want[2], status.Get_count(BYTE), want[3])
    return True


def check_size(call: Call, comm: Any, peer: int, want: int) -> None:
    """`fcoll.calls.errors.sizes_differ` unless the last blocking receive (`STATUS`) brought
    ``want`` bytes: ranks that passed different sizes raise instead of folding garbage."""
    got = STATUS.Get_count(BYTE)
    if got != want:
        raise sizes_differ_end(call.fn, comm, peer, got, want)


def truncated(fn: str, comm: Any, peer: int, want: int, error: Any) -> Exception:
    """MPI's truncation error (the peer sent more than ``want`` bytes) as
    `fcoll.calls.errors.sizes_differ`; any other MPI error as it is."""
    if error.Get_error_class() == MPI.ERR_TRUNCATE:
        return sizes_differ_end(fn, comm, peer, None, want)
    return error  # type: ignore[no-any-return]


_COMBINE: dict[tuple[Any, np.ufunc], Callable[..., Any] | None] = {}
runtime.on_change(_COMBINE.clear)  # FCOLL_NATIVE may have changed


def _kernel(dtype: np.dtype[Any], ufunc: np.ufunc) -> Callable[..., Any] | None:
    """``out = a op b`` by the compiled core for ``dtype`` and ``ufunc``, or None."""
    key = (dtype, ufunc)
    if key not in _COMBINE:
        kernel = native.kernel(dtype, ufunc, False, None)
        core = native.module() if native.running() else None
        fold = getattr(core, "combine", None)
        if kernel is None or fold is None or kernel[0] in (native.T_F16, native.T_BF16):
            _COMBINE[key] = None
        else:
            kind, op = kernel[0], kernel[1]
            _COMBINE[key] = lambda out, a, b: fold(out, a, b, kind, op)
    return _COMBINE[key]


def combine(ufunc: np.ufunc, a: np.ndarray, b: np.ndarray, out: np.ndarray) -> np.ndarray:
    """``out = a op b`` elementwise (``out`` may be ``a`` or ``b``), C-contiguous, one dtype.

    Example:
        >>> combine(np.add, np.ones(2), np.ones(2), np.empty(2))
        array([2., 2.])
    """
    fold = _kernel(out.dtype, ufunc) if out.size >= 256 else None
    if fold is None:
        ufunc(a, b, out=out)
    else:
        fold(out, a, b)
    return out


def run(call: Call, schedule: Schedule[T]) -> T:
    """Run ``schedule`` to its end for the blocking ``call`` (module docstring); its value."""
    try:
        requests = next(schedule)
        while True:
            complete(call, requests)
            requests = schedule.send(None)
    except StopIteration as done:
        call.end()
        return done.value  # type: ignore[no-any-return]


def complete(call: Call, requests: Requests) -> None:
    """Complete ``requests``: ``Waitall`` when nothing else can need this process, else polled."""
    if not requests or requests[0] is None:  # an eager link's: done
        return
    if call.seconds is None and not call.group.pending:
        checked(requests)
        return
    seconds = call.seconds if call.seconds is not None else float("inf")
    pause, started = 1e-5, time.monotonic()
    while not checked(requests, test=True):
        if time.monotonic() - call.start > seconds:
            flight.fail(call.slot)
            ABANDONED.extend(requests)  # they hold buffers MPI may still touch
            raise timed_out(call.fn, call.group, seconds, call.group.seq)
        for other in list(call.group.pending):
            other.test()
        pause = backoff(started, pause)
        flight_report.serve()
        check_notices(call)


class Scheduled(Operation):
    """A schedule in flight for ``async_op=True``: ``finish(value)`` makes the result."""

    needs_polling = True  # it moves only when this process resumes it

    def __init__(self, name: str, group: Any, schedule: Schedule[Any],
                 finish: Callable[[Any], Any]) -> None:
        super().__init__(name, group)
        self._schedule, self._finish = schedule, finish
        self._over = False
        self._requests: Requests = self._step(first=True)

    def _step(self, first: bool = False) -> Requests:
        """Fold and post the next step (the first: post only); at the end, the result."""
        try:
            return next(self._schedule) if first else self._schedule.send(None)
        except StopIteration as done:
            self.value = self._finish(done.value)
            self._over = True
            return []

    def _advance(self) -> bool:
        while not self._over:
            if not checked(self._requests, test=True):
                return False
            self._requests = self._step()
        return True

    def _block(self) -> None:
        while not self._over:
            checked(self._requests)
            self._requests = self._step()
