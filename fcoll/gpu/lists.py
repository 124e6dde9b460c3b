"""List, coalesced and permutation forms on cupy arrays over NCCL (see `collectives`).

Shapes and dtypes travel first over MPI (the numpy path's checks, so disagreements raise
on every rank); the bytes then move in one ``ncclGroupStart``/``End`` of sends and
receives, or of collectives for the coalesced forms (fused into one launch by NCCL).
Each function takes the backend first, as the `route` table calls them; it is always
`fcoll.backends.nccl` here (the MPI transports stage these forms through host memory).
The coalesced forms share their first lines (``member``, an empty list returns ``[]``, the
checks) in the order every public function keeps (docs/design.md, "Layers"); they differ
from there on.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from fcoll.backends import Backend, nccl
from fcoll.backends import mpi as host
from fcoll.calls.work import Call
from fcoll.gpu.collectives import as_bytes, cp, enter, plan_for
from fcoll.groups.group import Group
from fcoll.groups.membership import member
from fcoll.policy.validate import check_count, check_divisible, check_permutation, check_rank, one_dtype


def _meta(x: Any) -> tuple[tuple[int, ...], str]:
    return tuple(x.shape), str(x.dtype)


def _split(parts: list[Any], dtype: np.dtype[Any], shapes: list[tuple[int, ...]]) -> list[Any]:
    return [p.view(dtype).reshape(s) for p, s in zip(parts, shapes, strict=True)]


def _nbytes(shape: Sequence[int], dtype: np.dtype[Any]) -> int:
    return int(np.prod(shape, dtype=np.int64)) * dtype.itemsize


def _exchange(call: Call, sends: list[tuple[Any, int]], recv_sizes: list[int]) -> list[Any]:
    """Grouped send/recv: ``sends`` are (uint8 buffer, peer); one buffer received per rank."""
    recvs = [cp().empty(size, np.uint8) for size in recv_sizes]
    comm = nccl.communicator_for(call, sends[0][0] if sends else recvs[0])
    nccl.exchange(comm, sends, [(buf, p) for p, buf in enumerate(recvs)])
    return recvs


def all_gather(backend: Backend, x: Any, group: Any = None) -> list[Any]:
    fn = "all_gather"
    g, call = enter(group, x, fn)
    meta = host.allgather_obj(call, _meta(x))
    dtype = one_dtype([d for _, d in meta], fn)
    shapes = [s for s, _ in meta]
    with x.device:
        data = as_bytes(x)
        parts = _exchange(call, [(data, p) for p in range(g.size)],
                          [_nbytes(s, dtype) for s in shapes])
        return _split(parts, dtype, shapes)


def gather(backend: Backend, x: Any, dst: int = 0, group: Any = None) -> list[Any] | None:
    fn = "gather"
    g, call = enter(group, x, fn)
    root = check_rank(dst, g.size, fn, "dst")
    meta = host.allgather_obj(call, _meta(x))
    dtype = one_dtype([d for _, d in meta], fn)
    shapes = [s for s, _ in meta]
    with x.device:
        send = as_bytes(x)
        recvs = [cp().empty(_nbytes(s, dtype), np.uint8) for s in shapes] if g.rank == root else []
        comm = nccl.communicator_for(call, send)
        nccl.exchange(comm, [(send, root)], [(buf, p) for p, buf in enumerate(recvs)])
        return _split(recvs, dtype, shapes) if g.rank == root else None


def scatter_send(g: Group, chunks: Sequence[Any], root: int) -> Any:
    """The root's part of `fcoll.scatter` (its metadata already sent): send, keep its own."""
    with chunks[root].device:
        comm = nccl.communicator_for(g.call, chunks[root])
        nccl.exchange(comm, [(as_bytes(c), p) for p, c in enumerate(chunks) if p != root], [])
        return cp().array(chunks[root], order="C", copy=True)


def scatter_receive(g: Group, shape: tuple[int, ...], dtype: np.dtype[Any], root: int) -> Any:
    """A non-root rank's part of `fcoll.scatter`: receive on the current device."""
    out = cp().empty(shape, dtype)
    comm = nccl.communicator_for(g.call, out)
    nccl.exchange(comm, [], [(out.reshape(-1).view(np.uint8), root)])
    return out


