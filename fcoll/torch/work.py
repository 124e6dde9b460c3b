"""`FcollWork`: the ``torch.distributed.Work`` the backend returns, and `issue`, which runs
a collective at once or on fcoll's engine thread (`fcoll.calls.engine`).

A collective that torch's Python function calls with ``async_op=False`` runs at once in the
calling thread when the engine is idle (as fast as before: no thread hand-off) and returns
finished work. Everything else (``async_op=True``, DDP's buckets from its autograd hooks,
FSDP's gathers and reduce-scatters, functional collectives) is queued on the engine, which
runs it in issue order while the caller computes; the work's future is completed from the
engine, and ``.then`` callbacks run there (they may call collectives). `FcollWork.wait`
waits for the job, running queued jobs itself when the engine thread is not (a caller that
waits at once takes its job back). A missed deadline becomes torch's ``DistBackendError``
saying "Timed out" with the op, the group and the limit (`torch_error`).

Point-to-point operations start at once (an ``isend`` that blocked could deadlock a ring
of them), after the engine's queued jobs: their work wraps fcoll's `fcoll.Work` and
completes in `FcollWork.wait`, which copies a received message into its tensor.

Example:
    >>> w = dist.all_reduce(t, async_op=True)        # every rank; returns at once
    >>> y = model(x)                                 # runs while t is reduced
    >>> w.wait(); w.get_future().value()[0] is t
    True
"""

from __future__ import annotations

import datetime
import os
import sys
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from fcoll.calls.engine import ENGINE, Job
from fcoll.calls.errors import CollectiveTimeoutError
from fcoll.calls.work import Work

# torch.distributed.Work as a base class: torch's stubs make its methods' signatures
# clash with a Python subclass's, so mypy sees it as Any.
_Work: Any = dist.Work


class FcollWork(_Work):  # type: ignore[misc]
    """A finished collective's outputs (``pending=None``), or a point-to-point operation in
    flight whose ``finish(result)`` runs once when it completes.

    Example:
        >>> w = FcollWork([t])            # a collective that has written t
        >>> w.wait(), w.result()[0] is t
        (True, True)
    """

    def __init__(self, value: list[torch.Tensor], pending: Work[Any] | None = None,
                 finish: Callable[[Any], None] | None = None) -> None:
        super().__init__()
        self._value = value
        self._pending = pending
        self._finish = finish
        self._source = -1
        self._job: Job | None = None  # a collective queued on the engine
        self._future: torch.futures.Future[list[torch.Tensor]] | None = None  # made when asked

    def _new_future(self) -> torch.futures.Future[list[torch.Tensor]]:
        """A future of the outputs. A future of CUDA tensors names their devices (torch
        refuses CUDA tensors in a CPU future) and so orders its callbacks after the stream."""
        cuda = {t.device for t in self._value if t.is_cuda}
        devices: list[int | str | torch.device] = sorted(cuda, key=str)
        return torch.futures.Future(devices=devices or None)

    def _queue(self, run: Callable[[], object]) -> FcollWork:
        """Queue ``run`` on the engine; its end completes the future (made first: the
        engine may finish the job before `ENGINE.submit` returns)."""
        self._future = self._new_future()
        self._job = ENGINE.submit(run, self._complete)
        return self

    def _complete(self, job: Job) -> None:
        """The job's ``done`` callback (in the thread that ran it): complete the future."""
        assert self._future is not None
        if job.error is not None:
            self._future.set_exception(job.error)  # type: ignore[arg-type]  # torch stubs
        else:
            self._future.set_result(self._value)

    def wait(self, timeout: datetime.timedelta | None = None) -> bool:
        """Complete the operation; a ``timeout`` greater than zero raises
        `fcoll.CollectiveTimeoutError` when a receive is still not there. A collective that
        failed raises its error here (a missed deadline as torch's ``DistBackendError``)."""
        job = self._job
        if job is not None:
            ENGINE.wait(job)
            job.result()
            return True
        pending = self._pending
        if pending is None:
            return True
        seconds = timeout.total_seconds() if isinstance(timeout, datetime.timedelta) else 0.0
        result = ENGINE.inline(lambda: pending.wait(seconds if seconds > 0 else None))
        self._pending = None
        if self._finish is not None:  # a receive
            self._source = pending.source_rank()
            self._finish(result)
        return True

    def is_completed(self) -> bool:
        """Whether the operation has completed (a completed receive is finished here)."""
        if self._job is not None:
            return self._job.finished
        if self._pending is not None:
            if ENGINE.busy():  # MPI is the engine's now: not tested, not waited for
                return False
            if ENGINE.inline(self._pending.is_completed):
                self.wait()
        return self._pending is None

    def is_success(self) -> bool:
        """Whether it completed without error."""
        return self.is_completed() and self.exception() is None

    def exception(self) -> BaseException | None:
        """The error of a queued collective that failed, else None (the others raise at
        the call or in `wait`)."""
        return self._job.error if self._job is not None and self._job.finished else None

    def get_future(self) -> torch.futures.Future[list[torch.Tensor]]:
        """The future of the output tensors: completed by the engine for a queued
        collective, at once for a finished one (a point-to-point operation is waited for
        first)."""
        if self._job is None:
            self.wait()
        if self._future is None:
            self._future = self._new_future()
            self._future.set_result(self._value)
        return self._future

    def result(self) -> list[torch.Tensor]:
        """The output tensors, after `wait`."""
        self.wait()
        return self._value

    def synchronize(self) -> None:
        """Nothing to order: results are in host memory, or on the CUDA stream that made them."""

    def source_rank(self) -> int:
        """The group rank a receive from any source got its message from, after `wait`."""
        self.wait()
        return self._source

    def _source_rank(self) -> int:
        return self.source_rank()


