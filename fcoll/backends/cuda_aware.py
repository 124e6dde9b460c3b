"""CUDA-aware MPI: device buffers handed to MPI as they are (a `fcoll.backends.Backend`).

Chosen by `fcoll.dispatch.backend_for` only where `fcoll.dispatch.gpu_probe.cuda_aware_mpi` says
MPI is CUDA-aware (never guessed). mpi4py takes cupy arrays as buffers through
``__cuda_array_interface__``; cupy's current stream is synchronised first, because MPI
does not know cupy's streams, and MPI's blocking call returns with the result written.
A call with a deadline polls MPI's nonblocking form, as the host transport does.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from fcoll.backends import mpi as host
from fcoll.calls.work import Call, wait_request

NAME = "aware"


def _sync() -> None:
    """Wait for cupy's current stream: MPI reads and writes the buffers directly."""
    import cupy

    cupy.cuda.get_current_stream().synchronize()


def _comm(call: Call) -> Any:
    """The call's MPI communicator, after cupy's current stream has finished its work."""
    _sync()
    return call.begin()


def _run(call: Call, blocking: Callable[[], Any], nonblocking: Callable[[], Any]) -> None:
    if call.seconds is None:
        blocking()
    else:
        wait_request(nonblocking(), call)


def _empty(shape: Any, dtype: Any) -> Any:
    import cupy

    return cupy.empty(shape, dtype)


def allreduce(call: Call, send: Any, op: Any) -> Any:
    comm, out = _comm(call), _empty(send.shape, send.dtype)
    _run(call, lambda: comm.Allreduce(send, out, op), lambda: comm.Iallreduce(send, out, op))
    return out


def reduce(call: Call, send: Any, op: Any, root: int) -> Any | None:
    comm = _comm(call)
    out = _empty(send.shape, send.dtype) if comm.Get_rank() == root else None
    _run(call, lambda: comm.Reduce(send, out, op, root),
         lambda: comm.Ireduce(send, out, op, root))
    return out


def reduce_scatter_block(call: Call, send: Any, op: Any) -> Any:
    comm = _comm(call)
    out = _empty((send.shape[0] // comm.Get_size(), *send.shape[1:]), send.dtype)
    _run(call, lambda: comm.Reduce_scatter_block(send, out, op),
         lambda: comm.Ireduce_scatter_block(send, out, op))
    return out


# Data movement writes into the ``out`` the caller allocated, so the host transport's own
# functions serve device buffers too (mpi4py reads ``__cuda_array_interface__``).


def bcast(call: Call, buf: Any, root: int) -> Any:
    _sync()
    return host.bcast(call, buf, root)


def allgather(call: Call, send: Any, out: Any) -> Any:
    _sync()
    return host.allgather(call, send, out)


def alltoall(call: Call, send: Any, out: Any) -> Any:
    _sync()
    return host.alltoall(call, send, out)


def alltoallv(call: Call, send: Any, send_counts: Sequence[int], out: Any,
              recv_counts: Sequence[int]) -> Any:
    """Counts in bytes, one per rank."""
    _sync()
    return host.alltoallv(call, send, send_counts, out, recv_counts)