def all_to_all(backend: Backend, chunks: Sequence[Any], group: Any = None) -> list[Any]:
    fn = "all_to_all"
    g, call = member(group, fn)
    check_count(chunks, g.size, fn, "chunks")
    enter(group, chunks[0], fn)
    meta = host.allgather_obj(call, [_meta(c) for c in chunks])
    dtype = one_dtype([row[0][1] for row in meta], fn)
    shapes = [meta[p][g.rank][0] for p in range(g.size)]
    with chunks[0].device:
        sends = [(as_bytes(c), p) for p, c in enumerate(chunks)]
        parts = _exchange(call, sends, [_nbytes(s, dtype) for s in shapes])
        return _split(parts, dtype, shapes)


def all_reduce_coalesced(backend: Backend, xs: Sequence[Any], op: object = "sum",
                         group: Any = None) -> list[Any]:
    """One NCCL all-reduce per array, launched together (``ncclGroupStart``/``End``)."""
    fn = "all_reduce_coalesced"
    g, call = member(group, fn)
    if not xs:
        return []
    enter(group, xs[0], fn)
    plans = [plan_for(x.dtype, op, fn) for x in xs]
    with xs[0].device:
        wires = [p.wire(x, cp()) for x, p in zip(xs, plans, strict=True)]
        with nccl.grouped(call, wires[0]):
            outs = [backend.allreduce(call, w, p.op) for w, p in zip(wires, plans, strict=True)]
        return [p.finish(o, g.size, x.shape) for o, p, x in zip(outs, plans, xs, strict=True)]


def reduce_scatter_tensor_coalesced(backend: Backend, xs: Sequence[Any], op: object = "sum",
                                    group: Any = None) -> list[Any]:
    fn = "reduce_scatter_tensor_coalesced"
    g, call = member(group, fn)
    if not xs:
        return []
    n = g.size
    for i, x in enumerate(xs):
        check_divisible(x.shape, 0, n, fn, f"xs[{i}].shape[0]")
    enter(group, xs[0], fn)
    plans = [plan_for(x.dtype, op, fn) for x in xs]
    with xs[0].device:
        wires = [p.wire(x, cp()) for x, p in zip(xs, plans, strict=True)]
        with nccl.grouped(call, wires[0]):
            outs = [backend.reduce_scatter_block(call, w, p.op)
                    for w, p in zip(wires, plans, strict=True)]
        return [p.finish(o, n, (x.shape[0] // n, *x.shape[1:]))
                for o, p, x in zip(outs, plans, xs, strict=True)]


def all_gather_into_tensor_coalesced(backend: Backend, xs: Sequence[Any],
                                     group: Any = None) -> list[Any]:
    fn = "all_gather_into_tensor_coalesced"
    g, call = member(group, fn)
    if not xs:
        return []
    enter(group, xs[0], fn)
    n = g.size
    xs = [x.reshape(1) if x.ndim == 0 else x for x in xs]
    with xs[0].device:
        sends = [as_bytes(x) for x in xs]
        outs = [cp().empty((n * x.shape[0], *x.shape[1:]), x.dtype) for x in xs]
        with nccl.grouped(call, sends[0]):
            for s, o in zip(sends, outs, strict=True):
                backend.allgather(call, s, o.reshape(-1).view(np.uint8))
        return outs


def permute_tensor(backend: Backend, x: Any, src_dst: Sequence[int | None],
                   group: Any = None) -> Any:
    fn = "permute_tensor"
    g, call = enter(group, x, fn)
    targets = check_permutation(src_dst, g.size, fn)
    dst = targets[g.rank]
    senders = [i for i, d in enumerate(targets) if d == g.rank]
    with x.device:
        if dst == g.rank:
            return cp().array(x, order="C", copy=True)
        out = cp().empty(x.shape, x.dtype) if senders else cp().zeros(x.shape, x.dtype)
        sends = [] if dst is None else [(as_bytes(x), dst)]
        recvs = [(out.reshape(-1).view(np.uint8), senders[0])] if senders else []
        nccl.exchange(nccl.communicator_for(call, x), sends, recvs)
        return out
