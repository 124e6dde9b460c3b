"""The arguments of a halo exchange, checked (`fcoll.halo_exchange` on numpy arrays and its
cupy form in `fcoll.gpu.neighbors`): which array dim each mesh axis splits, its width and
whether it wraps around; `TypeError`/`ValueError` naming the argument before anything is sent.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from fcoll import runtime
from fcoll.backends import mpi as host
from fcoll.calls.errors import CollectiveMismatchError
from fcoll.calls.work import Call
from fcoll.dispatch import is_cupy
from fcoll.groups.mesh import Mesh
from fcoll.policy.dtypes import check_dtype
from fcoll.policy.validate import check_array


def _per_axis(value: object, n: int, fn: str, name: str) -> list[Any]:
    """``value`` once per mesh axis, or the sequence of ``n`` values given."""
    values = list(value) if isinstance(value, Sequence) and not isinstance(value, str) else [value] * n
    if len(values) != n:
        raise ValueError(f"{fn}: expected {name} to be one value or {n} (one per mesh axis), "
                         f"got {len(values)}")
    return values


def _widths(width: object, n: int, fn: str) -> list[int]:
    widths = _per_axis(width, n, fn, "width")
    for w in widths:
        if not isinstance(w, (int, np.integer)) or isinstance(w, (bool, np.bool_)):
            raise TypeError(f"{fn}: expected width to be an int or one per mesh axis, got {w!r}")
        if w < 0:
            raise ValueError(f"{fn}: expected width >= 0, got {w}")
    return [int(w) for w in widths]


def _flags(periodic: object, n: int, fn: str) -> list[bool]:
    flags = _per_axis(periodic, n, fn, "periodic")
    for p in flags:
        if not isinstance(p, (bool, np.bool_)):
            raise TypeError(f"{fn}: expected periodic to be a bool or one per mesh axis, got {p!r}")
    return [bool(p) for p in flags]


def _dims(x: np.ndarray, mesh: Mesh, dims: object, fn: str) -> list[int]:
    """The array dim each mesh axis splits: distinct, in range, one per axis."""
    if x.ndim < mesh.ndim:
        raise ValueError(f"{fn}: expected x with at least {mesh.ndim} dims (one per mesh axis), "
                         f"got shape {x.shape}")
    if dims is None:
        return list(range(mesh.ndim))
    if isinstance(dims, str) or not isinstance(dims, Sequence) or not all(
            isinstance(d, (int, np.integer)) and not isinstance(d, bool) for d in dims):
        raise TypeError(f"{fn}: expected dims to be a sequence of ints, got {dims!r}")
    if len(dims) != mesh.ndim or len({int(d) % x.ndim for d in dims}) != len(dims) or not all(
            -x.ndim <= d < x.ndim for d in dims):
        raise ValueError(f"{fn}: expected dims to name {mesh.ndim} distinct dims of x (one per "
                         f"mesh axis, in [{-x.ndim}, {x.ndim})), got {list(dims)}")
    return [int(d) % x.ndim for d in dims]


def axes(x: Any, mesh: object, width: object, dims: object, periodic: object,
         fn: str = "halo_exchange") -> list[tuple[str, int, int, bool]]:
    """``(axis name, dim, width, periodic)`` per axis of ``mesh``, after every check of a
    halo exchange's arguments (``x``: a numpy array, or a cupy one: its dtype is checked).

    Example:
        >>> axes(np.zeros((6, 8)), fc.Mesh((2, 2), ("y", "x")), [1, 2])   # mpiexec -n 4
        [('y', 0, 1, False), ('x', 1, 2, False)]
    """
    if not isinstance(mesh, Mesh):
        raise TypeError(f"{fn}: expected mesh to be a fcoll.Mesh, got {type(mesh).__name__}")
    if is_cupy(x):
        check_dtype(x.dtype, fn)
    else:
        check_array(x, fn)
    chosen = _dims(x, mesh, dims, fn)
    widths = _widths(width, mesh.ndim, fn)
    wraps = _flags(periodic, mesh.ndim, fn)
    for d, w in zip(chosen, widths, strict=True):
        if x.shape[d] < 3 * w:
            raise ValueError(f"{fn}: expected x.shape[{d}] >= 3 * width = {3 * w} (ghost cells "
                             f"on both sides and as many cells inside), got shape {x.shape}")
    return list(zip(mesh.names, chosen, widths, wraps, strict=True))


def check_faces(call: Call, x: Any, mesh: Mesh, split: list[tuple[str, int, int, bool]]) -> None:
    """Under ``debug="detail"``: every rank's faces against its neighbours' along each axis
    (the blocks must form a grid), from one all-gather over the mesh, so every rank finds
    the same problem and raises `fcoll.CollectiveMismatchError` alike, before any data moves."""
    if runtime._state.debug != "detail":
        return
    mine = [(tuple(s for i, s in enumerate(x.shape) if i != d), str(x.dtype)) for _, d, _, _ in split]
    faces = host.allgather_obj(call, mine)
    for p, q, k in _neighbours(mesh.shape, [wrap for *_, wrap in split]):
        if faces[p][k] != faces[q][k]:
            name, d = split[k][0], split[k][1]
            raise CollectiveMismatchError(
                f"halo_exchange: expected blocks that form a grid (neighbours along a mesh axis "
                f"hold faces of one shape and dtype), got along axis {name!r} (dim {d}) faces "
                f"{faces[p][k]} on mesh rank {p} and {faces[q][k]} on its neighbour, mesh rank "
                f"{q} (debug='detail'); nothing was sent")


def _neighbours(shape: tuple[int, ...], wraps: list[bool]) -> Iterator[tuple[int, int, int]]:
    """``(rank, its upper neighbour, axis)`` for every pair of neighbours on a mesh of ``shape``."""
    for p in range(math.prod(shape)):
        coord = np.unravel_index(p, shape)
        for k, size in enumerate(shape):
            up = list(coord)
            up[k] = (up[k] + 1) % size if wraps[k] else up[k] + 1
            if up[k] < size and int(np.ravel_multi_index(up, shape)) != p:
                yield p, int(np.ravel_multi_index(up, shape)), k
