"""cupy arrays over MPI: device buffers handed to a CUDA-aware MPI, or staged through host.

Staging: the current stream is synchronised (``cupy.asnumpy``), the numpy collective
runs on the host copies, and the result is copied back to the input's device
(``cupy.asarray`` under that device). So every collective works, with the numpy path's
exact semantics and dtype rules, at the price of two copies and a host sync.

CUDA-aware MPI (only when `fcoll._probe.cuda_aware_mpi` says so, never guessed): the
single-message paths (``all_reduce`` with MPI's own op, ``broadcast``, even
``all_gather_into_tensor`` along axis 0, even ``all_to_all_single``) hand device
pointers to MPI after a stream sync; everything else is staged.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import numpy as np

from fcoll.work import Work

_AWARE: list[bool] = []  # cached answer of cuda_aware_mpi()


def aware() -> bool:
    """Whether device buffers may go to MPI (None from the probe counts as False)."""
    if not _AWARE:
        from fcoll._probe import cuda_aware_mpi

        _AWARE.append(bool(cuda_aware_mpi()))
    return _AWARE[0]


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
    if isinstance(value, np.ndarray):
        with cupy.cuda.Device(device):
            return cupy.asarray(value)
    if isinstance(value, list):
        return [to_device(v, device) for v in value]
    if isinstance(value, tuple):
        return tuple(to_device(v, device) for v in value)
    if isinstance(value, Work):
        return value.then(lambda result: to_device(result, device))
    return value


def _device_of(args: tuple[Any, ...]) -> int:
    cupy = _cupy()
    for arg in args:
        if isinstance(arg, cupy.ndarray):
            return int(arg.device.id)
        if isinstance(arg, (list, tuple)):
            for item in arg:
                if isinstance(item, cupy.ndarray):
                    return int(item.device.id)
    return int(cupy.cuda.Device().id)


def run(name: str, numpy_fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``numpy_fn(*args, **kwargs)`` on host copies, or on device buffers where MPI is
    CUDA-aware and the call is a single-message one; the result on the input's device."""
    if aware():
        from fcoll.collectives import gpu_aware  # imports the transport: only when used

        direct = gpu_aware.DIRECT.get(name)
        if direct is not None:
            result = direct(*args, **kwargs)
            if result is not NotImplemented:
                return result
    device = _device_of(args)
    return to_device(numpy_fn(*to_host(args), **to_host(kwargs)), device)
