"""The MPI transport: mpi4py's buffer methods on C-contiguous numpy buffers.

Every function takes the group's communicator and C-contiguous buffers; none validates
its arguments or applies dtype policy (callers do). Reductions allocate their result
(`allreduce` and `reduce_scatter_block` write into an ``out`` given instead) and travel as
the buffer's numpy dtype. Data movement writes into the ``out`` array the
caller allocated (its final dtype and shape) and travels as ``MPI.BYTE``, so any dtype,
bfloat16 included, moves bit-exact; counts of the ``v`` variants are in bytes.

Each function writes out its two forms, the blocking MPI call or its nonblocking form
polled against the call's deadline, rather than pass both to a helper: that would build
two closures and make one more Python call on every call that misses the fast paths
(34 ns for the call alone, measured with `timeit` here).
"""

from __future__ import annotations

import itertools
import pickle
from collections.abc import Sequence
from typing import Any

import numpy as np

from fcoll.calls.work import Call, wait_request, wait_requests
from fcoll.runtime import mpi

NAME = "mpi"
MPI = mpi()
BYTE = MPI.BYTE

# Every function takes the public call in progress (`fcoll.calls.work.Call`, made by
# `fcoll.groups.membership.member`): its communicator, and its deadline: without one, MPI's blocking
# form; with one, the nonblocking form polled until done or late (`wait_request`). The
# first operation of a call counts it in the group's call number (`Call.begin`).


def displs(counts: Sequence[int]) -> list[int]:
    return [0, *np.cumsum(counts[:-1], dtype=np.int64).tolist()] if counts else []


def allreduce(call: Call, send: np.ndarray, op: Any, out: np.ndarray | None = None) -> np.ndarray:
    """``send`` reduced over the group, in a new array or into ``out`` (C-contiguous, its
    shape and dtype; ``out is send``: in place)."""
    comm = call.begin(send.nbytes)
    if out is None:
        out = np.empty(send.shape, send.dtype)
    data = MPI.IN_PLACE if out is send else send
    if call.seconds is None:
        comm.Allreduce(data, out, op)
        call.end()
    else:
        wait_request(comm.Iallreduce(data, out, op), call)
    return out


def reduce(call: Call, send: np.ndarray, op: Any, root: int) -> np.ndarray | None:
    comm = call.begin(send.nbytes)
    out = np.empty(send.shape, send.dtype) if comm.Get_rank() == root else None
    if call.seconds is None:
        comm.Reduce(send, out, op, root)
        call.end()
    else:
        wait_request(comm.Ireduce(send, out, op, root), call)
    return out