def done(value: list[torch.Tensor]) -> FcollWork:
    """The work of a collective that has written ``value``."""
    return FcollWork(value)


def torch_error(error: BaseException) -> BaseException:
    """The error torch's users expect for fcoll's ``error``: a missed deadline becomes
    ``DistBackendError`` saying " Timed out " with the op, the group and the limit (torch's
    tests and users' code match those words); anything else is itself.

    Example:
        >>> torch_error(e)      # e: barrier missed its 1 s deadline on group ranks [0, 1]
        DistBackendError('[fcoll] barrier on group ranks [0, 1] Timed out after 1 s (call #3) ...')
    """
    if not isinstance(error, CollectiveTimeoutError):
        return error
    op = error.op or "collective"
    where = f" on group ranks {list(error.ranks)}" if error.ranks else ""
    limit = f" after {error.seconds:g} s" if error.seconds else ""
    call = f" (call #{error.seq})" if error.seq else ""
    new = dist.DistBackendError(f"[fcoll] {op}{where} Timed out {limit.strip()}{call}: {error}")
    new.flight_record = error.flight_record  # type: ignore[attr-defined]
    new.__cause__ = error
    return new


# Whether calls that may overlap are queued on the engine (FCOLL_TORCH_ENGINE=0: every call
# runs inline, as before the engine; the benchmark's "inline" variant flips it).
DEFER = os.environ.get("FCOLL_TORCH_ENGINE", "1") != "0"


def _synchronous() -> bool:
    """Whether torch's Python function that called the backend's method (two frames up)
    passed ``async_op=False``: it waits at once, so the call runs inline. Any other caller
    (``async_op=True``, DDP's C++ reducer, FSDP, functional collectives) may compute
    meanwhile: the call is queued."""
    frame = sys._getframe(3)
    if not frame.f_code.co_filename.endswith("distributed_c10d.py"):
        return False
    return frame.f_locals.get("async_op") is False


def issue(run: Callable[[], object], value: list[torch.Tensor]) -> FcollWork:
    """The work of a collective whose local checks passed and which ``run()`` performs,
    writing ``value``: run at once (a synchronous call, engine idle) or queued on the engine.
    Called directly by the backend's method.

    Example:
        >>> return issue(lambda: _into.all_reduce(out, out, op, g), [t])   # in allreduce
    """
    if not DEFER or _synchronous():
        ENGINE.inline(lambda: _translated(run))
        return FcollWork(value)
    return FcollWork(value)._queue(lambda: _translated(run))


def _translated(run: Callable[[], object]) -> object:
    try:
        return run()
    except CollectiveTimeoutError as error:
        raise torch_error(error) from error
