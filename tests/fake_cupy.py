"""A CPU stand-in for the parts of cupy that fcoll uses (numpy underneath), so that fcoll's
cupy and NCCL code runs end to end under ``mpiexec`` without a GPU. For tests only.

Nothing here is cupy until `install` puts the fake into ``sys.modules`` (``cupy``,
``cupy.cuda``, ``cupy.cuda.runtime``, ``cupy.cuda.nccl``); `uninstall`, or the monkeypatch
given to `install`, takes it out again. mpi4py is imported on first use.

- Arrays: ``cupy.ndarray`` is a numpy subclass (``type(x) is np.ndarray`` is False; numpy
  results stay fake), with ``.device`` (current when it was made) and ``.data.ptr`` (host
  address of the first element). Like cupy's, its ufuncs and ``ascontiguousarray``,
  ``concatenate``, ``moveaxis``, ``split``, ``expand_dims`` refuse numpy arrays
  (`TypeError`). Limitation: numpy never
  calls ``__array__`` on its own subclasses, so ``np.asarray(x)`` and the buffer protocol
  (mpi4py) take fake arrays where cupy refuses implicit host conversion.
- Devices: ``FAKE_CUPY_DEVICES`` of them (default: the MPI world size, i.e. one per rank
  of one node, as NCCL needs), with distinct PCI bus ids. Streams and events are labels:
  all work runs when called, so it is always complete; `stall` makes events recorded from
  then on never complete (a stuck kernel, for deadline tests).
- NCCL: ``get_version()`` is ``FAKE_CUPY_NCCL_VERSION`` (default 22105; below 21000 ncclAvg
  and bfloat16 are refused, as before NCCL 2.10); ``FAKE_CUPY_NCCL=0`` makes it unavailable
  (``nccl.available`` False, as when cupy cannot load libnccl). Collectives run at once, blocking, with
  mpi4py on a communicator of the members; reductions fold in rank order (deterministic).
  Inside ``groupStart``/``groupEnd`` collectives still run at once, while sends (copied when
  called) and receives are queued, then posted together (nonblocking) by ``groupEnd``.
- Bootstrap, like real NCCL's (whose unique id holds its creator's address): the id is
  ``(creator's world rank, serial)``; each member sends its (rank, world rank) to the
  creator over ``COMM_WORLD`` with a tag near ``TAG_UB`` (fcoll uses COMM_WORLD with neither
  such tags nor ``ANY_TAG``); the creator, which must be a member, answers with the world
  ranks in rank order, and the members call ``MPI_Comm_create_group``, collective over them
  alone. So a subgroup's communicator never involves ranks outside it.
"""

from __future__ import annotations

import ctypes
import itertools
import os
import sys
import time
import types
from collections.abc import Callable
from typing import Any

import ml_dtypes
import numpy as np

Array = np.ndarray[Any, np.dtype[Any]]


def _mpi() -> Any:
    from mpi4py import MPI

    return MPI


class _State:
    """This process's current device and streams, and its queued point-to-point calls."""

    def __init__(self) -> None:
        self.device, self.depth = 0, 0  # depth: groupStart nesting
        self.streams: list[Stream] = []
        self.pending: list[Callable[[], Any]] = []  # each posts one MPI request
        self.stalled = False  # events recorded now never complete (`stall`)


_state, _serials, _saved = _State(), itertools.count(), dict[str, types.ModuleType | None]()


def getDeviceCount() -> int:
    return int(os.environ.get("FAKE_CUPY_DEVICES", "") or _mpi().COMM_WORLD.Get_size())


