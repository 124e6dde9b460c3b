"""The MPI transport: mpi4py's buffer methods on C-contiguous numpy buffers.

Every function takes the group's communicator and C-contiguous buffers; none validates
its arguments or applies dtype policy (callers do). Reductions allocate their result and
travel as the buffer's numpy dtype. Data movement writes into the ``out`` array the
caller allocated (its final dtype and shape) and travels as ``MPI.BYTE``, so any dtype,
bfloat16 included, moves bit-exact; counts of the ``v`` variants are in bytes.
"""

from __future__ import annotations

import itertools
import pickle
from collections.abc import Sequence
from typing import Any

import numpy as np

from fcoll._runtime import mpi

MPI = mpi()
BYTE = MPI.BYTE

# The deadline of the public call in progress (set by `fcoll.group.member`), or None:
# then every call below is MPI's blocking form; else its nonblocking form, polled until
# done or late (`fcoll.work.wait_request`).
DEADLINE: Any = None
# The group of the public call in progress until that call first communicates; then its
# sequence number is counted. Calls that fail their local checks are therefore not
# counted, and the numbers stay equal across ranks.
CALL: Any = None


def _begin() -> None:
    global CALL
    CALL.seq += 1
    CALL = None


def _wait(request: Any) -> None:
    from fcoll.work import wait_request

    wait_request(request, DEADLINE)


def _displs(counts: Sequence[int]) -> list[int]:
    return [0, *np.cumsum(counts[:-1], dtype=np.int64).tolist()] if counts else []


def allreduce(comm: Any, send: np.ndarray, op: Any) -> np.ndarray:
    if CALL is not None:
        _begin()
    out = np.empty(send.shape, send.dtype)
    if DEADLINE is None:
        comm.Allreduce(send, out, op)
    else:
        _wait(comm.Iallreduce(send, out, op))
    return out


def reduce(comm: Any, send: np.ndarray, op: Any, root: int) -> np.ndarray | None:
    if CALL is not None:
        _begin()
    out = np.empty(send.shape, send.dtype) if comm.Get_rank() == root else None
    if DEADLINE is None:
        comm.Reduce(send, out, op, root)
    else:
        _wait(comm.Ireduce(send, out, op, root))
    return out


