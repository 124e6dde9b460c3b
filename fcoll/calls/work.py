"""Async handles: `Work`, `wait_all`, and the per-group list of operations in flight.

A `Work` wraps one operation in flight: an MPI nonblocking request (collectives, isend)
or a matched-probe receive (irecv), plus the function that turns the received buffer into
the result. The group keeps every operation it started until it completes, so buffers
stay alive even when the caller drops its `Work`, and `barrier` can complete them.
"""

from __future__ import annotations

import abc
import os
import time
import warnings
from collections.abc import Callable, Iterable
from typing import Any, Generic, TypeVar

from fcoll import runtime
from fcoll.calls import traffic
from fcoll.calls.errors import check_notices, timed_out
from fcoll.diagnostics import flight, flight_report
from fcoll.runtime import Timeout, to_seconds

R = TypeVar("R")  # what a `Work` gives: the collective's result (``Work[A]``)
R_co = TypeVar("R_co", covariant=True)


class Call:
    """The public call in progress on a group: what the transport needs besides buffers.

    `fcoll.groups.membership.member` fills in the group's one `Call` at the start of each public call
    (cheaper than a new object on the small-message path) and it is passed down to the
    transport, which keeps no per-call state of its own:

    - ``comm``: the group's MPI communicator; ``group``: the `fcoll.groups.group.Group`;
    - ``fn``: the public function's name, for errors;
    - ``seconds``/``start``: the call's deadline (``None``: no deadline, MPI's blocking
      forms) and when the call began (``time.monotonic``);
    - ``counted``: whether the group's call number (``group.seq``) has counted this call.
      The transport's first operation counts it (`begin`), so a call that fails its local
      checks is not counted and the numbers stay equal across ranks;
    - ``check``: what must run before the call's first operation, or ``None``. The GPU
      path (`fcoll.gpu.route`) leaves its ``debug="detail"`` comparison here, since its
      local checks and its first message are spread over many functions;
    - ``args``/``slot``: the call's arguments as the flight recorder keeps them (set by the
      local checks, `fcoll.groups.detail.checked`) and its entry there (`fcoll.diagnostics.flight`; -1: none).
    """

    __slots__ = ("args", "check", "comm", "counted", "fn", "group", "seconds", "slot", "start")

    def __init__(self, group: Any, comm: Any) -> None:
        self.group, self.comm, self.fn = group, comm, ""
        self.seconds: float | None = None
        self.start = 0.0
        self.counted = True
        self.check: Callable[[], None] | None = None
        self.args: dict[str, object] | None = None
        self.slot = -1

    def begin(self, nbytes: int = -1) -> Any:
        """Count the call on its group (once) and return the communicator to use; a
        pending ``check`` runs first (once; it may communicate on this call, counting it).
        The flight recorder gets the call at its first message (in flight again at each
        later one, until `end`). ``nbytes`` >= 0: one MPI call sending that many bytes
        follows (`fcoll.calls.traffic`)."""
        if traffic.ACTIVE and nbytes >= 0:
            comm = self.begin()
            traffic.sent(self, nbytes)
            return comm
        if not self.counted:
            if self.check is not None:
                check, self.check = self.check, None
                check()
                if self.counted:
                    return self.comm
            self.counted = True
            self.group.seq += 1
            if flight.RING:
                self.slot = flight.RING.record(self.group.key, self.group.seq, self.fn,
                                               flight.summarize(self.args))
                self.args = None
        elif self.slot >= 0:
            flight.reopen(self.slot)
        return self.comm

    def end(self) -> None:
        """The call's message completed (the flight recorder's end time). A call with a
        deadline first checks that no peer gave up on it (`fcoll.calls.notices`)."""
        if self.seconds is not None:
            check_notices(self)
        if self.slot >= 0:
            flight.end(self.slot)


def fast_eligible(g: Any) -> bool:
    """Whether calls on ``g`` may take a fast path (`fcoll.collectives._fast`,
    `fcoll.gpu.fast`): ``g`` is a live group (the world or another) of a healthy job, with no
    deadline and no debug checks."""
    s = runtime._state
    return (g.usable and s.world.usable and not s.checking and s.timeout is None
            and g.timeout is None and s.before_call is None and not s.counting)


SPIN_SECONDS = 2e-3  # busy-poll this long before sleeping between polls


def backoff(started: float, pause: float) -> float:
    """Sleep (after the first ``SPIN_SECONDS`` of busy polling) and return the next pause.

    A sleep lasts at least ~50 µs on Linux, far longer than a small collective takes, so
    polls spin at first, as MPI's own blocking calls do, then back off to at most 1 ms.
    With more ranks than cores the spin yields the core at every poll (dp averaging of
    100 leaves at n=4 on 2 cores, 400 B: 2.5 ms -> see docs/performance.md).
    """
    if time.monotonic() - started < SPIN_SECONDS:
        if runtime.OVERSUBSCRIBED:  # the peer we wait for may need this core
            os.sched_yield()
        return pause
    time.sleep(pause)
    return min(2 * pause, 1e-3)