class Device:
    """``Device()`` is the current device; ``with Device(i):`` makes ``i`` current in the
    block, ``Device(i).use()`` from then on."""

    def __init__(self, device: int | None = None) -> None:
        self.id, self._outer = _state.device if device is None else int(device), list[int]()
        self.pci_bus_id = f"0000:{self.id + 1:02X}:00.0"

    def use(self) -> None:
        if not 0 <= self.id < getDeviceCount():
            raise RuntimeError(f"cudaErrorInvalidDevice: invalid device ordinal {self.id}")
        _state.device = self.id

    def __enter__(self) -> Device:
        self._outer.append(_state.device)
        self.use()
        return self

    def __exit__(self, *exc: object) -> None:
        _state.device = self._outer.pop()


class Stream:
    """``with Stream():`` makes it current; there is never anything to wait for."""

    _ptrs = itertools.count(0x1000, 0x10)

    def __init__(self, null: bool = False, non_blocking: bool = False, ptds: bool = False) -> None:
        self.ptr = 0 if null else next(Stream._ptrs)

    def __enter__(self) -> Stream:
        _state.streams.append(self)
        return self

    def __exit__(self, *exc: object) -> None:
        _state.streams.pop()

    def synchronize(self) -> None: ...

    def wait_event(self, event: Event) -> None: ...


def stall(stalled: bool = True) -> None:
    """Test hook: events recorded while stalled are never ``done`` (as after a stuck kernel)."""
    _state.stalled = stalled


class Event:
    """``done`` unless recorded under `stall`; ``record`` notes the host time (for
    `get_elapsed_time`)."""

    def __init__(self, block: bool = False, disable_timing: bool = False,
                 interprocess: bool = False) -> None:
        self.done, self.time = True, time.perf_counter()

    def record(self, stream: Stream | None = None) -> None:
        self.done, self.time = not _state.stalled, time.perf_counter()

    def synchronize(self) -> None: ...


_NULL_STREAM = Stream(null=True)


class _Pointer:
    def __init__(self, ptr: int, device_id: int = 0) -> None:
        self.ptr = ptr  # cupy's MemoryPointer.ptr
        self.device_id = device_id  # and its device_id


def _need(a: Any) -> ndarray:
    if isinstance(a, np.ndarray) and not isinstance(a, ndarray):
        raise TypeError(f"Unsupported type {type(a)}")  # cupy's words
    return a  # type: ignore[no-any-return]


class ndarray(Array):
    """cupy.ndarray: a numpy array in host memory, tagged with its device."""

    _device_id: int

    def __array_finalize__(self, obj: Any) -> None:
        self._device_id = getattr(obj, "_device_id", _state.device)

    @property
    def device(self) -> Device:  # type: ignore[override]
        return Device(self._device_id)

    @property
    def data(self) -> _Pointer:  # type: ignore[override]
        pointer = self.__dict__.get("_pointer")  # an array's memory never moves: made once
        if pointer is None:
            pointer = self.__dict__["_pointer"] = _Pointer(int(self.ctypes.data), self._device_id)
        return pointer  # type: ignore[no-any-return]

    @property
    def _c_contiguous(self) -> bool:  # cupy's cdef attribute, read by fcoll's fast paths
        return bool(self.flags.c_contiguous)

    def __array_ufunc__(self, ufunc: Any, method: str, *inputs: Any, **kwargs: Any) -> Any:
        """numpy's ufunc on the plain arrays; refuses numpy arrays, as cupy's ufuncs do."""
        outs = kwargs.get("out", ())
        args = [_need(a).view(np.ndarray) if isinstance(a, np.ndarray) else a for a in inputs]
        if outs:
            kwargs["out"] = tuple(_need(o).view(np.ndarray) for o in outs)
        result = getattr(ufunc, method)(*args, **kwargs)
        if method == "at":
            return None
        if outs:
            return outs[0] if len(outs) == 1 else outs
        out = np.asarray(result).view(ndarray)
        out._device_id = self._device_id
        return out


def _here(a: Any) -> ndarray:
    """``a`` (numpy) as a fake array on the current device, sharing its memory."""
    return np.asarray(a).view(ndarray)


