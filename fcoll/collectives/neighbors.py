"""Neighbours: `sendrecv` (MPI's ``Sendrecv``) and `halo_exchange` over a `fcoll.Mesh`.

`sendrecv` uses `fcoll.collectives.p2p`'s messages (a header with the shape and dtype, the data inside
it up to ``INLINE_LIMIT`` bytes, else in a second message), so it pairs with `fcoll.send`,
`fcoll.isend` and `fcoll.recv` on the same tag: its sends start at once, its receive probes
for the header and takes a message of any size.

`halo_exchange` moves, along each mesh axis in turn, this rank's edge cells into its
neighbours' ghost cells: the rows of a C-ordered block straight from the result array, other
faces packed into buffers kept per shape (`_halo`). The result is a copy of the block, or with
``donate=True`` the block itself (its ghost cells filled in place: a stencil loop copies
nothing). Dims go one after another, each from the array the previous ones filled, so
corners arrive too. Its ranks must form a grid: along an axis, neighbours' faces have the
same shape (checked: a face of another size raises `ValueError`).

`sendrecv` with ``like=`` sends the data alone (`_bare`).
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence
from typing import Any, cast, overload

import numpy as np

from fcoll import runtime
from fcoll.calls.work import Call, wait_requests
from fcoll.collectives import _bare, _fast, _fast_p2p, _halo
from fcoll.collectives._common import c_order
from fcoll.collectives.p2p import BARE, BYTE, DATA, INLINE_LIMIT, MPI, PARTS, _probe_message, _tag
from fcoll.dispatch import device, interop
from fcoll.gpu import route
from fcoll.groups import detail
from fcoll.groups.group import Group, GroupArg
from fcoll.groups.halo_axes import axes, check_faces
from fcoll.groups.membership import member
from fcoll.groups.mesh import Mesh
from fcoll.policy.arrays import A, ArrayProtocol
from fcoll.policy.dtypes import SUPPORTED
from fcoll.policy.header import INLINE, SEPARATE, header, inline, parse
from fcoll.policy.validate import check_array, check_like, check_rank


def _peer(peer: object, size: int, fn: str, name: str) -> int:
    """A group rank, or ``MPI.PROC_NULL`` for None."""
    if type(peer) is int and 0 <= peer < size:  # the common case, checked in one line
        return peer
    return MPI.PROC_NULL if peer is None else check_rank(peer, size, fn, name)


@overload
def sendrecv(x: A, dst: int | None, src: int, group: GroupArg = ..., *, tag: int = ...,
             like: Any = ...) -> A: ...
@overload
def sendrecv(x: ArrayProtocol | None, dst: int | None, src: None, group: GroupArg = ..., *,
             tag: int = ..., like: Any = ...) -> None: ...
@overload
def sendrecv(x: A, dst: int | None, src: int | None, group: GroupArg = ..., *,
             tag: int = ..., like: Any = ...) -> A | None: ...
@overload
def sendrecv(x: None, dst: int | None, src: int | None, group: GroupArg = ..., *,
             tag: int = ..., like: Any = ...) -> Any: ...


def sendrecv(  # type: ignore[misc]  # the numpy path (fcoll.policy.arrays)
    x: np.ndarray | None, dst: int | None, src: int | None, group: GroupArg = None, *,
    tag: int = 0, like: Any = None,
) -> Any:
    """Send ``x`` to group rank ``dst`` and return the array received from group rank ``src``
    (its shape and dtype travel with it), as ``MPI_Sendrecv``; ``x`` is not modified.

    ``dst=None`` sends nothing and ``src=None`` receives nothing and returns ``None``
    (``MPI.PROC_NULL``); either may be this rank. The messages are `fcoll.send`'s, so a
    `sendrecv` pairs with `send`/`recv` on the same ``tag``. Pass ``x`` (an array of the
    call's type) even with ``dst=None``: cupy arrays go over NCCL when it serves the group.

    ``like`` (an array, or a ``(shape, dtype)`` pair): the caller says what arrives, and
    nothing but the data travels (no header, no probe: `fcoll.collectives._bare`), so such a
    `sendrecv` pairs only with one that also passes ``like`` on the same ``tag``. A message
    of another size raises `ValueError` on the receiving rank (the communicator stays
    usable). Over NCCL (cupy) the sizes cannot be checked: NCCL requires the peer's send to
    have the receive's count, and reports nothing when it does not (the receive may wait
    forever or hold part of the message), so ``like`` must match what ``src`` sends.

    Example:
        >>> r, n = fc.get_rank(), fc.get_world_size()         # a ring of 4 ranks
        >>> fc.sendrecv(np.array([r]), dst=(r + 1) % n, src=(r - 1) % n)
        array([3])                                            # on rank 0
        >>> x = np.full(3, float(r))
        >>> fc.sendrecv(x, (r + 1) % n, (r - 1) % n, like=x)  # data alone: 24 bytes
        array([3., 3., 3.])                                   # on rank 0
    """
    if type(like) is np.ndarray and type(x) is np.ndarray and (fast := _fast.SENDRECV_LIKE.get(
            "like" if group is None else _fast.key(group, "like"))) is not None \
            and (y := fast(x, dst, src, tag, like)) is not None:
        return y
    fn = "sendrecv"
    if (on := _device_of(x, like, group)) is not None:
        return route.run(on, fn, sendrecv, x, dst, src, group=group, tag=tag, like=like)
    g, call = member(group, fn)
    to, source = _peer(dst, g.size, fn, "dst"), _peer(src, g.size, fn, "src")
    tag = tag if type(tag) is int and 0 <= tag < 1024 else _tag(tag, fn)
    if dst is not None or x is not None:
        x = check_array(x, fn)
    if detail.log.isEnabledFor(logging.INFO):  # logged; not collective: nothing to compare
        detail.log.info("rank %s: sendrecv dst=%s src=%s x=%s", g.rank, dst, src, detail.describe(x))
    if like is not None:
        shape: tuple[int, ...]
        if source == MPI.PROC_NULL:
            shape, dtype = (0,), np.dtype(np.uint8)  # nothing arrives
        elif type(like) is np.ndarray and like.dtype in SUPPORTED:
            shape, dtype = like.shape, like.dtype
        else:
            shape, dtype = check_like(like, fn)
        if type(like) is np.ndarray and dst is not None and src is not None:
            _fast.learn(_fast.SENDRECV_LIKE, _fast.key(group, "like"), g, _fast_p2p.sendrecv_like)
        return _bare.exchange(call, x if dst is not None else None, to, source,
                              PARTS * tag + BARE, shape, dtype)
    return _sendrecv(call, x if dst is not None else None, to, source, PARTS * tag)


def _device_of(x: Any, like: Any, group: GroupArg) -> Any:
    """The device backend for a non-numpy ``x`` (or, without ``x``, ``like``), else None."""
    if x is not None:
        return None if type(x) is np.ndarray else device(x, group)
    if like is None or isinstance(like, tuple) or type(like) is np.ndarray:
        return None
    return device(like, group)


def _sendrecv(call: Call, x: np.ndarray | None, to: int, source: int, tag: int) -> Any:
    """Header (and inline data) on ``tag``, separate data on ``tag + DATA`` (`fcoll.collectives.p2p`): the
    sends start, then the receive probes for the header (any size: `fcoll.isend` sends
    large arrays inline too), as `fcoll.recv` does. Not counted in the group's call
    numbers, as `fcoll.send` and `fcoll.recv` are not: only some ranks make it."""
    comm, sends = call.comm, []
    if x is not None:
        if x.nbytes <= INLINE_LIMIT:
            sends.append(comm.Isend([header(x, INLINE) + x.tobytes(), BYTE], to, tag))
        else:
            sends.append(comm.Isend([header(x, SEPARATE), BYTE], to, tag))
            sends.append(comm.Isend([c_order(x), BYTE], to, tag + DATA))
    out = None
    if source != MPI.PROC_NULL:
        status = MPI.Status()
        message = _probe_message(call, source, tag, status)
        buf = np.empty(status.Get_count(BYTE), np.uint8)
        message.Recv([buf, BYTE])
        kind, dtype, shape, offset = parse(buf)
        if kind & SEPARATE:
            out = np.empty(shape, dtype)
            _probe_message(call, source, tag + DATA, status).Recv([out, BYTE])
        else:
            out = inline(buf, dtype, shape, offset)
    if sends:
        wait_requests(sends, call)
    return out


def halo_exchange(x: A, mesh: Mesh, width: int | Sequence[int], *,
                  dims: Sequence[int] | None = None, periodic: bool | Sequence[bool] = False,
                  donate: bool = False) -> A:
    """Fill the ghost cells of this rank's block ``x`` of a grid split over ``mesh`` with the
    neighbours' edge cells; returns a new array, ``x`` is not modified, unless ``donate``.

    Mesh axis k splits array dim ``dims[k]`` (default: dim k); along it ``x`` holds ``width``
    ghost cells on each side. The low ghosts get the lower neighbour's last ``width`` cells
    inside its ghosts, the high ghosts the upper neighbour's first ones; at an edge with
    ``periodic=False`` they keep ``x``'s values. Dims are exchanged one after another, so
    corners are filled. ``width`` and ``periodic`` may be one per mesh axis. Every rank of
    the mesh calls it; each split dim needs ``x.shape[d] >= 3 * width``.

    ``donate=True`` (JAX's ``donate_argnums``): the caller gives ``x`` up; its ghost cells are
    filled in place and ``x`` itself is returned, so a stencil loop copies nothing (a
    C-contiguous ``x``: rows travel as views of it, other dims' faces through buffers; another
    layout goes through a C-ordered copy written back into ``x``). A read-only ``x`` raises
    `ValueError`, as does a torch tensor that requires grad, is a lazy conjugate or negative
    view, an inference tensor outside ``inference_mode`` or an expanded one (stride 0); a
    CPU or CUDA tensor, and a cupy array, are filled in place; a JAX array cannot be
    written, so it gets a new array as without ``donate`` (JAX's donation is a hint too).

    Example:
        >>> mesh = fc.Mesh((4,), ("x",))                    # 4 ranks, 1-D grid
        >>> x = np.array([0, r, r, 0.0])                     # 1 ghost on each side
        >>> fc.halo_exchange(x, mesh, 1)                     # on rank 1
        array([0., 1., 1., 2.])
        >>> fc.halo_exchange(x, mesh, 1, periodic=True)      # on rank 0
        array([3., 0., 0., 1.])
        >>> fc.halo_exchange(x, mesh, 1, donate=True) is x   # x's ghosts filled in place
        True
    """
    fn = "halo_exchange"
    if donate is not False and donate is not True:
        raise ValueError(f"{fn}: expected donate to be a bool, got {donate!r}")
    if type(x) is not np.ndarray and (on := device(x)) is not None:
        return _routed(on, x, mesh, width, dims, periodic, donate)  # type: ignore[no-any-return]
    key = _key(x, mesh, width, dims, periodic) if type(x) is np.ndarray else None
    steps = None if key is None or runtime._state.checking else _STEPS.get(key)
    if steps is None:
        steps = _steps(x, mesh, width, dims, periodic, donate)
        if key is not None:
            if len(_STEPS) >= KEPT:
                _STEPS.clear()
            _STEPS[key] = steps
    y = _donated(x) if donate else np.array(x, order="C", copy=True)
    for group, plan in steps:
        _halo.exchange(member(group, fn)[1], y, plan)
    if donate and y is not x:
        x[...] = y  # type: ignore[index]  # another layout: back into the caller's array
        return x
    return y  # type: ignore[return-value]  # numpy in, numpy out


def _donated(x: Any) -> np.ndarray:
    """The array a donated exchange fills: ``x`` itself (C-contiguous), else a C-ordered copy
    to write back; `ValueError` for a read-only ``x``, before anything is sent."""
    _check_writable(x)
    return x if x.flags.c_contiguous else np.array(x, order="C", copy=True)


def _check_writable(x: Any) -> None:
    """`ValueError` for a donated numpy ``x`` that is read-only."""
    if not x.flags.writeable:
        raise ValueError("halo_exchange: expected x to be writable with donate=True (its ghost "
                         "cells are filled in place), got a read-only array")


def _routed(on: Any, x: Any, mesh: Mesh, width: Any, dims: Any, periodic: Any, donate: bool
            ) -> Any:
    """`halo_exchange` of a torch tensor, JAX array or cupy array (``on``: its backend). A
    donated tensor or cupy array is filled in place (through a view of its memory, or a copy
    back where the route stages it) and returned itself; a JAX array is never donated."""
    fn, k = "halo_exchange", interop.kind(x)
    if donate and k == "jax":
        donate = False  # immutable: a new array, as JAX may ignore a donation
    if donate and k == "torch":
        _check_donated_tensor(x)
    y = route.run(on, fn, halo_exchange, x, mesh, width, dims=dims, periodic=periodic,
                  donate=donate)
    if not donate or y is x:
        return y
    if k == "torch":
        if y.data_ptr() != x.data_ptr():
            x.copy_(y)
        return x
    x[...] = y
    return x


def _check_donated_tensor(x: Any) -> None:
    """`ValueError` for a torch tensor that cannot be filled in place (where torch's own
    in-place ops refuse it too), before anything is sent."""
    fn = "halo_exchange"
    if x.requires_grad:
        raise ValueError(f"{fn}: expected x not to require grad with donate=True (autograd "
                         "cannot see an in-place fill), got a tensor that requires grad")
    if x.is_conj() or x.is_neg():
        raise ValueError(f"{fn}: expected x to own its values with donate=True, got a lazy "
                         "conjugate or negative view (call resolve_conj()/resolve_neg())")
    if x.is_inference() and not sys.modules["torch"].is_inference_mode_enabled():
        raise ValueError(f"{fn}: expected x to be writable with donate=True, got an inference "
                         "tensor outside torch.inference_mode()")
    if any(step == 0 and n > 1 for step, n in zip(x.stride(), x.shape, strict=True)):
        raise ValueError(f"{fn}: expected x's elements to have memory of their own with "
                         "donate=True, got an expanded tensor (a stride of 0: call clone())")


Step = tuple[Group, _halo.Plan]  # an axis's group and its exchange
KEPT = 64
_STEPS: dict[tuple[Any, ...], list[Step]] = {}  # a call's steps, by its arguments
runtime.on_change(_STEPS.clear)


def _key(x: ArrayProtocol, mesh: Mesh, width: object, dims: object, periodic: object
         ) -> tuple[Any, ...] | None:
    """What a call's steps depend on, or None where an argument is not a plain value."""
    if type(width) is int and dims is None and type(periodic) is bool and type(mesh) is Mesh:
        return (mesh, x.shape, x.dtype, width, periodic)  # the common call, cheaply
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


def _steps(x: ArrayProtocol, mesh: Mesh, width: object, dims: object, periodic: object,
           donate: bool = False) -> list[Step]:
    """The checked call's exchanges, one per mesh axis that has a neighbour and a width. A
    donated read-only ``x`` fails among the checks, so under ``debug="detail"`` every rank
    raises (the others `CollectiveMismatchError`), not only this one."""
    fn = "halo_exchange"
    g, call = member(mesh.parent if isinstance(mesh, Mesh) else None, fn)
    with detail.checked(g, call, fn, dtype=str(getattr(x, "dtype", None)),
                        ndim=getattr(x, "ndim", None), width=width, dims=dims, periodic=periodic):
        split = axes(x, mesh, width, dims, periodic)
        if donate and type(x) is np.ndarray:
            _check_writable(x)
    check_faces(call, x, mesh, split)
    steps: list[Step] = []
    for name, d, w, wrap in split:
        src, dst = mesh.shift(name, 1, periodic=wrap)
        if w and (src is not None or dst is not None):
            block = cast(np.ndarray, x)  # the numpy path's
            steps.append((mesh.group(name), _halo.Plan(block.shape, block.dtype, d, w, src, dst)))
    return steps
