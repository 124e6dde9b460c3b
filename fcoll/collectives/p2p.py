"""Point-to-point: send/recv, isend/irecv, batch_isend_irecv, permute_tensor.

A message carries its own shape and dtype, so a receiver needs no template. Wire format
on the group's communicator: a header of int64 ``[kind, dtype index, ndim, *shape]``
(padded to 16 bytes, `fcoll.policy.header`) on tag ``3 * tag``; small arrays ride in the
same message after the header, large ones follow as a second message on tag
``3 * tag + 1`` (no copy). MPI keeps messages between two ranks on one tag in order, so
header and data always pair up. Tag ``3 * tag + 2`` carries data without a header
(`fcoll.sendrecv` with ``like=``), so it never matches a message that has one.

cupy arrays travel through host memory; the header's kind carries a flag (`_CUPY`) that
the array was a cupy array, and a receiver with cupy imported gets a cupy array on its
current device (the device current when it called `recv`/`irecv`), else numpy. torch
tensors and JAX arrays travel as their numpy or cupy views (`fcoll.dispatch.interop`) with
a flag (`_TORCH`, `_JAX`) too: a receiver that has imported torch (JAX) gets a tensor
(array) on the CPU or, if a device array was sent and cupy is imported, on the current
device; otherwise numpy (cupy).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, overload

import numpy as np

from fcoll.backends import staged
from fcoll.calls.errors import timed_out
from fcoll.calls.work import (
    Call,
    Operation,
    RequestOperation,
    Work,
    backoff,
    wait_request,
    wait_requests,
)
from fcoll.collectives._common import c_order
from fcoll.dispatch import device, interop, is_cupy
from fcoll.groups import detail
from fcoll.groups.group import Group, GroupArg, resolve_group
from fcoll.groups.membership import member
from fcoll.policy.arrays import A, ArrayProtocol
from fcoll.policy.header import INLINE as _INLINE
from fcoll.policy.header import SEPARATE as _SEPARATE
from fcoll.policy.header import header as _header
from fcoll.policy.header import inline as _inline
from fcoll.policy.header import parse as _parse
from fcoll.policy.validate import check_array, check_permutation, check_rank
from fcoll.runtime import mpi

MPI = mpi()
BYTE = MPI.BYTE
INLINE_LIMIT = 8 << 10  # arrays up to this many bytes travel inside the header message
_CUPY = 4  # or-ed into the kind: the sender's array was a cupy array
_KIND_FLAGS = {"torch": 8, "jax": 16}  # or-ed too: it was a torch tensor, a JAX array
_FLAGS = _CUPY | 8 | 16
PARTS = 3  # wire tags per user tag: PARTS * tag + HEADER, + DATA (a header's data), + BARE
HEADER, DATA, BARE = 0, 1, 2  # BARE: data without a header (sendrecv's like=)
_MAX_TAG = MPI.COMM_WORLD.Get_attr(MPI.TAG_UB) // PARTS - 1024
# Tags fcoll uses itself, above every user tag's three.
PERMUTE_TAG = _MAX_TAG * PARTS + PARTS
MONITOR_TAG = PERMUTE_TAG + 1  # monitored_barrier: reports on this tag, verdicts on + 1
HALO_TAG = PERMUTE_TAG + 3  # halo_exchange: data moving up a mesh axis; + 1: moving down


def _tag(tag: object, fn: str) -> int:
    if type(tag) is not int or not 0 <= tag <= _MAX_TAG:
        raise ValueError(f"{fn}: expected tag to be an int in [0, {_MAX_TAG}], got {tag!r}")
    return tag


def _packed(x: np.ndarray, flags: int = 0) -> bytes:
    """Header and data in one fresh buffer (also the snapshot an isend needs)."""
    return _header(x, _INLINE | flags) + x.tobytes()


def _host(x: Any, fn: str) -> tuple[Any, int]:
    """``x`` as the host array that travels, and the header flags saying what it was."""
    if type(x) is np.ndarray:
        return x, 0
    flags = 0
    if (k := interop.kind(x)) is not None:
        x, flags = interop.to_native(x, fn, "x"), _KIND_FLAGS[k]
    if is_cupy(x):
        return staged.to_host(x), flags | _CUPY
    return x, flags


def _receiving_device() -> int | None:
    """The current device if cupy is imported (a cupy message lands there), else None."""
    cupy = sys.modules.get("cupy")
    return None if cupy is None else int(cupy.cuda.Device().id)


def _arrived(out: np.ndarray, kind: int, device: int | None) -> Any:
    """The received array as the receiver gets it: cupy on ``device`` if it was sent as
    cupy and the receiver has cupy, else numpy; then a tensor (JAX array) if it was sent as
    one and the receiver has imported torch (JAX)."""
    y: Any = out
    if kind & _CUPY and device is not None:
        y = staged.to_device(out, device)
    for k, flag in _KIND_FLAGS.items():
        if kind & flag and k in sys.modules:
            return interop.as_kind(y, k)
    return y


def _send(call: Call, buf: Any, peer: int, tag: int) -> None:
    """A blocking send, bounded by the call's deadline when one is set."""
    if call.seconds is None:
        call.comm.Send([buf, BYTE], peer, tag)
    else:
        wait_request(call.comm.Isend([buf, BYTE], peer, tag), call)


