"""The fast paths of all_reduce and reduce_scatter_tensor on a group that spans nodes.

Once the group's `fcoll.backends.nodes.Hierarchy` exists (its first full-path call made
it), its segment steps in C and holds the message, and the number of nodes ``k`` is a power
of two, a call of at most `LIMIT` bytes per rank runs here without the full path's set-up:
the node's subtree by the core in one C call (`REDUNDANT` bytes and below: every local rank
gets it whole; above: a reduce-scatter, then the slices), recursive doubling across the
nodes with ``Sendrecv`` on the same-local-rank communicator (lower operand on the left: the
canonical tree of ``k``), then (above `REDUNDANT`) the core's all-gather. Same steps, same
messages and bits as `fcoll.backends.nodes.allreduce` (a rank on the full path meets the
others on it: where the tree would not take recursive doubling, the full path runs). The
full path's set-up (member, checks, plan, hierarchy lookup, the tree's driver) cost about
40 us of a 60 us call at 8 B here. A group that spans nodes without a split (one rank per
node, another layout) takes the tree's recursive doubling over the group the same way.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from fcoll.backends import native, nodes
from fcoll.backends.native import module
from fcoll.backends.tree import doubling_limit
from fcoll.backends.tree.steps import BYTE, MPI, STATUS, combine, tag, truncated
from fcoll.calls import fingerprint
from fcoll.calls.errors import sizes_differ_end
from fcoll.diagnostics import flight

Fast = Callable[[np.ndarray], "np.ndarray | None"]
LIMIT = 1 << 20  # per-rank bytes; above, the full path's set-up is noise


def all_reduce(g: Any, plan: Any) -> Fast | None:
    """A closure for ``g``'s all_reduce of ``plan`` (`fcoll.policy.plan.ReductionPlan`, one
    the tree reduces) that returns None where it does not serve the call (the full path then
    does); None where the core cannot fold the plan's wire data.

    Example:
        >>> run = all_reduce(g, plan)                  # 2 nodes x 2 ranks, float32 sum
        >>> run(np.ones(4, np.float32))
        array([4., 4., 4., 4.], dtype=float32)
    """
    kernel = native.kernel(plan.wire_dtype, plan.fold_ufunc, False, None)
    if kernel is None or plan.ufunc is None:
        return None
    ufunc, wire, finish, fp = plan.ufunc, plan.wire, plan.finish, plan.fp
    recorder = flight.recorder(g.key)
    mismatch = module().Mismatch

    def across(x: np.ndarray) -> np.ndarray | None:
        """No split (one rank per node, another layout): the tree's recursive doubling over
        the group for a power-of-two size, as the full path's tree takes it."""
        data = wire(x).reshape(-1)
        p = g.size
        if p & (p - 1) or data.nbytes > doubling_limit(p):
            return None
        i = _begin(g, recorder, "all_reduce", x)
        y = data.copy()
        _doubling(g._comm, g.rank, p, y, ufunc, tag(g.seq))
        _end(recorder, i)
        done: np.ndarray = finish(y)
        return done.reshape(x.shape)

    def run(x: np.ndarray) -> np.ndarray | None:
        h = g.nodes
        if not h or not x.flags.c_contiguous or x.nbytes > LIMIT:
            return across(x) if h is False and x.flags.c_contiguous else None
        seg, k = h.node.shm, h.k
        core = seg.core
        flat = wire(x)
        if flat.ndim != 1:
            flat = flat.reshape(-1)
        whole = flat.nbytes <= nodes.REDUNDANT
        part = flat.nbytes if whole else flat.nbytes // h.m
        if core is None or k & (k - 1) or flat.nbytes > seg.capacity or (
                not whole and flat.size % h.m) or part > doubling_limit(k):
            return None  # the full path (whose tree would not take recursive doubling)
        i = _begin(g, recorder, "all_reduce", x)
        try:
            y = core.allreduce(flat, *kernel, fp, -1.0) if whole else core.reduce_scatter(
                flat, *kernel, fp, -1.0)
            _doubling(h.cross.comm, h.cross.rank, k, y, ufunc, tag(g.seq))
            if not whole:
                out = np.empty(flat.size, flat.dtype)
                core.allgather(y, out, fp, -1.0)
                y = out
        except mismatch as error:
            raise _told(g, seg, "all_reduce", error) from None
        _end(recorder, i)
        done: np.ndarray = finish(y)
        return done if done.shape == x.shape else done.reshape(x.shape)

    return run


