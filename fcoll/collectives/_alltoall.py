"""The all-to-alls' moves (`fcoll.all_to_all_single`, `fcoll.all_to_all`), checked: through the
group's on-node segment where it serves (`fcoll.backends.shm_alltoall`), else MPI's
``Alltoall``/``Alltoallv``.

The segment serves a group on one node whenever `fcoll.backends.shm.limit` allows the
``all_to_all`` op at all (the compiled core running, or ``FCOLL_SHM=1``), whatever the sizes:
uneven splits give ranks different sizes, and every rank must take the same path. There the
metadata of uneven splits and of lists (split sizes; shapes and dtype) travels as int64 words
in one step of the segment (`shm_alltoall.agree`) rather than as pickled objects over MPI;
what cannot be told in words (a chunk of more than `DIMS` dims, dtypes that differ) sends
every rank, alike, to the pickled exchange, which finds and raises the problem.
"""

from __future__ import annotations

import math
import zlib
from typing import Any

import numpy as np

from fcoll.backends import mpi as backend
from fcoll.backends import shm, shm_alltoall
from fcoll.calls.fingerprint import of as fingerprint
from fcoll.calls.work import Call
from fcoll.collectives._common import nbytes_of, split_bytes
from fcoll.dispatch import on_node
from fcoll.policy.dtypes import as_bytes
from fcoll.policy.validate import one_dtype, split_problem

DIMS = 4  # dims of a list's chunk told in words; more: the pickled exchange
META = fingerprint("all_to_all_single", "meta", np.dtype(np.int64))
LIST_META = fingerprint("all_to_all", "meta", np.dtype(np.int64))


def shared(call: Call) -> bool:
    """Whether this group's all-to-alls go through its segment (the same on every rank)."""
    return on_node(call, 0, "all_to_all") is not None


