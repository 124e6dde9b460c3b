"""The fast paths of the all-to-alls (`fcoll.collectives._fast`'s tables ``ALL_TO_ALL``,
``ALL_TO_ALL_V``, ``ALL_TO_ALL_LISTS``): an even ``all_to_all_single`` through MPI or the
group's on-node segment, one with split sizes and a list ``all_to_all`` through the segment
stepped by the compiled core (`fcoll.backends.shm_alltoall`). Learned and dropped as the other
fast paths are (`fcoll.collectives._fast.learn`, ``reset``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from fcoll.calls.fingerprint import of as fingerprint
from fcoll.collectives import _fast
from fcoll.collectives import _fast_native as _native
from fcoll.collectives._fast import INF, Fast
from fcoll.diagnostics import flight


def counted(g: Any, recorder: flight.Recorder, name: str, shape: tuple[int, ...], dtype: Any,
            start: float) -> None:
    """Count a call the compiled core has just served on ``g`` and record it in the flight
    recorder (begun at ``start``, ended now) when one is on.

    Example:
        >>> counted(g, flight.recorder(g.key), "all_to_all", (4,), np.dtype("f4"), t0)
    """
    g.seq += 1
    calls, ends, pos, mask, ranks, clock = recorder
    if calls is not None:
        i = pos[0] & mask
        pos[0] += 1
        calls[i] = (ranks, g.seq, name, "numpy", shape, dtype, start)
        ends[i] = clock()


def all_to_all(g: Any, byte: Any, dtype: np.dtype[Any] | None = None, key: Any = None,
               native: bool = True) -> Fast:
    """MPI's all_to_all; with ``dtype`` (the group's all-to-alls go through its segment)
    through the segment instead: the compiled core (``native``; its own callable once the
    segment steps, `fcoll.collectives._fast_native.swapper`) or one numpy step
    (`fcoll.backends.shm_alltoall.alltoall_step`), the full path where the segment cannot hold
    ``x`` in one step yet."""
    comm, empty, n = g._comm, np.empty, g.size
    calls, ends, pos, mask, ranks, clock = recorder = flight.recorder(g.key)
    core, top, steps, fp, one = None, INF, None, 0, 0
    if dtype is not None:
        from fcoll.backends import shm_alltoall
        from fcoll.collectives._alltoall import limit

        fp, top = fingerprint("all_to_all_single", "", dtype), limit()
        top = INF if top < 0 else top
        if native:
            swap = _native.swapper(_fast.ALL_TO_ALL, key, g, "alltoall", "all_to_all_single", fp,
                                   limit=top) if key is not None else None
            core = _native.call(g, "all_to_all_single", "alltoall", fp, -1.0, swap=swap)
        else:
            steps, one = shm_alltoall.alltoall_step, shm_alltoall.piece(n, 1 << 62)

    def run(x: np.ndarray) -> np.ndarray | None:
        shape = x.shape
        if not shape or shape[0] % n or not x.flags.c_contiguous:
            return None
        if core is not None and x.nbytes < top:
            return core(x)  # type: ignore[no-any-return]
        if steps is not None:  # the numpy steps: one step, else the full path
            return _fast.segment_call(g, recorder, "all_to_all_single", steps, x, fp) \
                if x.nbytes // n <= one else None
        g.seq += 1
        out = empty(shape, x.dtype)
        if calls is None:
            comm.Alltoall([x, byte], [out, byte])
        else:
            i = pos[0]
            pos[0] = i + 1
            i &= mask
            calls[i] = (ranks, g.seq, "all_to_all_single", "numpy", x.shape, x.dtype, clock())
            comm.Alltoall([x, byte], [out, byte])
            ends[i] = clock()
        return out

    return run


def all_to_all_v(g: Any, dtype: np.dtype[Any]) -> Callable[[np.ndarray, Any, Any], np.ndarray | None]:
    """all_to_all_single with split sizes through the group's segment stepped by the compiled
    core: one C call (``Core.alltoallv_rows``) checks the sizes, agrees on them with every rank
    in one step and moves the rows; None (nothing sent) where it does not take the call (the
    sizes are not ``n`` ints >= 0 summing to ``x.shape[0]``, the segment is too small), and the
    full path raises or grows. ``dtype``: the arrays' dtype, for the fingerprint."""
    from fcoll.collectives import _alltoall

    recorder = flight.recorder(g.key)
    calls, clock = recorder[0], recorder[5]
    name, fp, meta, code = "all_to_all_single", fingerprint("all_to_all_single", "", dtype), \
        _alltoall.META, _alltoall._code
    top, ndarray = _alltoall.limit(), np.ndarray
    from fcoll.backends.native import module

    mismatch = module().Mismatch

    def run(x: np.ndarray, outs: Any, ins: Any) -> np.ndarray | None:
        seg = g.shm
        if not seg or (core := seg.core) is None or not x.flags.c_contiguous:
            return None
        call = g.call
        call.fn, call.counted, call.slot = name, True, -1  # counted here, recorded here
        start = clock() if calls is not None else 0.0
        try:
            got = core.alltoallv_rows(x, ins, outs, code(x.shape[1:], dtype), meta, fp, top, -1.0)
        except mismatch as error:
            raise _native.told(g, name, error.args[0]) from None
        if got is None:
            return None
        counted(g, recorder, name, x.shape, x.dtype, start)
        return got if type(got) is ndarray else _alltoall.rows_result(call, x, ins, outs, got)

    return run


