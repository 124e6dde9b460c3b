"""Which backend moves an array: numpy -> MPI, cupy -> NCCL (or MPI without NCCL).

The check goes through ``sys.modules``: if cupy was never imported, no array can be a
cupy array, so numpy users never import cupy (and pay one dict lookup, only for inputs
that are not exactly ``numpy.ndarray``).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from typing import Any, Literal

import numpy as np

Backend = Literal["mpi", "nccl", "mpi-gpu"]
TRANSPORTS = ("auto", "nccl", "mpi")
ENV = "FCOLL_GPU_TRANSPORT"


def is_cupy(x: object) -> bool:
    """Whether ``x`` is a ``cupy.ndarray`` (False without importing cupy when it is not loaded)."""
    if type(x) is np.ndarray:
        return False
    cupy = sys.modules.get("cupy")
    return cupy is not None and isinstance(x, cupy.ndarray)


def any_cupy(xs: object, fn: str, name: str) -> bool:
    """Whether the list ``xs`` holds cupy arrays; `TypeError` naming the entry if it mixes
    numpy and cupy arrays. Non-lists answer False (the caller's checks reject them)."""
    if isinstance(xs, np.ndarray) or not isinstance(xs, Sequence) or isinstance(xs, (str, bytes)):
        return False
    kinds = [is_cupy(x) for x in xs]
    if not any(kinds):
        return False
    for i, (x, gpu) in enumerate(zip(xs, kinds, strict=True)):
        if not gpu:
            raise TypeError(f"{fn}: expected {name}[{i}] to be a cupy.ndarray like {name}[0..], "
                            f"got {type(x).__module__}.{type(x).__name__}; numpy and cupy arrays "
                            "cannot be mixed in one call")
    return True


def transport() -> Literal["auto", "nccl", "mpi"]:
    """The value of ``FCOLL_GPU_TRANSPORT`` (``auto`` when unset); `ValueError` if unknown."""
    value = os.environ.get(ENV, "auto").strip().lower() or "auto"
    if value not in TRANSPORTS:
        raise ValueError(f"{ENV}: expected one of {list(TRANSPORTS)}, got {value!r}")
    return value  # type: ignore[return-value]


def gpu_backend() -> Backend:
    """The backend for cupy arrays: NCCL where cupy has it (unless ``FCOLL_GPU_TRANSPORT=mpi``),
    else MPI (CUDA-aware or staged through host memory)."""
    choice = transport()
    if choice == "mpi":
        return "mpi-gpu"
    from fcoll.backends import nccl

    if nccl.available():
        return "nccl"
    if choice == "nccl":
        raise RuntimeError(f"{ENV}=nccl: expected cupy with NCCL (cupy.cuda.nccl.available), "
                           f"got none ({nccl.why_unavailable()}); install nvidia-nccl-cu12 "
                           "or set FCOLL_GPU_TRANSPORT=mpi")
    return "mpi-gpu"


def backend_for(x: object, group: Any = None) -> Backend:
    """``"mpi"`` for numpy arrays, ``"nccl"`` or ``"mpi-gpu"`` for cupy arrays.

    ``group`` is accepted for the interface of DESIGN.md; the choice does not depend on it.
    """
    return gpu_backend() if is_cupy(x) else "mpi"
