"""Prefix reductions carried out (`fcoll.scan`, `fcoll.exscan`): rank r's inclusive prefix
(ranks 0..r) or exclusive prefix (ranks 0..r-1), and on request the total, every element
folded in group-rank order, ``((x0 op x1) op x2) ...``, whatever the transport and size:

- MPI's ``Scan``/``Exscan`` where MPI's own op is exact in any order (integers, bool, and a
  sum or product on two ranks: `fcoll.policy.plan`); the total by ``Allreduce``;
- else fcoll's fold. Up to `fcoll.collectives._fold.GATHER_LIMIT` bytes per rank every
  rank all-gathers every input and folds rows 0..r. Above it the data is cut into ``n``
  blocks: an all-to-all gives rank r block r of every rank, rank r folds the ``n``
  prefixes of that block and a second all-to-all hands prefix k's block to rank k (the
  total's blocks are all-gathered): ``2 (n - 1) / n`` of the bytes per rank each way, as
  a reduce-scatter and all-gather move;
- on one node, where the compiled core runs (`fcoll.backends.native`), through the group's
  segment: one step per MiB per rank (``Core.scan``; the total is a second step, as an
  all_reduce), in the all_reduce's size window (`fcoll.dispatch.on_node`).

``async_op=True`` all-gathers (or posts ``Iscan``/``Iexscan``) and folds when it completes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from fcoll.backends import mpi as backend
from fcoll.backends import native, shm
from fcoll.calls.fingerprint import kind_bits
from fcoll.calls.work import Call, Work
from fcoll.collectives._fold import GATHER_LIMIT, blocks, native_kernel
from fcoll.collectives.nonblocking import launch, private
from fcoll.dispatch import on_node
from fcoll.groups.group import Group
from fcoll.policy.plan import ReductionPlan

Pair = tuple[np.ndarray | None, np.ndarray | None]  # (prefix, total)


def running(rows: np.ndarray, ufunc: np.ufunc, upto: int, total: bool) -> Pair:
    """``rows[0] op ... op rows[upto - 1]`` (None when ``upto`` is 0) and, with ``total``,
    the fold of every row: new arrays, never one object twice.

    Example:
        >>> running(np.array([[1], [2], [3]]), np.add, 2, True)
        (array([3]), array([6]))
    """
    last = len(rows) if total else upto
    if last == 0:
        return None, None
    prefix, acc = None, rows[0].copy()
    for k in range(1, last + 1):  # acc holds rows 0..k-1
        if k == upto:
            prefix = acc.copy() if total else acc
        if k < last:
            ufunc(acc, rows[k], out=acc)
    return prefix, acc if total else None


def segment(call: Call, plan: ReductionPlan, nbytes: int) -> native.Kernel | None:
    """The core's fold where this call goes through the group's segment, else None (MPI).
    Collective at the group's first call that could use the segment (`on_node`)."""
    kernel = native_kernel(plan)
    if kernel is not None and on_node(call, nbytes) is not None and call.group.shm.core:
        return kernel
    return None


def run(call: Call, plan: ReductionPlan, x: np.ndarray, exclusive: bool, total: bool) -> Pair:
    """This rank's prefix (None on rank 0 of an exclusive scan) and, with ``total``, the
    reduction over every rank: finished arrays of ``x``'s shape and dtype."""
    if (kernel := segment(call, plan, x.nbytes)) is not None:
        return _segment(call, plan, x, kernel, exclusive, total)
    me = call.group.rank
    wire = plan.wire(x)
    if plan.ufunc is None:  # MPI's op is exact
        got = backend.scan(call, wire, plan.op, exclusive)
        whole = plan.finish(backend.allreduce(call, wire, plan.op)) if total else None
        return (None if exclusive and me == 0 else plan.finish(got)), whole
    flat = wire.reshape(-1)
    if call.group.size == 1 or flat.nbytes <= GATHER_LIMIT:
        n = call.group.size
        rows = flat[None] if n == 1 else backend.allgather(call, flat, np.empty((n, flat.size),
                                                                                 flat.dtype))
        pair = running(rows, plan.ufunc, me if exclusive else me + 1, total)
    else:
        pair = _blocks(call, flat, plan.ufunc, exclusive, total)
    return _finished(plan, pair, wire.shape)


