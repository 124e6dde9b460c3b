"""What this process can do on GPUs: `gpu_report` and `cuda_aware_mpi` (for ``fcoll info``).

Both are guarded: without cupy, a GPU or NCCL they report that, and never raise.
"""

from __future__ import annotations

import ctypes
import os
import warnings
from typing import Any

AWARE_ENV = "FCOLL_CUDA_AWARE_MPI"


def _try(fn: Any) -> str:
    try:
        return str(fn())
    except Exception as error:  # a probe reports every failure instead of raising
        return f"unavailable ({type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''})"


def _cuda_version(code: int) -> str:
    return f"{code // 1000}.{code % 1000 // 10}"


def _nccl_version() -> str:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from cupy.cuda import nccl
    if not getattr(nccl, "available", False):
        return "unavailable (libnccl.so.2 not loadable; pip install nvidia-nccl-cu12)"
    code = int(nccl.get_version())
    return f"{code // 10000}.{code % 10000 // 100}.{code % 100}"


def _devices(cupy: Any) -> dict[str, str]:
    count = int(cupy.cuda.runtime.getDeviceCount())
    names = [cupy.cuda.runtime.getDeviceProperties(i)["name"] for i in range(count)]
    return {"gpu.device_count": str(count),
            "gpu.devices": ", ".join(n.decode() if isinstance(n, bytes) else str(n) for n in names)}


def gpu_report() -> dict[str, str]:
    """cupy, CUDA runtime/driver, NCCL versions and the visible devices, as strings.

    Importing cupy here is deliberate (this is a diagnostic). Every entry that cannot be
    determined says why instead of raising.

    Example:
        >>> gpu_report()["cupy"]                 # on a machine without cupy
        'not installed'
    """
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import cupy
    except Exception as error:
        reason = "not installed" if isinstance(error, ImportError) else f"broken ({error})"
        return {"cupy": reason}
    report = {"cupy": str(cupy.__version__),
              "cuda.runtime": _try(lambda: _cuda_version(cupy.cuda.runtime.runtimeGetVersion())),
              "cuda.driver": _try(lambda: _cuda_version(cupy.cuda.runtime.driverGetVersion())),
              "nccl": _try(_nccl_version)}
    try:
        report.update(_devices(cupy))
    except Exception as error:
        report["gpu.device_count"] = f"0 ({type(error).__name__}: {error})"
    return report


def _info_kinds() -> str | None:
    """MPI 4.1's ``mpi_memory_alloc_kinds`` of the world communicator, if the MPI reports it."""
    from fcoll.runtime import mpi

    info = mpi().COMM_WORLD.Get_info()
    try:
        value = info.Get("mpi_memory_alloc_kinds")
    finally:
        info.Free()
    return None if value is None else str(value)


def _libmpi_path() -> str | None:
    """The path of the MPI library mapped into this process (Linux), if any."""
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                path = line.split()[-1] if len(line.split()) >= 6 else ""
                if "libmpi" in os.path.basename(path) and ".so" in path:
                    return path
    except OSError:
        return None
    return None


def _mpix_query() -> bool | None:
    """``MPIX_Query_cuda_support()`` of the loaded libmpi (Open MPI, MPICH >= 4), if exported."""
    path = _libmpi_path()
    if path is None:
        return None
    try:
        lib = ctypes.CDLL(path)
        query = lib.MPIX_Query_cuda_support
    except (OSError, AttributeError):
        return None
    query.restype, query.argtypes = ctypes.c_int, []
    return bool(query())


def cuda_aware_mpi() -> bool | None:
    """Whether the MPI library can take device pointers: True, False, or None (cannot tell).

    In order: ``FCOLL_CUDA_AWARE_MPI=1``/``0`` (the user's word); MPI 4.1's
    ``mpi_memory_alloc_kinds`` info key (contains ``cuda``: True); the library's own
    ``MPIX_Query_cuda_support()`` (Open MPI, MPICH). fcoll treats None as False.

    Example:
        >>> cuda_aware_mpi()                     # the mpich wheel from PyPI
        False
    """
    forced = os.environ.get(AWARE_ENV, "").strip()
    if forced in ("0", "1"):
        return forced == "1"
    try:
        kinds = _info_kinds()
    except Exception:  # an MPI without the key (or without Comm.Get_info) cannot tell
        kinds = None
    if kinds is not None and "cuda" in kinds.lower():
        return True
    query = _mpix_query()
    if query is not None:
        return query
    return False if kinds is not None else None
