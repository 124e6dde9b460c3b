"""List forms: all_gather, gather, scatter, all_to_all (shapes may differ per rank).

Shapes and dtypes travel first (a small pickled exchange that every rank checks the same
way, so a dtype disagreement raises `ValueError` everywhere), then the data as raw bytes.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Sequence
from typing import Any, overload

import numpy as np

from fcoll.backends import mpi as backend
from fcoll.backends import native
from fcoll.collectives import _alltoall, _fast, _fast_alltoall
from fcoll.collectives._common import c_order, nbytes_of, split_bytes
from fcoll.dispatch import INTEROP, device, device_list, gpu_backend, interop
from fcoll.gpu import route
from fcoll.groups import detail
from fcoll.groups.group import GroupArg
from fcoll.groups.membership import member
from fcoll.policy.arrays import A
from fcoll.policy.dtypes import as_bytes, dtype_from_name
from fcoll.policy.validate import check_array, check_arrays, check_rank, one_dtype


def _meta(x: np.ndarray) -> tuple[tuple[int, ...], str]:
    return x.shape, str(x.dtype)


def all_gather(x: A, group: GroupArg = None) -> list[A]:
    """A list of every rank's ``x`` (entry ``i`` from group rank ``i``); shapes may differ.

    Example:
        >>> ys = fc.all_gather(np.arange(r + 1))     # rank r of 2 ranks
        >>> ys                                       # on every rank
        [array([0]), array([0, 1])]
    """
    fn = "all_gather"
    if type(x) is not np.ndarray and (on := device(x, group)) is not None:
        return route.run(on, fn, all_gather, x, group=group)
    g, call = member(group, fn)
    with detail.checked(g, call, fn, x=x):
        array = check_array(x, fn)
    meta = backend.allgather_obj(call, _meta(array))
    dtype = one_dtype([d for _, d in meta], fn)
    shapes = [s for s, _ in meta]
    counts = [nbytes_of(s, dtype) for s in shapes]
    buf = backend.allgatherv(call, c_order(array), np.empty(sum(counts), np.uint8), counts)
    return split_bytes(buf, dtype, shapes)  # type: ignore[return-value]  # numpy in, numpy out


def gather(x: A, dst: int = 0, group: GroupArg = None) -> list[A] | None:
    """The list of every rank's ``x`` on group rank ``dst``; ``None`` elsewhere.

    Example:
        >>> ys = fc.gather(np.array([r]), dst=0)     # rank r of 2 ranks
        >>> ys                                       # rank 0; None on rank 1
        [array([0]), array([1])]
    """
    fn = "gather"
    if type(x) is not np.ndarray and (on := device(x, group)) is not None:
        return route.run(on, fn, gather, x, dst, group=group)
    g, call = member(group, fn)
    with detail.checked(g, call, fn, x=x, dst=dst):
        root = check_rank(dst, g.size, fn, "dst")
        array = check_array(x, fn)
    meta = backend.allgather_obj(call, _meta(array))
    dtype = one_dtype([d for _, d in meta], fn)
    shapes = [s for s, _ in meta]
    counts = [nbytes_of(s, dtype) for s in shapes]
    out = np.empty(sum(counts), np.uint8) if g.rank == root else None
    buf = backend.gatherv(call, c_order(array), out, counts, root)
    return None if buf is None else split_bytes(buf, dtype, shapes)  # type: ignore[return-value]


@overload
def scatter(chunks: Sequence[A], src: int = ..., group: GroupArg = ...) -> A: ...
@overload
def scatter(chunks: None, src: int = ..., group: GroupArg = ...) -> Any: ...


def scatter(  # type: ignore[misc]  # the numpy path (fcoll.policy.arrays)
    chunks: Sequence[np.ndarray] | None, src: int = 0, group: GroupArg = None
) -> np.ndarray:
    """Rank ``r`` gets ``chunks[r]`` of group rank ``src``; other ranks pass ``None``.

    A root's torch tensors (JAX arrays) arrive as tensors (arrays) on ranks that have
    imported torch (JAX), as numpy arrays elsewhere; cupy arrays as `fcoll.recv` says.

    Example:
        >>> chunks = [np.array([10]), np.array([11])] if r == 0 else None
        >>> fc.scatter(chunks, src=0)                # on rank 1
        array([11])
    """
    return _scatter(chunks, src, group)


def _scatter(chunks: Sequence[np.ndarray] | None, src: int, group: GroupArg,
             sent_as: str = "") -> np.ndarray:
    """`scatter`; ``sent_as`` (``"torch:"``, ``"jax:"``) prefixes the dtype names the root
    sends: its chunks were of that array type."""
    fn = "scatter"
    if (on := device_list(chunks, group, fn, "chunks")) is not None:
        if on is INTEROP:
            as_kind = _SCATTER_AS[str(interop.kind(next(c for c in chunks or [] if interop.kind(c))))]
            return interop.run(as_kind, fn, chunks, src, group)  # type: ignore[no-any-return]
        return route.scatter(on, chunks, src, group, sent_as)  # type: ignore[no-any-return]
    g, call = member(group, fn)
    with detail.checked(g, call, fn, src=src):
        root = check_rank(src, g.size, fn, "src")
        if g.rank != root and chunks is not None:
            raise ValueError(f"{fn}: expected chunks=None on ranks other than src={root}, "
                             f"got {type(chunks).__name__} on rank {g.rank}")
        arrays = check_arrays(chunks, g.size, fn, "chunks") if g.rank == root else []
    if g.rank != root:
        shape, name = backend.scatter_obj(call, None, root)
        kind, name = _sent_as(name)
        if name.startswith(route.TAG):  # the root scatters cupy arrays: receive on the GPU
            y = route.scatter_receive(gpu_backend(g), g, shape, name, root)
        else:
            y = backend.scatterv(call, None, [], np.empty(shape, dtype_from_name(name)), root)
        return interop.as_kind(y, kind) if kind in sys.modules else y  # type: ignore[no-any-return]
    backend.scatter_obj(call, [(a.shape, sent_as + str(a.dtype)) for a in arrays], root)
    counts = [a.nbytes for a in arrays]
    send = np.concatenate([as_bytes(a) for a in arrays])
    return backend.scatterv(call, send, counts, np.empty_like(arrays[root], order="C"), root)


_SCATTER_AS = {k: functools.partial(_scatter, sent_as=f"{k}:") for k in interop.KINDS}


def _sent_as(name: str) -> tuple[str, str]:
    """The array type a scatter's root sent (``""``: numpy or cupy) and the rest of ``name``."""
    head, colon, rest = name.partition(":")
    return (head, rest) if colon and head in interop.KINDS else ("", name)


