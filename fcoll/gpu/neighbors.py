"""`fcoll.sendrecv` and `fcoll.halo_exchange` on cupy arrays over NCCL: grouped send/recv
(``ncclGroupStart``/``End``) on cupy's current stream, as `fcoll.gpu.lists` moves bytes.

`sendrecv`: the shape and dtype travel first over MPI (`fcoll.policy.header`'s header, on an
internal tag of the group's communicator), the data then over NCCL, so a cupy `sendrecv`
pairs with a cupy `sendrecv` (NCCL orders messages between two ranks by call, whatever the
tag). With ``like=`` no header travels: the data goes straight into a cupy array of
``like``'s shape and dtype, unchecked (NCCL requires matching counts and cannot tell a
mismatch: a receive may wait forever or hold part of the message).

`halo_exchange`: per mesh axis, each edge is copied into a contiguous buffer on the device
(``ascontiguousarray``), sent, and the received faces copied into the ghost cells of the
result (``x`` itself when donated). Under a deadline each axis waits for its NCCL work
(`fcoll.backends.nccl.wait`). The MPI transports stage both through host memory (`fcoll.gpu.route`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from fcoll.backends import Backend, nccl
from fcoll.backends import mpi as host
from fcoll.calls.work import Call, wait_requests
from fcoll.gpu.collectives import as_bytes, cp, enter
from fcoll.groups import detail
from fcoll.groups.halo_axes import axes, check_faces
from fcoll.groups.membership import member
from fcoll.groups.mesh import Mesh
from fcoll.policy.header import INLINE, MAX_BYTES, header, parse
from fcoll.policy.validate import check_like, check_rank
from fcoll.runtime import mpi


def _header_tag() -> int:
    """An internal tag of the group's communicator, above every user tag's pair."""
    return int(mpi().COMM_WORLD.Get_attr(mpi().TAG_UB)) - 1


def _shape_of(call: Call, x: Any, dst: int | None, src: int | None) -> Any:
    """``src``'s header (what it will send over NCCL), after sending ours to ``dst``."""
    comm, tag = call.comm, _header_tag()  # not counted: point-to-point, as fcoll.send
    buf = np.empty(MAX_BYTES, np.uint8)
    requests = [] if src is None else [comm.Irecv([buf, host.BYTE], src, tag)]
    if dst is not None:
        requests.append(comm.Isend([header(x, INLINE), host.BYTE], dst, tag))
    wait_requests(requests, call)
    return None if src is None else parse(buf)


def sendrecv(backend: Backend, x: Any, dst: int | None, src: int | None, group: Any = None, *,
             tag: int = 0, like: Any = None) -> Any:
    """`fcoll.sendrecv` over NCCL; with ``like`` no header travels first (NCCL cannot check
    the size: ``like`` must match what ``src`` sends)."""
    fn = "sendrecv"
    g, call = enter(group, x if x is not None else like, fn)
    to = None if dst is None else check_rank(dst, g.size, fn, "dst")
    source = None if src is None else check_rank(src, g.size, fn, "src")
    if type(tag) is not int or tag < 0:
        raise ValueError(f"{fn}: expected tag to be a non-negative int, got {tag!r}")
    if like is not None:
        got = None if source is None else (0, *reversed(check_like(like, fn)))
    else:
        got = _shape_of(call, x, to, source)
    device = (x if x is not None else like).device
    with device:
        out = None if got is None else cp().empty(got[2], got[1])
        sends = [] if to is None else [(as_bytes(x), to)]
        recvs = [] if out is None or source is None else [(out.reshape(-1).view(np.uint8), source)]
        nccl.exchange(nccl.communicator(call.group, int(device.id), call.fn), sends, recvs)
    return out


def _face(y: Any, dim: int, start: int, width: int) -> Any:
    """``y``'s cells ``start:start + width`` along ``dim`` (a view)."""
    return y[(slice(None),) * dim + (slice(start, start + width),)]


def halo_exchange(backend: Backend, x: Any, mesh: Any, width: int | Sequence[int], *,
                  dims: Sequence[int] | None = None,
                  periodic: bool | Sequence[bool] = False, donate: bool = False) -> Any:
    """The numpy function's result (`fcoll.halo_exchange`), moved by NCCL; ``donate``: ``x``
    itself, its ghost cells filled in place."""
    fn = "halo_exchange"
    g, call = member(mesh.parent if isinstance(mesh, Mesh) else None, fn)
    with detail.checked(g, call, fn, dtype=str(x.dtype), ndim=x.ndim, width=width, dims=dims,
                        periodic=periodic):
        split = axes(x, mesh, width, dims, periodic)
    check_faces(call, x, mesh, split)
    with x.device:
        y = x if donate else cp().array(x, order="C", copy=True)
        for name, d, w, wrap in split:
            src, dst = mesh.shift(name, 1, periodic=wrap)
            if w and (src is not None or dst is not None):
                _exchange(member(mesh.group(name), "halo_exchange")[1], y, d, w, src, dst)
    return y


def _exchange(call: Call, y: Any, d: int, w: int, src: int | None, dst: int | None) -> None:
    """One dim: send the low edge to ``src`` and the high edge to ``dst`` first, then receive
    the high ghosts from ``dst`` and the low ones from ``src`` (per pair, NCCL matches in
    posting order: with two ranks on a periodic axis both messages go to the same peer)."""
    n = y.shape[d]
    shape = (*y.shape[:d], w, *y.shape[d + 1 :])
    low = None if src is None else cp().empty(shape, y.dtype)
    high = None if dst is None else cp().empty(shape, y.dtype)
    sends = [] if src is None else [(as_bytes(_face(y, d, w, w)), src)]
    sends += [] if dst is None else [(as_bytes(_face(y, d, n - 2 * w, w)), dst)]
    recvs = [] if high is None or dst is None else [(high.reshape(-1).view(np.uint8), dst)]
    recvs += [] if low is None or src is None else [(low.reshape(-1).view(np.uint8), src)]
    nccl.exchange(nccl.communicator_for(call, y), sends, recvs)
    if low is not None:
        _face(y, d, 0, w)[...] = low
    if high is not None:
        _face(y, d, n - w, w)[...] = high
    nccl.wait(call)
