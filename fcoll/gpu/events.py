"""Async handles for GPU work: a `fcoll.calls.work.Work` over a CUDA event recorded after the work
enqueued on the current stream (``async_op=True`` on the NCCL path)."""

from __future__ import annotations

import time
from typing import Any

from fcoll.backends import nccl
from fcoll.calls.errors import timed_out
from fcoll.calls.work import Operation, Work, backoff


class EventOperation(Operation):
    """GPU work enqueued on a stream, marked by a CUDA event recorded after it.

    Completing it never blocks the host: the current stream waits on the event.
    """

    def __init__(self, name: str, group: Any, event: Any, value: Any) -> None:
        super().__init__(name, group)
        self._event = event
        self._value = value

    def _advance(self) -> bool:
        if self._event.done:  # cudaEventQuery: never blocks
            self.value = self._value
            return True
        return False

    def finish(self, timeout: float | None) -> Any:
        """Make cupy's current stream wait for the event, and return the result at once.

        With a ``timeout`` (``Work.wait(timeout=...)``, or a default deadline), the host
        polls the event instead, as a blocking call under a deadline does
        (`fcoll.backends.nccl.wait`): past the timeout it aborts the group's NCCL communicator
        and raises `fcoll.calls.errors.CollectiveTimeoutError`."""
        if not self.done:
            import cupy

            if timeout is not None:
                self._poll_until(timeout)
            cupy.cuda.get_current_stream().wait_event(self._event)
            self.value = self._value
            self._complete()
        return self.value

    def _poll_until(self, timeout: float) -> None:
        pause, started = 1e-5, time.monotonic()
        while not self._event.done:  # cudaEventQuery: never blocks
            if time.monotonic() - started > timeout:
                nccl.abort(self.group)
                raise timed_out(self.name, self.group, timeout, self.seq)
            pause = backoff(started, pause)


def event_work(name: str, group: Any, value: Any) -> Work[Any]:
    """A `Work` for GPU work just enqueued on the current stream, with result ``value``.

    Example:
        >>> work = event_work("all_reduce", g, out)     # after enqueueing into out
        >>> work.wait() is out                          # the stream now waits on the event
        True
    """
    import cupy

    event = cupy.cuda.Event(block=False, disable_timing=True, interprocess=False)
    event.record(cupy.cuda.get_current_stream())
    return Work(EventOperation(name, group, event, value))
