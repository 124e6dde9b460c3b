"""The NCCL transport: ``cupy.cuda.nccl`` on cupy's current stream.

Every function takes C-contiguous cupy buffers and enqueues NCCL work on the current
stream; none synchronises the host or validates its arguments (callers do). Counts are
in elements of the NCCL datatype passed. A group's NCCL communicator is created on its
first GPU call (the unique id travels by ``Bcast`` over the group's MPI communicator)
and destroyed with the group.
"""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from fcoll import _runtime

DEVICE_ENV = "FCOLL_GPU_DEVICE"
_why = ""


def module() -> Any | None:
    """``cupy.cuda.nccl`` when cupy is imported and its NCCL library loads, else None."""
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
    return nccl


def available() -> bool:
    """Whether cupy's NCCL bindings are usable in this process."""
    return module() is not None


def why_unavailable() -> str:
    """Why `available` last returned False."""
    return _why or "unknown"


def version() -> int:
    """NCCL's runtime version code (e.g. 22105 for 2.21.5); 0 if unknown."""
    nccl = module()
    return int(nccl.get_version()) if nccl is not None else 0


def stream_ptr() -> int:
    """The handle of cupy's current stream."""
    import cupy

    return int(cupy.cuda.get_current_stream().ptr)


def local_device(comm: Any) -> int:
    """The device this rank should use: ``FCOLL_GPU_DEVICE`` if set, else its node-local
    rank (``Split_type(COMM_TYPE_SHARED)`` of ``comm``) modulo the visible devices."""
    import cupy

    if os.environ.get(DEVICE_ENV, "").strip():
        value = os.environ[DEVICE_ENV].strip()
        if not value.isdigit():
            raise ValueError(f"{DEVICE_ENV}: expected a device number, got {value!r}")
        return int(value)
    node = comm.Split_type(_runtime.mpi().COMM_TYPE_SHARED)
    try:
        local = node.Get_rank()
    finally:
        node.Free()
    return int(local % max(cupy.cuda.runtime.getDeviceCount(), 1))


def _check_devices(comm: Any, device: int, fn: str) -> None:
    """`RuntimeError` on every rank if two ranks of the group drive the same GPU."""
    import cupy

    bus = cupy.cuda.Device(device).pci_bus_id
    entries = comm.allgather((_runtime.mpi().Get_processor_name(), bus))
    seen: dict[tuple[str, str], int] = {}
    for rank, entry in enumerate(entries):
        if entry in seen:
            raise RuntimeError(
                f"{fn}: expected one GPU per rank (NCCL allows no more), got group ranks "
                f"{seen[entry]} and {rank} both on GPU {entry[1]} of {entry[0]}; call "
                "fcoll.gpu.use_local_device() (or cupy.cuda.Device(i).use()) before "
                "allocating arrays, or set FCOLL_GPU_DEVICE per rank")
        seen[entry] = rank


def communicator(group: Any, device: int, fn: str) -> Any:
    """The group's NCCL communicator (created on ``device`` at the group's first GPU call).

    Collective over the group the first time; later calls on another device raise.
    """
    comm = group.nccl
    if comm is not None:
        if group.nccl_device != device:
            raise ValueError(f"{fn}: expected arrays on GPU {group.nccl_device} (the device of "
                             f"the group's NCCL communicator), got GPU {device}")
        return comm
    nccl = module()
    assert nccl is not None  # callers choose this backend only when NCCL is available
    mpi_comm = group.comm(fn)
    _check_devices(mpi_comm, device, fn)
    uid = nccl.get_unique_id() if group.rank == 0 else None
    uid = mpi_comm.bcast(uid, root=0)
    import cupy

    with cupy.cuda.Device(device):
        group.nccl = nccl.NcclCommunicator(group.size, uid, group.rank)
    group.nccl_device = device
    return group.nccl


def destroy(group: Any) -> None:
    """Free the group's NCCL communicator, if it has one (called by `Group.destroy`)."""
    if group.nccl is not None:
        group.nccl.destroy()
        group.nccl = None


@contextmanager
def grouped() -> Iterator[None]:
    """``ncclGroupStart``/``ncclGroupEnd`` around the calls in the block (fused launch)."""
    nccl = module()
    assert nccl is not None
    nccl.groupStart()
    try:
        yield
    finally:
        nccl.groupEnd()


def _ptr(a: Any) -> int:
    return int(a.data.ptr)


def allreduce(comm: Any, send: Any, out: Any, count: int, datatype: int, op: int) -> Any:
    comm.allReduce(_ptr(send), _ptr(out), count, datatype, op, stream_ptr())
    return out


def reduce(comm: Any, send: Any, out: Any, count: int, datatype: int, op: int, root: int) -> Any:
    """``out`` is written on ``root`` only (other ranks may pass ``send`` as ``out``)."""
    comm.reduce(_ptr(send), _ptr(out), count, datatype, op, root, stream_ptr())
    return out


def reduce_scatter(comm: Any, send: Any, out: Any, recvcount: int, datatype: int, op: int) -> Any:
    comm.reduceScatter(_ptr(send), _ptr(out), recvcount, datatype, op, stream_ptr())
    return out


def broadcast(comm: Any, send: Any, out: Any, count: int, datatype: int, root: int) -> Any:
    comm.broadcast(_ptr(send), _ptr(out), count, datatype, root, stream_ptr())
    return out


def allgather(comm: Any, send: Any, out: Any, count: int, datatype: int) -> Any:
    comm.allGather(_ptr(send), _ptr(out), count, datatype, stream_ptr())
    return out


def exchange(comm: Any, sends: Sequence[tuple[Any, int]], recvs: Sequence[tuple[Any, int]]) -> None:
    """Grouped point-to-point: ``sends``/``recvs`` are ``(uint8 buffer, peer)`` pairs, started
    together in one ``ncclGroupStart``/``End`` (the all-to-all and gather patterns)."""
    stream = stream_ptr()
    with grouped():
        for buf, peer in sends:
            if buf.size:
                comm.send(_ptr(buf), buf.size, 1, peer, stream)
        for buf, peer in recvs:
            if buf.size:
                comm.recv(_ptr(buf), buf.size, 1, peer, stream)
