"""Prefix reductions carried out (`fcoll.scan`, `fcoll.exscan`): rank r's inclusive prefix
(ranks 0..r) or exclusive prefix (ranks 0..r-1), and on request the total. Floats follow
the scan order of the group's size (`fcoll.backends.tree.order`: recursive doubling over
the canonical tree's leaves), whatever the transport and size; the last rank's prefix and
the total are the all-reduce's bits:

- MPI's ``Scan``/``Exscan`` where MPI's own op is exact in any order (integers, bool, and a
  sum or product on two ranks: `fcoll.policy.plan`); the total by ``Allreduce``;
- else fcoll's recursive-doubling scan (`fcoll.backends.tree.scan`): ``lg p + 2`` steps of
  the whole message, the total coming with it;
- on one node, where the compiled core runs (`fcoll.backends.native`), through the group's
  segment: one step per MiB per rank (``Core.scan``, the scan order's program; the total is
  a second step, as an all_reduce), in the all_reduce's size window (`fcoll.dispatch.on_node`).

``async_op=True`` posts ``Iscan``/``Iexscan`` (exact ops without the total) or runs the tree
scan in flight.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from fcoll.backends import mpi as backend
from fcoll.backends import native, shm, tree
from fcoll.calls.fingerprint import kind_bits
from fcoll.calls.work import Call, Work
from fcoll.collectives._fold import native_kernel
from fcoll.collectives.nonblocking import launch, private
from fcoll.dispatch import on_node
from fcoll.groups.group import Group
from fcoll.policy.plan import ReductionPlan

Pair = tuple[np.ndarray | None, np.ndarray | None]  # (prefix, total)



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
    pair = tree.scan(call, wire.reshape(-1), plan.ufunc, exclusive, total)
    return _finished(plan, pair, wire.shape)


def _finished(plan: ReductionPlan, pair: Pair, shape: tuple[int, ...]) -> Pair:
    prefix, whole = pair
    return (None if prefix is None else plan.finish(prefix.reshape(shape)),
            None if whole is None else plan.finish(whole.reshape(shape)))



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
    shape = wire.shape
    # plan.fold_ufunc: MPI's exact result where MPI's op would reduce (its total along)
    return Work(tree.start(fn, call, "scan", lambda pair: done(*_finished(plan, pair, shape)),
                           wire.reshape(-1), plan.fold_ufunc, exclusive, total))