def array(obj: Any, dtype: Any = None, copy: bool = True, order: str = "K") -> ndarray:
    """A copy on the current device (``copy=False``: ``obj`` itself if it is one already)."""
    if not copy and isinstance(obj, ndarray) and (dtype is None or np.dtype(dtype) == obj.dtype):
        return obj
    return _here(np.array(obj.view(np.ndarray) if isinstance(obj, ndarray) else obj, dtype,
                          copy=True, order=order))  # type: ignore[call-overload]


def ascontiguousarray(a: Any, dtype: Any = None) -> ndarray:
    x = _need(a)
    if x.flags.c_contiguous and (dtype is None or np.dtype(dtype) == x.dtype):
        return x
    return array(x, dtype, order="C")


# ---- cupy.cuda.nccl ---------------------------------------------------------------------

_DATATYPES = {0: np.int8, 1: np.uint8, 2: np.int32, 3: np.uint32, 4: np.int64, 5: np.uint64,
              6: np.float16, 7: np.float32, 8: np.float64, 9: ml_dtypes.bfloat16}
_OPS = {0: np.add, 1: np.multiply, 2: np.maximum, 3: np.minimum, 4: np.add}  # 4: avg
_AVG, _BF16, _V2_10 = 4, 9, 21000


class NcclError(RuntimeError):
    """An invalid argument (cupy's ``NcclError`` carries NCCL's result code)."""


def get_version() -> int:
    return int(os.environ.get("FAKE_CUPY_NCCL_VERSION", "") or 22105)


def _buffer(ptr: int, count: int, datatype: int) -> Array:
    """The ``count`` elements at address ``ptr`` as a numpy view (writes reach their owner)."""
    if datatype not in _DATATYPES or (datatype == _BF16 and get_version() < _V2_10) or count < 0:
        raise NcclError(f"ncclInvalidArgument: datatype {datatype}, count {count}")
    dtype = np.dtype(_DATATYPES[datatype])
    if count == 0:
        return np.empty(0, dtype)
    return np.frombuffer((ctypes.c_char * (count * dtype.itemsize)).from_address(ptr), dtype)


def _raw(a: Array) -> list[Any]:
    return [a.view(np.uint8), _mpi().BYTE]


def _post_pending() -> None:
    requests = [start() for start in _state.pending]
    _state.pending.clear()
    _mpi().Request.Waitall(requests)


def groupStart() -> None:
    _state.depth += 1


def groupEnd() -> None:
    if _state.depth == 0:
        raise NcclError("ncclInvalidUsage: groupEnd without groupStart")
    _state.depth -= 1
    if _state.depth == 0:
        _post_pending()


