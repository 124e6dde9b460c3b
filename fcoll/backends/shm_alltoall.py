"""All-to-all through a group's on-node segment (`fcoll.backends.segment`): block ``j`` of
every rank's input goes to rank ``j``, as MPI's ``Alltoall``/``Alltoallv`` on bytes.

Each step carries the next piece of every block a rank sends: it copies them into its slot
(piece ``j`` at ``j * per``), arrives announcing the call's fingerprint, and copies piece
``me`` of every peer's slot into its result; its own block goes straight from its input. A
piece is all of a block where ``n`` of the largest fit one ``CHUNK``, else a ``CHUNK``'s
``n``-th, so a call takes ``ceil(most / per)`` steps, ``most`` the largest block any rank
sends (the same on every rank). Per byte each rank moves two copies, as MPI's shared-memory
path, with one flag per step instead of a message per pair.

Uneven splits first agree on the sizes in one step of int64 words (`agree`): every rank
reads every rank's input and output split sizes and finds the same problem, so ranks that
disagree raise `ValueError` together, without a pickled metadata round. The compiled core
(`fcoll.backends._shmcore`: ``alltoall``, ``alltoallv``) takes the steps where it runs; the
numpy path (`steps`) takes the same ones.

Example:
    >>> alltoall(call, np.array([10 * r, 10 * r + 1]), fp)      # rank r of 2 on one node
    array([ 1, 11])                                              # on rank 1
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from fcoll.backends import shm
from fcoll.backends.segment import CHUNK, Segment
from fcoll.calls.work import Call


def piece(n: int, most: int) -> int:
    """Bytes of each block one step carries (the C core's ``alltoall_piece``).

    Example:
        >>> piece(2, 8), piece(4, 8 << 20)
        (8, 262144)
    """
    per = CHUNK // n
    if per > 64:
        per &= ~63
    return max(1, min(per, most))


def alltoall(call: Call, x: np.ndarray, fp: int) -> np.ndarray:
    """``x`` (C-contiguous, at least 1-D, ``x.shape[0]`` divisible by ``n``): its rows in ``n``
    blocks, block ``j`` to group rank ``j``; a new array of ``x``'s shape. Ranks whose ``fp``
    (call, dtype) or size differ raise `fcoll.calls.errors.CollectiveMismatchError` together."""
    seg = shm._segment(call)
    n = seg.n
    block = x.nbytes // n
    shm.ready(call, seg, min(block, piece(n, block)) * n, fp, x.size)
    if seg.core is not None:
        out: np.ndarray = seg.native(call, seg.core.alltoall, x, fp)
    else:
        out = np.empty(x.shape, x.dtype)
        counts = [block] * n
        steps(call, seg, _bytes(x), counts, _offsets(counts), _bytes(out), counts, block, fp, x.size)
    call.end()
    return out


def alltoall_step(seg: Segment, call: Call, x: np.ndarray, fp: int) -> np.ndarray:
    """`alltoall` on the numpy path of an ``x`` whose blocks fit one step, for the default
    group's fast path (no deadline, the segment made and holding ``x``:
    `fcoll.collectives._fast.segment_call`).

    Example:
        >>> alltoall_step(group.shm, group.call, np.array([r, r]), fp)   # rank r of 2
        array([0, 1])
    """
    n = seg.n
    block = x.nbytes // n
    out = np.empty(x.shape, x.dtype)
    counts = [block] * n
    steps(call, seg, _bytes(x), counts, _offsets(counts), _bytes(out), counts, block, fp, x.size)
    return out


def alltoallv(call: Call, send: np.ndarray, send_counts: np.ndarray, out: np.ndarray,
              recv_counts: np.ndarray, most: int, fp: int) -> np.ndarray:
    """As MPI's ``Alltoallv`` on bytes (``send_counts``/``recv_counts``: int64 arrays of bytes,
    blocks packed in rank order) into ``out`` (C-contiguous); ``most``: the largest block of
    any rank, agreed (`agree`)."""
    seg = shm._segment(call)
    shm.ready(call, seg, min(most, piece(seg.n, most)) * seg.n, fp, most)
    if seg.core is not None:
        seg.native(call, seg.core.alltoallv, _bytes(send), send_counts, _bytes(out), recv_counts,
                   most, fp, most)
    else:
        sends = send_counts.tolist()
        steps(call, seg, _bytes(send), sends, _offsets(sends), _bytes(out), recv_counts.tolist(),
              most, fp, most)
    call.end()
    return out


def agree(call: Call, words: np.ndarray, fp: int) -> np.ndarray:
    """Every rank's ``words`` (int64, the same length everywhere) as an ``(n, len)`` array, in
    one step of the segment: the metadata of an uneven all-to-all."""
    seg = shm._segment(call)
    shm.ready(call, seg, words.nbytes, fp, words.size)
    rows = seg.exchange(words, call, fp, words.size)
    return np.stack(rows)


def steps(call: Call, seg: Segment, src: np.ndarray, sends: Sequence[int], starts: Sequence[int],
          dst: np.ndarray, recvs: Sequence[int], most: int, fp: int, count: int) -> None:
    """The numpy path's steps (bytes: ``src`` and ``dst`` uint8, blocks at ``starts`` and
    packed ``dst``): what the core's ``alltoall_steps`` does, with `Segment.exchange`."""
    n, me = seg.n, seg.rank
    per = piece(n, most)
    into = _offsets(recvs)
    staged = np.zeros((n, per), np.uint8)
    for at in range(0, max(most, 1), per):
        for j in range(n):
            m = max(0, min(sends[j] - at, per))
            if j != me and m:
                staged[j, :m] = src[starts[j] + at : starts[j] + at + m]
        rows = seg.exchange(staged.reshape(-1), call, fp, count)
        for j in range(n):
            m = max(0, min(recvs[j] - at, per))
            if m:
                row = src[starts[me] + at :] if j == me else rows[j][me * per :]
                dst[into[j] + at : into[j] + at + m] = row[:m]


def _offsets(counts: Sequence[int]) -> list[int]:
    out, at = [], 0
    for c in counts:
        out.append(at)
        at += c
    return out


def _bytes(a: np.ndarray) -> Any:
    """``a`` (C-contiguous) as a flat uint8 view."""
    return a.reshape(-1).view(np.uint8)
