"""The collectives on cupy arrays over NCCL, enqueued on cupy's current stream.

No call synchronises the host: the result is a new cupy array, valid in stream order (as
with torch's NCCL backend). ``async_op=True`` returns a `Work` whose ``wait()`` makes the
current stream wait on a CUDA event. Shapes travel first over MPI where they may differ
between ranks (the same checks as the numpy path), the data then as raw bytes (uint8),
so data movement is bit-exact for every dtype. Reductions follow `fcoll._plan.nccl_plan`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from fcoll._plan import NcclPlan, nccl_plan
from fcoll._validate import check_dim, check_rank, check_sizes, sizes_problem, split_problem
from fcoll.backends import mpi as mpi_backend
from fcoll.backends import nccl
from fcoll.dtypes import check_dtype
from fcoll.group import Group, member
from fcoll.work import event_work

UINT8 = 1  # ncclUint8


def _cp() -> Any:
    import cupy

    return cupy


def _setup(group: Any, x: Any, fn: str) -> tuple[Group, Any]:
    g, _ = member(group, fn)
    check_dtype(x.dtype, fn)
    return g, nccl.communicator(g, int(x.device.id), fn)


def _done(fn: str, g: Group, value: Any, async_op: bool) -> Any:
    return event_work(fn, g, value) if async_op else value


def _bytes(a: Any) -> Any:
    """``a``'s elements in C order as a flat uint8 cupy array (a view when contiguous)."""
    return _cp().ascontiguousarray(a).reshape(-1).view(np.uint8)


def all_reduce(x: Any, op: object = "sum", group: Any = None, *, async_op: bool = False) -> Any:
    g, comm = _setup(group, x, "all_reduce")
    plan = nccl_plan(x.dtype, op, nccl.version(), "all_reduce")
    with x.device:
        wire = plan.wire(x, _cp())
        out = _cp().empty_like(wire)
        nccl.allreduce(comm, wire, out, wire.size, plan.datatype, plan.op)
        return _done("all_reduce", g, plan.finish(out, g.size, x.shape), async_op)


def reduce(x: Any, dst: int = 0, op: object = "sum", group: Any = None, *,
           async_op: bool = False) -> Any:
    g, comm = _setup(group, x, "reduce")
    root = check_rank(dst, g.size, "reduce", "dst")
    plan = nccl_plan(x.dtype, op, nccl.version(), "reduce")
    with x.device:
        wire = plan.wire(x, _cp())
        out = _cp().empty_like(wire) if g.rank == root else wire  # recvbuf is root's only
        nccl.reduce(comm, wire, out, wire.size, plan.datatype, plan.op, root)
        y = plan.finish(out, g.size, x.shape) if g.rank == root else None
        return _done("reduce", g, y, async_op)