def wait_request(request: Any, call: Call) -> None:
    """Poll ``request`` until it completes; `CollectiveTimeoutError` once ``call.seconds`` passed."""
    pause, started = 1e-5, time.monotonic()
    seconds = call.seconds if call.seconds is not None else float("inf")
    while not request.Test():
        if time.monotonic() - call.start > seconds:
            flight.fail(call.slot)
            ABANDONED.append(request)  # it holds the buffers MPI may still touch
            raise timed_out(call.fn, call.group, seconds, call.group.seq)
        pause = backoff(started, pause)
        flight_report.serve()  # a report in progress elsewhere gets this rank's record
        check_notices(call)
    call.end()


# Requests left in flight by calls that missed their deadline: kept (with the buffers they
# hold) for the life of the process, since MPI cannot cancel a collective and a late peer
# may still complete it.
ABANDONED: list[Any] = []


def wait_requests(requests: list[Any], call: Call) -> None:
    """Complete every request: MPI's ``Waitall`` without a deadline, else each polled
    against ``call``'s deadline (`wait_request`)."""
    if call.seconds is None:
        runtime.mpi().Request.Waitall(requests)
        call.end()
        return
    for request in requests:
        wait_request(request, call)


class Operation(abc.ABC):
    """One operation in flight. Subclasses implement `_advance` (non-blocking progress).

    ``needs_polling``: the operation only moves when this process advances it (an `irecv`
    posts its receive once it has probed the header), so while it is pending, waiting for
    anything else on the group polls everything instead of blocking in MPI.
    """

    needs_polling = False

    def __init__(self, name: str, group: Any) -> None:
        self.name = name
        self.group = group
        self.done = False
        self.value: Any = None
        self.source: int | None = None
        self.seq = group.seq
        group.pending.append(self)

    @abc.abstractmethod
    def _advance(self) -> bool:
        """Make progress without blocking; True once ``value`` is set."""

    def _block(self) -> None:
        """Block until complete (subclasses with a blocking form override it)."""
        self._poll(None)

    def test(self) -> bool:
        if not self.done and self._advance():
            self._complete()
        return self.done

    def finish(self, timeout: float | None) -> Any:
        """Complete the operation (within ``timeout`` seconds if given) and return its value.

        Without a deadline it blocks in MPI when that is safe: this is the oldest operation
        of the group in flight (a peer that waits for an older one first advances it, as
        this process's own wait would not) and none in flight needs polling. Otherwise it
        polls and advances the others too: an `irecv` is only posted once probed, and a
        peer's (or this rank's own) `isend` may need it before this operation can complete.
        """
        if self.done:
            return self.value
        pending = self.group.pending
        if timeout is None and (not pending or pending[0] is self) and not any(
                op.needs_polling for op in pending if op is not self):
            self._block()
        else:
            self._poll(timeout)
        if not self.done:  # polling the others may have completed this one already
            self._complete()
        return self.value

    def _poll(self, timeout: float | None) -> None:
        started = time.monotonic()
        deadline = None if timeout is None else started + timeout
        pause = 1e-5
        while not self.done and not self._advance():
            for other in list(self.group.pending):
                if other is not self:
                    other.test()
            if deadline is not None and timeout is not None and time.monotonic() > deadline:
                raise timed_out(self.name, self.group, timeout, self.seq)
            pause = backoff(started, pause)

    def _complete(self) -> None:
        self.done = True
        pending = self.group.pending
        if pending and pending[0] is self:
            del pending[0]
        elif self in pending:
            pending.remove(self)


class RequestOperation(Operation):
    """An MPI request plus the function that makes the result once it completes."""

    def __init__(self, name: str, group: Any, request: Any, result: Callable[[], Any],
                 keep: tuple[Any, ...] = ()) -> None:
        super().__init__(name, group)
        self._request = request
        self._result = result
        self._keep = keep  # buffers MPI reads or writes until completion

    def _advance(self) -> bool:
        if self._request.Test():
            self.value = self._result()
            return True
        return False

    def _block(self) -> None:
        self._request.Wait()
        self.value = self._result()


