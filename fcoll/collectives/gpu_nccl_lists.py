"""List, coalesced and permutation forms on cupy arrays over NCCL (see `gpu_nccl`).

Shapes and dtypes travel first over MPI (the numpy path's checks, so disagreements raise
on every rank); the bytes then move in one ``ncclGroupStart``/``End`` of sends and
receives, or of collectives for the coalesced forms (fused into one launch by NCCL).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from fcoll._plan import nccl_plan
from fcoll._validate import check_permutation, check_rank, one_dtype
from fcoll.backends import mpi as mpi_backend
from fcoll.backends import nccl
from fcoll.collectives.gpu_nccl import UINT8, _bytes, _cp, _exchange, _setup
from fcoll.group import Group, member


def _meta(x: Any) -> tuple[tuple[int, ...], str]:
    return tuple(x.shape), str(x.dtype)


def _split(parts: list[Any], dtype: np.dtype[Any], shapes: list[tuple[int, ...]]) -> list[Any]:
    return [p.view(dtype).reshape(s) for p, s in zip(parts, shapes, strict=True)]


def _nbytes(shape: Sequence[int], dtype: np.dtype[Any]) -> int:
    return int(np.prod(shape, dtype=np.int64)) * dtype.itemsize


def all_gather(x: Any, group: Any = None) -> list[Any]:
    fn = "all_gather"
    g, comm = _setup(group, x, fn)
    meta = mpi_backend.allgather_obj(g.call, _meta(x))
    dtype = one_dtype([d for _, d in meta], fn)
    shapes = [s for s, _ in meta]
    with x.device:
        data = _bytes(x)
        parts = _exchange(comm, [(data, p) for p in range(g.size)], [_nbytes(s, dtype) for s in shapes])
        return _split(parts, dtype, shapes)


def gather(x: Any, dst: int = 0, group: Any = None) -> list[Any] | None:
    fn = "gather"
    g, comm = _setup(group, x, fn)
    root = check_rank(dst, g.size, fn, "dst")
    meta = mpi_backend.allgather_obj(g.call, _meta(x))
    dtype = one_dtype([d for _, d in meta], fn)
    shapes = [s for s, _ in meta]
    with x.device:
        sizes = [_nbytes(s, dtype) for s in shapes] if g.rank == root else []
        recvs = [_cp().empty(size, np.uint8) for size in sizes]
        nccl.exchange(comm, [(_bytes(x), root)], [(buf, p) for p, buf in enumerate(recvs)])
        return _split(recvs, dtype, shapes) if g.rank == root else None


def scatter_send(g: Group, chunks: Sequence[Any], root: int) -> Any:
    """The root's part of `fcoll.scatter` (its metadata already sent): send, keep its own."""
    _, comm = _setup(g, chunks[root], "scatter")
    with chunks[root].device:
        nccl.exchange(comm, [(_bytes(c), p) for p, c in enumerate(chunks) if p != root], [])
        return _cp().array(chunks[root], order="C", copy=True)


def scatter_receive(g: Group, shape: tuple[int, ...], dtype: np.dtype[Any], root: int) -> Any:
    """A non-root rank's part of `fcoll.scatter`: receive on the current device."""
    cp = _cp()
    out = cp.empty(shape, dtype)
    comm = nccl.communicator(g, int(cp.cuda.Device().id), "scatter")
    nccl.exchange(comm, [], [(out.reshape(-1).view(np.uint8), root)])
    return out


def all_to_all(chunks: Sequence[Any], group: Any = None) -> list[Any]:
    fn = "all_to_all"
    g, _ = member(group, fn)
    if len(chunks) != g.size:
        raise ValueError(f"{fn}: expected chunks to hold {g.size} arrays (one per group rank), "
                         f"got {len(chunks)}")
    _, comm = _setup(group, chunks[0], fn)
    meta = mpi_backend.allgather_obj(g.call, [_meta(c) for c in chunks])
    dtype = one_dtype([row[0][1] for row in meta], fn)
    shapes = [meta[p][g.rank][0] for p in range(g.size)]
    with chunks[0].device:
        sends = [(_bytes(c), p) for p, c in enumerate(chunks)]
        parts = _exchange(comm, sends, [_nbytes(s, dtype) for s in shapes])
        return _split(parts, dtype, shapes)


