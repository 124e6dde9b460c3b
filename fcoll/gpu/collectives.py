"""The single-array collectives on cupy arrays, written once over a device `Backend`.

``backend`` is the one `fcoll.dispatch.backend_for` chose: `fcoll.backends.nccl` (work
enqueued on cupy's current stream, no host sync: the result is a new cupy array valid in
stream order, as with torch's NCCL backend) or `fcoll.backends.cuda_aware` (CUDA-aware MPI after a
stream sync). ``async_op=True`` returns a `Work` whose ``wait()`` makes the current
stream wait on a CUDA event. Shapes travel first over MPI where they may differ between
ranks (the numpy path's checks), the data then as raw bytes, so data movement is
bit-exact for every dtype. NCCL reductions follow `fcoll.policy.plan.nccl_plan`; on MPI only
what MPI's own op reduces goes as it is (``NotImplemented`` sends the rest through
`fcoll.backends.staged`, where fcoll's rank-order fold runs).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from fcoll.backends import Backend, nccl
from fcoll.backends import mpi as host
from fcoll.calls.work import Call
from fcoll.gpu import fast
from fcoll.gpu.events import event_work
from fcoll.groups.group import Group
from fcoll.groups.membership import member
from fcoll.policy.dtypes import check_dtype
from fcoll.policy.plan import NcclPlan, nccl_plan, reduction_plan
from fcoll.policy.validate import (
    check_count,
    check_dim,
    check_divisible,
    check_rank,
    check_same_dtype,
    check_sizes,
    check_splits,
    sizes_problem,
    split_problem,
)


def cp() -> Any:
    """The cupy module (imported: a cupy array reached this code)."""
    import cupy

    return cupy


def enter(group: Any, x: Any, fn: str) -> tuple[Group, Call]:
    """The group and call of ``fn`` on cupy array ``x``, after the dtype check."""
    g, call = member(group, fn)
    check_dtype(x.dtype, fn)
    return g, call


_PLANS: dict[tuple[Any, Any], NcclPlan] = {}  # (dtype, op name): made once per process


def plan_for(dtype: Any, op: object, fn: str) -> NcclPlan:
    """`nccl_plan` under this process's NCCL, made once per (dtype, op name)."""
    key = (dtype, op)
    plan = _PLANS.get(key) if type(op) is str else None
    if plan is None:
        plan = nccl_plan(dtype, op, nccl.version(), fn)
        if type(op) is str:
            _PLANS[key] = plan
    return plan


def done(fn: str, g: Group, value: Any, async_op: bool) -> Any:
    return event_work(fn, g, value) if async_op else value


def as_bytes(a: Any) -> Any:
    """``a``'s elements in C order as a flat uint8 cupy array (a view when contiguous)."""
    return cp().ascontiguousarray(a).reshape(-1).view(np.uint8)


def all_reduce(backend: Backend, x: Any, op: object = "sum", group: Any = None, *,
               async_op: bool = False) -> Any:
    """NCCL: any (dtype, op) `nccl_plan` allows. MPI: those MPI's own op reduces."""
    fn = "all_reduce"
    g, call = enter(group, x, fn)
    if backend is not nccl:
        plan = reduction_plan(np.empty(0, x.dtype), op, g, fn)
        if async_op or not plan.direct:
            return NotImplemented
        with x.device:
            return backend.allreduce(call, cp().ascontiguousarray(x), plan.op)
    nplan = plan_for(x.dtype, op, fn)
    with x.device:
        out = backend.allreduce(call, nplan.wire(x, cp()), nplan.op)
        result = nplan.finish(out, g.size, x.shape)
    if nplan.native and not async_op and type(op) is str:
        fast.learn(fast.ALL_REDUCE, (op, x.dtype), g, fast.all_reduce, nccl.DATATYPES[x.dtype],
                   int(nplan.op))
    return done(fn, g, result, async_op)