def reduce_scatter_block(comm: Any, send: np.ndarray, op: Any) -> np.ndarray:
    """Block ``rank`` of ``send`` split evenly along axis 0, reduced."""
    if CALL is not None:
        _begin()
    out = np.empty((send.shape[0] // comm.Get_size(), *send.shape[1:]), send.dtype)
    if DEADLINE is None:
        comm.Reduce_scatter_block(send, out, op)
    else:
        _wait(comm.Ireduce_scatter_block(send, out, op))
    return out


def reduce_scatter(comm: Any, send: np.ndarray, counts: Sequence[int], op: Any) -> np.ndarray:
    if CALL is not None:
        _begin()
    out = np.empty(counts[comm.Get_rank()], send.dtype)
    if DEADLINE is None:
        comm.Reduce_scatter(send, out, list(counts), op)
    else:
        _wait(comm.Ireduce_scatter(send, out, list(counts), op))
    return out


def bcast(comm: Any, buf: np.ndarray, root: int) -> np.ndarray:
    if CALL is not None:
        _begin()
    if DEADLINE is None:
        comm.Bcast([buf, BYTE], root)
    else:
        _wait(comm.Ibcast([buf, BYTE], root))
    return buf


# Broadcasts of at least this many bytes go in chunks of at least PIPELINE_CHUNK bytes (at
# most 16), so the root's copy of chunk k+1 into its result overlaps the transfer of chunk
# k: at n=2, 64 MiB took 16.7 ms with copy-then-Bcast, 7.9 ms pipelined (raw in-place
# Bcast: 8.1 ms); 16 MiB 3.1 -> 1.5 ms (raw 1.9). See docs/performance.md.
PIPELINE_BYTES = 1 << 20
PIPELINE_CHUNK = 256 << 10


def bcast_copy(comm: Any, x: np.ndarray, root: int) -> np.ndarray:
    """A new array holding ``root``'s C-contiguous ``x`` on every rank, sent in chunks."""
    if CALL is not None:
        _begin()
    out = np.empty(x.shape, x.dtype)
    flat_out, flat_x = out.reshape(-1).view(np.uint8), x.reshape(-1).view(np.uint8)
    step = max(PIPELINE_CHUNK, -(-flat_out.size // 16))
    is_root = comm.Get_rank() == root
    requests = []
    for start in range(0, flat_out.size, step):
        chunk = flat_out[start : start + step]
        if is_root:
            chunk[...] = flat_x[start : start + step]
        requests.append(comm.Ibcast([chunk, BYTE], root))
    if DEADLINE is None:
        MPI.Request.Waitall(requests)
    else:
        for request in requests:
            _wait(request)
    return out


def allgather(comm: Any, send: np.ndarray, out: np.ndarray) -> np.ndarray:
    if CALL is not None:
        _begin()
    if DEADLINE is None:
        comm.Allgather([send, BYTE], [out, BYTE])
    else:
        _wait(comm.Iallgather([send, BYTE], [out, BYTE]))
    return out


def allgatherv(comm: Any, send: np.ndarray, out: np.ndarray, counts: Sequence[int]) -> np.ndarray:
    """``counts`` in bytes, one per rank."""
    if CALL is not None:
        _begin()
    if DEADLINE is None:
        comm.Allgatherv([send, BYTE], [out, (list(counts), _displs(counts)), BYTE])
    else:
        _wait(comm.Iallgatherv([send, BYTE], [out, (list(counts), _displs(counts)), BYTE]))
    return out


def gatherv(
    comm: Any, send: np.ndarray, out: np.ndarray | None, counts: Sequence[int], root: int
) -> np.ndarray | None:
    """``out`` and ``counts`` (bytes) are read on ``root`` only."""
    if CALL is not None:
        _begin()
    if comm.Get_rank() != root:
        if DEADLINE is None:
            comm.Gatherv([send, BYTE], None, root)
        else:
            _wait(comm.Igatherv([send, BYTE], None, root))
        return None
    if DEADLINE is None:
        comm.Gatherv([send, BYTE], [out, (list(counts), _displs(counts)), BYTE], root)
    else:
        _wait(comm.Igatherv([send, BYTE], [out, (list(counts), _displs(counts)), BYTE], root))
    return out


def scatterv(
    comm: Any, send: np.ndarray | None, counts: Sequence[int], out: np.ndarray, root: int
) -> np.ndarray:
    """``send`` and ``counts`` (bytes) are read on ``root`` only."""
    if CALL is not None:
        _begin()
    spec = None if send is None else [send, (list(counts), _displs(counts)), BYTE]
    if DEADLINE is None:
        comm.Scatterv(spec, [out, BYTE], root)
    else:
        _wait(comm.Iscatterv(spec, [out, BYTE], root))
    return out


def alltoall(comm: Any, send: np.ndarray, out: np.ndarray) -> np.ndarray:
    if CALL is not None:
        _begin()
    if DEADLINE is None:
        comm.Alltoall([send, BYTE], [out, BYTE])
    else:
        _wait(comm.Ialltoall([send, BYTE], [out, BYTE]))
    return out


def alltoallv(
    comm: Any,
    send: np.ndarray,
    send_counts: Sequence[int],
    out: np.ndarray,
    recv_counts: Sequence[int],
) -> np.ndarray:
    """Counts in bytes, one per rank."""
    if CALL is not None:
        _begin()
    spec = ([send, (list(send_counts), _displs(send_counts)), BYTE],
            [out, (list(recv_counts), _displs(recv_counts)), BYTE])
    if DEADLINE is None:
        comm.Alltoallv(*spec)
    else:
        _wait(comm.Ialltoallv(*spec))
    return out


# Nonblocking forms: each starts the operation and returns its MPI request. The caller
# keeps every buffer alive (and unmodified) until the request completes.


def iallreduce(comm: Any, send: np.ndarray, out: np.ndarray, op: Any) -> Any:
    if CALL is not None:
        _begin()
    return comm.Iallreduce(send, out, op)


def ireduce(comm: Any, send: np.ndarray, out: np.ndarray | None, op: Any, root: int) -> Any:
    if CALL is not None:
        _begin()
    return comm.Ireduce(send, out, op, root)


def ireduce_scatter_block(comm: Any, send: np.ndarray, out: np.ndarray, op: Any) -> Any:
    if CALL is not None:
        _begin()
    return comm.Ireduce_scatter_block(send, out, op)


def ibcast(comm: Any, buf: np.ndarray, root: int) -> Any:
    if CALL is not None:
        _begin()
    return comm.Ibcast([buf, BYTE], root)


def iallgather(comm: Any, send: np.ndarray, out: np.ndarray) -> Any:
    if CALL is not None:
        _begin()
    return comm.Iallgather([send, BYTE], [out, BYTE])


def iallgatherv(comm: Any, send: np.ndarray, out: np.ndarray, counts: Sequence[int]) -> Any:
    if CALL is not None:
        _begin()
    return comm.Iallgatherv([send, BYTE], [out, (list(counts), _displs(counts)), BYTE])


def igather(comm: Any, send: np.ndarray, out: np.ndarray | None, root: int) -> Any:
    if CALL is not None:
        _begin()
    return comm.Igather([send, BYTE], None if out is None else [out, BYTE], root)


def ialltoall(comm: Any, send: np.ndarray, out: np.ndarray) -> Any:
    if CALL is not None:
        _begin()
    return comm.Ialltoall([send, BYTE], [out, BYTE])


def ialltoallv(comm: Any, send: np.ndarray, send_counts: Sequence[int], out: np.ndarray,
               recv_counts: Sequence[int]) -> Any:
    if CALL is not None:
        _begin()
    return comm.Ialltoallv(
        [send, (list(send_counts), _displs(send_counts)), BYTE],
        [out, (list(recv_counts), _displs(recv_counts)), BYTE],
    )


def barrier(comm: Any) -> None:
    if CALL is not None:
        _begin()
    if DEADLINE is None:
        comm.Barrier()
    else:
        _wait(comm.Ibarrier())


def allgather_ints(comm: Any, values: Sequence[int]) -> np.ndarray:
    """Every rank's ``values`` (same length everywhere) as an ``(n, len)`` int64 array."""
    if CALL is not None:
        _begin()
    send = np.asarray(values, dtype=np.int64)
    out = np.empty((comm.Get_size(), send.size), np.int64)
    if DEADLINE is None:
        comm.Allgather(send, out)
    else:
        _wait(comm.Iallgather(send, out))
    return out


def allgather_obj(comm: Any, obj: object) -> list[Any]:
    """Every rank's (small, fcoll-made) metadata object, via pickled bytes."""
    payload = np.frombuffer(pickle.dumps(obj, pickle.HIGHEST_PROTOCOL), np.uint8)
    sizes = allgather_ints(comm, [payload.size])[:, 0].tolist()
    buf = allgatherv(comm, payload, np.empty(sum(sizes), np.uint8), sizes)
    offsets = np.cumsum([0, *sizes]).tolist()
    return [pickle.loads(buf[a:b].tobytes()) for a, b in itertools.pairwise(offsets)]


def bcast_obj(comm: Any, obj: object, root: int) -> Any:
    """``root``'s (small) object on every rank, via pickled bytes."""
    here = comm.Get_rank() == root
    payload = pickle.dumps(obj, pickle.HIGHEST_PROTOCOL) if here else b""
    size = bcast(comm, np.array([len(payload)], np.int64), root)[0]
    buf = np.frombuffer(payload, np.uint8).copy() if here else np.empty(size, np.uint8)
    return pickle.loads(bcast(comm, buf, root).tobytes())


def scatter_obj(comm: Any, objs: Sequence[object] | None, root: int) -> Any:
    """Object ``objs[rank]`` of ``root`` on every rank, via pickled bytes."""
    pickled = [pickle.dumps(o, pickle.HIGHEST_PROTOCOL) for o in objs] if objs is not None else []
    sizes = bcast_obj(comm, [len(p) for p in pickled], root)
    send = np.frombuffer(b"".join(pickled), np.uint8) if objs is not None else None
    buf = scatterv(comm, send, sizes, np.empty(sizes[comm.Get_rank()], np.uint8), root)
    return pickle.loads(buf.tobytes())
