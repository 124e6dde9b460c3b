"""One engine thread per process that runs deferred collectives in issue order, so the
caller keeps computing while they communicate (the torch backend's asynchronous work:
``async_op=True``, DDP's buckets, FSDP's gathers and reduce-scatters).

A `Job` is a function that runs one collective (its local checks already done by the
caller). `Engine.submit` queues it and wakes the engine thread; `Engine.inline` runs one at
once in the calling thread when nothing is queued or running (a synchronous call keeps
its latency: no thread hand-off), else after the jobs issued before it. `Engine.wait`
waits for a job, and runs queued jobs itself when the engine thread is not running one
(a caller that waits at once takes its job back from the queue). Exactly one job runs at
a time, in the order jobs were issued, whichever thread runs it: MPI stays at
``MPI_THREAD_SERIALIZED`` and the groups' call state (`fcoll.calls.work.Call`) is never
shared between threads. A job's ``done`` callback runs after the job, outside that
exclusion: it may submit and wait for more jobs (torch's ``Future.then`` callbacks, comm
hooks that call collectives). Before it runs the callback, the thread makes sure another
engine thread is free (`Engine._spare`): a callback may block on a later job's future.

While jobs are queued or running, fcoll's own eager calls from other threads first wait
for them (`drain`, through `fcoll.runtime.add_before_call`), so they follow the work issued
before them. At exit the engine drains before fcoll frees what it made in MPI
(`fcoll.runtime.finalize`); before a ``fork`` it drains, and a forked child starts with an
empty engine and no thread.

Example:
    >>> job = ENGINE.submit(lambda: fc.all_reduce(x))     # every rank; returns at once
    >>> y = model(z)                                      # runs while x is reduced
    >>> ENGINE.wait(job); job.value                       # the sum
"""

from __future__ import annotations

import os
import sys
import threading
from collections import deque
from collections.abc import Callable
from typing import Any

from fcoll import runtime
from fcoll.runtime import finalize

MAX_IDLE = 2  # engine threads kept waiting for jobs (one runs callbacks while another is free)


class Job:
    """One deferred collective: ``run()`` gives ``value`` or raises ``error``; ``done(job)``
    runs once after it, in the thread that ran it. ``first``: issued from a job's callback,
    so it runs before the jobs the other threads issued (see `Engine`).

    Example:
        >>> job = Job(lambda: 42)
        >>> ENGINE.wait(ENGINE.submit_job(job)); job.value
        42
    """

    __slots__ = ("done", "error", "finished", "first", "run", "value")

    def __init__(self, run: Callable[[], Any], done: Callable[[Job], None] | None = None) -> None:
        self.run, self.done = run, done
        self.value: Any = None
        self.error: BaseException | None = None
        self.finished = False
        self.first = False

    def result(self) -> Any:
        """``value``, or ``error`` raised (after the job finished)."""
        if self.error is not None:
            raise self.error
        return self.value


