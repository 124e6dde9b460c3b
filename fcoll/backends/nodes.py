"""Groups that span nodes: shared memory inside each node, MPI between them.

A group whose ranks sit on several nodes gets a `Hierarchy` at its first call that can use
one (collective over the group), where its layout allows: every node holds the same number
``m`` of the group's ranks, ``m`` is a power of two (at least 2), and the ranks are placed
by block (group ranks ``j*m .. j*m+m-1`` on node ``j``). Then each node's ranks are one
subtree of the canonical tree of the group's size (API.md "Reduction order"; the tree's
pre-step pairs ``2i, 2i+1`` never cross a block of ``m``), and the tree above the nodes is
the canonical tree of the ``k`` nodes, so the schedules below give the flat schedule's bits:

- small all-reduces (`REDUNDANT` bytes per rank at most): the node's subtree through the
  segment (every local rank gets it), then every local rank reduces the whole vector
  with its same-local-rank peers on the other nodes (``k`` ranks): two latencies, no
  gather;
- larger ones (multi-leader, as Open MPI's coll/han and MPICH's multi-leader composition):
  the node's subtree as a reduce-scatter through the segment (local rank ``i`` holds slice
  ``i``), the ``m`` slices reduced across the nodes in parallel (``k`` ranks each, ``n/m``
  elements), then an all-gather of the slices through the segment; each rank sends
  ``2(k-1)/k * n/m`` bytes over the network instead of ``2(p-1)/p * n``.

Other layouts (and ``m = 1``, ``m = p``) return None: the flat schedule runs. Messages
between nodes go through `fcoll.backends.tree` on a communicator of the same-local-rank
peers (reductions MPI's op carries out, integers, stay flat: any order gives their bits).

Movement follows the same split (`allgather`, `broadcast`, `barrier`, `reduce_scatter`):
inside nodes through the segment, between nodes on ``k`` ranks.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Any

import numpy as np

from fcoll import runtime
from fcoll.backends import mpi as backend
from fcoll.backends import native, shm, tree
from fcoll.backends.segment import Segment
from fcoll.calls.work import Call, Operation, wait_request
from fcoll.diagnostics.board import split_node

NAME = "nodes"
# Per-rank bytes of a pipelined piece of a large all-reduce, and pieces in flight
# (bench/nodes.py).
PIPELINE = 4 << 20
DEPTH = 1
# Per-rank bytes up to which an all-reduce takes the redundant schedule (module docstring).
REDUNDANT = 16 << 10
# Per-rank bytes from which each collective goes through the hierarchy, where it measured
# faster than the flat schedule or MPI's own algorithm on the simulated cluster
# (bench/nodes.py, docs/performance.md "Across nodes"): the reductions and the barrier (MPICH's
# barrier over TCP took 0.9 ms, this one 0.1 ms) always. The multi-leader all-gather and
# broadcast did not beat MPI's on 2 x 2 here (TCP on lo is a memory copy like the segment's,
# so fewer network bytes buy nothing): NEVER, until a real cluster measures them.
NEVER = 1 << 62
FROM = {"all_reduce": 0, "reduce_scatter": 0, "all_gather": NEVER, "broadcast": NEVER,
        "barrier": 0}


def serves(h: Hierarchy | None, op: str, nbytes: int) -> bool:
    """Whether ``op`` of ``nbytes`` per rank goes through the hierarchy ``h`` (`FROM`).

    Example:
        >>> serves(h, "all_gather", 8), serves(h, "barrier", 0)
        (False, True)
    """
    return h is not None and nbytes >= FROM[op]


class Level:
    """The ranks of a group on this node (or with this local rank), seen as a group by the
    transports: its own communicator, rank, size and segment; everything else (the call
    number, pending operations, deadline, key for notices, ``broken``) is the group's.

    Example:
        >>> lvl = Level(group, node_comm)        # group rank 2 of 4, on the second node
        >>> (lvl.rank, lvl.size, lvl.seq == group.seq)
        (0, 2, True)
    """

    __slots__ = ("_group", "call", "comm", "rank", "shm", "size")

    def __init__(self, group: Any, comm: Any) -> None:
        object.__setattr__(self, "_group", group)
        object.__setattr__(self, "comm", comm)
        object.__setattr__(self, "rank", comm.Get_rank())
        object.__setattr__(self, "size", comm.Get_size())
        object.__setattr__(self, "shm", None)
        call = Call(self, comm)
        object.__setattr__(self, "call", call)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._group, name)

    def __setattr__(self, name: str, value: Any) -> None:
        if name in Level.__slots__:
            object.__setattr__(self, name, value)
        else:
            setattr(self._group, name, value)  # broken, usable: the group's

    def enter(self, call: Call) -> Call:
        """This level's call for the group's ``call`` in progress (its name, deadline and
        flight record; already counted)."""
        sub: Call = self.call
        sub.fn, sub.seconds, sub.start, sub.slot = call.fn, call.seconds, call.start, call.slot
        return sub


class Hierarchy:
    """A group's split into nodes: ``node`` (its ranks on this node, with the segment) and
    ``cross`` (its ranks with this local rank, one per node); ``k`` nodes of ``m`` ranks.

    Example:
        >>> h = hierarchy(call)                   # 4 ranks, 2 nodes of 2, by block
        >>> (h.k, h.m, h.node.rank, h.cross.rank) # on group rank 3
        (2, 2, 1, 1)
    """

    def __init__(self, group: Any, node: Any, cross: Any) -> None:
        self.node, self.cross = Level(group, node), Level(group, cross)
        self.m, self.k = node.Get_size(), cross.Get_size()
        core = native.module() if native.running() and self.m <= native.MAX_RANKS else None
        self.node.shm = Segment(node, 64 << 10, core, owner=self.node)

    def free(self) -> None:
        """Free the segment and both communicators (collective over the group)."""
        self.node.shm.free()
        self.cross.comm.Free()


def hierarchy(call: Call) -> Hierarchy | None:
    """The group's `Hierarchy`, made at its first use (collective over the group), or None
    where its layout does not allow one, or ``FCOLL_SHM=0``."""
    g = call.group
    if g.nodes is None:
        g.nodes = _build(call) or False
    return g.nodes or None


def splittable(m: int, p: int) -> bool:
    """Whether ``m`` ranks on every node of a ``p``-rank group allow a split: a power of two,
    at least 2, and more than one node.

    Example:
        >>> splittable(2, 4), splittable(3, 6), splittable(4, 4)
        (True, False, False)
    """
    return 1 < m < p and m & (m - 1) == 0


def by_block(first: int, rank: int, local: int, m: int) -> bool:
    """Whether this rank's node holds group ranks ``first .. first + m - 1`` in order, an
    aligned block (``first``: the node's lowest group rank; ``local``: this rank's place on
    the node). Every rank of the group must find it so.

    Example:
        >>> by_block(2, 3, 1, 2), by_block(1, 3, 1, 2)
        (True, False)
    """
    return first == rank - local and first % m == 0


def _build(call: Call) -> Hierarchy | None:
    g = call.group
    if g.size < 4 or shm.settings()[0] == "off":
        return None
    comm = call.begin()
    if call.seconds is not None:  # everyone is in this call before the blocking setup
        wait_request(comm.Ibarrier(), call)
    MPI = runtime.mpi()
    node = split_node(comm, shm.settings()[1])
    m, i, r = node.Get_size(), node.Get_rank(), comm.Get_rank()
    first = node.allreduce(r, op=MPI.MIN)
    fits = splittable(m, g.size) and by_block(first, r, i, m)
    agreed = np.array([m, -m, int(fits)], np.int64)
    comm.Allreduce(MPI.IN_PLACE, agreed, op=MPI.MIN)
    if agreed[0] != -agreed[1] or not agreed[2]:
        node.Free()
        return None
    return Hierarchy(g, node, comm.Split(i, r))


def allreduce(call: Call, h: Hierarchy, x: np.ndarray, ufunc: np.ufunc,
              kernel: native.Kernel | None, fp: int) -> np.ndarray:
    """Every rank's flat C-contiguous ``x`` reduced with ``ufunc`` along the tree, a new flat
    array: inside nodes by the core's ``kernel`` where it runs (no division, no scaling),
    across them by `fcoll.backends.tree`. ``fp``: the call's fingerprint, announced in the
    segment.

    Example:
        >>> allreduce(call, h, np.array([r + 1.0]), np.add, None, fp)  # rank r, 2 x 2
        array([10.])
    """
    call.begin()
    node, cross = h.node.enter(call), h.cross.enter(call)
    if x.nbytes <= REDUNDANT:
        return tree.allreduce(cross, _node_allreduce(node, x, ufunc, kernel, fp), ufunc)
    m = h.m
    b = -(-x.size // m)
    data = x if x.size == b * m else np.resize(x, b * m)  # repeats x's own lanes: same ops
    out = np.empty(b * m, x.dtype)
    piece = max(m, PIPELINE // x.itemsize // m * m)  # elements of a piece, a multiple of m
    if data.size <= piece:
        part = _node_reduce_scatter(node, data, ufunc, kernel, fp)
        shm.allgather(node, tree.allreduce(cross, part, ufunc), out, fp)
    else:
        _pipelined(node, cross, data, out, piece, ufunc, kernel, fp)
    return out if out.size == x.size else out[: x.size]


def _pipelined(node: Call, cross: Call, data: np.ndarray, out: np.ndarray, piece: int,
               ufunc: np.ufunc, kernel: native.Kernel | None, fp: int) -> None:
    """The multi-leader all-reduce of ``data`` into ``out`` in pieces of ``piece`` elements:
    piece ``c + 1``'s reduce-scatter in the segment while piece ``c``'s slices cross the
    network (`DEPTH` pieces in flight, each with its own tag), every node rank in the same
    order."""
    flight: deque[tuple[int, int, Operation]] = deque()
    for number, start in enumerate(range(0, data.size, piece)):
        chunk = data[start : start + piece]
        part = _node_reduce_scatter(node, chunk, ufunc, kernel, fp)
        op = tree.start("all_reduce", cross, "allreduce", _same, part, ufunc, seq=number)
        flight.append((start, chunk.size, op))
        if len(flight) > DEPTH:
            _gather(node, cross, flight.popleft(), out, fp)
    while flight:
        _gather(node, cross, flight.popleft(), out, fp)


def _same(y: np.ndarray) -> np.ndarray:
    return y


def _gather(node: Call, cross: Call, done: tuple[int, int, Operation], out: np.ndarray, fp: int
            ) -> None:
    """Wait for a piece's slices to cross, then gather them into ``out`` in the segment."""
    start, size, op = done
    left = None if cross.seconds is None else cross.seconds - (time.monotonic() - cross.start)
    shm.allgather(node, op.finish(left), out[start : start + size], fp)