def all_to_all_lists(g: Any, dtype: np.dtype[Any]) -> Callable[[Any], list[np.ndarray] | None]:
    """all_to_all of a list of ``n`` numpy arrays of ``dtype`` through the group's segment
    stepped by the compiled core: the chunks packed with their headers
    (`fcoll.collectives._alltoall`), one ``Core.alltoallv_rows`` call, the chunks cut out of
    the result; None (nothing sent) where the list is not that or the core does not take it."""
    from fcoll.backends.native import module
    from fcoll.collectives import _alltoall

    recorder = flight.recorder(g.key)
    calls, clock = recorder[0], recorder[5]
    name, n, kind = "all_to_all", g.size, "all_to_all"
    fp, meta, word = _alltoall._fp(kind, np.dtype(np.uint8)), _alltoall.METAS[kind], \
        _alltoall._code((), np.dtype(np.uint8))
    core_module = module()
    mismatch, pack, unpack, code = core_module.Mismatch, core_module.pack_chunks, \
        core_module.unpack_chunks, _alltoall._code(dtype)
    ndarray = np.ndarray
    top = _alltoall.limit()

    def run(chunks: Any) -> list[np.ndarray] | None:
        seg = g.shm
        if not seg or (core := seg.core) is None or type(chunks) is not list or len(chunks) != n:
            return None
        for c in chunks:
            if type(c) is not ndarray or ((d := c.dtype) is not dtype and d != dtype):
                return None
        call = g.call
        call.fn, call.counted, call.slot = name, True, -1  # counted here, recorded here
        start = clock() if calls is not None else 0.0
        send, sizes = pack(chunks, code) or _alltoall._packed(chunks)  # None: numpy packs
        try:
            got = core.alltoallv_rows(send, sizes, None, word, meta, fp, top, -1.0)
        except mismatch as error:
            raise _native.told(g, name, error.args[0]) from None
        if got is None:
            return None
        counted(g, recorder, name, (n,), dtype, start)
        if type(got) is not ndarray:
            got = _alltoall.rows_result(call, send, sizes, None, got, kind)
        out, codes = unpack(got, dtype)
        # dtypes that differ between ranks (every rank sees them): the pickled exchange names them
        return out if codes.count(codes[0]) == n else _alltoall._lists_mpi(call, chunks)

    return run