def _probe_message(call: Call, source: int, tag: int, status: Any) -> Any:
    """A matched probe, bounded by the call's deadline when one is set."""
    seconds = call.seconds
    if seconds is None:
        return call.comm.Mprobe(source, tag, status)
    pause, started = 1e-5, time.monotonic()
    while (message := call.comm.Improbe(source, tag, status)) is None:
        if time.monotonic() - call.start > seconds:
            raise timed_out(call.fn, call.group, seconds, call.group.seq)
        pause = backoff(started, pause)
    return message


def _peer(peer: object, g: Group, fn: str, name: str, self_ok: bool) -> int:
    rank = check_rank(peer, g.size, fn, name)
    if rank == g.rank and not self_ok:
        raise ValueError(f"{fn}: expected {name} other than this rank ({rank}); a blocking "
                         "send or recv to itself would deadlock: use isend/irecv")
    return rank


def send(x: ArrayProtocol, dst: int, group: GroupArg = None, tag: int = 0) -> None:
    """Send ``x`` to group rank ``dst`` (blocking until ``x`` may be reused). A cupy
    array is sent from a host copy and arrives as a cupy array where cupy is imported.

    Example:
        >>> if r == 0: fc.send(np.arange(3), dst=1)
        >>> if r == 1: fc.recv(src=0)
        array([0, 1, 2])
    """
    host, flags = _host(x, "send")
    g, call = member(group, "send")
    peer = _peer(dst, g, "send", "dst", self_ok=False)
    array = check_array(host, "send")
    tag = _tag(tag, "send")
    if array.nbytes <= INLINE_LIMIT:
        _send(call, _packed(array, flags), peer, PARTS * tag)
        return
    _send(call, _header(array, _SEPARATE | flags), peer, PARTS * tag)
    _send(call, c_order(array), peer, PARTS * tag + DATA)


@overload
def recv(src: int | None = ..., group: GroupArg = ..., tag: int = ..., *,
         return_source: Literal[False] = ...) -> Any: ...
@overload
def recv(src: int | None = ..., group: GroupArg = ..., tag: int = ..., *,
         return_source: Literal[True]) -> tuple[Any, int]: ...


def recv(src: int | None = None, group: GroupArg = None, tag: int = 0, *,
         return_source: bool = False) -> Any:
    """Receive an array (shape and dtype come with it) from group rank ``src``, or from
    any rank when ``src`` is ``None``; ``return_source=True`` gives ``(array, src)``.
    A cupy array sent arrives as a cupy array on the current device if cupy is imported
    here (else as numpy); a numpy array as numpy; a torch tensor (JAX array) as a tensor
    (array) if torch (JAX) is imported here, on the CPU or, sent from a GPU, on the current
    device (see the module's docstring).

    Example:
        >>> y, who = fc.recv(return_source=True)     # on rank 0, rank 2 sent it
        >>> who
        2
    """
    g, call = member(group, "recv")
    source = MPI.ANY_SOURCE if src is None else _peer(src, g, "recv", "src", self_ok=False)
    tag = _tag(tag, "recv")
    device = _receiving_device()
    status = MPI.Status()
    message = _probe_message(call, source, PARTS * tag, status)
    buf = np.empty(status.Get_count(BYTE), np.uint8)
    message.Recv([buf, BYTE])
    kind, dtype, shape, offset = _parse(buf)
    if kind & ~_FLAGS == _INLINE:
        out = _inline(buf, dtype, shape, offset)
    else:
        out = np.empty(shape, dtype)
        data = _probe_message(call, status.Get_source(), PARTS * tag + DATA, MPI.Status())
        data.Recv([out, BYTE])
    out = _arrived(out, kind, device)
    return (out, status.Get_source()) if return_source else out


