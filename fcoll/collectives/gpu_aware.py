"""CUDA-aware MPI: single-message collectives on device buffers (see `gpu_mpi`).

Each function returns ``NotImplemented`` for a call it does not cover (the caller then
stages it through host memory). mpi4py takes cupy arrays as buffers through
``__cuda_array_interface__``; the current stream is synchronised first because MPI does
not know cupy's streams, and MPI's blocking call returns with the result written.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from fcoll._plan import reduction_plan
from fcoll.backends import mpi as backend
from fcoll.group import member


def _sync() -> Any:
    import cupy

    cupy.cuda.get_current_stream().synchronize()
    return cupy


def all_reduce(x: Any, op: object = "sum", group: Any = None, *, async_op: bool = False) -> Any:
    if async_op:
        return NotImplemented
    g, call = member(group, "all_reduce")
    plan = reduction_plan(np.empty(0, x.dtype), op, g, "all_reduce")
    if not plan.direct:
        return NotImplemented
    cupy = _sync()
    with x.device:
        send, out = cupy.ascontiguousarray(x), cupy.empty(x.shape, x.dtype)
        call.comm.Allreduce(send, out, plan.op)
    return out


def broadcast(x: Any, src: int = 0, group: Any = None, *, async_op: bool = False) -> Any:
    if async_op:
        return NotImplemented
    g, call = member(group, "broadcast")
    from fcoll._validate import check_rank

    root = check_rank(src, g.size, "broadcast", "src")
    cupy = _sync()
    with x.device:
        buf = cupy.array(x, order="C", copy=True) if g.rank == root else cupy.empty(x.shape, x.dtype)
        call.comm.Bcast([buf, backend.BYTE], root)
    return buf


def all_gather_into_tensor(x: Any, group: Any = None, *, gather_dim: int = 0,
                           sizes: Sequence[int] | str | None = None, async_op: bool = False) -> Any:
    if async_op or sizes is not None or gather_dim != 0 or x.ndim == 0:
        return NotImplemented
    g, call = member(group, "all_gather_into_tensor")
    cupy = _sync()
    with x.device:
        send = cupy.ascontiguousarray(x)
        out = cupy.empty((x.shape[0] * g.size, *x.shape[1:]), x.dtype)
        call.comm.Allgather([send, backend.BYTE], [out, backend.BYTE])
    return out


def all_to_all_single(x: Any, output_split_sizes: Sequence[int] | None = None,
                      input_split_sizes: Sequence[int] | None = None, group: Any = None, *,
                      async_op: bool = False) -> Any:
    if async_op or output_split_sizes is not None or input_split_sizes is not None or x.ndim == 0:
        return NotImplemented
    g, call = member(group, "all_to_all_single")
    if x.shape[0] % g.size:
        return NotImplemented  # the staged numpy path raises the documented error
    cupy = _sync()
    with x.device:
        send, out = cupy.ascontiguousarray(x), cupy.empty(x.shape, x.dtype)
        call.comm.Alltoall([send, backend.BYTE], [out, backend.BYTE])
    return out


# The single-message collectives that hand device buffers to a CUDA-aware MPI.
DIRECT: dict[str, Callable[..., Any]] = {
    "all_reduce": all_reduce,
    "broadcast": broadcast,
    "all_gather_into_tensor": all_gather_into_tensor,
    "all_to_all_single": all_to_all_single,
}
