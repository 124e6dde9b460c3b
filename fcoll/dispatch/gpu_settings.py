"""The GPU settings read once per process: ``FCOLL_GPU_TRANSPORT`` (`transport`), whether
MPI takes device buffers (`aware`), and so the MPI backend for cupy arrays (`mpi_for_device`).

They sit below both `fcoll.dispatch` (which chooses a backend per call) and
`fcoll.gpu.route` (which decides per group whether NCCL can serve it).
"""

from __future__ import annotations

import os
from typing import Literal

from fcoll.backends import Backend

TRANSPORTS = ("auto", "nccl", "mpi")
ENV = "FCOLL_GPU_TRANSPORT"
_AWARE: list[bool] = []  # the probe's answer, asked once per process
_SETTING: list[Literal["auto", "nccl", "mpi"]] = []  # FCOLL_GPU_TRANSPORT, read once


def transport() -> Literal["auto", "nccl", "mpi"]:
    """The value of ``FCOLL_GPU_TRANSPORT`` (``auto`` when unset); `ValueError` if unknown.

    Read once (the GPU path's per-call cost matters); `forget` makes the next call read it
    again.

    Example:
        >>> transport()        # FCOLL_GPU_TRANSPORT unset
        'auto'
    """
    if _SETTING:
        return _SETTING[0]
    value = os.environ.get(ENV, "auto").strip().lower() or "auto"
    if value not in TRANSPORTS:
        raise ValueError(f"{ENV}: expected one of {list(TRANSPORTS)}, got {value!r}")
    _SETTING.append(value)  # type: ignore[arg-type]
    return _SETTING[0]


def forget() -> None:
    """Read ``FCOLL_GPU_TRANSPORT`` again, probe CUDA-aware MPI again and look for NCCL again
    at the next GPU call (`fcoll.init` does this; so do tests that change the setting)."""
    from fcoll.backends import nccl

    _SETTING.clear()
    _AWARE.clear()
    nccl.forget()


def aware() -> bool:
    """Whether MPI takes device buffers (`fcoll.dispatch.gpu_probe.cuda_aware_mpi`; None counts as
    False), asked once per process."""
    if not _AWARE:
        from fcoll.dispatch.gpu_probe import cuda_aware_mpi

        _AWARE.append(bool(cuda_aware_mpi()))
    return _AWARE[0]


def mpi_for_device() -> Backend:
    """The MPI backend for cupy arrays: CUDA-aware where the probe says so, else staged.

    Example:
        >>> mpi_for_device().NAME          # Open MPI built without CUDA
        'staged'
    """
    from fcoll.backends import cuda_aware as cuda_aware
    from fcoll.backends import staged

    return cuda_aware if aware() else staged
