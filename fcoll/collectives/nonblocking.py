"""``async_op=True``: the collectives started with MPI's nonblocking calls or fcoll's tree
schedules.

What is copied, and when: the data an async call sends is snapshotted when the call
returns. If the wire data is the caller's own memory (a C-contiguous input that needs no
conversion), it is copied; otherwise the conversion already made a private copy. The
caller may therefore change or reuse its input right after the call. Results are
allocated at the call and filled by MPI; they are handed out by `Work.wait`.

Floating-point reductions that fcoll folds (three or more ranks, see `_fold`) run the
blocking call's tree schedule (`fcoll.backends.tree`), so they give its bits: the schedule
posts its first messages at the call and moves on whenever this process tests or waits on
any work of the group (`fcoll.backends.tree.steps.Scheduled`). Its messages are tagged by
the call's number, so calls in flight together never mix.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from fcoll.backends import mpi as backend
from fcoll.backends import tree
from fcoll.calls.work import Call, RequestOperation, Work
from fcoll.groups.group import Group
from fcoll.policy.plan import ReductionPlan


def private(buf: np.ndarray, x: np.ndarray) -> np.ndarray:
    """``buf``, or a copy of it when it may share memory with the caller's ``x``."""
    if buf is x or np.may_share_memory(buf, x):
        return buf.copy()
    return buf


def launch(name: str, group: Group, request: Any, result: Callable[[], Any],
           *keep: Any) -> Work[Any]:
    """Wrap a started MPI request in a `Work` registered with ``group``."""
    return Work(RequestOperation(name, group, request, result, keep))


def all_reduce(call: Call, group: Group, plan: ReductionPlan, x: np.ndarray, *,
               owned: bool = False) -> Work[np.ndarray]:
    """``owned``: ``x`` is fcoll's own (e.g. a dp bucket), so it needs no snapshot copy."""
    wire = plan.wire(x) if owned else private(plan.wire(x), x)
    if plan.ufunc is None:
        out = np.empty(wire.shape, wire.dtype)
        request = backend.iallreduce(call, wire, out, plan.op)
        return launch("all_reduce", group, request, lambda: plan.finish(out), wire)
    shape, finish = wire.shape, plan.finish
    return Work(tree.start("all_reduce", call, "allreduce",
                           lambda y: finish(y).reshape(shape), wire.reshape(-1), plan.ufunc))


def reduce(call: Call, group: Group, plan: ReductionPlan, x: np.ndarray,
           root: int) -> Work[np.ndarray | None]:
    wire = private(plan.wire(x), x)
    here = group.rank == root
    if plan.ufunc is None:
        out = np.empty(wire.shape, wire.dtype) if here else None
        request = backend.ireduce(call, wire, out, plan.op, root)
        return launch("reduce", group, request,
                      lambda: None if out is None else plan.finish(out), wire)
    shape, finish = wire.shape, plan.finish
    return Work(tree.start("reduce", call, "reduce",
                           lambda y: None if y is None else finish(y).reshape(shape),
                           wire.reshape(-1), plan.ufunc, root))


def reduce_scatter(call: Call, group: Group, plan: ReductionPlan, x: np.ndarray,
                   blocks: np.ndarray, shape: tuple[int, ...]) -> Work[np.ndarray]:
    """``blocks``: ``x`` laid out with the scatter blocks first; ``shape``: the result's."""
    wire = private(plan.wire(blocks), x)
    n = group.size
    if plan.ufunc is None:
        out = np.empty(wire.size // n, wire.dtype)
        request = backend.ireduce_scatter_block(call, wire, out, plan.op)
        return launch("reduce_scatter_tensor", group, request,
                      lambda: plan.finish(out).reshape(shape), wire)
    finish = plan.finish
    return Work(tree.start("reduce_scatter_tensor", call, "reduce_scatter",
                           lambda y: finish(y).reshape(shape), wire.reshape(-1), plan.ufunc,
                           [wire.size // n] * n))