def isend(x: ArrayProtocol, dst: int, group: GroupArg = None, tag: int = 0) -> Work[None]:
    """Start sending ``x`` (copied at the call) to group rank ``dst``; returns a `Work`.
    A cupy array arrives as a cupy array where cupy is imported (see `recv`).

    Example:
        >>> r = fc.get_rank()                               # mpiexec -n 2
        >>> w = fc.isend(np.array([r]), dst=1 - r)          # to the other rank
        >>> fc.recv(src=1 - r), w.wait()                    # on rank 0; rank 1 gets [0]
        (array([1]), None)
    """
    host, flags = _host(x, "isend")  # a cupy array: copied to the host at the call
    g, call = member(group, "isend")
    peer = _peer(dst, g, "isend", "dst", self_ok=True)
    packed = _packed(check_array(host, "isend"), flags)
    request = call.comm.Isend([packed, BYTE], peer, PARTS * _tag(tag, "isend"))
    return Work(RequestOperation("isend", g, request, lambda: None, (packed,)))


class _Receive(Operation):
    """irecv: probe for the header without blocking, then receive the rest."""

    needs_polling = True  # its receive is posted only once this process probes

    def __init__(self, g: Group, call: Call, source: int, tag: int) -> None:
        super().__init__("irecv", g)
        self._comm, self._wanted, self._tag = call.comm, source, tag
        self._device = _receiving_device()
        self._request: Any = None
        self._buf: np.ndarray | None = None
        self._kind, self._data = 0, np.empty(0)

    def _matched(self, message: Any, status: Any) -> None:
        self.source = status.Get_source()
        self._buf = np.empty(status.Get_count(BYTE), np.uint8)
        self._request = message.Irecv([self._buf, BYTE])

    def _received(self) -> bool:
        """The header message arrived: done if inline, else start the data receive."""
        assert self._buf is not None
        kind, dtype, shape, offset = _parse(self._buf)
        if kind & ~_FLAGS == _INLINE:
            self.value = _arrived(_inline(self._buf, dtype, shape, offset), kind, self._device)
            return True
        self._kind, self._data = kind, np.empty(shape, dtype)
        self._buf = None
        self._request = self._comm.Irecv([self._data, BYTE], self.source, PARTS * self._tag + DATA)
        return False

    def _landed(self) -> bool:
        """The data message arrived too."""
        self.value = _arrived(self._data, self._kind, self._device)
        return True

    def _advance(self) -> bool:
        if self._request is None:
            status = MPI.Status()
            message = self._comm.Improbe(self._wanted, PARTS * self._tag, status)
            if message is None:
                return False
            self._matched(message, status)
        if not self._request.Test():
            return False
        return self._landed() if self._buf is None else self._received()

    def _block(self) -> None:
        if self._request is None:
            status = MPI.Status()
            self._matched(self._comm.Mprobe(self._wanted, PARTS * self._tag, status), status)
        self._request.Wait()
        if self._buf is not None and self._received():
            return
        self._request.Wait()  # the data (returns at once if it is in already)
        self._landed()


def irecv(src: int | None = None, group: GroupArg = None, tag: int = 0) -> Work[Any]:
    """Start receiving from group rank ``src`` (any rank if ``None``); ``wait()`` returns
    the array and `Work.source_rank` the sender. A cupy array sent arrives as a cupy array
    on the device current at this call, if cupy is imported here (see `recv`).

    Example:
        >>> r = fc.get_rank()                               # mpiexec -n 2
        >>> w = fc.irecv(src=1 - r)
        >>> fc.send(np.full(2, r), dst=1 - r)
        >>> w.wait()                                        # on rank 0; rank 1 gets [0, 0]
        array([1, 1])
    """
    g, call = member(group, "irecv")
    source = MPI.ANY_SOURCE if src is None else _peer(src, g, "irecv", "src", self_ok=True)
    return Work(_Receive(g, call, source, _tag(tag, "irecv")))


