"""``async_op=True``: the collectives started with MPI's nonblocking calls.

What is copied, and when: the data an async call sends is snapshotted when the call
returns. If the wire data is the caller's own memory (a C-contiguous input that needs no
conversion), it is copied; otherwise the conversion already made a private copy. The
caller may therefore change or reuse its input right after the call. Results are
allocated at the call and filled by MPI; they are handed out by `Work.wait`.

Floating-point reductions folded by fcoll (three or more ranks, see `_fold`) travel in one
nonblocking step: every rank's data is all-gathered (or gathered to the root, or
exchanged all-to-all for reduce-scatter) and folded in rank order when the operation
completes, so the result is bit-identical to the blocking call's.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from fcoll.backends import mpi as backend
from fcoll.collectives._fold import fold
from fcoll.collectives._plan import ReductionPlan
from fcoll.group import Group
from fcoll.work import RequestOperation, Work


def private(buf: np.ndarray, x: np.ndarray) -> np.ndarray:
    """``buf``, or a copy of it when it may share memory with the caller's ``x``."""
    if buf is x or np.may_share_memory(buf, x):
        return buf.copy()
    return buf


def launch(name: str, group: Group, request: Any, result: Callable[[], Any],
           *keep: Any) -> Work:
    """Wrap a started MPI request in a `Work` registered with ``group``."""
    return Work(RequestOperation(name, group, request, result, keep))


def all_reduce(comm: Any, group: Group, plan: ReductionPlan, x: np.ndarray, *,
               owned: bool = False) -> Work:
    """``owned``: ``x`` is fcoll's own (e.g. a dp bucket), so it needs no snapshot copy."""
    wire = plan.wire(x) if owned else private(plan.wire(x), x)
    if plan.ufunc is None:
        out = np.empty(wire.shape, wire.dtype)
        request = backend.iallreduce(comm, wire, out, plan.mpi_op)
        return launch("all_reduce", group, request, lambda: plan.finish(out), wire)
    rows = np.empty((group.size, wire.size), wire.dtype)
    ufunc = plan.ufunc
    request = backend.iallgather(comm, wire, rows)
    return launch("all_reduce", group, request,
                  lambda: plan.finish(fold(rows, ufunc).reshape(wire.shape)), wire)


def reduce(comm: Any, group: Group, plan: ReductionPlan, x: np.ndarray, root: int) -> Work:
    wire = private(plan.wire(x), x)
    here = group.rank == root
    if plan.ufunc is None:
        out = np.empty(wire.shape, wire.dtype) if here else None
        request = backend.ireduce(comm, wire, out, plan.mpi_op, root)
        return launch("reduce", group, request,
                      lambda: None if out is None else plan.finish(out), wire)
    rows = np.empty((group.size, wire.size), wire.dtype) if here else None
    ufunc = plan.ufunc
    request = backend.igather(comm, wire, rows, root)
    return launch("reduce", group, request, lambda: None if rows is None else plan.finish(
        fold(rows, ufunc).reshape(wire.shape)), wire)


def reduce_scatter(comm: Any, group: Group, plan: ReductionPlan, x: np.ndarray,
                   blocks: np.ndarray, shape: tuple[int, ...]) -> Work:
    """``blocks``: ``x`` laid out with the scatter blocks first; ``shape``: the result's."""
    wire = private(plan.wire(blocks), x)
    n = group.size
    if plan.ufunc is None:
        out = np.empty(wire.size // n, wire.dtype)
        request = backend.ireduce_scatter_block(comm, wire, out, plan.mpi_op)
        return launch("reduce_scatter_tensor", group, request,
                      lambda: plan.finish(out).reshape(shape), wire)
    rows = np.empty((n, wire.size // n), wire.dtype)
    ufunc = plan.ufunc
    request = backend.ialltoall(comm, wire, rows)
    return launch("reduce_scatter_tensor", group, request,
                  lambda: plan.finish(fold(rows, ufunc)).reshape(shape), wire)
