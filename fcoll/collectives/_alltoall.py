"""The all-to-alls' moves (`fcoll.all_to_all_single`, `fcoll.all_to_all`), checked: through the
group's on-node segment where it serves (`fcoll.backends.shm_alltoall`), else MPI's
``Alltoall``/``Alltoallv``.

The segment serves a group on one node whenever `fcoll.backends.shm.limit` allows the
``all_to_all`` op at all (the compiled core running, or ``FCOLL_SHM=1``), up to `limit`
bytes of ``n`` blocks of the largest: uneven splits give ranks different sizes, and every
rank must take the same path, so they choose after agreeing on the sizes. There the
split sizes of uneven calls travel as int64 words in one step of the segment (the core's
``alltoallv_rows``, or `shm_alltoall.agree` on the numpy path) rather than as pickled objects
over MPI, and a list's chunks travel as blocks of bytes each led by its header (dtype word,
size, shape). What words cannot say (rows or dtypes that differ between ranks) sends every
rank, alike, to the pickled exchange, which finds and names the problem.
"""

from __future__ import annotations

import math
import zlib
from typing import Any

import numpy as np

from fcoll.backends import mpi as backend
from fcoll.backends import native, shm, shm_alltoall
from fcoll.calls.fingerprint import of as fingerprint
from fcoll.calls.work import Call
from fcoll.collectives._common import nbytes_of, split_bytes
from fcoll.dispatch import on_node
from fcoll.policy.dtypes import as_bytes
from fcoll.policy.validate import one_dtype, split_problem

ALIGN = 16  # a list's chunks start at multiples of this in the buffers (numpy's alignment)
META = fingerprint("all_to_all_single", "meta", np.dtype(np.int64))  # the words' step
METAS = {"all_to_all_single": META, "all_to_all": fingerprint("all_to_all", "meta", np.dtype(np.int64))}


def shared(call: Call) -> bool:
    """Whether this group's all-to-alls go through its segment (the same on every rank)."""
    return on_node(call, 0, "all_to_all") is not None


def limit() -> int:
    """The bytes (``n`` blocks of the largest) from which an all-to-all on a segment's group
    takes MPI's copies instead (`fcoll.backends.shm.ceiling`; -1: none); equal on every rank."""
    top = shm.ceiling("all_to_all")
    return -1 if top == shm.NEVER else int(top)


