"""Neighbours: `sendrecv` (MPI's ``Sendrecv``) and `halo_exchange` over a `fcoll.Mesh`.

`sendrecv` uses `fcoll.collectives.p2p`'s messages (a header with the shape and dtype, the data inside
it up to ``INLINE_LIMIT`` bytes, else in a second message), so it pairs with `fcoll.send`,
`fcoll.isend` and `fcoll.recv` on the same tag: its sends start at once, its receive probes
for the header and takes a message of any size.

`halo_exchange` moves, along each mesh axis in turn, this rank's edge cells into its
neighbours' ghost cells: the rows of a C-ordered block straight from the result array, other
slices as MPI subarray datatypes of it (`_halo`), so nothing is packed by fcoll and the
caller copies nothing. Dims go one after another, each from the array the previous ones
filled, so corners arrive too. Its ranks must form a grid: along an axis, neighbours'
faces have the same shape (checked: a face of another size raises `ValueError`).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, overload

import numpy as np

from fcoll import runtime
from fcoll.calls.work import Call, wait_requests
from fcoll.collectives import _halo
from fcoll.collectives._common import c_order
from fcoll.collectives.p2p import BYTE, INLINE_LIMIT, MPI, _probe_message, _tag
from fcoll.dispatch import device
from fcoll.gpu import route
from fcoll.groups import detail
from fcoll.groups.group import Group, GroupArg
from fcoll.groups.halo_axes import axes, check_faces
from fcoll.groups.membership import member
from fcoll.groups.mesh import Mesh
from fcoll.policy.arrays import A, ArrayProtocol
from fcoll.policy.header import INLINE, SEPARATE, header, inline, parse
from fcoll.policy.validate import check_array, check_rank


def _peer(peer: object, size: int, fn: str, name: str) -> int:
    """A group rank, or ``MPI.PROC_NULL`` for None."""
    if type(peer) is int and 0 <= peer < size:  # the common case, checked in one line
        return peer
    return MPI.PROC_NULL if peer is None else check_rank(peer, size, fn, name)


@overload
def sendrecv(x: A, dst: int | None, src: int, group: GroupArg = ..., *, tag: int = ...) -> A: ...
@overload
def sendrecv(x: ArrayProtocol | None, dst: int | None, src: None, group: GroupArg = ..., *,
             tag: int = ...) -> None: ...
@overload
def sendrecv(x: A, dst: int | None, src: int | None, group: GroupArg = ..., *,
             tag: int = ...) -> A | None: ...
@overload
def sendrecv(x: None, dst: int | None, src: int | None, group: GroupArg = ..., *,
             tag: int = ...) -> Any: ...


def sendrecv(  # type: ignore[misc]  # the numpy path (fcoll.policy.arrays)
    x: np.ndarray | None, dst: int | None, src: int | None, group: GroupArg = None, *, tag: int = 0
) -> Any:
    """Send ``x`` to group rank ``dst`` and return the array received from group rank ``src``
    (its shape and dtype travel with it), as ``MPI_Sendrecv``; ``x`` is not modified.

    ``dst=None`` sends nothing and ``src=None`` receives nothing and returns ``None``
    (``MPI.PROC_NULL``); either may be this rank. The messages are `fcoll.send`'s, so a
    `sendrecv` pairs with `send`/`recv` on the same ``tag``. Pass ``x`` (an array of the
    call's type) even with ``dst=None``: cupy arrays go over NCCL when it serves the group.

    Example:
        >>> r, n = fc.get_rank(), fc.get_world_size()         # a ring of 4 ranks
        >>> fc.sendrecv(np.array([r]), dst=(r + 1) % n, src=(r - 1) % n)
        array([3])                                            # on rank 0
    """
    fn = "sendrecv"
    if x is not None and type(x) is not np.ndarray and (on := device(x, group)) is not None:
        return route.run(on, fn, sendrecv, x, dst, src, group=group, tag=tag)
    g, call = member(group, fn)
    to, source = _peer(dst, g.size, fn, "dst"), _peer(src, g.size, fn, "src")
    tag = tag if type(tag) is int and 0 <= tag < 1024 else _tag(tag, fn)
    if dst is not None or x is not None:
        x = check_array(x, fn)
    if detail.log.isEnabledFor(logging.INFO):  # logged; not collective: nothing to compare
        detail.log.info("rank %s: sendrecv dst=%s src=%s x=%s", g.rank, dst, src, detail.describe(x))
    return _sendrecv(call, x if dst is not None else None, to, source, 2 * tag)


def _sendrecv(call: Call, x: np.ndarray | None, to: int, source: int, tag: int) -> Any:
    """Header (and inline data) on ``tag``, separate data on ``tag + 1`` (`fcoll.collectives.p2p`): the
    sends start, then the receive probes for the header (any size: `fcoll.isend` sends
    large arrays inline too), as `fcoll.recv` does. Not counted in the group's call
    numbers, as `fcoll.send` and `fcoll.recv` are not: only some ranks make it."""
    comm, sends = call.comm, []
    if x is not None:
        if x.nbytes <= INLINE_LIMIT:
            sends.append(comm.Isend([header(x, INLINE) + x.tobytes(), BYTE], to, tag))
        else:
            sends.append(comm.Isend([header(x, SEPARATE), BYTE], to, tag))
            sends.append(comm.Isend([c_order(x), BYTE], to, tag + 1))
    out = None
    if source != MPI.PROC_NULL:
        status = MPI.Status()
        message = _probe_message(call, source, tag, status)
        buf = np.empty(status.Get_count(BYTE), np.uint8)
        message.Recv([buf, BYTE])
        kind, dtype, shape, offset = parse(buf)
        if kind & SEPARATE:
            out = np.empty(shape, dtype)
            _probe_message(call, source, tag + 1, status).Recv([out, BYTE])
        else:
            out = inline(buf, dtype, shape, offset)
    if sends:
        wait_requests(sends, call)
    return out


def halo_exchange(x: A, mesh: Mesh, width: int | Sequence[int], *,
                  dims: Sequence[int] | None = None, periodic: bool | Sequence[bool] = False) -> A:
    """Fill the ghost cells of this rank's block ``x`` of a grid split over ``mesh`` with the
    neighbours' edge cells; returns a new array, ``x`` is not modified.

    Mesh axis k splits array dim ``dims[k]`` (default: dim k); along it ``x`` holds ``width``
    ghost cells on each side. The low ghosts get the lower neighbour's last ``width`` cells
    inside its ghosts, the high ghosts the upper neighbour's first ones; at an edge with
    ``periodic=False`` they keep ``x``'s values. Dims are exchanged one after another, so
    corners are filled. ``width`` and ``periodic`` may be one per mesh axis. Every rank of
    the mesh calls it; each split dim needs ``x.shape[d] >= 3 * width``.

    Example:
        >>> mesh = fc.Mesh((4,), ("x",))                    # 4 ranks, 1-D grid
        >>> x = np.array([0, r, r, 0.0])                     # 1 ghost on each side
        >>> fc.halo_exchange(x, mesh, 1)                     # on rank 1
        array([0., 1., 1., 2.])
        >>> fc.halo_exchange(x, mesh, 1, periodic=True)      # on rank 0
        array([3., 0., 0., 1.])
    """
    fn = "halo_exchange"
    if type(x) is not np.ndarray and (on := device(x)) is not None:
        return route.run(  # type: ignore[no-any-return]  # the caller's array type
            on, fn, halo_exchange, x, mesh, width, dims=dims, periodic=periodic)
    key = _key(x, mesh, width, dims, periodic) if type(x) is np.ndarray else None
    steps = None if key is None or runtime._state.checking else _STEPS.get(key)
    if steps is None:
        steps = _steps(x, mesh, width, dims, periodic)
        if key is not None:
            if len(_STEPS) >= KEPT:
                _STEPS.clear()
            _STEPS[key] = steps
    y = np.array(x, order="C", copy=True)
    for group, d, w, src, dst in steps:
        _halo.exchange(member(group, fn)[1], y, d, w, src, dst)
    return y  # type: ignore[return-value]  # numpy in, numpy out


Step = tuple[Group, int, int, "int | None", "int | None"]  # axis group, dim, width, src, dst
KEPT = 64
_STEPS: dict[tuple[Any, ...], list[Step]] = {}  # a call's steps, by its arguments
runtime.on_change(_STEPS.clear)


def _key(x: ArrayProtocol, mesh: Mesh, width: object, dims: object, periodic: object
         ) -> tuple[Any, ...] | None:
    """What a call's steps depend on, or None where an argument is not a plain value."""
    parts = [width, dims, periodic]
    for i, value in enumerate(parts):
        if isinstance(value, list):
            parts[i] = tuple(value)
    key = (mesh, x.shape, x.dtype, *(type(v) for v in parts), *parts)
    try:
        hash(key)
    except TypeError:
        return None
    return key if isinstance(mesh, Mesh) else None


def _steps(x: ArrayProtocol, mesh: Mesh, width: object, dims: object, periodic: object) -> list[Step]:
    """The checked call's exchanges, one per mesh axis that has a neighbour and a width."""
    fn = "halo_exchange"
    g, call = member(mesh.parent if isinstance(mesh, Mesh) else None, fn)
    with detail.checked(g, call, fn, dtype=str(getattr(x, "dtype", None)),
                        ndim=getattr(x, "ndim", None), width=width, dims=dims, periodic=periodic):
        split = axes(x, mesh, width, dims, periodic)
    check_faces(call, x, mesh, split)
    steps: list[Step] = []
    for name, d, w, wrap in split:
        src, dst = mesh.shift(name, 1, periodic=wrap)
        if w and (src is not None or dst is not None):
            steps.append((mesh.group(name), d, w, src, dst))
    return steps
