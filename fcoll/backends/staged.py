"""cupy arrays over MPI through host memory (a `fcoll.backends.Backend`).

The backend's operations copy device buffers to the host (``cupy.asnumpy``, which waits
for the current stream), run the host transport (`fcoll.backends.mpi`) and copy the
result back to the buffer's device. `run` stages a whole public collective the same way:
its numpy form runs on host copies, so every collective works on cupy arrays over any
MPI, with the numpy path's exact semantics and dtype rules, for two copies and a host
sync.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from fcoll.backends import mpi as host
from fcoll.calls.work import Call, map_arrays

NAME = "staged"


def _cupy() -> Any:
    return sys.modules["cupy"]


def to_host(value: Any) -> Any:
    """cupy arrays (also inside lists/tuples) as numpy arrays, after a stream sync."""
    cupy = _cupy()
    if isinstance(value, cupy.ndarray):
        return cupy.asnumpy(value)  # copies on the current stream and waits for it
    if isinstance(value, (list, tuple)):
        return type(value)(to_host(v) for v in value)
    return value


def to_device(value: Any, device: int) -> Any:
    """numpy arrays (also inside lists and `Work` results) as cupy arrays on ``device``."""
    cupy = _cupy()

    def copy(x: np.ndarray) -> Any:
        with cupy.cuda.Device(device):
            return cupy.asarray(x)

    return map_arrays(value, lambda v: isinstance(v, np.ndarray), copy)


def device_of(args: Sequence[Any]) -> int:
    """The device of the first cupy array in ``args`` (or inside a list there), else the
    current device."""
    cupy = _cupy()
    for arg in args:
        if isinstance(arg, cupy.ndarray):
            return int(arg.device.id)
        if isinstance(arg, (list, tuple)):
            for item in arg:
                if isinstance(item, cupy.ndarray):
                    return int(item.device.id)
    return int(cupy.cuda.Device().id)


def run(numpy_fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``numpy_fn(*args, **kwargs)`` on host copies; the result on the input's device."""
    device = device_of(args)
    return to_device(numpy_fn(*to_host(args), **to_host(kwargs)), device)


def _back(result: Any, like: Any) -> Any:
    return None if result is None else to_device(result, int(like.device.id))


def allreduce(call: Call, send: Any, op: Any) -> Any:
    return _back(host.allreduce(call, to_host(send), op), send)


def reduce(call: Call, send: Any, op: Any, root: int) -> Any | None:
    return _back(host.reduce(call, to_host(send), op, root), send)


def reduce_scatter_block(call: Call, send: Any, op: Any) -> Any:
    return _back(host.reduce_scatter_block(call, to_host(send), op), send)


def bcast(call: Call, buf: Any, root: int) -> Any:
    buf[...] = _back(host.bcast(call, to_host(buf), root), buf)
    return buf


def allgather(call: Call, send: Any, out: Any) -> Any:
    out[...] = _back(host.allgather(call, to_host(send), np.empty(out.shape, out.dtype)), out)
    return out


def alltoall(call: Call, send: Any, out: Any) -> Any:
    out[...] = _back(host.alltoall(call, to_host(send), np.empty(out.shape, out.dtype)), out)
    return out


def alltoallv(call: Call, send: Any, send_counts: Sequence[int], out: Any,
              recv_counts: Sequence[int]) -> Any:
    """Counts in bytes, one per rank."""
    got = host.alltoallv(call, to_host(send), send_counts, np.empty(out.shape, out.dtype),
                         recv_counts)
    out[...] = _back(got, out)
    return out
