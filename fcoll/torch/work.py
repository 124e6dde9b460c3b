"""`FcollWork`: the ``torch.distributed.Work`` the backend returns.

Collectives run to completion before the backend returns (`fcoll.torch.backend`), so their
work is done at once and its future already holds the output tensors: DDP, which waits on
the future rather than on the work, and ``.then`` callbacks see the data at once, and no
thread ever has to complete a future. Point-to-point operations stay in flight (an
``isend`` that blocked could deadlock a ring of them): their work wraps fcoll's `fcoll.Work`
and completes in `FcollWork.wait`, which copies a received message into its tensor;
`FcollWork.get_future` waits first, so its future also completes when the data is there.

Example:
    >>> w = dist.all_reduce(t, async_op=True)        # every rank; the data is there
    >>> w.is_completed(), w.get_future().value()[0] is t
    (True, True)
"""

from __future__ import annotations

import datetime
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

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
        self._future: torch.futures.Future[list[torch.Tensor]] | None = None  # made when asked

    def wait(self, timeout: datetime.timedelta | None = None) -> bool:
        """Complete the operation (at once for a collective); a ``timeout`` greater than
        zero raises `fcoll.CollectiveTimeoutError` when a receive is still not there."""
        pending = self._pending
        if pending is None:
            return True
        seconds = timeout.total_seconds() if isinstance(timeout, datetime.timedelta) else 0.0
        result = pending.wait(seconds if seconds > 0 else None)
        self._pending = None
        if self._finish is not None:  # a receive
            self._source = pending.source_rank()
            self._finish(result)
        return True

    def is_completed(self) -> bool:
        """Whether the operation has completed (a completed receive is finished here)."""
        if self._pending is not None and self._pending.is_completed():
            self.wait()
        return self._pending is None

    def is_success(self) -> bool:
        """Whether it completed without error (errors are raised by the call or `wait`)."""
        return self.is_completed()

    def exception(self) -> None:
        """None: an operation that fails raises at the call or in `wait`."""
        return None

    def get_future(self) -> torch.futures.Future[list[torch.Tensor]]:
        """The future of the output tensors, completed (a point-to-point operation is
        waited for first). A future of CUDA tensors names their devices (torch refuses
        CUDA tensors in a CPU future) and so orders its callbacks after the current stream."""
        self.wait()
        if self._future is None:
            cuda = {t.device for t in self._value if t.is_cuda}
            devices: list[int | str | torch.device] = sorted(cuda, key=str)
            self._future = torch.futures.Future(devices=devices or None)
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
