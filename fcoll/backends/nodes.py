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
between nodes go through `fcoll.backends.tree` (or MPI's op where the plan says order does
not matter), on a communicator of the same-local-rank peers.

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
PIPELINE = 1 << 20
DEPTH = 1
# Per-rank bytes up to which an all-reduce takes the redundant schedule (module docstring).
REDUNDANT = 16 << 10


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
        sub = self.call
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
    fits = 1 < m < g.size and m & (m - 1) == 0 and first == r - i and first % m == 0
    agreed = np.array([m, -m, int(fits)], np.int64)
    comm.Allreduce(MPI.IN_PLACE, agreed, op=MPI.MIN)
    if agreed[0] != -agreed[1] or not agreed[2]:
        node.Free()
        return None
    return Hierarchy(g, node, comm.Split(i, r))


def allreduce(call: Call, h: Hierarchy, x: np.ndarray, fold: np.ufunc, ufunc: np.ufunc | None,
              op: Any, kernel: native.Kernel | None, fp: int) -> np.ndarray:
    """Every rank's flat C-contiguous ``x`` reduced, a new flat array: inside nodes folded
    with ``fold`` (by the core's ``kernel`` where it runs: no division, no scaling), across
    them by the tree with ``ufunc``, or MPI's ``op`` where ``ufunc`` is None. ``fp``: the
    call's fingerprint, announced in the segment.

    Example:
        >>> allreduce(call, h, np.array([r + 1.0]), np.add, np.add, None, None, fp)  # 2 x 2
        array([10.])
    """
    call.begin()
    node, cross = h.node.enter(call), h.cross.enter(call)
    if x.nbytes <= REDUNDANT:
        mine = _node_allreduce(node, x, fold, kernel, fp)
        return _cross_allreduce(cross, mine, ufunc, op)
    m = h.m
    b = -(-x.size // m)
    data = x if x.size == b * m else np.resize(x, b * m)  # repeats x's own lanes: same ops
    out = np.empty(b * m, x.dtype)
    piece = max(m, PIPELINE // x.itemsize // m * m)  # elements of a piece, a multiple of m
    if ufunc is None or data.size <= piece:
        part = _node_reduce_scatter(node, data, fold, kernel, fp)
        shm.allgather(node, _cross_allreduce(cross, part, ufunc, op), out, fp)
    else:
        _pipelined(node, cross, data, out, piece, fold, ufunc, kernel, fp)
    return out if out.size == x.size else out[: x.size]


def _pipelined(node: Call, cross: Call, data: np.ndarray, out: np.ndarray, piece: int,
               fold: np.ufunc, ufunc: np.ufunc, kernel: native.Kernel | None, fp: int) -> None:
    """The multi-leader all-reduce of ``data`` into ``out`` in pieces of ``piece`` elements:
    piece ``c + 1``'s reduce-scatter in the segment while piece ``c``'s slices cross the
    network (`DEPTH` pieces in flight, each with its own tag), every node rank in the same
    order."""
    flight: deque[tuple[int, int, Operation]] = deque()
    for number, start in enumerate(range(0, data.size, piece)):
        chunk = data[start : start + piece]
        part = _node_reduce_scatter(node, chunk, fold, kernel, fp)
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


def _cross_allreduce(cross: Call, x: np.ndarray, ufunc: np.ufunc | None, op: Any) -> np.ndarray:
    if ufunc is None:
        return backend.allreduce(cross, x, op)
    return tree.allreduce(cross, x, ufunc)