def all_to_all(chunks: Sequence[A], group: GroupArg = None) -> list[A]:
    """``chunks[i]`` goes to rank ``i``; entry ``i`` of the result is rank ``i``'s
    ``chunks[r]``. Shapes may differ.

    Example:
        >>> out = fc.all_to_all([np.array([r, 0]), np.array([r, 1])])   # rank r of 2
        >>> out                                                         # on rank 1
        [array([0, 1]), array([1, 1])]
    """
    if type(chunks) is list and chunks and type(first := chunks[0]) is np.ndarray and (
            fast := _fast.ALL_TO_ALL_LISTS.get(_fast.key(group, first.dtype))) is not None and (
            y := fast(chunks)) is not None:
        return y  # type: ignore[return-value]  # numpy in, numpy out
    fn = "all_to_all"
    if (on := device_list(chunks, group, fn, "chunks")) is not None:
        return route.run(on, fn, all_to_all, chunks, group=group)
    g, call = member(group, fn)
    with detail.checked(g, call, fn, chunks=chunks):
        arrays = check_arrays(chunks, g.size, fn, "chunks")
    if native.running() and _alltoall.shared(call):
        _fast.learn(_fast.ALL_TO_ALL_LISTS, _fast.key(group, arrays[0].dtype), g,
                    _fast_alltoall.all_to_all_lists, arrays[0].dtype)
    return _alltoall.lists(call, arrays)  # type: ignore[return-value]  # numpy in, numpy out