def _node_allreduce(node: Call, x: np.ndarray, fold: np.ufunc, kernel: native.Kernel | None,
                    fp: int) -> np.ndarray:
    if kernel is not None:
        return shm.allreduce_native(node, x, kernel, fp)
    return shm.allreduce(node, x, fold, fp)


def _node_reduce_scatter(node: Call, x: np.ndarray, fold: np.ufunc,
                         kernel: native.Kernel | None, fp: int) -> np.ndarray:
    if kernel is not None:
        return shm.reduce_scatter_native(node, x, kernel, fp)
    return shm.reduce_scatter_block(node, x, fold, fp)


def reduce_scatter(call: Call, h: Hierarchy, x: np.ndarray, ufunc: np.ufunc,
                   kernel: native.Kernel | None, fp: int) -> np.ndarray:
    """Block ``rank`` of ``p`` equal blocks of every rank's flat C-contiguous ``x``, reduced
    with ``ufunc`` (`allreduce`'s arguments): the blocks of this local rank's peers on every node gathered
    (``x`` as ``(k, m, b)`` read as ``(m, k, b)``: one copy), reduced inside the node by a
    reduce-scatter through the segment (local rank ``i`` gets the node's sums of blocks
    ``j*m + i``), then a reduce-scatter across the nodes (``k`` ranks).

    Example:
        >>> reduce_scatter(call, h, np.arange(4.0), np.add, None, fp)   # every rank, 2 x 2
        array([0.])                                        # group rank 1: [4.], ...: [12.]
    """
    call.begin()
    node, cross = h.node.enter(call), h.cross.enter(call)
    k, m = h.k, h.m
    b = x.size // (k * m)
    data = np.ascontiguousarray(x.reshape(k, m, b).transpose(1, 0, 2)).reshape(-1)
    part = _node_reduce_scatter(node, data, ufunc, kernel, fp)
    return tree.reduce_scatter(cross, part, [b] * k, ufunc)