def even(call: Call, x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """Equal blocks of the C-contiguous ``x`` (checked), into ``out`` or a new array."""
    if shared(call) and not 0 <= limit() <= x.nbytes:
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


def uneven(call: Call, x: np.ndarray, ins: list[int], outs: list[int] | None,
           kind: str = "all_to_all_single") -> np.ndarray:
    """Rows of the C-contiguous ``x`` in blocks of ``ins`` rows, block ``j`` to rank ``j``;
    ``outs``: what this rank expects from each (None: whatever they send). Ranks that
    disagree raise `ValueError` together. ``kind``: the call the fingerprints name."""
    if not shared(call):
        return _uneven_mpi(call, x, ins, outs)
    seg = shm._segment(call)
    if seg.core is None:
        return _uneven_words(call, x, ins, outs, kind)
    width, meta = 2 * seg.n + 1, METAS[kind]
    shm.ready(call, seg, 8 * width, meta, width)
    got = seg.native(call, seg.core.alltoallv_rows, x, ins, outs, _code(x.shape[1:], x.dtype),
                     meta, _fp(kind, x.dtype), limit())
    return rows_result(call, x, ins, outs, got, kind)


def rows_result(call: Call, x: np.ndarray, ins: list[int], outs: list[int] | None, got: Any,
                kind: str = "all_to_all_single") -> np.ndarray:
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
    verdict, most, received = got
    row = x.itemsize * math.prod(x.shape[1:])
    if verdict == "mpi":
        out = np.empty((sum(received), *x.shape[1:]), x.dtype)
        return backend.alltoallv(call, x, [s * row for s in ins], out, [s * row for s in received])
    out = np.empty((sum(received), *x.shape[1:]), x.dtype)
    return shm_alltoall.alltoallv(call, x, np.asarray(ins, np.int64) * row, out,
                                  np.asarray(received, np.int64) * row, most, _fp(kind, x.dtype))


def _disagree(fn: str, p: int, q: int, expected: int, sent: int) -> ValueError:
    return ValueError(f"{fn}: ranks disagree: rank {p} expects output_split_sizes[{q}] = "
                      f"{expected} rows but rank {q} sends {sent} (its input_split_sizes[{p}])")


def _uneven_words(call: Call, x: np.ndarray, ins: list[int], outs: list[int] | None,
                  kind: str) -> np.ndarray:
    """`uneven` on the numpy path: the words' step (`shm_alltoall.agree`), their check here,
    the data steps (`shm_alltoall.alltoallv`): what the core's ``alltoallv_rows`` does."""
    n = call.group.size
    words = np.empty(2 * n + 1, np.int64)
    words[:n] = ins
    words[n : 2 * n] = outs if outs is not None else -1
    words[-1] = _code(x.shape[1:], x.dtype)
    meta = shm_alltoall.agree(call, words, METAS[kind])
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
    if 0 <= limit() <= int(sent.max()) * row * n:
        return backend.alltoallv(call, x, [s * row for s in ins], out,
                                 [int(s) * row for s in received])
    return shm_alltoall.alltoallv(call, x, words[:n] * row, out, received * row,
                                  int(sent.max()) * row, _fp(kind, x.dtype))


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
    """`fcoll.all_to_all` of checked ``arrays`` (one per rank, one dtype): through the segment
    each chunk travels as one block of bytes led by its header (`_packed`), as an uneven
    all-to-all of bytes; dtypes that differ between ranks (every rank sees every rank's in
    the blocks it receives) send every rank to the pickled exchange, which names them."""
    if not shared(call):
        return _lists_mpi(call, arrays)
    send, sizes = _packed(arrays)
    return unpacked(call, uneven(call, send, sizes, None, "all_to_all"), arrays)


def unpacked(call: Call, buf: np.ndarray, arrays: list[np.ndarray]) -> list[np.ndarray]:
    """The chunks the blocks of ``buf`` hold; where their dtypes differ (every rank sees it)
    the pickled exchange of ``arrays`` instead, which names them."""
    chunks, codes = _unpacked(buf, arrays[0].dtype)
    if len(set(codes)) > 1:
        return _lists_mpi(call, arrays)
    return chunks


def _packed(arrays: list[np.ndarray]) -> tuple[np.ndarray, list[int]]:
    """Every chunk as header words ``[dtype word, nbytes, ndim, *shape]`` (an even count) then
    its bytes padded to `ALIGN`, in one buffer; the blocks' sizes. The compiled core's
    ``pack_chunks`` where it runs (C-contiguous chunks), the same bytes in numpy otherwise."""
    code = _code(arrays[0].dtype)
    if native.running() and type(arrays) is list and \
            (packed := _core().pack_chunks(arrays, code)) is not None:
        return packed  # type: ignore[no-any-return]
    parts, sizes = [], []
    for a in arrays:
        head = np.array([code, a.nbytes, a.ndim, *a.shape, *_PAD[a.ndim % 2]], np.int64)
        pad = -a.nbytes % ALIGN
        parts += [head.view(np.uint8), as_bytes(a), _ZEROS[:pad]]
        sizes.append(head.nbytes + a.nbytes + pad)
    return np.concatenate(parts), sizes


_PAD = ((0,), ())  # a word after an odd count of header words
_ZEROS = np.zeros(ALIGN, np.uint8)
_CORE: list[Any] = []  # native.module() reads FCOLL_NATIVE at each call: looked up once here


def _core() -> Any:
    """The compiled core's module (looked up once)."""
    if not _CORE:
        _CORE.append(native.module())
    return _CORE[0]


def _unpacked(buf: np.ndarray, dtype: np.dtype[Any]) -> tuple[list[np.ndarray], list[int]]:
    """The chunks in ``buf`` (`_packed` blocks, one per rank) as ``dtype`` arrays (views), and
    each block's dtype word (the compiled core's ``unpack_chunks`` where it runs)."""
    if native.running():
        return _core().unpack_chunks(buf, dtype)  # type: ignore[no-any-return]
    chunks, codes, at, words = [], [], 0, buf[: buf.size // 8 * 8].view(np.int64)
    while at < buf.size:
        code, nbytes, ndim = words[at // 8 : at // 8 + 3].tolist()
        shape = tuple(words[at // 8 + 3 : at // 8 + 3 + ndim].tolist())
        at += 8 * (ndim + 3 + (ndim + 1) % 2)
        codes.append(code)
        data = buf[at : at + nbytes]
        chunks.append(data.view(dtype).reshape(shape) if nbytes % dtype.itemsize == 0 and
                      math.prod(shape) * dtype.itemsize == nbytes else data)
        at += nbytes + -nbytes % ALIGN
    return chunks, codes


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
