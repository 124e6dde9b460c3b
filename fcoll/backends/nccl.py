"""The NCCL transport: ``cupy.cuda.nccl`` on cupy's current stream (a `fcoll.backends.Backend`).

Every operation takes the call in progress and C-contiguous cupy buffers, and enqueues
NCCL work on the current stream; none synchronises the host or validates its arguments
(callers do). Reductions travel as ``send``'s dtype (`fcoll.policy.dtypes.NCCL_DATATYPES`) with
an `fcoll.policy.ops.NcclOp`; data movement travels as bytes, so it is bit-exact for every
dtype. A group's NCCL communicator is created on its first GPU call (the unique id
travels by ``Bcast`` over the group's MPI communicator) and destroyed with the group.
"""

from __future__ import annotations

import os
import sys
import time
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import ml_dtypes
import numpy as np

from fcoll import runtime
from fcoll.backends import mpi as host
from fcoll.calls.errors import timed_out
from fcoll.calls.work import Call, backoff

NAME = "nccl"
# ncclDataType_t codes (nccl.h; stable since NCCL 2.0, bfloat16 from 2.10). The other
# dtypes fcoll accepts are mapped onto these by `fcoll.policy.plan.nccl_plan`.
DATATYPES: dict[np.dtype[Any], int] = {
    np.dtype("int8"): 0, np.dtype("uint8"): 1, np.dtype("int32"): 2, np.dtype("uint32"): 3,
    np.dtype("int64"): 4, np.dtype("uint64"): 5, np.dtype("float16"): 6,
    np.dtype("float32"): 7, np.dtype("float64"): 8, np.dtype(ml_dtypes.bfloat16): 9,
}
UINT8 = DATATYPES[np.dtype("uint8")]

DEVICE_ENV = "FCOLL_GPU_DEVICE"
_why = ""
_FOUND: list[Any] = []  # cupy.cuda.nccl and its version, once found (they cannot change)


def module() -> Any | None:
    """``cupy.cuda.nccl`` when cupy is imported and its NCCL library loads, else None.

    Found once: later calls are one list lookup (a failed search is retried, since cupy
    may be imported later)."""
    if _FOUND:
        return _FOUND[0]
    global _why
    if "cupy" not in sys.modules:
        _why = "cupy is not imported"
        return None
    try:
        with warnings.catch_warnings():  # cupy warns when libnccl cannot be loaded
            warnings.simplefilter("ignore")
            from cupy.cuda import nccl
    except Exception as error:  # an import failure of any kind means "no NCCL"
        _why = f"{type(error).__name__}: {error}"
        return None
    if not getattr(nccl, "available", False) or not hasattr(nccl, "NcclCommunicator"):
        _why = "cupy.cuda.nccl.available is False (libnccl.so.2 not found)"
        return None
    _FOUND.extend((nccl, int(nccl.get_version())))
    return nccl


def available() -> bool:
    """Whether cupy's NCCL bindings are usable in this process."""
    return module() is not None


def why_unavailable() -> str:
    """Why `available` last returned False."""
    return _why or "unknown"


def version() -> int:
    """NCCL's runtime version code (e.g. 22105 for 2.21.5); 0 if unknown."""
    return int(_FOUND[1]) if module() is not None else 0


def forget() -> None:
    """Look for NCCL again on the next call (tests that swap the cupy module)."""
    _FOUND.clear()


def stream_ptr() -> int:
    """The handle of cupy's current stream (read per call: capture runs on its own stream)."""
    return int(sys.modules["cupy"].cuda.get_current_stream().ptr)


def local_device(comm: Any) -> int:
    """The device this rank should use: ``FCOLL_GPU_DEVICE`` if set, else its node-local
    rank (``Split_type(COMM_TYPE_SHARED)`` of ``comm``) modulo the visible devices."""
    import cupy

    if os.environ.get(DEVICE_ENV, "").strip():
        value = os.environ[DEVICE_ENV].strip()
        if not value.isdigit():
            raise ValueError(f"{DEVICE_ENV}: expected a device number, got {value!r}")
        return int(value)
    node = comm.Split_type(runtime.mpi().COMM_TYPE_SHARED)
    try:
        local = node.Get_rank()
    finally:
        node.Free()
    return int(local % max(cupy.cuda.runtime.getDeviceCount(), 1))