def _finished(plan: ReductionPlan, pair: Pair, shape: tuple[int, ...]) -> Pair:
    prefix, whole = pair
    return (None if prefix is None else plan.finish(prefix.reshape(shape)),
            None if whole is None else plan.finish(whole.reshape(shape)))


def _blocks(call: Call, flat: np.ndarray, ufunc: np.ufunc, exclusive: bool, total: bool) -> Pair:
    """The large-message fold (module docstring): two all-to-alls (and an all-gather)."""
    n, me, size = call.group.size, call.group.rank, flat.itemsize
    counts = blocks(flat.size, n)
    recv = np.empty((n, counts[me]), flat.dtype)  # row j: block ``me`` of rank j
    if counts.count(counts[0]) == n:
        backend.alltoall(call, flat, recv)
    else:
        backend.alltoallv(call, flat, [c * size for c in counts], recv, [counts[me] * size] * n)
    shift = 1 if exclusive else 0
    send = np.empty((n, counts[me]), flat.dtype)  # row k: block ``me`` of rank k's prefix
    acc = recv[0].copy()
    for k in range(n):  # acc holds rows 0..k
        if k + shift < n:
            send[k + shift] = acc
        if k + 1 < n:
            ufunc(acc, recv[k + 1], out=acc)
    mine = [0 if exclusive and k == 0 else counts[me] * size for k in range(n)]
    theirs = [0 if exclusive and me == 0 else c * size for c in counts]
    out = np.empty(sum(theirs) // size, flat.dtype)
    backend.alltoallv(call, send[shift:], mine, out, theirs)
    whole = backend.allgatherv(call, acc, np.empty(flat.size, flat.dtype),
                               [c * size for c in counts]) if total else None
    return (None if exclusive and me == 0 else out), whole


def _segment(call: Call, plan: ReductionPlan, x: np.ndarray, kernel: native.Kernel,
             exclusive: bool, total: bool) -> Pair:
    """Through the group's segment by the compiled core (``Core.scan``, then for the total
    ``Core.allreduce``): every rank announces the call's fingerprint and element count."""
    seg = call.group.shm
    call.begin()
    data = x if x.flags.c_contiguous else np.ascontiguousarray(x)
    fp = plan.fp | kind_bits("exscan" if exclusive else "scan")
    shm.ready(call, seg, data.nbytes, fp, data.size)
    kind, op, flags, factor = kernel
    flags |= native.F_EXCLUSIVE if exclusive else 0
    prefix: np.ndarray = seg.native(call, seg.core.scan, data, kind, op, flags, factor, fp)
    whole: np.ndarray | None = seg.native(call, seg.core.allreduce, data, *kernel, fp) \
        if total else None
    call.end()
    return (None if exclusive and seg.rank == 0 else prefix), whole


def start(call: Call, g: Group, plan: ReductionPlan, x: np.ndarray, exclusive: bool,
          total: bool, done: Callable[[np.ndarray | None, np.ndarray | None], Any]) -> Work[Any]:
    """``async_op=True``: a `Work` whose result is ``done(prefix, total)`` (see `run`); ``x``
    is snapshotted at the call."""
    fn, me = ("exscan" if exclusive else "scan"), g.rank
    wire = private(plan.wire(x), x)
    if plan.ufunc is None and not total:
        out = np.empty(wire.shape, wire.dtype)
        request = backend.iscan(call, wire, out, plan.op, exclusive)
        return launch(fn, g, request, lambda: done(
            None if exclusive and me == 0 else plan.finish(out), None), wire, out)
    flat = wire.reshape(-1)
    rows = np.empty((g.size, flat.size), flat.dtype)
    request = backend.iallgather(call, flat, rows)
    ufunc = plan.fold_ufunc  # MPI's exact result where MPI's op would reduce
    return launch(fn, g, request, lambda: done(*_finished(
        plan, running(rows, ufunc, me if exclusive else me + 1, total), wire.shape)), flat, rows)