def all_reduce_coalesced(xs: Sequence[Any], op: object = "sum", group: Any = None) -> list[Any]:
    """One NCCL all-reduce per array, launched together (``ncclGroupStart``/``End``)."""
    fn = "all_reduce_coalesced"
    g, _ = member(group, fn)
    if not xs:
        return []
    _, comm = _setup(group, xs[0], fn)
    version, cp = nccl.version(), _cp()
    plans = [nccl_plan(x.dtype, op, version, fn) for x in xs]
    with xs[0].device:
        wires = [p.wire(x, _cp()) for x, p in zip(xs, plans, strict=True)]
        outs = [cp.empty_like(w) for w in wires]
        with nccl.grouped():
            for w, o, p in zip(wires, outs, plans, strict=True):
                nccl.allreduce(comm, w, o, w.size, p.datatype, p.op)
        return [p.finish(o, g.size, x.shape) for o, p, x in zip(outs, plans, xs, strict=True)]


def _check_rows(xs: Sequence[Any], n: int, fn: str) -> None:
    for i, x in enumerate(xs):
        if x.ndim == 0 or x.shape[0] % n:
            raise ValueError(f"{fn}: expected xs[{i}].shape[0] divisible by the group's size "
                             f"{n}, got shape {x.shape}")


def reduce_scatter_tensor_coalesced(xs: Sequence[Any], op: object = "sum",
                                    group: Any = None) -> list[Any]:
    fn = "reduce_scatter_tensor_coalesced"
    g, _ = member(group, fn)
    if not xs:
        return []
    _check_rows(xs, g.size, fn)
    _, comm = _setup(group, xs[0], fn)
    version, cp, n = nccl.version(), _cp(), g.size
    plans = [nccl_plan(x.dtype, op, version, fn) for x in xs]
    with xs[0].device:
        wires = [p.wire(x, _cp()) for x, p in zip(xs, plans, strict=True)]
        outs = [cp.empty(w.size // n, w.dtype) for w in wires]
        with nccl.grouped():
            for w, o, p in zip(wires, outs, plans, strict=True):
                nccl.reduce_scatter(comm, w, o, o.size, p.datatype, p.op)
        return [p.finish(o, n, (x.shape[0] // n, *x.shape[1:]))
                for o, p, x in zip(outs, plans, xs, strict=True)]


def all_gather_into_tensor_coalesced(xs: Sequence[Any], group: Any = None) -> list[Any]:
    fn = "all_gather_into_tensor_coalesced"
    g, _ = member(group, fn)
    if not xs:
        return []
    _, comm = _setup(group, xs[0], fn)
    cp, n = _cp(), g.size
    xs = [x.reshape(1) if x.ndim == 0 else x for x in xs]
    with xs[0].device:
        sends = [_bytes(x) for x in xs]
        outs = [cp.empty((n * x.shape[0], *x.shape[1:]), x.dtype) for x in xs]
        with nccl.grouped():
            for s, o in zip(sends, outs, strict=True):
                nccl.allgather(comm, s, o.reshape(-1).view(np.uint8), s.size, UINT8)
        return outs


def permute_tensor(x: Any, src_dst: Sequence[int | None], group: Any = None) -> Any:
    fn = "permute_tensor"
    g, comm = _setup(group, x, fn)
    targets = check_permutation(src_dst, g.size, fn)
    dst = targets[g.rank]
    senders = [i for i, d in enumerate(targets) if d == g.rank]
    cp = _cp()
    with x.device:
        if dst == g.rank:
            return cp.array(x, order="C", copy=True)
        out = cp.empty(x.shape, x.dtype) if senders else cp.zeros(x.shape, x.dtype)
        sends = [] if dst is None else [(_bytes(x), dst)]
        recvs = [(out.reshape(-1).view(np.uint8), senders[0])] if senders else []
        nccl.exchange(comm, sends, recvs)
        return out
