"""Fast paths for the common cupy call: the default group on NCCL, blocking, a C-contiguous
array on the communicator's device whose (op, dtype) the default group has already served.

The first such call goes the whole way (`fcoll.gpu.route`, `fcoll.gpu.collectives`: choose
the backend, check, plan); when NCCL takes the data as it is (`fcoll.policy.plan.NcclPlan.native`)
and nothing could change the outcome (`fcoll.calls.work.fast_eligible`: no deadline, no debug
checks), it leaves a closure here. Later calls find it with one dict lookup in the public
function and go straight to NCCL: allocate the result (``cupy.ndarray(shape, dtype)``, the
cheapest correct allocation measured) and enqueue one NCCL call on the current stream. No
host synchronisation, no allocation outside cupy's pool: the calls can be captured in a CUDA
graph. Each closure checks its conditions (array type, contiguity, device, shape) and returns
``None`` when one fails, so the caller falls through to the whole path, which raises the
documented error or serves the case. `reset` drops every closure when a setting changes
(`fcoll.init`, a broken or destroyed group).

As in `fcoll.collectives._fast`, the closures repeat their few lines on purpose (the one
repetition of this module that `duplicates` lists): a shared helper would put one more
Python call per call: 34 ns (`timeit` of the table lookup and call, inline 64 ns, through
a helper 98 ns), 4 % of an 8 B all_reduce at n = 2 (0.84 us, bench/run.py); on a GPU the
host-side cost is all fcoll adds to a call from a fresh array.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from fcoll import runtime
from fcoll.calls.work import fast_eligible
from fcoll.diagnostics import flight

Fast = Callable[[Any], Any]
ARRAY: list[type] = []  # cupy.ndarray, once a closure exists (public functions test against it)
ALL_REDUCE: dict[tuple[Any, Any], Fast] = {}  # (op name, dtype)
REDUCE_SCATTER: dict[tuple[Any, Any], Fast] = {}  # (op name, dtype)
ALL_GATHER: dict[Any, Fast] = {}  # dtype
ALL_TO_ALL: dict[Any, Fast] = {}  # dtype
BROADCAST: dict[tuple[int, Any], Fast] = {}  # (src, dtype)
_TABLES: tuple[dict[Any, Fast], ...] = (ALL_REDUCE, REDUCE_SCATTER, ALL_GATHER, ALL_TO_ALL, BROADCAST)
UINT8 = 1  # ncclUint8


def reset() -> None:
    """Forget every fast path (their assumptions may no longer hold)."""
    for table in _TABLES:
        table.clear()


runtime.on_change(reset)


def learn(table: dict[Any, Fast], key: Any, g: Any, make: Callable[..., Fast], *args: Any) -> None:
    """Leave ``make(g, *args)`` in ``table`` under ``key`` unless one is there or calls on
    ``g`` (the group the call resolved to) may not take a fast path; the tables here serve
    the default group alone (the world).

    Example:
        >>> learn(ALL_REDUCE, ("sum", x.dtype), g, all_reduce, code, op)   # after a full call
    """
    if key not in table and g is runtime._state.world and fast_eligible(g) and g.nccl is not None:
        if not ARRAY:
            ARRAY.append(sys.modules["cupy"].ndarray)
        table[key] = make(g, *args)


def _parts(g: Any) -> tuple[Any, int, Any, Any, Any]:
    cupy = sys.modules["cupy"]
    return (g.nccl, g.nccl_device, cupy.ndarray, cupy.cuda.get_current_stream,
            cupy.cuda.runtime.getDevice)


def all_reduce(g: Any, code: int, op: int) -> Fast:
    """``fc.all_reduce(x, op)``: ``ncclAllReduce`` into a fresh array."""
    comm, dev, nd, stream, current = _parts(g)
    calls, _ends, pos, mask, ranks, clock = flight.recorder(g.key)

    def run(x: Any) -> Any:
        if type(x) is not nd or not x._c_contiguous or x.data.device_id != dev or current() != dev:
            return None
        g.seq += 1
        if calls is not None:  # enqueued: NCCL's completion is not seen by the host
            i = pos[0]
            pos[0] = i + 1
            i &= mask
            calls[i] = (ranks, g.seq, "all_reduce", "cupy", x.shape, x.dtype, clock())
        out = nd(x.shape, x.dtype)
        comm.allReduce(x.data.ptr, out.data.ptr, x.size, code, op, stream().ptr)
        return out

    return run


def reduce_scatter(g: Any, code: int, op: int) -> Fast:
    """``fc.reduce_scatter_tensor(x, op)`` along axis 0: ``ncclReduceScatter``."""
    comm, dev, nd, stream, current = _parts(g)
    calls, _ends, pos, mask, ranks, clock = flight.recorder(g.key)
    n = g.size

    def run(x: Any) -> Any:
        if (type(x) is not nd or not x._c_contiguous or x.ndim == 0 or x.shape[0] % n
                or x.data.device_id != dev or current() != dev):
            return None
        g.seq += 1
        if calls is not None:  # enqueued: NCCL's completion is not seen by the host
            i = pos[0]
            pos[0] = i + 1
            i &= mask
            calls[i] = (ranks, g.seq, "reduce_scatter_tensor", "cupy", x.shape, x.dtype, clock())
        out = nd((x.shape[0] // n, *x.shape[1:]), x.dtype)
        comm.reduceScatter(x.data.ptr, out.data.ptr, out.size, code, op, stream().ptr)
        return out

    return run


def all_gather(g: Any) -> Fast:
    """``fc.all_gather_into_tensor(x)`` along axis 0: ``ncclAllGather`` of the bytes."""
    comm, dev, nd, stream, current = _parts(g)
    calls, _ends, pos, mask, ranks, clock = flight.recorder(g.key)
    n = g.size

    def run(x: Any) -> Any:
        if (type(x) is not nd or not x._c_contiguous or x.ndim == 0 or x.data.device_id != dev
                or current() != dev):
            return None
        g.seq += 1
        if calls is not None:  # enqueued: NCCL's completion is not seen by the host
            i = pos[0]
            pos[0] = i + 1
            i &= mask
            calls[i] = (ranks, g.seq, "all_gather_into_tensor", "cupy", x.shape, x.dtype, clock())
        out = nd((n * x.shape[0], *x.shape[1:]), x.dtype)
        comm.allGather(x.data.ptr, out.data.ptr, x.nbytes, UINT8, stream().ptr)
        return out

    return run


def all_to_all(g: Any, nccl: Any) -> Fast:
    """``fc.all_to_all_single(x)`` with even splits: grouped ``ncclSend``/``ncclRecv``."""
    comm, dev, nd, stream, current = _parts(g)
    calls, _ends, pos, mask, ranks, clock = flight.recorder(g.key)
    n, start, end = g.size, nccl.groupStart, nccl.groupEnd

    def run(x: Any) -> Any:
        if (type(x) is not nd or not x._c_contiguous or x.ndim == 0 or x.shape[0] % n
                or x.data.device_id != dev or current() != dev):
            return None
        g.seq += 1
        if calls is not None:  # enqueued: NCCL's completion is not seen by the host
            i = pos[0]
            pos[0] = i + 1
            i &= mask
            calls[i] = (ranks, g.seq, "all_to_all_single", "cupy", x.shape, x.dtype, clock())
        out = nd(x.shape, x.dtype)
        block, src, dst, s = x.nbytes // n, x.data.ptr, out.data.ptr, stream().ptr
        if block:
            start()
            try:
                for p in range(n):
                    comm.send(src + p * block, block, UINT8, p, s)
                    comm.recv(dst + p * block, block, UINT8, p, s)
            finally:
                end()
        return out

    return run


def broadcast(g: Any, root: int) -> Fast:
    """``fc.broadcast(x, src)``: ``ncclBroadcast`` from ``x`` into a fresh array."""
    comm, dev, nd, stream, current = _parts(g)
    calls, _ends, pos, mask, ranks, clock = flight.recorder(g.key)

    def run(x: Any) -> Any:
        if type(x) is not nd or not x._c_contiguous or x.data.device_id != dev or current() != dev:
            return None
        g.seq += 1
        if calls is not None:  # enqueued: NCCL's completion is not seen by the host
            i = pos[0]
            pos[0] = i + 1
            i &= mask
            calls[i] = (ranks, g.seq, "broadcast", "cupy", x.shape, x.dtype, clock())
        out = nd(x.shape, x.dtype)
        if x.nbytes:
            comm.broadcast(x.data.ptr, out.data.ptr, x.nbytes, UINT8, root, stream().ptr)
        return out

    return run