def reduce_scatter_block(call: Call, send: np.ndarray, op: Any, out: np.ndarray | None = None
                         ) -> np.ndarray:
    """Block ``rank`` of ``send`` split evenly along axis 0, reduced, in a new array or into
    ``out`` (C-contiguous, the block's size and dtype, not overlapping ``send``)."""
    comm = call.begin(send.nbytes)
    if out is None:
        out = np.empty((send.shape[0] // comm.Get_size(), *send.shape[1:]), send.dtype)
    if call.seconds is None:
        comm.Reduce_scatter_block(send, out, op)
        call.end()
    else:
        wait_request(comm.Ireduce_scatter_block(send, out, op), call)
    return out


def reduce_scatter(call: Call, send: np.ndarray, counts: Sequence[int], op: Any) -> np.ndarray:
    comm = call.begin(send.nbytes)
    out = np.empty(counts[comm.Get_rank()], send.dtype)
    if call.seconds is None:
        comm.Reduce_scatter(send, out, list(counts), op)
        call.end()
    else:
        wait_request(comm.Ireduce_scatter(send, out, list(counts), op), call)
    return out


def scan(call: Call, send: np.ndarray, op: Any, exclusive: bool) -> np.ndarray:
    """``Scan`` (``Exscan`` if ``exclusive``: rank 0's result is left unwritten)."""
    comm = call.begin(send.nbytes)
    out = np.empty(send.shape, send.dtype)
    if call.seconds is None:
        (comm.Exscan if exclusive else comm.Scan)(send, out, op)
        call.end()
    else:
        wait_request((comm.Iexscan if exclusive else comm.Iscan)(send, out, op), call)
    return out


def bcast(call: Call, buf: np.ndarray, root: int) -> np.ndarray:
    comm = call.begin(buf.nbytes)
    if call.seconds is None:
        comm.Bcast([buf, BYTE], root)
        call.end()
    else:
        wait_request(comm.Ibcast([buf, BYTE], root), call)
    return buf


# Broadcasts of at least this many bytes go in chunks of at least PIPELINE_CHUNK bytes (at
# most 16), so the root's copy of chunk k+1 into its result overlaps the transfer of chunk
# k: at n=2, 64 MiB took 16.7 ms with copy-then-Bcast, 7.9 ms pipelined (raw in-place
# Bcast: 8.1 ms); 16 MiB 3.1 -> 1.5 ms (raw 1.9). Below 8 MiB one Bcast was faster in
# later runs (1-4 MiB: 1.2-2.3x raw against 3.4-4.2x in chunks). See docs/performance.md.
PIPELINE_BYTES = 8 << 20
PIPELINE_CHUNK = 256 << 10


def bcast_copy(call: Call, x: np.ndarray, root: int) -> np.ndarray:
    """A new array holding ``root``'s C-contiguous ``x`` on every rank, sent in chunks."""
    comm = call.begin(x.nbytes)
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
    wait_requests(requests, call)
    return out


def allgather(call: Call, send: np.ndarray, out: np.ndarray) -> np.ndarray:
    comm = call.begin(send.nbytes)
    if call.seconds is None:
        comm.Allgather([send, BYTE], [out, BYTE])
        call.end()
    else:
        wait_request(comm.Iallgather([send, BYTE], [out, BYTE]), call)
    return out


def allgatherv(call: Call, send: np.ndarray, out: np.ndarray, counts: Sequence[int]) -> np.ndarray:
    """``counts`` in bytes, one per rank."""
    comm = call.begin(send.nbytes)
    if call.seconds is None:
        comm.Allgatherv([send, BYTE], [out, (list(counts), displs(counts)), BYTE])
        call.end()
    else:
        wait_request(comm.Iallgatherv([send, BYTE], [out, (list(counts), displs(counts)), BYTE]), call)
    return out


def gatherv(call: Call, send: np.ndarray, out: np.ndarray | None, counts: Sequence[int], root: int
) -> np.ndarray | None:
    """``out`` and ``counts`` (bytes) are read on ``root`` only."""
    comm = call.begin(send.nbytes)
    if comm.Get_rank() != root:
        if call.seconds is None:
            comm.Gatherv([send, BYTE], None, root)
            call.end()
        else:
            wait_request(comm.Igatherv([send, BYTE], None, root), call)
        return None
    if call.seconds is None:
        comm.Gatherv([send, BYTE], [out, (list(counts), displs(counts)), BYTE], root)
        call.end()
    else:
        wait_request(comm.Igatherv([send, BYTE], [out, (list(counts), displs(counts)), BYTE], root), call)
    return out


def scatterv(call: Call, send: np.ndarray | None, counts: Sequence[int], out: np.ndarray, root: int
) -> np.ndarray:
    """``send`` and ``counts`` (bytes) are read on ``root`` only."""
    comm = call.begin(0 if send is None else send.nbytes)
    spec = None if send is None else [send, (list(counts), displs(counts)), BYTE]
    if call.seconds is None:
        comm.Scatterv(spec, [out, BYTE], root)
        call.end()
    else:
        wait_request(comm.Iscatterv(spec, [out, BYTE], root), call)
    return out


def alltoall(call: Call, send: np.ndarray, out: np.ndarray) -> np.ndarray:
    comm = call.begin(send.nbytes)
    if call.seconds is None:
        comm.Alltoall([send, BYTE], [out, BYTE])
        call.end()
    else:
        wait_request(comm.Ialltoall([send, BYTE], [out, BYTE]), call)
    return out


def alltoallv(call: Call,
    send: np.ndarray,
    send_counts: Sequence[int],
    out: np.ndarray,
    recv_counts: Sequence[int],
) -> np.ndarray:
    """Counts in bytes, one per rank."""
    comm = call.begin(send.nbytes)
    spec = ([send, (list(send_counts), displs(send_counts)), BYTE],
            [out, (list(recv_counts), displs(recv_counts)), BYTE])
    if call.seconds is None:
        comm.Alltoallv(*spec)
        call.end()
    else:
        wait_request(comm.Ialltoallv(*spec), call)
    return out


# Nonblocking forms: each starts the operation and returns its MPI request. The caller
# keeps every buffer alive (and unmodified) until the request completes.


def iallreduce(call: Call, send: np.ndarray, out: np.ndarray, op: Any) -> Any:
    comm = call.begin(send.nbytes)
    return comm.Iallreduce(send, out, op)


def ireduce(call: Call, send: np.ndarray, out: np.ndarray | None, op: Any, root: int) -> Any:
    comm = call.begin(send.nbytes)
    return comm.Ireduce(send, out, op, root)


def ireduce_scatter_block(call: Call, send: np.ndarray, out: np.ndarray, op: Any) -> Any:
    comm = call.begin(send.nbytes)
    return comm.Ireduce_scatter_block(send, out, op)


def iscan(call: Call, send: np.ndarray, out: np.ndarray, op: Any, exclusive: bool) -> Any:
    comm = call.begin(send.nbytes)
    return (comm.Iexscan if exclusive else comm.Iscan)(send, out, op)


def ibcast(call: Call, buf: np.ndarray, root: int) -> Any:
    comm = call.begin(buf.nbytes)
    return comm.Ibcast([buf, BYTE], root)


def iallgather(call: Call, send: np.ndarray, out: np.ndarray) -> Any:
    comm = call.begin(send.nbytes)
    return comm.Iallgather([send, BYTE], [out, BYTE])


def iallgatherv(call: Call, send: np.ndarray, out: np.ndarray, counts: Sequence[int]) -> Any:
    comm = call.begin(send.nbytes)
    return comm.Iallgatherv([send, BYTE], [out, (list(counts), displs(counts)), BYTE])


def igather(call: Call, send: np.ndarray, out: np.ndarray | None, root: int) -> Any:
    comm = call.begin(send.nbytes)
    return comm.Igather([send, BYTE], None if out is None else [out, BYTE], root)


def ialltoall(call: Call, send: np.ndarray, out: np.ndarray) -> Any:
    comm = call.begin(send.nbytes)
    return comm.Ialltoall([send, BYTE], [out, BYTE])


def ialltoallv(call: Call, send: np.ndarray, send_counts: Sequence[int], out: np.ndarray,
               recv_counts: Sequence[int]) -> Any:
    comm = call.begin(send.nbytes)
    return comm.Ialltoallv(
        [send, (list(send_counts), displs(send_counts)), BYTE],
        [out, (list(recv_counts), displs(recv_counts)), BYTE],
    )


def barrier(call: Call) -> None:
    """``MPI_Ibarrier``, polled (`wait_request`): a rank that waits long sleeps between
    polls instead of spinning in MPI's progress loop, deadline or not."""
    wait_request(call.begin(0).Ibarrier(), call)


def allgather_ints(call: Call, values: Sequence[int]) -> np.ndarray:
    """Every rank's ``values`` (same length everywhere) as an ``(n, len)`` int64 array."""
    comm = call.begin(8 * len(values))
    send = np.asarray(values, dtype=np.int64)
    out = np.empty((comm.Get_size(), send.size), np.int64)
    if call.seconds is None:
        comm.Allgather(send, out)
        call.end()
    else:
        wait_request(comm.Iallgather(send, out), call)
    return out


def allgather_obj(call: Call, obj: object) -> list[Any]:
    """Every rank's (small, fcoll-made) metadata object, via pickled bytes."""
    payload = np.frombuffer(pickle.dumps(obj, pickle.HIGHEST_PROTOCOL), np.uint8)
    sizes = allgather_ints(call, [payload.size])[:, 0].tolist()
    buf = allgatherv(call, payload, np.empty(sum(sizes), np.uint8), sizes)
    offsets = np.cumsum([0, *sizes]).tolist()
    return [pickle.loads(buf[a:b].tobytes()) for a, b in itertools.pairwise(offsets)]


def bcast_obj(call: Call, obj: object, root: int) -> Any:
    """``root``'s (small) object on every rank, via pickled bytes."""
    here = call.comm.Get_rank() == root
    payload = pickle.dumps(obj, pickle.HIGHEST_PROTOCOL) if here else b""
    size = bcast(call, np.array([len(payload)], np.int64), root)[0]
    buf = np.frombuffer(payload, np.uint8).copy() if here else np.empty(size, np.uint8)
    return pickle.loads(bcast(call, buf, root).tobytes())


def scatter_obj(call: Call, objs: Sequence[object] | None, root: int) -> Any:
    """Object ``objs[rank]`` of ``root`` on every rank, via pickled bytes."""
    pickled = [pickle.dumps(o, pickle.HIGHEST_PROTOCOL) for o in objs] if objs is not None else []
    sizes = bcast_obj(call, [len(p) for p in pickled], root)
    send = np.frombuffer(b"".join(pickled), np.uint8) if objs is not None else None
    buf = scatterv(call, send, sizes, np.empty(sizes[call.comm.Get_rank()], np.uint8), root)
    return pickle.loads(buf.tobytes())