def allgather(call: Call, h: Hierarchy, send: np.ndarray, out: np.ndarray, fp: int
              ) -> np.ndarray:
    """Every rank's C-contiguous ``send`` in group-rank order, into ``out`` (C-contiguous,
    ``p`` times ``send``'s bytes): this rank's block gathered with its same-local-rank
    peers across the nodes (``k`` ranks, ``(k-1) * b`` bytes received over the network, where
    a flat all-gather receives ``(p-1) * b``), then those through the segment, then one copy
    into group order.

    Example:
        >>> allgather(call, h, np.array([r]), np.empty(4, int), fp)   # rank r, 2 x 2
        array([0, 1, 2, 3])
    """
    call.begin()
    node, cross = h.node.enter(call), h.cross.enter(call)
    k, m = h.k, h.m
    mine = np.empty(k * send.nbytes, np.uint8)
    backend.allgather(cross, send.reshape(-1).view(np.uint8), mine)
    every = np.empty(m * mine.size, np.uint8)
    shm.allgather(node, mine, every, fp)
    np.copyto(out.reshape(-1).view(np.uint8).reshape(k, m, -1),
              every.reshape(m, k, -1).transpose(1, 0, 2))
    return out


def broadcast(call: Call, h: Hierarchy, x: np.ndarray, root: int, fp: int) -> np.ndarray:
    """Group rank ``root``'s ``x`` (any layout) in a new C-contiguous array on every rank:
    across the nodes among the root's local rank (MPI's broadcast on ``k`` ranks), then
    inside every node through the segment.

    Example:
        >>> broadcast(call, h, np.array([r]), 3, fp)     # rank r, 2 x 2
        array([3])
    """
    call.begin()
    node, cross = h.node.enter(call), h.cross.enter(call)
    top, leader = divmod(root, h.m)
    if h.node.rank != leader:
        return shm.broadcast(node, x, leader, fp)  # x: only its shape and dtype
    buf = np.array(x, order="C", copy=True) if h.cross.rank == top else np.empty(x.shape, x.dtype)
    backend.bcast(cross, buf.reshape(-1).view(np.uint8), top)
    return shm.broadcast(node, buf, leader, fp)


def barrier(call: Call, h: Hierarchy) -> None:
    """Every rank of the group arrived: every rank of this node (a step of the segment),
    then every node's rank of this local rank (MPI's barrier on ``k`` ranks), which had
    each seen its own node arrive."""
    call.begin()
    shm.barrier(h.node.enter(call))
    backend.barrier(h.cross.enter(call))