class Work(Generic[R_co]):
    """Handle of an ``async_op=True`` call (or `isend`/`irecv`); a ``Work[A]``'s `wait` gives an ``A``.

    Example:
        >>> w = fc.all_reduce(np.ones(2), async_op=True)   # every rank
        >>> ...                                            # overlap other work here
        >>> w.wait()                                       # 2 ranks
        array([2., 2.])
    """

    def __init__(self, op: Operation, then: Callable[[Any], R_co] | None = None,
                 parent: Work[Any] | None = None) -> None:
        self._op = op
        self._then = then
        self._parent = parent
        self._waited = False
        self._has_value = False
        self._value: Any = None

    def wait(self, timeout: Timeout = None) -> R_co:
        """Block until the operation completes and return its result.

        ``timeout`` (seconds or `datetime.timedelta`; default: `fcoll.init`'s) raises
        `CollectiveTimeoutError` if it passes first; the operation stays in flight.

        Example:
            >>> w = fc.broadcast(np.array([fc.get_rank()]), src=1, async_op=True)
            >>> w.wait(timeout=10)        # rank 0 held [0], rank 1 held [1]; both get
            array([1])
        """
        self._waited = True
        if self._has_value:
            return self._value  # type: ignore[no-any-return]
        if (before := runtime.settings().before_call) is not None:  # jitted collectives
            before()
        if timeout is None:
            group_timeout = self._op.group.timeout
            seconds = group_timeout if group_timeout is not None else runtime.settings().timeout
        else:
            seconds = to_seconds(timeout, "wait")
        value: R_co = self._parent.wait(seconds) if self._parent is not None else self._op.finish(seconds)
        if self._then is not None:
            value = self._then(value)
        self._value, self._has_value = value, True
        return value

    def is_completed(self) -> bool:
        """Whether the operation has completed (makes progress; never blocks).

        Example:
            >>> w = fc.all_reduce(np.ones(2), async_op=True)     # every rank
            >>> while not w.is_completed():
            ...     do_some_local_work()
            >>> w.wait()                                       # 2 ranks: no waiting left
            array([2., 2.])
        """
        return self._op.test()

    def then(self, fn: Callable[[R_co], R]) -> Work[R]:
        """A `Work` whose result is ``fn(result)``; ``fn`` runs in the waiting thread.

        Example:
            >>> w = fc.all_reduce(np.array([fc.get_rank() + 1]), async_op=True)
            >>> w.then(lambda y: y * 10).wait()     # rank 0 held [1], rank 1 [2]; both get
            array([30])
        """
        self._waited = True  # the chained Work takes over the duty to wait
        return Work(self._op, fn, self)

    def source_rank(self) -> int:
        """The group rank a completed `irecv` received from.

        Example:
            >>> if fc.get_rank() == 2: fc.send(np.arange(3), dst=0)
            >>> if fc.get_rank() == 0:
            ...     w = fc.irecv()                     # from any rank
            ...     w.wait(), w.source_rank()
            (array([0, 1, 2]), 2)
        """
        if not self._op.done or self._op.source is None:
            raise ValueError("source_rank: expected a completed irecv, "
                             f"got a {'pending' if not self._op.done else 'non-receive'} "
                             f"{self._op.name}")
        return self._op.source

    def __del__(self) -> None:
        if not self._waited and not self._op.done:
            warnings.warn(f"fcoll.Work for {self._op.name} on {self._op.group!r} was never "
                          "waited; call wait() (or barrier()) before dropping it",
                          ResourceWarning, stacklevel=1)

    def __repr__(self) -> str:
        state = "completed" if self._op.done else "pending"
        return f"Work({self._op.name}, {state})"


def map_arrays(value: Any, is_array: Callable[[Any], bool], fn: Callable[[Any], Any]) -> Any:
    """``value`` with ``fn`` applied to each array in it (``is_array``), also inside lists,
    tuples and `Work` results (where ``fn`` runs when the result is waited for).

    Example:
        >>> map_arrays([np.ones(2), (np.zeros(3),)], lambda v: isinstance(v, np.ndarray), len)
        [2, (3,)]
    """
    if is_array(value):
        return fn(value)
    if isinstance(value, list):
        return [map_arrays(v, is_array, fn) for v in value]
    if isinstance(value, tuple):
        return tuple(map_arrays(v, is_array, fn) for v in value)
    if isinstance(value, Work):
        return value.then(lambda result: map_arrays(result, is_array, fn))
    return value


def wait_all(works: Iterable[Work[R]], timeout: Timeout = None) -> list[R]:
    """Wait for every `Work` (in order) and return their results.

    Example:
        >>> ws = [fc.all_reduce(np.array([i]), async_op=True) for i in range(3)]
        >>> fc.wait_all(ws)                                   # 2 ranks
        [array([0]), array([2]), array([4])]
    """
    return [work.wait(timeout) for work in works]


def complete_pending(call: Call) -> None:
    """Complete every operation ``call``'s group has in flight, oldest first, by its deadline if any."""
    pending = call.group.pending
    while pending:
        left = None if call.seconds is None else call.seconds - (time.monotonic() - call.start)
        pending[0].finish(left if left is None else max(left, 0.0))