def _begin(g: Any, recorder: flight.Recorder, name: str, x: np.ndarray) -> int:
    """Count a fast path's call on ``g`` and enter it in the flight recorder (as the other
    fast paths do, `fcoll.collectives._fast`); its slot there, or -1 (no recorder)."""
    calls, _, pos, mask, ranks, clock = recorder
    g.seq += 1
    if calls is None:
        return -1
    i = pos[0]
    pos[0] = i + 1
    i &= mask
    calls[i] = (ranks, g.seq, name, "numpy", x.shape, x.dtype, clock())
    return i


def _end(recorder: flight.Recorder, i: int) -> None:
    """The call in slot ``i`` (`_begin`) completed."""
    if i >= 0:
        recorder[1][i] = recorder[5]()


def _told(g: Any, seg: Any, name: str, error: Any) -> Exception:
    """The core's Mismatch at a step as `fcoll.calls.errors.CollectiveMismatchError` (every
    rank of the node alike)."""
    g.call.fn = name
    return fingerprint.mismatch(name, g.ranks, seg.announced(error.args[0]))


def _doubling(comm: Any, me: int, k: int, y: np.ndarray, ufunc: np.ufunc, label: int) -> None:
    """``y`` reduced in place over the ``k`` (a power of two) ranks of ``comm``: the
    canonical tree of ``k``, each step the lower block's value on the left."""
    other = np.empty_like(y)
    d = 1
    while d < k:
        peer = me ^ d
        _sendrecv(comm, y, other, peer, label)
        if peer < me:
            combine(ufunc, other, y, y)
        else:
            combine(ufunc, y, other, y)
        d <<= 1


def reduce_scatter(g: Any, plan: Any, fp: int) -> Fast | None:
    """A closure for ``g``'s reduce_scatter_tensor of ``plan`` on two nodes (``fp``: the
    call's fingerprint as the full path announces it): the peers' blocks side by side (one
    copy), the node's sums of them by the core's reduce-scatter, then one exchange with the
    other node and the fold, the lower node's value on the left (the canonical tree of two);
    None where it does not serve the call.

    Example:
        >>> run = reduce_scatter(g, plan, fp)            # 2 nodes x 2 ranks, float32 sum
        >>> run(np.ones(8, np.float32))
        array([4., 4.], dtype=float32)
    """
    kernel = native.kernel(plan.wire_dtype, plan.fold_ufunc, False, None)
    if kernel is None or plan.ufunc is None:
        return None
    ufunc, wire, finish = plan.ufunc, plan.wire, plan.finish
    recorder = flight.recorder(g.key)
    mismatch = module().Mismatch
    p = g.size

    def run(x: np.ndarray) -> np.ndarray | None:
        h = g.nodes
        shape = x.shape
        if not h or h.k != 2 or not shape or shape[0] % p or not x.flags.c_contiguous or \
                x.nbytes > LIMIT:
            return None
        seg = h.node.shm
        core = seg.core
        flat = wire(x).reshape(-1)
        if core is None or flat.nbytes > seg.capacity:
            return None
        b = flat.size // p
        peers = np.ascontiguousarray(flat.reshape(2, h.m, b).transpose(1, 0, 2)).reshape(-1)
        i = _begin(g, recorder, "reduce_scatter_tensor", x)
        try:
            part = core.reduce_scatter(peers, *kernel, fp, -1.0)
        except mismatch as error:
            raise _told(g, seg, "reduce_scatter_tensor", error) from None
        j = h.cross.rank
        other = np.empty(b, part.dtype)
        label = tag(g.seq)
        _sendrecv(h.cross.comm, part[(1 - j) * b : (2 - j) * b], other, 1 - j, label,
                  "reduce_scatter_tensor")
        mine = part[j * b : (j + 1) * b]
        y = combine(ufunc, other, mine, other) if j else combine(ufunc, mine, other, other)
        _end(recorder, i)
        done: np.ndarray = finish(y)
        return done.reshape((shape[0] // p, *shape[1:]))

    return run


def _sendrecv(comm: Any, send: np.ndarray, recv: np.ndarray, peer: int, label: int,
              fn: str = "all_reduce") -> None:
    """One exchange with ``peer``; `fcoll.calls.errors.sizes_differ` if the peer's message
    was not ``recv``'s size (the ranks passed different sizes)."""
    try:
        comm.Sendrecv([send, BYTE], peer, label, [recv, BYTE], peer, label, STATUS)
    except MPI.Exception as error:
        raise truncated(fn, comm, peer, recv.nbytes, error) from None
    if STATUS.Get_count(BYTE) != recv.nbytes:
        raise sizes_differ_end(fn, comm, peer, STATUS.Get_count(BYTE), recv.nbytes)