class NcclCommunicator:
    """cupy's NcclCommunicator over mpi4py: buffers are addresses; streams are ignored."""

    def __init__(self, ndev: int, commId: tuple[int, int], rank: int) -> None:
        MPI, world = _mpi(), _mpi().COMM_WORLD
        if not 0 <= rank < ndev:
            raise NcclError(f"ncclInvalidArgument: rank {rank} of {ndev}")
        if _state.depth:  # NCCL 2.28 defers a communicator made in a group: its calls fail
            raise NcclError("ncclInvalidUsage: communicator created inside groupStart/groupEnd "
                            "(NCCL sets it up at groupEnd; calls before that fail)")
        hub, serial = commId
        me, tag = world.Get_rank(), world.Get_attr(MPI.TAG_UB) - serial % 1024
        members = [me] * ndev
        if me == hub:  # the id's creator collects the world ranks and hands them out
            for _ in range(ndev - 1):
                r, w = world.recv(source=MPI.ANY_SOURCE, tag=tag)
                members[r] = w
            for w in set(members) - {me}:
                world.send(members, dest=w, tag=tag)
        else:
            world.send((rank, me), dest=hub, tag=tag)
            members = world.recv(source=hub, tag=tag)
        group = world.Get_group().Incl(members)
        self._comm: Any = world.Create_group(group, tag=tag)
        group.Free()
        self._rank, self._size, self._device = rank, ndev, _state.device
        self.aborted = False  # set by `abort`

    def rank_id(self) -> int:
        return self._rank

    def size(self) -> int:
        return self._size

    def device_id(self) -> int:
        return self._device

    def destroy(self) -> None:
        if self._comm is not None and not _mpi().Is_finalized():
            self._comm.Free()
        self._comm = None

    def abort(self) -> None:
        """ncclCommAbort: drops the communicator at once, with no peer taking part."""
        self.aborted, self._comm = True, None

    def _check(self, op: int = 0, root: int = 0) -> None:
        if op not in _OPS or (op == _AVG and get_version() < _V2_10) or not 0 <= root < self._size:
            raise NcclError(f"ncclInvalidArgument: op {op}, root/peer {root} of {self._size}")

    def _fold(self, parts: Array, op: int) -> Any:
        """The rows of ``parts`` reduced in rank order (avg: then divided, in their dtype)."""
        with np.errstate(all="ignore"):
            acc = parts[0].copy()
            for part in parts[1:]:
                acc = _OPS[op](acc, part)
            if op != _AVG:
                return acc
            if acc.dtype.kind in "iu":  # C's integer division: towards zero
                return np.sign(acc) * (np.abs(acc) // len(parts))
            return acc / np.asarray(len(parts), acc.dtype)

    def allReduce(self, sendbuf: int, recvbuf: int, count: int, datatype: int, op: int,
                  stream: int) -> None:
        self._check(op)
        send = _buffer(sendbuf, count, datatype)
        parts = np.empty((self._size, count), send.dtype)
        self._comm.Allgather(_raw(send), _raw(parts))
        _buffer(recvbuf, count, datatype)[...] = self._fold(parts, op)

    def reduce(self, sendbuf: int, recvbuf: int, count: int, datatype: int, op: int, root: int,
               stream: int) -> None:
        self._check(op, root)
        send, mine = _buffer(sendbuf, count, datatype), self._rank == root
        parts = np.empty((self._size if mine else 0, count), send.dtype)
        self._comm.Gather(_raw(send), _raw(parts) if mine else None, root=root)
        if mine:
            _buffer(recvbuf, count, datatype)[...] = self._fold(parts, op)

    def reduceScatter(self, sendbuf: int, recvbuf: int, recvcount: int, datatype: int, op: int,
                      stream: int) -> None:
        self._check(op)
        send = _buffer(sendbuf, recvcount * self._size, datatype)
        parts = np.empty((self._size, recvcount), send.dtype)
        self._comm.Alltoall(_raw(send), _raw(parts))
        _buffer(recvbuf, recvcount, datatype)[...] = self._fold(parts, op)

    def broadcast(self, sendbuf: int, recvbuf: int, count: int, datatype: int, root: int,
                  stream: int) -> None:
        self._check(root=root)
        out = _buffer(recvbuf, count, datatype)
        if self._rank == root and sendbuf != recvbuf:
            out[...] = _buffer(sendbuf, count, datatype)
        self._comm.Bcast(_raw(out), root=root)

    def allGather(self, sendbuf: int, recvbuf: int, count: int, datatype: int, stream: int) -> None:
        send = _buffer(sendbuf, count, datatype).copy()  # it may lie inside recvbuf
        self._comm.Allgather(_raw(send), _raw(_buffer(recvbuf, count * self._size, datatype)))

    def _p2p(self, start: Callable[[], Any], peer: int) -> None:
        self._check(root=peer)
        _state.pending.append(start)
        if _state.depth == 0:
            _post_pending()

    def send(self, sendbuf: int, count: int, datatype: int, peer: int, stream: int) -> None:
        data = _buffer(sendbuf, count, datatype).copy()
        self._p2p(lambda: self._comm.Isend(_raw(data), peer), peer)

    def recv(self, recvbuf: int, count: int, datatype: int, peer: int, stream: int) -> None:
        out = _buffer(recvbuf, count, datatype)
        self._p2p(lambda: self._comm.Irecv(_raw(out), peer), peer)


# ---- the modules --------------------------------------------------------------------------

def _module(name: str, **attrs: Any) -> types.ModuleType:
    module = types.ModuleType(name, f"fake {name} (tests/fake_cupy.py)")
    module.__dict__.update(attrs)
    return module


runtime = _module(
    "cupy.cuda.runtime", getDeviceCount=getDeviceCount, getDevice=lambda: _state.device,
    runtimeGetVersion=lambda: 12040, driverGetVersion=lambda: 12040,
    getDeviceProperties=lambda i: {"name": b"fake_cupy (CPU)"})
nccl = _module(
    "cupy.cuda.nccl", available=os.environ.get("FAKE_CUPY_NCCL", "1").strip() != "0",
    get_version=get_version, NcclError=NcclError,
    get_unique_id=lambda: (int(_mpi().COMM_WORLD.Get_rank()), next(_serials)),
    groupStart=groupStart, groupEnd=groupEnd, NcclCommunicator=NcclCommunicator)
cuda = _module(
    "cupy.cuda", Device=Device, Stream=Stream, Event=Event, runtime=runtime, nccl=nccl,
    get_current_stream=lambda: _state.streams[-1] if _state.streams else _NULL_STREAM,
    get_elapsed_time=lambda start, end: (end.time - start.time) * 1e3)  # milliseconds
cupy = _module(
    "cupy", __version__="14.0.0+fake", ndarray=ndarray, cuda=cuda, array=array,
    asarray=lambda a, dtype=None: array(a, dtype, copy=False),
    ascontiguousarray=ascontiguousarray,
    asnumpy=lambda a, stream=None: np.array(a, copy=True),  # a plain numpy copy
    empty=lambda shape, dtype=float, order="C": _here(np.empty(shape, dtype, order)),
    zeros=lambda shape, dtype=float, order="C": _here(np.zeros(shape, dtype, order)),
    ones=lambda shape, dtype=float, order="C": _here(np.ones(shape, dtype, order)),
    empty_like=lambda a, dtype=None: _here(np.empty(a.shape, a.dtype if dtype is None else dtype)),
    arange=lambda *args, **kwargs: _here(np.arange(*args, **kwargs)),
    from_dlpack=lambda obj: _here(np.from_dlpack(obj)),  # zero-copy, as cupy's
    concatenate=lambda arrays, axis=0: _here(np.concatenate([_need(a) for a in arrays], axis)),
    moveaxis=lambda a, source, destination: np.moveaxis(_need(a), source, destination),
    split=lambda a, indices_or_sections, axis=0: np.split(_need(a), indices_or_sections, axis),
    expand_dims=lambda a, axis: np.expand_dims(_need(a), axis),
    multiply=np.multiply, maximum=np.maximum, exp=np.exp,
    log=np.log)  # a fake array's ufunc refuses numpy arrays
_MODULES = {"cupy": cupy, "cupy.cuda": cuda, "cupy.cuda.runtime": runtime, "cupy.cuda.nccl": nccl}


def install(monkeypatch: Any = None) -> types.ModuleType:
    """Make ``import cupy`` give the fake and return it; undone by ``monkeypatch`` (a pytest
    MonkeyPatch) if one is given, else by `uninstall`."""
    for name, module in _MODULES.items():
        if monkeypatch is not None:
            monkeypatch.setitem(sys.modules, name, module)
        else:
            _saved.setdefault(name, sys.modules.get(name))
            sys.modules[name] = module
    return cupy


def uninstall() -> None:
    """Put back what `install` (without a monkeypatch) replaced in ``sys.modules``."""
    for name, previous in _saved.items():
        if previous is None:
            sys.modules.pop(name, None)
        else:
            sys.modules[name] = previous
    _saved.clear()
