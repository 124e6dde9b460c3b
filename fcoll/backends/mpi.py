"""The MPI transport: mpi4py's buffer methods on flat, C-contiguous numpy buffers.

Every function takes the group's communicator and fcoll-owned or read-only send buffers,
and returns a freshly allocated result; none validates its arguments (callers do).
Byte buffers travel as ``MPI.BYTE``; reduction buffers as their numpy dtype.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from fcoll._runtime import mpi

MPI = mpi()
BYTE = MPI.BYTE


def _displs(counts: Sequence[int]) -> list[int]:
    return [0, *np.cumsum(counts[:-1], dtype=np.int64).tolist()] if counts else []


def allreduce(comm: Any, send: np.ndarray, op: Any) -> np.ndarray:
    out = np.empty_like(send)
    comm.Allreduce(send, out, op)
    return out


def reduce(comm: Any, send: np.ndarray, op: Any, root: int) -> np.ndarray | None:
    out = np.empty_like(send) if comm.Get_rank() == root else None
    comm.Reduce(send, out, op, root)
    return out


def reduce_scatter_block(comm: Any, send: np.ndarray, op: Any) -> np.ndarray:
    out = np.empty(send.size // comm.Get_size(), send.dtype)
    comm.Reduce_scatter_block(send, out, op)
    return out


def reduce_scatter(comm: Any, send: np.ndarray, counts: Sequence[int], op: Any) -> np.ndarray:
    out = np.empty(counts[comm.Get_rank()], send.dtype)
    comm.Reduce_scatter(send, out, list(counts), op)
    return out


def bcast(comm: Any, buf: np.ndarray, root: int) -> np.ndarray:
    comm.Bcast([buf, BYTE], root)
    return buf


def allgather(comm: Any, send: np.ndarray) -> np.ndarray:
    out = np.empty(send.size * comm.Get_size(), np.uint8)
    comm.Allgather([send, BYTE], [out, BYTE])
    return out


def allgatherv(comm: Any, send: np.ndarray, counts: Sequence[int]) -> np.ndarray:
    out = np.empty(sum(counts), np.uint8)
    comm.Allgatherv([send, BYTE], [out, (list(counts), _displs(counts)), BYTE])
    return out


def gatherv(comm: Any, send: np.ndarray, counts: Sequence[int], root: int) -> np.ndarray | None:
    if comm.Get_rank() != root:
        comm.Gatherv([send, BYTE], None, root)
        return None
    out = np.empty(sum(counts), np.uint8)
    comm.Gatherv([send, BYTE], [out, (list(counts), _displs(counts)), BYTE], root)
    return out


def scatterv(
    comm: Any, send: np.ndarray | None, counts: Sequence[int], root: int
) -> np.ndarray:
    out = np.empty(counts[comm.Get_rank()], np.uint8)
    spec = None if send is None else [send, (list(counts), _displs(counts)), BYTE]
    comm.Scatterv(spec, [out, BYTE], root)
    return out


def alltoall(comm: Any, send: np.ndarray) -> np.ndarray:
    out = np.empty_like(send)
    comm.Alltoall([send, BYTE], [out, BYTE])
    return out


def alltoallv(
    comm: Any, send: np.ndarray, send_counts: Sequence[int], recv_counts: Sequence[int]
) -> np.ndarray:
    out = np.empty(sum(recv_counts), np.uint8)
    comm.Alltoallv(
        [send, (list(send_counts), _displs(send_counts)), BYTE],
        [out, (list(recv_counts), _displs(recv_counts)), BYTE],
    )
    return out


def barrier(comm: Any) -> None:
    comm.Barrier()


def allgather_ints(comm: Any, values: Sequence[int]) -> np.ndarray:
    """Every rank's ``values`` (same length everywhere) as an ``(n, len)`` int64 array."""
    send = np.asarray(values, dtype=np.int64)
    out = np.empty((comm.Get_size(), send.size), np.int64)
    comm.Allgather(send, out)
    return out


def allgather_obj(comm: Any, obj: object) -> list[Any]:
    return list(comm.allgather(obj))


def alltoall_obj(comm: Any, objs: Sequence[object]) -> list[Any]:
    return list(comm.alltoall(list(objs)))


def gather_obj(comm: Any, obj: object, root: int) -> list[Any] | None:
    out = comm.gather(obj, root=root)
    return None if out is None else list(out)


def scatter_obj(comm: Any, objs: Sequence[object] | None, root: int) -> Any:
    return comm.scatter(None if objs is None else list(objs), root=root)


def bcast_obj(comm: Any, obj: object, root: int) -> Any:
    return comm.bcast(obj, root=root)