class Engine:
    """The queue of deferred jobs and the threads that run them (one per process: `ENGINE`).

    One job runs at a time, in issue order. While a job's callbacks run (``done``: torch's
    ``Future.then`` callbacks), no job issued by another thread starts; the jobs the
    callbacks issue run first, in the order issued. So a comm hook that issues collectives
    from its callbacks (PowerSGD) makes the same sequence of calls on every rank, whatever
    the threads' timing: bucket 1, its hook's calls, bucket 2, ... A callback must not wait
    for work that another thread issued after its job.

    Example:
        >>> ENGINE.inline(lambda: fc.barrier())        # at once, in this thread, when idle
    """

    def __init__(self) -> None:
        self._cv = threading.Condition(threading.Lock())
        self._queue: deque[Job] = deque()
        self._firsts = 0  # jobs at the queue's head that callbacks issued
        self._callbacks = 0  # jobs' callbacks running now
        self._running: threading.Thread | None = None  # the thread running a job now
        self._threads = 0  # engine threads alive
        self._idle = 0     # of them, waiting for a job
        self._generation = 0  # a forked child's engine starts a new one
        self._local = threading.local()  # .depth: running a job; .callbacks: running callbacks
        self.last: Job | None = None  # the latest job issued
        self.ran = {"engine": 0, "caller": 0, "inline": 0}  # who ran the jobs (tests, bench)

    # -- issuing -------------------------------------------------------------------------
    def submit(self, run: Callable[[], Any], done: Callable[[Job], None] | None = None) -> Job:
        """Queue ``run`` as a job; an engine thread runs it after those issued before it."""
        return self.submit_job(Job(run, done))

    def submit_job(self, job: Job) -> Job:
        """Queue ``job`` (see `submit`)."""
        with self._cv:
            if getattr(self._local, "callbacks", 0):
                job.first = True
                self._queue.insert(self._firsts, job)
                self._firsts += 1
            else:
                self._queue.append(job)
                self.last = job
            if self._threads == 0:
                self._start()
            self._cv.notify_all()
        runtime.add_before_call(self.drain)
        return job

    def inline(self, run: Callable[[], Any]) -> Any:
        """Run ``run`` now in this thread, after every job issued before (none: at once),
        and return its value; nothing else runs meanwhile."""
        me = threading.current_thread()
        if getattr(self._local, "depth", 0):  # inside a job: it holds the engine already
            return run()
        self._settle(me)
        self.ran["inline"] += 1
        self._enter()
        try:
            return run()
        finally:
            self._leave()
            with self._cv:
                self._running = None
                self._cv.notify_all()

    # -- waiting -------------------------------------------------------------------------
    def wait(self, job: Job) -> None:
        """Return once ``job`` finished (its ``done`` callback too), running queued jobs
        in this thread while no engine thread does."""
        self._help_until(lambda: job.finished)

    def drain(self) -> None:
        """Return once every job issued so far has finished, callbacks too (at once from
        inside a job or a callback). Run before fcoll's eager calls while the engine has
        work (`runtime.add_before_call`); an idle engine takes the wait off again."""
        if getattr(self._local, "depth", 0) or getattr(self._local, "callbacks", 0):
            return
        me = threading.current_thread()
        self._settle(me)
        with self._cv:
            self._running = None
            self._cv.notify_all()
        runtime.remove_before_call(self.drain)

    def busy(self) -> bool:
        """Whether a job is queued or running, or callbacks run."""
        with self._cv:
            return bool(self._queue) or self._running is not None or self._callbacks > 0

    # -- running -------------------------------------------------------------------------
    def _settle(self, me: threading.Thread) -> None:
        """Run or wait for the jobs this thread must follow, then hold the engine (``_running``
        is ``me``): from a callback, the jobs callbacks issued; else every job, and no
        callback running."""
        in_callback = bool(getattr(self._local, "callbacks", 0))

        def hold() -> bool:
            done = (self._firsts == 0) if in_callback else (not self._queue and self._callbacks == 0)
            if self._running is None and done:
                self._running = me
                return True
            return False

        self._help_until(hold)

    def _help_until(self, ready: Callable[[], bool]) -> None:
        """Run queued jobs in this thread (while no other thread runs one) until ``ready()``,
        checked holding ``_cv``, says so; wait for the other threads meanwhile."""
        me = threading.current_thread()
        while True:
            with self._cv:
                if ready():
                    return
                nxt = self._take(me)
                if nxt is None:
                    self._cv.wait()
                    continue
            self.ran["caller"] += 1
            self._execute(nxt)

    def _take(self, me: threading.Thread) -> Job | None:
        """The next job ``me`` may run (then marked running), or None: another thread runs
        one, nothing is queued, or callbacks run and the head is not theirs. Holds ``_cv``."""
        if not self._queue or self._running is not None:
            return None
        if self._callbacks and not self._queue[0].first:
            return None
        self._running = me
        job = self._queue.popleft()
        self._firsts -= job.first
        return job

    def _execute(self, job: Job) -> None:
        """Run ``job`` (marked running by `_take`), then its callback outside the exclusion."""
        self._enter()
        try:
            job.value = job.run()
        except BaseException as error:  # (the waiter raises it)
            job.error = error
        finally:
            self._leave()
            with self._cv:
                self._running = None
                job.finished = True
                if job.done is not None:
                    self._callbacks += 1
                    self._spare()
                self._cv.notify_all()
        if job.done is not None:
            self._local.callbacks = getattr(self._local, "callbacks", 0) + 1
            try:
                job.done(job)
            except BaseException as error:  # the engine must go on
                sys.stderr.write(f"fcoll engine: a job's completion callback raised {error!r}\n")
            finally:
                self._local.callbacks -= 1
                with self._cv:
                    self._callbacks -= 1
                    self._cv.notify_all()

    def _spare(self) -> None:
        """Make sure an engine thread is free to run jobs while this thread runs a job's
        callbacks: they may block on the future of a job they issued (PowerSGD's hook
        waits inside its ``then`` callback), which only another thread can run. Holds ``_cv``."""
        if self._idle == 0:
            self._start()

    def _enter(self) -> None:
        self._local.depth = getattr(self._local, "depth", 0) + 1

    def _leave(self) -> None:
        self._local.depth -= 1

    def _loop(self, generation: int) -> None:
        me = threading.current_thread()
        while True:
            with self._cv:
                job = self._take(me)
                while job is None:
                    if generation != self._generation or self._idle >= MAX_IDLE:
                        self._threads -= generation == self._generation
                        return  # a forked child's old engine, or enough spare threads
                    self._idle += 1
                    self._cv.wait()
                    self._idle -= 1
                    job = self._take(me)
            self.ran["engine"] += 1
            self._execute(job)

    def _start(self) -> None:
        """One more engine thread (called holding ``_cv``)."""
        self._threads += 1
        threading.Thread(target=self._loop, args=(self._generation,), name="fcoll engine",
                         daemon=True).start()

    def _after_fork(self) -> None:
        """In a forked child: no thread, nothing queued (the parent drained before)."""
        self._cv = threading.Condition(threading.Lock())
        self._queue.clear()
        self._firsts = self._callbacks = 0
        self._running = None
        self._threads = self._idle = 0
        self._generation += 1
        self._local = threading.local()
        self.last = None


ENGINE = Engine()


def _drain_at_exit() -> bool:
    ENGINE.drain()
    return True


finalize.on_exit(finalize.AGREE - 1, _drain_at_exit)
os.register_at_fork(before=lambda: _drain_at_exit() and None, after_in_child=ENGINE._after_fork)