def sharing(call: Call, device: int, extra: object = None) -> tuple[list[list[int]], list[Any]]:
    """The sets of ranks of ``call``'s group that drive one GPU (same host and PCI bus id),
    each in rank order (empty when every rank has a GPU of its own), and every rank's
    ``extra``. One exchange over the group's MPI communicator, under the call's deadline,
    so every rank gets the same answer.

    Example:
        >>> sharing(call, 0)           # ranks 0 and 1 of 3 both on GPU 0 of one host
        ([[0, 1]], [None, None, None])
    """
    import cupy

    bus = cupy.cuda.Device(device).pci_bus_id
    entries = host.allgather_obj(call, (runtime.mpi().Get_processor_name(), bus, extra))
    by_gpu: dict[tuple[str, str], list[int]] = {}
    for rank, (name, bus_id, _) in enumerate(entries):
        by_gpu.setdefault((name, bus_id), []).append(rank)
    return [ranks for ranks in by_gpu.values() if len(ranks) > 1], [e[2] for e in entries]


def describe(shared: Sequence[Sequence[int]]) -> str:
    """``shared`` (from `sharing`) in words: "ranks 0 and 1 share a GPU; ..."."""
    return "; ".join(" and ".join(map(str, ranks)).join(("ranks ", " share a GPU")) for ranks in shared)


def communicator(group: Any, device: int, fn: str) -> Any:
    """The group's NCCL communicator (created on ``device`` at the group's first GPU call).

    Collective over the group the first time (the exchange before it is bounded by the
    deadline of the group's call in progress); later calls on another device raise.
    """
    comm = group.nccl
    if comm is not None:
        if group.nccl_device != device:
            raise ValueError(f"{fn}: expected arrays on GPU {group.nccl_device} (the device of "
                             f"the group's NCCL communicator), got GPU {device}")
        return comm
    nccl = module()
    assert nccl is not None  # callers choose this backend only when NCCL is available
    group.comm(fn)  # raises the documented error for a group that cannot be used
    # every rank's GPU and rank 0's unique id, in one exchange bounded by the call's deadline
    shared, ids = sharing(group.call, device, nccl.get_unique_id() if group.rank == 0 else None)
    if shared:
        raise RuntimeError(
            f"{fn}: expected one GPU per rank (NCCL allows no more), got group {describe(shared)}; "
            "call fcoll.gpu.use_local_device() (or cupy.cuda.Device(i).use()) before allocating "
            "arrays, set FCOLL_GPU_DEVICE per rank, or leave FCOLL_GPU_TRANSPORT unset (auto: "
            "such groups use MPI)")
    uid = ids[0]
    import cupy

    with cupy.cuda.Device(device):
        group.nccl = nccl.NcclCommunicator(group.size, uid, group.rank)
    group.nccl_device = device
    return group.nccl


def wait(call: Call) -> None:
    """Under a deadline, block the host until the NCCL work ``call`` enqueued is done.

    Without a deadline (``call.seconds is None``) it returns at once: the work stays in
    stream order. With one, it records a CUDA event on the current stream of the group's
    NCCL device and polls it (``event.done``, `fcoll.calls.work.backoff` between polls, as
    `fcoll.calls.work.wait_request` does) until it completes or the deadline passes. Then, as
    torch's NCCL watchdog does, it aborts the group's NCCL communicator (`abort`), marks the
    group unusable and raises `fcoll.calls.errors.CollectiveTimeoutError`.

    Example:
        >>> out = allreduce(call, x, op)   # enqueued on the current stream
        >>> wait(call)                     # fc.init(timeout=5): returns once out is ready,
        ...                                # or raises after 5 s, on this rank
    """
    group, seconds = call.group, call.seconds
    if seconds is None or group.nccl is None:
        return
    cuda = sys.modules["cupy"].cuda
    with cuda.Device(group.nccl_device):
        event = cuda.Event(block=False, disable_timing=True, interprocess=False)
        event.record(cuda.get_current_stream())
    pause, started = 1e-5, time.monotonic()
    while not event.done:  # cudaEventQuery: never blocks
        if time.monotonic() - call.start > seconds:
            abort(group)
            raise timed_out(call.fn, group, seconds, group.seq)
        pause = backoff(started, pause)


def abort(group: Any) -> None:
    """Abort the group's NCCL communicator (``ncclCommAbort``: its work in flight ends, and
    no other rank takes part) and drop it; the group makes no new one."""
    comm, group.nccl = group.nccl, None
    if comm is not None:
        comm.abort()


