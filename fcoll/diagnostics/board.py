"""The node board: what each rank of this node is doing, in memory the node's ranks share.

One MPI-3 shared window per node (``MPI.Win.Allocate_shared`` on the node's ranks, split
by ``COMM_TYPE_SHARED``; ``FCOLL_SHM_NODE_SIZE=k`` pretends each node holds ``k``
consecutive ranks, as for the shared-memory transport), made at `fcoll.init`. Each rank
owns one 512-byte line and is the only one to write it; any rank reads every line without
a message, from any thread. The stall watch (`fcoll.diagnostics.watch`) of each rank publishes its
rank's state there about once a second (no store on any call's path), and a rank that ends
its script publishes that it ended and the last call number it made on each group. So a
rank stuck in a collective can say what its peers on the node are doing, and notice that a
peer it waits for has ended (a hang nothing else would report).

A line (int64 words, then text):

| words | meaning |
|---|---|
| 0 state | 0 not started, 1 running, 2 ended normally, 3 ended by an exception |
| 1 rank, 2 pid | global rank, process id |
| 3 time | when the line was written (``time.time()``, microseconds) |
| 4 waiting | 1 while the main thread waits in a blocking fcoll call |
| 5 serial, 6 seq, 7 since | the call it waits in: group serial, call number, since when (µs) |
| 8 groups | how many ``(serial, seq)`` pairs follow from word 16: each group's last call number |
| bytes 384-447, 448-511 | the op it waits in; why it ended (text) |

Readers may see a line half-written (no lock): the board feeds reports and a check that
only acts on a rank that has ended, whose line is final.

Example:
    >>> board = Board(node)                      # every rank of the node, at fcoll.init
    >>> board.publish(state=RUNNING)
    >>> [line.rank for line in board.lines()]    # 2 ranks on this node
    [0, 1]
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fcoll import runtime

LINE = 512
NOT_STARTED, RUNNING, ENDED, FAILED = range(4)
STATE, RANK, PID, TIME, WAITING, SERIAL, SEQ, SINCE, GROUPS = range(9)
PAIRS_AT, MAX_GROUPS = 16, 16
OP_AT, REASON_AT, TEXT = 384, 448, 64
NODE_ENV = "FCOLL_SHM_NODE_SIZE"


@dataclass
class Line:
    """One rank's line, decoded."""

    state: int
    rank: int
    pid: int
    written: float  # seconds since the epoch
    waiting: bool
    serial: int
    seq: int
    since: float
    op: str
    reason: str
    seqs: dict[int, int] = field(default_factory=dict)  # group serial -> last call number


def node_size_setting() -> int:
    """``FCOLL_SHM_NODE_SIZE`` (0: the real nodes)."""
    size = os.environ.get(NODE_ENV, "").strip() or "0"
    if not size.isdigit():
        raise ValueError(f"{NODE_ENV}: expected a number of ranks per node, got {size!r}")
    return int(size)


def split_node(comm: Any, per_node: int) -> Any:
    """``comm``'s ranks on this node, in ``comm``'s order (collective over ``comm``);
    ``per_node`` > 0 pretends each node holds that many consecutive global ranks."""
    MPI = runtime.mpi()
    node = comm.Split_type(MPI.COMM_TYPE_SHARED, key=comm.Get_rank())
    if per_node:
        fake = node.Split(MPI.COMM_WORLD.Get_rank() // per_node, node.Get_rank())
        node.Free()
        node = fake
    return node


def _text(buf: np.ndarray, at: int) -> str:
    return bytes(buf[at : at + TEXT]).split(b"\0", 1)[0].decode(errors="replace")


class Board:
    """The node's board (collective over ``node``, every rank of this node)."""

    def __init__(self, node: Any) -> None:
        MPI = runtime.mpi()
        self.node, self.n, self.me = node, node.Get_size(), node.Get_rank()
        self.win = MPI.Win.Allocate_shared(self.n * LINE if self.me == 0 else 0, 1, comm=node)
        buf, _ = self.win.Shared_query(0)
        self.mem = np.frombuffer(buf, np.uint8, count=self.n * LINE)
        self.words = self.mem.view(np.int64).reshape(self.n, LINE // 8)
        self.mine = self.words[self.me]
        self.mine[:] = 0
        self.mine[RANK], self.mine[PID] = MPI.COMM_WORLD.Get_rank(), os.getpid()
        node.Barrier()  # every line cleared before anyone reads

    def publish(self, state: int = RUNNING, wait: tuple[int, int, float, str] | None = None,
                seqs: Sequence[tuple[int, int]] = (), reason: str = "") -> None:
        """Write this rank's line: its ``state``, the call it waits in (``(serial, seq,
        since, op)``) or None, and each group's last call number ``seqs``."""
        line, text = self.mine, self.mem[self.me * LINE :]
        pairs = list(seqs)[:MAX_GROUPS]
        for i, (serial, seq) in enumerate(pairs):
            line[PAIRS_AT + 2 * i], line[PAIRS_AT + 2 * i + 1] = serial, seq
        line[GROUPS] = len(pairs)
        if wait is not None:
            line[SERIAL], line[SEQ], line[SINCE] = wait[0], wait[1], int(wait[2] * 1e6)
            _write(text, OP_AT, wait[3])
        line[WAITING] = wait is not None
        _write(text, REASON_AT, reason)
        line[TIME] = int(time.time() * 1e6)
        line[STATE] = state

    def free(self) -> None:
        """Free the window and the node communicator (collective over the node's ranks;
        at exit, `fcoll.diagnostics.watch`)."""
        del self.words, self.mine
        self.mem = np.empty(0, np.uint8)
        self.win.Free()
        self.node.Free()

    def lines(self) -> list[Line]:
        """Every rank's line on this node (this rank's own included), by node rank."""
        out = []
        for j in range(self.n):
            w, text = self.words[j].tolist(), self.mem[j * LINE :]
            seqs = {w[PAIRS_AT + 2 * i]: w[PAIRS_AT + 2 * i + 1] for i in range(min(w[GROUPS], MAX_GROUPS))}
            out.append(Line(w[STATE], w[RANK], w[PID], w[TIME] / 1e6, bool(w[WAITING]), w[SERIAL],
                            w[SEQ], w[SINCE] / 1e6, _text(text, OP_AT), _text(text, REASON_AT), seqs))
        return out


def _write(buf: np.ndarray, at: int, value: str) -> None:
    data = value.encode(errors="replace")[: TEXT - 1]
    buf[at : at + len(data)] = np.frombuffer(data, np.uint8)
    buf[at + len(data)] = 0