def even(call: Call, x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """Equal blocks of the C-contiguous ``x`` (checked), into ``out`` or a new array."""
    if shared(call):
        y = shm_alltoall.alltoall(call, x, fingerprint("all_to_all_single", "", x.dtype))
        if out is None:
            return y
        np.copyto(out.reshape(x.shape), y)
        return out
    return backend.alltoall(call, x, np.empty(x.shape, x.dtype) if out is None else out)


_CODES: dict[Any, int] = {}  # (rows' shape, dtype) -> its word
_FPS: dict[tuple[str, np.dtype[Any]], int] = {}  # (call, dtype) -> the data steps' fingerprint


def _code(*parts: Any) -> int:
    """A word for ``parts`` (shapes, dtypes), equal in every process: a CRC of their names."""
    code = _CODES.get(parts)
    if code is None:
        if len(_CODES) > 256:
            _CODES.clear()
        code = _CODES[parts] = zlib.crc32(repr([str(p) for p in parts]).encode())
    return code


def _fp(kind: str, dtype: np.dtype[Any]) -> int:
    fp = _FPS.get((kind, dtype))
    if fp is None:
        fp = _FPS[(kind, dtype)] = fingerprint(kind, "", dtype)
    return fp


def uneven(call: Call, x: np.ndarray, ins: list[int], outs: list[int] | None) -> np.ndarray:
    """Rows of the C-contiguous ``x`` in blocks of ``ins`` rows, block ``j`` to rank ``j``;
    ``outs``: what this rank expects from each (None: whatever they send). Ranks that
    disagree raise `ValueError` together."""
    if not shared(call):
        return _uneven_mpi(call, x, ins, outs)
    seg = shm._segment(call)
    if seg.core is None:
        return _uneven_words(call, x, ins, outs)
    width = 2 * seg.n + 1
    shm.ready(call, seg, 8 * width, META, width)
    got = seg.native(call, seg.core.alltoallv_rows, x, ins, outs, _code(x.shape[1:], x.dtype),
                     META, _fp("all_to_all_single", x.dtype))
    return rows_result(call, x, ins, outs, got)


def rows_result(call: Call, x: np.ndarray, ins: list[int], outs: list[int] | None, got: Any
                ) -> np.ndarray:
    """What the core's ``alltoallv_rows`` returned (every rank alike), as the call's result:
    the array; the pickled exchange where rows or dtypes differ; `ValueError` where sizes
    disagree; the data steps after the segment grew."""
    if isinstance(got, np.ndarray):
        call.end()
        return got
    if got is None:
        raise RuntimeError(f"{call.fn}: the compiled core did not take checked split sizes")
    if got[0] == "rows":
        return _uneven_mpi(call, x, ins, outs)
    if got[0] == "disagree":
        raise _disagree(call.fn, *got[1:])
    _, most, received = got
    row = x.itemsize * math.prod(x.shape[1:])
    out = np.empty((sum(received), *x.shape[1:]), x.dtype)
    return shm_alltoall.alltoallv(call, x, np.asarray(ins, np.int64) * row, out,
                                  np.asarray(received, np.int64) * row, most,
                                  _fp("all_to_all_single", x.dtype))


def _disagree(fn: str, p: int, q: int, expected: int, sent: int) -> ValueError:
    return ValueError(f"{fn}: ranks disagree: rank {p} expects output_split_sizes[{q}] = "
                      f"{expected} rows but rank {q} sends {sent} (its input_split_sizes[{p}])")


def _uneven_words(call: Call, x: np.ndarray, ins: list[int], outs: list[int] | None
                  ) -> np.ndarray:
    """`uneven` on the numpy path: the words' step (`shm_alltoall.agree`), their check here,
    the data steps (`shm_alltoall.alltoallv`): what the core's ``alltoallv_rows`` does."""
    n = call.group.size
    words = np.empty(2 * n + 1, np.int64)
    words[:n] = ins
    words[n : 2 * n] = outs if outs is not None else -1
    words[-1] = _code(x.shape[1:], x.dtype)
    meta = shm_alltoall.agree(call, words, META)
    if (meta[:, -1] != meta[0, -1]).any():  # rows or dtypes differ: the full story, and raise
        return _uneven_mpi(call, x, ins, outs)
    sent, wanted = meta[:, :n], meta[:, n : 2 * n]
    bad = (wanted[:, :1] >= 0) & (wanted != sent.T)
    if bad.any():
        p, q = (int(i) for i in np.argwhere(bad)[0])
        raise _disagree(call.fn, p, q, int(wanted[p, q]), int(sent[q, p]))
    received = sent[:, call.group.rank]
    row = x.itemsize * math.prod(x.shape[1:])
    out = np.empty((int(received.sum()), *x.shape[1:]), x.dtype)
    return shm_alltoall.alltoallv(call, x, words[:n] * row, out, received * row,
                                  int(sent.max()) * row, _fp("all_to_all_single", x.dtype))


def _uneven_mpi(call: Call, x: np.ndarray, ins: list[int], outs: list[int] | None) -> np.ndarray:
    """The pickled metadata round and MPI's ``Alltoallv``."""
    received = pickled_sizes(call, x, ins, outs)
    row = nbytes_of(x.shape[1:], x.dtype)
    out = np.empty((sum(received), *x.shape[1:]), x.dtype)
    return backend.alltoallv(call, x, [s * row for s in ins], out, [s * row for s in received])


def pickled_sizes(call: Call, x: np.ndarray, ins: list[int], outs: list[int] | None) -> list[int]:
    """The rows each rank sends this one, from every rank's split sizes, rows and dtype as
    pickled objects over MPI; `ValueError` on every rank alike where they disagree."""
    g = call.group
    meta = backend.allgather_obj(call, (ins, outs, x.shape[1:], str(x.dtype)))
    problem = split_problem(meta)
    if problem is not None:
        raise ValueError(f"{call.fn}: ranks disagree: {problem}")
    return [meta[p][0][g.rank] for p in range(g.size)]


def lists(call: Call, arrays: list[np.ndarray]) -> list[np.ndarray]:
    """`fcoll.all_to_all` of checked ``arrays`` (one per rank, one dtype)."""
    n, me = call.group.size, call.group.rank
    if not shared(call):
        return _lists_mpi(call, arrays)
    dtype = arrays[0].dtype
    words = np.full(n * (1 + DIMS) + 1, 0, np.int64)
    for j, a in enumerate(arrays):
        words[j * (1 + DIMS)] = a.ndim if a.ndim <= DIMS else -1
        words[j * (1 + DIMS) + 1 : j * (1 + DIMS) + 1 + min(a.ndim, DIMS)] = a.shape[:DIMS]
    words[-1] = _code(dtype)
    meta = shm_alltoall.agree(call, words, LIST_META)
    ndims = meta[:, : n * (1 + DIMS)].reshape(n, n, 1 + DIMS)
    if (meta[:, -1] != meta[0, -1]).any() or (ndims[:, :, 0] < 0).any():
        return _lists_mpi(call, arrays)
    sizes = ndims[:, :, 1:].copy()
    for d in range(DIMS):  # a dim past a chunk's ndim counts 1 in its size
        sizes[:, :, d][ndims[:, :, 0] <= d] = 1
    nbytes = sizes.prod(axis=2) * dtype.itemsize
    shapes = [tuple(int(s) for s in ndims[p, me, 1 : 1 + ndims[p, me, 0]]) for p in range(n)]
    send = np.concatenate([as_bytes(a) for a in arrays])
    counts = np.ascontiguousarray(nbytes[:, me])
    buf = shm_alltoall.alltoallv(call, send, np.ascontiguousarray(nbytes[me]),
                                 np.empty(int(counts.sum()), np.uint8), counts, int(nbytes.max()),
                                 _fp("all_to_all", dtype))
    return split_bytes(buf, dtype, shapes)


def _lists_mpi(call: Call, arrays: list[np.ndarray]) -> list[np.ndarray]:
    """The pickled metadata round and MPI's ``Alltoallv`` on bytes."""
    g = call.group
    meta: Any = backend.allgather_obj(call, [(a.shape, str(a.dtype)) for a in arrays])
    dtype = one_dtype([row[0][1] for row in meta], call.fn)
    shapes = [meta[p][g.rank][0] for p in range(g.size)]
    send = np.concatenate([as_bytes(a) for a in arrays])
    counts = [nbytes_of(s, dtype) for s in shapes]
    buf = backend.alltoallv(call, send, [a.nbytes for a in arrays],
                            np.empty(sum(counts), np.uint8), counts)
    return split_bytes(buf, dtype, shapes)