@contextmanager
def grouped(call: Call | None = None, buf: Any = None) -> Iterator[None]:
    """``ncclGroupStart``/``ncclGroupEnd`` around the calls in the block (fused launch).

    Given the ``call`` and a buffer, the group's communicator is made first, outside the
    group: NCCL 2.28 defers the set-up of a communicator made inside one, and the calls in
    the group then fail with ``INVALID_ARGUMENT``."""
    nccl = module()
    assert nccl is not None
    if call is not None:
        communicator_for(call, buf)
    nccl.groupStart()
    try:
        yield
    finally:
        nccl.groupEnd()


def _ptr(a: Any) -> int:
    return int(a.data.ptr)


def communicator_for(call: Call, buf: Any) -> Any:
    """The NCCL communicator of the call's group, on ``buf``'s device; counts the call."""
    call.begin()
    return communicator(call.group, int(buf.device.id), call.fn)


def _bytes(a: Any) -> Any:
    return a.reshape(-1).view(np.uint8)


def allreduce(call: Call, send: Any, op: int) -> Any:
    comm, out = communicator_for(call, send), _empty_like(send)
    comm.allReduce(_ptr(send), _ptr(out), send.size, DATATYPES[send.dtype], op, stream_ptr())
    return out


def reduce(call: Call, send: Any, op: int, root: int) -> Any | None:
    """The result on ``root``; None elsewhere (NCCL reads recvbuff on the root only)."""
    comm = communicator_for(call, send)
    out = _empty_like(send) if call.group.rank == root else send
    comm.reduce(_ptr(send), _ptr(out), send.size, DATATYPES[send.dtype], op, root,
                stream_ptr())
    return out if call.group.rank == root else None


def reduce_scatter_block(call: Call, send: Any, op: int) -> Any:
    """Block ``rank`` of ``send`` split evenly along axis 0, reduced."""
    comm, n = communicator_for(call, send), call.group.size
    out = sys.modules["cupy"].ndarray((send.shape[0] // n, *send.shape[1:]), send.dtype)
    comm.reduceScatter(_ptr(send), _ptr(out), out.size, DATATYPES[send.dtype], op,
                       stream_ptr())
    return out


def bcast(call: Call, buf: Any, root: int) -> Any:
    """``root``'s bytes of ``buf`` into ``buf`` on every rank (in place)."""
    comm = communicator_for(call, buf)
    comm.broadcast(_ptr(buf), _ptr(buf), buf.nbytes, UINT8, root, stream_ptr())
    return buf


def allgather(call: Call, send: Any, out: Any) -> Any:
    comm = communicator_for(call, send)
    comm.allGather(_ptr(send), _ptr(out), send.nbytes, UINT8, stream_ptr())
    return out


def alltoall(call: Call, send: Any, out: Any) -> Any:
    """Even blocks of bytes: block ``p`` of ``send`` to rank ``p``, into block ``p`` of ``out``."""
    n = call.group.size
    counts = [send.nbytes // n] * n
    return alltoallv(call, send, counts, out, [out.nbytes // n] * n)


def alltoallv(call: Call, send: Any, send_counts: Sequence[int], out: Any,
              recv_counts: Sequence[int]) -> Any:
    """Counts in bytes, one per rank (grouped sends and receives)."""
    comm = communicator_for(call, send)
    data, into = _bytes(send), _bytes(out)
    sends, recvs, a, b = [], [], 0, 0
    for peer, (s, r) in enumerate(zip(send_counts, recv_counts, strict=True)):
        sends.append((data[a : a + s], peer))
        recvs.append((into[b : b + r], peer))
        a, b = a + s, b + r
    exchange(comm, sends, recvs)
    return out


def exchange(comm: Any, sends: Sequence[tuple[Any, int]], recvs: Sequence[tuple[Any, int]]) -> None:
    """Grouped point-to-point: ``sends``/``recvs`` are ``(uint8 buffer, peer)`` pairs, started
    together in one ``ncclGroupStart``/``End`` (the all-to-all and gather patterns)."""
    stream = stream_ptr()
    with grouped():
        for buf, peer in sends:
            if buf.size:
                comm.send(_ptr(buf), buf.size, UINT8, peer, stream)
        for buf, peer in recvs:
            if buf.size:
                comm.recv(_ptr(buf), buf.size, UINT8, peer, stream)


def _empty_like(a: Any) -> Any:
    """A fresh C-contiguous array like ``a`` on the current device: ``cupy.ndarray(shape,
    dtype)`` is the cheapest correct allocation measured (1.8 us; ``cupy.empty`` 2.4 us,
    ``cupy.empty_like`` 4.0 us on an H100 host), see docs/performance.md."""
    return sys.modules["cupy"].ndarray(a.shape, a.dtype)
