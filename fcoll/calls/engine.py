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
hooks that call collectives).

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


class Job:
    """One deferred collective: ``run()`` gives ``value`` or raises ``error``; ``done(job)``
    runs once after it, in the thread that ran it.

    Example:
        >>> job = Job(lambda: 42)
        >>> ENGINE.wait(ENGINE.submit_job(job)); job.value
        42
    """

    __slots__ = ("done", "error", "finished", "run", "value")

    def __init__(self, run: Callable[[], Any], done: Callable[[Job], None] | None = None) -> None:
        self.run, self.done = run, done
        self.value: Any = None
        self.error: BaseException | None = None
        self.finished = False

    def result(self) -> Any:
        """``value``, or ``error`` raised (after the job finished)."""
        if self.error is not None:
            raise self.error
        return self.value


class Engine:
    """The queue of deferred jobs and the thread that runs them (one per process: `ENGINE`).

    Example:
        >>> ENGINE.inline(lambda: fc.barrier())        # at once, in this thread, when idle
    """

    def __init__(self) -> None:
        self._cv = threading.Condition(threading.Lock())
        self._queue: deque[Job] = deque()
        self._running: threading.Thread | None = None  # the thread running a job now
        self._thread: threading.Thread | None = None
        self._local = threading.local()  # .depth > 0: this thread is running a job
        self.last: Job | None = None  # the latest job issued
        self.ran = {"engine": 0, "caller": 0, "inline": 0}  # who ran the jobs (tests, bench)

    # -- issuing -------------------------------------------------------------------------
    def submit(self, run: Callable[[], Any], done: Callable[[Job], None] | None = None) -> Job:
        """Queue ``run`` as a job; the engine thread runs it after those issued before it."""
        return self.submit_job(Job(run, done))

    def submit_job(self, job: Job) -> Job:
        """Queue ``job`` (see `submit`)."""
        with self._cv:
            self._queue.append(job)
            self.last = job
            if self._thread is None:
                self._start()
            self._cv.notify_all()
        runtime.add_before_call(self.drain)
        return job

    def inline(self, run: Callable[[], Any]) -> Any:
        """Run ``run`` now in this thread, after every job issued before (none: at once),
        and return its value; nothing else runs meanwhile."""
        me = threading.current_thread()
        if not getattr(self._local, "depth", 0):
            self._finish_queue()
        with self._cv:
            while self._running is not None and self._running is not me:
                self._cv.wait()
            outer, self._running = self._running, me
        self.ran["inline"] += 1
        self._enter()
        try:
            return run()
        finally:
            self._leave()
            with self._cv:
                self._running = outer
                self._cv.notify_all()

    # -- waiting -------------------------------------------------------------------------
    def wait(self, job: Job) -> None:
        """Return once ``job`` finished (its ``done`` callback too), running queued jobs
        in this thread while the engine thread is not."""
        me = threading.current_thread()
        while not job.finished:
            with self._cv:
                if job.finished:
                    return
                outer = self._running
                nxt = self._take(me)
                if nxt is None:
                    self._cv.wait()
                    continue
            self.ran["caller"] += 1
            self._execute(nxt, outer if outer is me else None)

    def drain(self) -> None:
        """Return once every job issued so far has finished (at once from inside a job).
        Run before fcoll's eager calls while the engine has work (`runtime.add_before_call`);
        an idle engine takes the wait off again."""
        if getattr(self._local, "depth", 0):
            return
        self._finish_queue()
        with self._cv:
            idle = not self._queue and self._running is None
        if idle:
            runtime.remove_before_call(self.drain)

    def busy(self) -> bool:
        """Whether a job is queued or running."""
        with self._cv:
            return bool(self._queue) or self._running is not None

    # -- running -------------------------------------------------------------------------
    def _take(self, me: threading.Thread) -> Job | None:
        """The next queued job for ``me`` to run (marked running), or None while another
        thread runs one or nothing is queued. Called holding ``_cv``."""
        if not self._queue or (self._running is not None and self._running is not me):
            return None
        self._running = me
        return self._queue.popleft()

    def _finish_queue(self) -> None:
        last = self.last
        if last is not None and not last.finished:
            self.wait(last)

    def _execute(self, job: Job, outer: threading.Thread | None) -> None:
        """Run ``job`` (marked running by `_take`), then its callback outside the exclusion
        (``outer``: the thread that ran before, when a job waits for a later one)."""
        self._enter()
        try:
            job.value = job.run()
        except BaseException as error:
            job.error = error
        finally:
            self._leave()
            with self._cv:
                self._running = outer
                job.finished = True
                self._cv.notify_all()
        if job.done is not None:
            try:
                job.done(job)
            except BaseException as error:
                sys.stderr.write(f"fcoll engine: a job's completion callback raised {error!r}\n")

    def _enter(self) -> None:
        self._local.depth = getattr(self._local, "depth", 0) + 1

    def _leave(self) -> None:
        self._local.depth -= 1

    def _loop(self) -> None:
        me = threading.current_thread()
        while True:
            with self._cv:
                job = self._take(me)
                while job is None:
                    if self._thread is not me:  # reset after a fork, or stopped
                        return
                    self._cv.wait()
                    job = self._take(me)
            self.ran["engine"] += 1
            self._execute(job, None)

    def _start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="fcoll engine", daemon=True)
        self._thread.start()

    def _after_fork(self) -> None:
        """In a forked child: no thread, nothing queued (the parent drained before)."""
        self._cv = threading.Condition(threading.Lock())
        self._queue.clear()
        self._running = None
        self._thread = None
        self._local = threading.local()
        self.last = None


ENGINE = Engine()


def _drain_at_exit() -> bool:
    ENGINE._finish_queue()
    return True


finalize.on_exit(finalize.AGREE - 1, _drain_at_exit)
os.register_at_fork(before=lambda: _drain_at_exit() and None, after_in_child=ENGINE._after_fork)
