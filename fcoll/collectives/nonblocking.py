"""``async_op=True``: the collectives started with MPI's nonblocking calls.

What is copied, and when: the data an async call sends is snapshotted when the call
returns. If the wire data is the caller's own memory (a C-contiguous input that needs no
conversion), it is copied; otherwise the conversion already made a private copy. The
caller may therefore change or reuse its input right after the call. Results are
allocated at the call and filled by MPI; they are handed out by `Work.wait`.

Floating-point reductions folded by fcoll (three or more ranks, see `_fold`) give the
blocking call's bits. Small ones travel in one nonblocking step: every rank's data is
all-gathered (or gathered to the root, or exchanged all-to-all for reduce-scatter) and
folded when the operation completes. A large all-reduce takes two, as the blocking one
does: an all-to-all of blocks started at the call, then (when that completes) this
rank's block is folded and sent to every rank. That second step is started whenever a
rank gets to it, so it is not a collective (ranks could start the second steps of two
calls in different orders) but tagged point-to-point messages on a duplicate of the
group's communicator, tagged by the call's number.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from fcoll.backends import mpi as backend
from fcoll.calls.work import Call, Operation, RequestOperation, Work
from fcoll.collectives._fold import GATHER_LIMIT, blocks, fold
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
    if wire.nbytes > GATHER_LIMIT:
        return Work(_FoldedAllReduce(call, group, plan, wire))
    rows = np.empty((group.size, wire.size), wire.dtype)
    ufunc = plan.ufunc
    request = backend.iallgather(call, wire, rows)
    return launch("all_reduce", group, request,
                  lambda: plan.finish(fold(rows, ufunc).reshape(wire.shape)), wire)


class _FoldedAllReduce(Operation):
    """A large folded all-reduce in two nonblocking steps (module docstring): moves
    2(n-1)/n of the bytes per rank, where all-gathering everything moves n-1 times them."""

    def __init__(self, call: Call, group: Group, plan: ReductionPlan, wire: np.ndarray) -> None:
        if group.side_comm is None:  # every rank makes this call in the same order: safe
            group.side_comm = call.comm.Dup()
        super().__init__("all_reduce", group)
        n, me = group.size, group.rank
        self._plan, self._shape, self._wire = plan, wire.shape, wire.reshape(-1)
        self._counts = blocks(self._wire.size, n)
        size = wire.itemsize
        self._recv = np.empty((n, self._counts[me]), wire.dtype)
        if self._counts.count(self._counts[0]) == n:
            self._request = backend.ialltoall(call, self._wire, self._recv)
        else:
            self._request = backend.ialltoallv(call, self._wire, [c * size for c in self._counts],
                                               self._recv, [self._counts[me] * size] * n)
        self._out = np.empty(self._wire.size, wire.dtype)
        self._tag = self.seq % 32768
        self._second = False

    def _start_second(self) -> None:
        """Fold this rank's block into its place in the result; exchange the blocks."""
        n, me, side = self.group.size, self.group.rank, self.group.side_comm
        starts = [0, *np.cumsum(self._counts[:-1]).tolist()]
        parts = [self._out[a:a + c] for a, c in zip(starts, self._counts, strict=True)]
        assert self._plan.ufunc is not None
        parts[me][...] = fold(self._recv, self._plan.ufunc)
        byte = backend.BYTE
        requests = [side.Irecv([parts[p], byte], p, self._tag) for p in range(n) if p != me]
        requests += [side.Isend([parts[me], byte], p, self._tag) for p in range(n) if p != me]
        self._requests = requests
        self._second = True

    def _advance(self) -> bool:
        if not self._second:
            if not self._request.Test():
                return False
            self._start_second()
        if not backend.MPI.Request.Testall(self._requests):
            return False
        self.value = self._plan.finish(self._out.reshape(self._shape))
        return True

    def _block(self) -> None:
        if not self._second:
            self._request.Wait()
            self._start_second()
        backend.MPI.Request.Waitall(self._requests)
        self.value = self._plan.finish(self._out.reshape(self._shape))


def reduce(call: Call, group: Group, plan: ReductionPlan, x: np.ndarray,
           root: int) -> Work[np.ndarray | None]:
    wire = private(plan.wire(x), x)
    here = group.rank == root
    if plan.ufunc is None:
        out = np.empty(wire.shape, wire.dtype) if here else None
        request = backend.ireduce(call, wire, out, plan.op, root)
        return launch("reduce", group, request,
                      lambda: None if out is None else plan.finish(out), wire)
    rows = np.empty((group.size, wire.size), wire.dtype) if here else None
    ufunc = plan.ufunc
    request = backend.igather(call, wire, rows, root)
    return launch("reduce", group, request, lambda: None if rows is None else plan.finish(
        fold(rows, ufunc).reshape(wire.shape)), wire)


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
    rows = np.empty((n, wire.size // n), wire.dtype)
    ufunc = plan.ufunc
    request = backend.ialltoall(call, wire, rows)
    return launch("reduce_scatter_tensor", group, request,
                  lambda: plan.finish(fold(rows, ufunc)).reshape(shape), wire)