def reduce(backend: Backend, x: Any, dst: int = 0, op: object = "sum", group: Any = None, *,
           async_op: bool = False) -> Any:
    fn = "reduce"
    g, call = enter(group, x, fn)
    root = check_rank(dst, g.size, fn, "dst")
    plan = plan_for(x.dtype, op, fn)
    with x.device:
        out = backend.reduce(call, plan.wire(x, cp()), plan.op, root)
        return done(fn, g, None if out is None else plan.finish(out, g.size, x.shape), async_op)


def reduce_scatter_tensor(backend: Backend, x: Any, op: object = "sum", group: Any = None, *,
                          scatter_dim: int = 0, async_op: bool = False) -> Any:
    fn = "reduce_scatter_tensor"
    g, call = enter(group, x, fn)
    plan = plan_for(x.dtype, op, fn)
    dim, n = check_dim(x, scatter_dim, fn, "scatter_dim"), g.size
    check_divisible(x.shape, dim, n, fn, f"x.shape[{scatter_dim}]")
    with x.device:
        shape = (*x.shape[:dim], n, x.shape[dim] // n, *x.shape[dim + 1 :])
        blocks = cp().moveaxis(x.reshape(shape), dim, 0)
        out = backend.reduce_scatter_block(call, plan.wire(blocks, cp()), plan.op)
        out_shape = (*x.shape[:dim], x.shape[dim] // n, *x.shape[dim + 1 :])
        result = plan.finish(out, n, out_shape)
    if dim == 0 and plan.native and not async_op and type(op) is str:
        fast.learn(fast.REDUCE_SCATTER, (op, x.dtype), g, fast.reduce_scatter,
                   nccl.DATATYPES[x.dtype], int(plan.op))
    return done(fn, g, result, async_op)


def reduce_scatter(backend: Backend, chunks: Sequence[Any], op: object = "sum",
                   group: Any = None) -> Any:
    """Uneven chunks travel padded to the largest (NCCL's reduce-scatter is even)."""
    fn = "reduce_scatter"
    g, call = member(group, fn)
    check_count(chunks, g.size, fn, "chunks")
    check_same_dtype(chunks, fn, "chunks")
    x = chunks[g.rank]
    enter(group, x, fn)
    plan = plan_for(x.dtype, op, fn)
    with x.device:
        wires = [plan.wire(c, cp()) for c in chunks]
        width = max(w.size for w in wires)
        padded = cp().zeros((g.size, width), plan.wire_dtype)
        for i, w in enumerate(wires):
            padded[i, : w.size] = w
        out = backend.reduce_scatter_block(call, padded, plan.op).reshape(-1)
        return plan.finish(out[: wires[g.rank].size], g.size, x.shape)


def broadcast(backend: Backend, x: Any, src: int = 0, group: Any = None, *,
              async_op: bool = False) -> Any:
    fn = "broadcast"
    g, call = enter(group, x, fn)
    root = check_rank(src, g.size, fn, "src")
    with x.device:
        out = cp().array(x, order="C", copy=True) if g.rank == root else cp().empty(x.shape, x.dtype)
        backend.bcast(call, out.reshape(-1).view(np.uint8), root)
    if backend is nccl and not async_op and type(src) is int:
        fast.learn(fast.BROADCAST, (src, x.dtype), g, fast.broadcast, root)
    return done(fn, g, out, async_op)


def _gather_rows(backend: Backend, call: Call, n: int, send: Any, counts: list[int]) -> Any:
    """Every rank's flat uint8 ``send`` (``counts[p]`` bytes from rank p), concatenated."""
    if len(set(counts)) == 1:
        return backend.allgather(call, send, cp().empty(counts[0] * n, np.uint8))
    width = max(counts)
    padded = cp().zeros(width, np.uint8)
    padded[: send.size] = send
    rows = backend.allgather(call, padded, cp().empty((n, width), np.uint8))
    return cp().concatenate([rows[p, :c] for p, c in enumerate(counts)])


def _gathered_lengths(call: Call, g: Group, x: Any, dim: int, sizes: Sequence[int] | str | None,
                      gather_dim: int, fn: str) -> list[int]:
    """Every rank's length along ``dim`` (from ``sizes``, checked across ranks)."""
    if sizes is None:
        return [x.shape[dim]] * g.size
    auto = isinstance(sizes, str) and sizes == "auto"
    checked = None if auto else check_sizes(sizes, g.size, fn, "sizes")
    if checked is not None and checked[g.rank] != x.shape[dim]:
        raise ValueError(f"{fn}: expected x.shape[{gather_dim}] == sizes[{g.rank}] == "
                         f"{checked[g.rank]}, got shape {x.shape}")
    meta = host.allgather_obj(call, (x.shape, str(x.dtype), checked))
    problem = sizes_problem(meta, dim)
    if problem is not None:
        raise ValueError(f"{fn}: ranks disagree: {problem}")
    return [m[0][dim] for m in meta]


def all_gather_into_tensor(backend: Backend, x: Any, group: Any = None, *, gather_dim: int = 0,
                           sizes: Sequence[int] | str | None = None, async_op: bool = False) -> Any:
    fn = "all_gather_into_tensor"
    g, call = enter(group, x, fn)
    learnable = backend is nccl and x.ndim > 0 and sizes is None and not async_op
    x = x.reshape(1) if x.ndim == 0 else x
    dim = check_dim(x, gather_dim, fn, "gather_dim")
    lengths = _gathered_lengths(call, g, x, dim, sizes, gather_dim, fn)
    with x.device:
        front = cp().moveaxis(x, dim, 0)
        row = int(np.prod(front.shape[1:], dtype=np.int64)) * x.dtype.itemsize
        flat = _gather_rows(backend, call, g.size, as_bytes(front), [s * row for s in lengths])
        y = flat.view(x.dtype).reshape(sum(lengths), *front.shape[1:])
        y = y if dim == 0 else cp().ascontiguousarray(cp().moveaxis(y, 0, dim))
    if learnable and dim == 0:
        fast.learn(fast.ALL_GATHER, x.dtype, g, fast.all_gather)
    return done(fn, g, y, async_op)


def _received(call: Call, g: Group, x: Any, ins: list[int], outs: list[int] | None,
              fn: str) -> list[int]:
    """Rows this rank receives from each rank (split sizes checked across ranks)."""
    meta = host.allgather_obj(call, (ins, outs, x.shape[1:], str(x.dtype)))
    problem = split_problem(meta)
    if problem is not None:
        raise ValueError(f"{fn}: ranks disagree: {problem}")
    return [meta[p][0][g.rank] for p in range(g.size)]


def all_to_all_single(backend: Backend, x: Any, output_split_sizes: Sequence[int] | None = None,
                      input_split_sizes: Sequence[int] | None = None, group: Any = None, *,
                      async_op: bool = False) -> Any:
    fn = "all_to_all_single"
    g, call = enter(group, x, fn)
    ins, outs = check_splits(x, output_split_sizes, input_split_sizes, g.size, fn)
    uneven = output_split_sizes is not None or input_split_sizes is not None
    received = _received(call, g, x, ins, outs, fn) if uneven else list(ins)
    row = int(np.prod(x.shape[1:], dtype=np.int64)) * x.dtype.itemsize
    with x.device:
        out = cp().empty((sum(received), *x.shape[1:]), x.dtype)
        send, into = as_bytes(x), out.reshape(-1).view(np.uint8)
        if uneven:
            backend.alltoallv(call, send, [s * row for s in ins], into, [r * row for r in received])
        else:
            backend.alltoall(call, send, into)
    if backend is nccl and not uneven and not async_op:
        fast.learn(fast.ALL_TO_ALL, x.dtype, g, fast.all_to_all, nccl.module())
    return done(fn, g, out, async_op)
