"""Which backend moves an array: the one place that chooses (`backend_for`).

numpy arrays go to the host MPI transport (`fcoll.backends.mpi`); cupy arrays to NCCL
(`fcoll.backends.nccl`) where cupy has it, else to MPI: CUDA-aware (`fcoll.backends.cuda_aware`) where
the probe says so, else staged through host memory (`fcoll.backends.staged`).
``FCOLL_GPU_TRANSPORT=mpi`` skips NCCL, ``=nccl`` requires it; unset (``auto``), a group
whose ranks share a GPU uses MPI (`fcoll.gpu.route.choose` decides that per group, together).
The setting is read once, at the first GPU call (and again after `fcoll.init` or `forget`).

The array check goes through ``sys.modules``: if cupy was never imported, no array can be
a cupy array, so numpy users never import cupy (and pay one dict lookup, only for inputs
that are not exactly ``numpy.ndarray``).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any, cast

import numpy as np

from fcoll import runtime
from fcoll.backends import Backend, nodes, shm
from fcoll.backends import mpi as host
from fcoll.dispatch import interop
from fcoll.dispatch.gpu_settings import ENV, TRANSPORTS, aware, forget, mpi_for_device, transport

__all__ = ["ENV", "INTEROP", "TRANSPORTS", "any_cupy", "aware", "backend_for", "device",
           "device_list", "forget", "gpu_backend", "is_cupy", "mpi_for_device", "on_node",
           "shm_limit", "shm_range", "transport"]



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


def gpu_backend(group: Any = None) -> Backend:
    """The backend for cupy arrays: NCCL where cupy has it (unless ``FCOLL_GPU_TRANSPORT=mpi``),
    else MPI (CUDA-aware or staged through host memory)."""
    choice = transport()
    if choice == "mpi":
        return mpi_for_device()
    from fcoll.backends import nccl

    if nccl.available():
        return nccl
    if choice == "nccl":
        raise RuntimeError(f"{ENV}=nccl: expected cupy with NCCL (cupy.cuda.nccl.available), "
                           f"got none ({nccl.why_unavailable()}); install nvidia-nccl-cu12 "
                           "or set FCOLL_GPU_TRANSPORT=mpi")
    return mpi_for_device()


def backend_for(x: object, group: Any = None) -> Backend:
    """The backend that moves ``x`` (an array, or a list of them: its first entry) within
    ``group``: `fcoll.backends.mpi` for numpy, `gpu_backend` for cupy.

    ``group`` is part of the choice's interface; today every group of a job uses the same
    transport for the same array kind.

    Example:
        >>> backend_for(np.ones(2)).NAME
        'mpi'
    """
    return gpu_backend(group) if is_cupy(x) else host


def shm_limit(group: Any, op: str = "all_reduce") -> float:
    """The per-rank bytes from which ``group``'s numpy ``op`` (``all_reduce``,
    ``reduce_scatter``, ``all_gather``, ``broadcast``) may go through on-node shared memory
    (`fcoll.backends.shm.limit`: infinite where it cannot)."""
    return shm.limit(group, op)


def shm_range(group: Any, op: str) -> tuple[float, float]:
    """`shm_limit` and the bytes from which ``op`` goes back to MPI (`shm.ceiling`): a
    message of ``lo <= nbytes < hi`` per rank may use shared memory."""
    return shm.limit(group, op), shm.ceiling(op)


def on_node(call: Any, nbytes: int, op: str = "all_reduce") -> Any:
    """`fcoll.backends.shm` when this call's ``op`` of ``nbytes`` per rank goes through
    the group's shared segment (every rank of the group on this node, ``FCOLL_SHM`` and the
    size allow it), else None (MPI). Collective at a group's first such call: every rank
    takes the same decision (same size, same settings), and the group finds out whether its
    ranks share a node.

    Example:
        >>> on_node(call, 1 << 20).NAME        # 2 ranks on one node, FCOLL_SHM unset
        'shm'
    """
    if not shm.limit(call.group, op) <= nbytes < shm.ceiling(op) or shm.segment(call) is None:
        return None
    return shm


def across_nodes(call: Any, op: str = "all_reduce", nbytes: int = 0) -> nodes.Hierarchy | None:
    """The group's split into nodes (`fcoll.backends.nodes.Hierarchy`: shared memory inside
    each node, MPI between them) when its ranks span nodes in a layout that allows one and
    ``op`` of ``nbytes`` per rank is faster through it (`fcoll.backends.nodes.FROM`), else
    None (one node, another layout, ``FCOLL_SHM=0``: the flat schedules). Collective at the
    group's first such call.

    Example:
        >>> across_nodes(call).k               # 4 ranks on 2 nodes of 2, by block
        2
    """
    if call.group.shm or nbytes < nodes.FROM[op]:  # a segment: the group is on one node
        return None
    return nodes.hierarchy(call)


def device(x: object, group: Any = None) -> Backend | None:
    """The backend for ``x`` when it is not a numpy array, or None (the public functions'
    first question: ``if type(x) is not np.ndarray and (on := device(x, group))``): the
    GPU backend for cupy, `fcoll.dispatch.interop` for torch tensors and JAX arrays."""
    if is_cupy(x):
        return gpu_backend(group)
    return INTEROP if interop.kind(x) is not None else None


def device_list(xs: object, group: Any, fn: str, name: str) -> Backend | None:
    """`device` for a list argument: None for lists of numpy arrays; `TypeError` naming the
    entry if it mixes numpy and cupy arrays (`fcoll.dispatch.interop` checks torch/JAX)."""
    if any_cupy(xs, fn, name):
        return gpu_backend(group)
    if isinstance(xs, (list, tuple)) and any(interop.kind(x) is not None for x in xs):
        return INTEROP
    return None


# Not a transport: an adapter the public functions hand to `fcoll.gpu.route.run`, which
# passes it to `interop.run` (the arrays as numpy or cupy, then the numpy/cupy path) before
# any transport function could be called; typed as a Backend for that one branch.
INTEROP = cast(Backend, interop)


runtime.on_change(forget)  # fcoll.init re-reads the settings