@dataclass(frozen=True)
class P2POp:
    """One operation of `batch_isend_irecv`: ``P2POp(fc.isend, x, peer)`` or
    ``P2POp(fc.irecv, None, peer)`` (the received shape and dtype travel with the data).

    Example:
        >>> r, n = fc.get_rank(), fc.get_world_size()        # a ring of n ranks
        >>> ops = [fc.P2POp(fc.isend, np.array([r]), (r + 1) % n),
        ...        fc.P2POp(fc.irecv, None, (r - 1) % n)]
        >>> fc.wait_all(fc.batch_isend_irecv(ops))[1]        # rank 0 of 4 gets rank 3's
        array([3])
    """

    op: Any
    tensor: ArrayProtocol | None
    peer: int
    group: GroupArg = None
    tag: int = 0

    def __post_init__(self) -> None:
        if self.op is not isend and self.op is not irecv:
            raise ValueError("Invalid ``op``. Expected ``op`` to be of type ``fcoll.isend`` "
                             f"or ``fcoll.irecv``, got {self.op!r}")
        if self.op is irecv and self.tensor is not None:
            raise TypeError("P2POp: expected tensor=None for irecv (shape and dtype travel "
                            f"with the message), got {type(self.tensor).__name__}")


def batch_isend_irecv(p2p_op_list: Sequence[P2POp]) -> list[Work[Any]]:
    """Start every operation of the list; returns one `Work` per operation, in order.

    Example:
        >>> ring = [fc.P2POp(fc.isend, x, (r + 1) % n), fc.P2POp(fc.irecv, None, (r - 1) % n)]
        >>> _, got = [w.wait() for w in fc.batch_isend_irecv(ring)]   # got: rank r-1's x
    """
    if not isinstance(p2p_op_list, Sequence) or not p2p_op_list or not all(
            isinstance(p, P2POp) for p in p2p_op_list):
        raise ValueError("Invalid ``p2p_op_list``. Each op is expected to be of type "
                         f"``fcoll.P2POp``, got {p2p_op_list!r}")
    groups = {id(resolve_group(p.group, "batch_isend_irecv")) for p in p2p_op_list}
    if len(groups) > 1:
        raise ValueError("batch_isend_irecv: All ops need to use the same group")
    return [
        isend(p.tensor, p.peer, p.group, p.tag) if p.op is isend
        else irecv(p.peer, p.group, p.tag)
        for p in p2p_op_list
    ]


def permute_tensor(x: A, src_dst: Sequence[int | None], group: GroupArg = None) -> A:
    """Rank ``i`` sends ``x`` to rank ``src_dst[i]`` (``None``: sends nothing); a rank
    that receives nothing gets zeros. Every rank passes the same shape and dtype.

    Example:
        >>> fc.permute_tensor(np.array([r]), [1, 2, 0])    # 3 ranks, on rank 0
        array([2])
    """
    fn = "permute_tensor"
    if type(x) is not np.ndarray and (on := device(x, group)) is not None:
        from fcoll.gpu import route

        return route.run(on, fn, permute_tensor, x, src_dst, group=group)  # type: ignore[no-any-return]
    g, call = member(group, fn)
    with detail.checked(g, call, fn, x=x, src_dst=src_dst):
        array = check_array(x, fn)
        targets = check_permutation(src_dst, g.size, fn)
    dst = targets[g.rank]
    senders = [i for i, d in enumerate(targets) if d == g.rank]
    if dst == g.rank:
        return np.array(array, order="C", copy=True)  # type: ignore[return-value]  # numpy in, out
    out = np.empty(array.shape, array.dtype) if senders else np.zeros(array.shape, array.dtype)
    requests = [call.comm.Irecv([out, BYTE], senders[0], PERMUTE_TAG)] if senders else []
    if dst is not None:
        requests.append(call.comm.Isend([c_order(array), BYTE], dst, PERMUTE_TAG))
    wait_requests(requests, call)
    return out  # type: ignore[return-value]  # numpy in, numpy out