def _reduce_scatter_flat(comm: Any, g: Group, wire: Any, plan: NcclPlan) -> Any:
    out = _cp().empty(wire.size // g.size, wire.dtype)
    nccl.reduce_scatter(comm, wire, out, out.size, plan.datatype, plan.op)
    return out


def reduce_scatter_tensor(x: Any, op: object = "sum", group: Any = None, *, scatter_dim: int = 0,
                          async_op: bool = False) -> Any:
    fn = "reduce_scatter_tensor"
    g, comm = _setup(group, x, fn)
    plan = nccl_plan(x.dtype, op, nccl.version(), fn)
    dim, n = check_dim(x, scatter_dim, fn, "scatter_dim"), g.size
    if x.shape[dim] % n:
        raise ValueError(f"{fn}: expected x.shape[{scatter_dim}] divisible by the group's size "
                         f"{n}, got shape {x.shape}")
    cp = _cp()
    with x.device:
        shape = (*x.shape[:dim], n, x.shape[dim] // n, *x.shape[dim + 1 :])
        blocks = cp.moveaxis(x.reshape(shape), dim, 0)
        out = _reduce_scatter_flat(comm, g, plan.wire(blocks, _cp()), plan)
        out_shape = (*x.shape[:dim], x.shape[dim] // n, *x.shape[dim + 1 :])
        return _done(fn, g, plan.finish(out, n, out_shape), async_op)


def reduce_scatter(chunks: Sequence[Any], op: object = "sum", group: Any = None) -> Any:
    """Uneven chunks travel padded to the largest (NCCL's reduce-scatter is even)."""
    fn = "reduce_scatter"
    g, _ = member(group, fn)
    if len(chunks) != g.size:
        raise ValueError(f"{fn}: expected chunks to hold {g.size} arrays (one per group rank), "
                         f"got {len(chunks)}")
    if len({str(c.dtype) for c in chunks}) > 1:
        raise ValueError(f"{fn}: expected one dtype across chunks, got "
                         f"{sorted({str(c.dtype) for c in chunks})}")
    x = chunks[g.rank]
    _, comm = _setup(group, x, fn)
    plan = nccl_plan(x.dtype, op, nccl.version(), fn)
    cp = _cp()
    with x.device:
        wires = [plan.wire(c, _cp()) for c in chunks]
        width = max(w.size for w in wires)
        padded = cp.zeros((g.size, width), plan.wire_dtype)
        for i, w in enumerate(wires):
            padded[i, : w.size] = w
        out = _reduce_scatter_flat(comm, g, padded.reshape(-1), plan)
        return plan.finish(out[: wires[g.rank].size], g.size, x.shape)


def broadcast(x: Any, src: int = 0, group: Any = None, *, async_op: bool = False) -> Any:
    g, comm = _setup(group, x, "broadcast")
    root = check_rank(src, g.size, "broadcast", "src")
    cp = _cp()
    with x.device:
        out = cp.empty(x.shape, x.dtype)
        send = _bytes(x) if g.rank == root else out.reshape(-1).view(np.uint8)
        nccl.broadcast(comm, send, out.reshape(-1).view(np.uint8), x.nbytes, UINT8, root)
        return _done("broadcast", g, out, async_op)


def _gather_rows(comm: Any, g: Group, send: Any, counts: list[int]) -> Any:
    """Every rank's flat uint8 ``send`` (``counts[p]`` bytes from rank p), concatenated."""
    cp = _cp()
    if len(set(counts)) == 1:
        out = cp.empty(counts[0] * g.size, np.uint8)
        return nccl.allgather(comm, send, out, counts[0], UINT8)
    width = max(counts)
    padded = cp.zeros(width, np.uint8)
    padded[: send.size] = send
    rows = nccl.allgather(comm, padded, cp.empty((g.size, width), np.uint8), width, UINT8)
    return cp.concatenate([rows[p, :c] for p, c in enumerate(counts)])


def all_gather_into_tensor(x: Any, group: Any = None, *, gather_dim: int = 0,
                           sizes: Sequence[int] | str | None = None, async_op: bool = False) -> Any:
    fn = "all_gather_into_tensor"
    g, comm = _setup(group, x, fn)
    x = x.reshape(1) if x.ndim == 0 else x
    dim = check_dim(x, gather_dim, fn, "gather_dim")
    lengths = [x.shape[dim]] * g.size
    if sizes is not None:
        auto = isinstance(sizes, str) and sizes == "auto"
        checked = None if auto else check_sizes(sizes, g.size, fn, "sizes")
        if checked is not None and checked[g.rank] != x.shape[dim]:
            raise ValueError(f"{fn}: expected x.shape[{gather_dim}] == sizes[{g.rank}] == "
                             f"{checked[g.rank]}, got shape {x.shape}")
        meta = mpi_backend.allgather_obj(g.call, (x.shape, str(x.dtype), checked))
        problem = sizes_problem(meta, dim)
        if problem is not None:
            raise ValueError(f"{fn}: ranks disagree: {problem}")
        lengths = [m[0][dim] for m in meta]
    cp = _cp()
    with x.device:
        front = cp.moveaxis(x, dim, 0)
        row = int(np.prod(front.shape[1:], dtype=np.int64)) * x.dtype.itemsize
        flat = _gather_rows(comm, g, _bytes(front), [s * row for s in lengths])
        y = flat.view(x.dtype).reshape(sum(lengths), *front.shape[1:])
        y = y if dim == 0 else cp.ascontiguousarray(cp.moveaxis(y, 0, dim))
        return _done(fn, g, y, async_op)


def _exchange(comm: Any, sends: list[tuple[Any, int]], recv_sizes: list[int]) -> list[Any]:
    """Grouped send/recv: ``sends`` are (uint8 buffer, peer); one buffer received per rank."""
    cp = _cp()
    recvs = [cp.empty(size, np.uint8) for size in recv_sizes]
    nccl.exchange(comm, sends, [(buf, p) for p, buf in enumerate(recvs)])
    return recvs


def all_to_all_single(x: Any, output_split_sizes: Sequence[int] | None = None,
                      input_split_sizes: Sequence[int] | None = None, group: Any = None, *,
                      async_op: bool = False) -> Any:
    fn = "all_to_all_single"
    g, comm = _setup(group, x, fn)
    n = g.size
    if x.ndim == 0:
        raise ValueError(f"{fn}: expected x with at least 1 dimension, got a 0-d array")
    if input_split_sizes is None and x.shape[0] % n:
        raise ValueError(f"{fn}: expected x.shape[0] divisible by the group's size {n} when "
                         f"input_split_sizes is None, got shape {x.shape}")
    ins = [x.shape[0] // n] * n if input_split_sizes is None else check_sizes(
        input_split_sizes, n, fn, "input_split_sizes")
    if sum(ins) != x.shape[0]:
        raise ValueError(f"{fn}: expected sum(input_split_sizes) == x.shape[0] == {x.shape[0]}, "
                         f"got {ins} (sum {sum(ins)})")
    received = list(ins)
    if output_split_sizes is not None or input_split_sizes is not None:
        outs = None if output_split_sizes is None else check_sizes(
            output_split_sizes, n, fn, "output_split_sizes")
        meta = mpi_backend.allgather_obj(g.call, (ins, outs, x.shape[1:], str(x.dtype)))
        problem = split_problem(meta)
        if problem is not None:
            raise ValueError(f"{fn}: ranks disagree: {problem}")
        received = [meta[p][0][g.rank] for p in range(n)]
    row = int(np.prod(x.shape[1:], dtype=np.int64)) * x.dtype.itemsize
    cp = _cp()
    with x.device:
        data, offsets = _bytes(x), np.cumsum([0, *ins]) * row
        sends = [(data[offsets[p] : offsets[p + 1]], p) for p in range(n)]
        parts = _exchange(comm, sends, [s * row for s in received])
        flat = cp.concatenate(parts) if parts else cp.empty(0, np.uint8)
        return _done(fn, g, flat.view(x.dtype).reshape(sum(received), *x.shape[1:]), async_op)
