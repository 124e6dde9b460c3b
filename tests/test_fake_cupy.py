"""tests/fake_cupy.py, the CPU stand-in for cupy: its arrays, devices and streams, and each
NcclCommunicator call against a numpy reference (in rank order), at any world size.

Every test installs the fake through ``monkeypatch``, so nothing is left in ``sys.modules``.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Iterator
from typing import Any

import ml_dtypes
import numpy as np
import pytest

import fcoll as fc
from fcoll.runtime import mpi
from tests import fake_cupy

BF16 = np.dtype(ml_dtypes.bfloat16)
DATATYPES = {np.dtype("int32"): 2, np.dtype("float32"): 7, BF16: 9}
OPS = {"sum": 0, "prod": 1, "max": 2, "min": 3, "avg": 4}
NUMPY = {"sum": np.add, "prod": np.multiply, "max": np.maximum, "min": np.minimum, "avg": np.add}


@pytest.fixture(autouse=True)
def cp(monkeypatch: pytest.MonkeyPatch) -> Any:
    """The fake cupy, in ``sys.modules`` for this test only, with state of its own."""
    monkeypatch.setattr(fake_cupy, "_state", fake_cupy._State())
    for name in ("FAKE_CUPY_DEVICES", "FAKE_CUPY_NCCL_VERSION"):  # the defaults, whatever the job sets
        monkeypatch.delenv(name, raising=False)
    return fake_cupy.install(monkeypatch)


@pytest.fixture
def comm(cp: Any) -> Iterator[Any]:
    """An NCCL communicator over the world (the id made by rank 0 and broadcast, as fcoll does)."""
    world, rank = mpi().COMM_WORLD, fc.get_rank()
    uid = world.bcast(cp.cuda.nccl.get_unique_id() if rank == 0 else None, root=0)
    c = cp.cuda.nccl.NcclCommunicator(world.Get_size(), uid, rank)
    yield c
    c.destroy()


def _data(rank: int, count: int, dtype: np.dtype[Any]) -> np.ndarray[Any, Any]:
    """Small integers (1 to 7), different per rank."""
    return ((np.arange(count) * (rank + 2) + rank) % 7 + 1).astype(dtype)


def _reference(inputs: list[np.ndarray[Any, Any]], op: str) -> np.ndarray[Any, Any]:
    total = functools.reduce(NUMPY[op], inputs)
    if op != "avg":
        return total
    if total.dtype.kind == "i":
        return np.asarray(total // len(inputs))  # data >= 0: truncation is floor division
    return np.asarray(total / np.asarray(len(inputs), total.dtype))


def _ptr(a: Any) -> int:
    return int(a.data.ptr)


def test_fake_arrays_are_cupy_arrays_not_numpy_arrays(cp: Any) -> None:
    x = cp.asarray(np.arange(12, dtype=np.int32))
    assert type(x) is not np.ndarray and isinstance(x, cp.ndarray)
    assert cp.asarray(x) is x and cp.array(x) is not x
    for y in (x + 1, x.reshape(3, 4), x.view(np.uint8), x.astype(np.float32), x[2:], x & 1,
              cp.moveaxis(x.reshape(3, 4), 0, 1), cp.concatenate([x, x]), cp.zeros(2), x.sum()):
        assert isinstance(y, cp.ndarray), type(y)
    assert x.data.ptr == x.ctypes.data and x[3:].data.ptr == x.data.ptr + 12
    y = x.astype(np.float64)
    y /= 2
    assert isinstance(y, cp.ndarray) and y[3] == 1.5
    with pytest.raises(TypeError, match="Unsupported type"):
        x + np.ones(12, np.int32)  # cupy refuses host arrays in its ufuncs
    for call in (cp.ascontiguousarray, lambda a: cp.concatenate([a]), lambda a: cp.moveaxis(a, 0, 0)):
        with pytest.raises(TypeError):
            call(np.ones(2))
    assert isinstance(cp.multiply(x, cp.asarray(2, dtype=x.dtype)), cp.ndarray)


def test_asnumpy_round_trip_copies(cp: Any) -> None:
    a = np.arange(6, dtype=BF16).reshape(2, 3)
    x = cp.asarray(a)
    back = cp.asnumpy(x)
    assert type(back) is np.ndarray and back.dtype == BF16 and np.array_equal(back, a)
    x[0, 0] = 5
    assert a[0, 0] == 0 and back[0, 0] == 0  # asarray and asnumpy copied
    t = cp.asarray(a).T
    assert not t.flags.c_contiguous and cp.ascontiguousarray(t).flags.c_contiguous


def test_devices_streams_and_events(cp: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_CUPY_DEVICES", "2")
    cuda = cp.cuda
    assert cuda.runtime.getDeviceCount() == 2 and cuda.Device().id == 0
    assert cuda.Device(0).pci_bus_id != cuda.Device(1).pci_bus_id
    with cuda.Device(1):
        x = cp.empty(3)
        assert cuda.Device().id == 1
    assert cuda.Device().id == 0 and x.device.id == 1 and (x + 1).device.id == 1
    with x.device:
        assert cp.zeros(1).device.id == 1
    with pytest.raises(RuntimeError, match="invalid device"):
        cuda.Device(2).use()
    null = cuda.get_current_stream()
    with cuda.Stream(non_blocking=True) as stream:
        assert cuda.get_current_stream() is stream and stream.ptr != null.ptr
        event = cuda.Event(block=False, disable_timing=True, interprocess=False)
        event.record(stream)
    assert cuda.get_current_stream() is null and event.done
    stream.wait_event(event)
    stream.synchronize()
    assert cuda.get_elapsed_time(event, event) == 0.0
    assert cuda.runtime.getDeviceProperties(0)["name"]


def test_install_and_uninstall(cp: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fake_cupy, "_saved", {})
    for name in fake_cupy._MODULES:
        monkeypatch.delitem(sys.modules, name, raising=False)
    module = fake_cupy.install()
    import cupy
    from cupy.cuda import nccl

    assert cupy is module and nccl.available and nccl.get_version() == 22105
    fake_cupy.uninstall()
    assert not any(name in sys.modules for name in fake_cupy._MODULES)


@pytest.mark.parametrize("dtype", list(DATATYPES), ids=str)
@pytest.mark.parametrize("op", list(OPS))
def test_all_reduce_reduce_and_reduce_scatter(cp: Any, comm: Any, dtype: np.dtype[Any], op: str) -> None:
    n, me, count, code = comm.size(), comm.rank_id(), 2 * comm.size(), DATATYPES[dtype]
    inputs = [_data(r, count, dtype) for r in range(n)]
    want = _reference(inputs, op)
    x, out = cp.asarray(inputs[me]), cp.zeros(count, dtype)
    comm.allReduce(_ptr(x), _ptr(out), count, code, OPS[op], 0)
    assert np.array_equal(cp.asnumpy(out), want) and np.array_equal(cp.asnumpy(x), inputs[me])
    comm.allReduce(_ptr(x), _ptr(x), count, code, OPS[op], 0)  # in place
    assert np.array_equal(cp.asnumpy(x), want)
    x, out = cp.asarray(inputs[me]), cp.zeros(count, dtype)
    comm.reduce(_ptr(x), _ptr(out), count, code, OPS[op], n - 1, 0)
    assert np.array_equal(cp.asnumpy(out), want if me == n - 1 else np.zeros(count, dtype))
    out = cp.zeros(2, dtype)
    comm.reduceScatter(_ptr(x), _ptr(out), 2, code, OPS[op], 0)
    assert np.array_equal(cp.asnumpy(out), want[2 * me : 2 * me + 2])


@pytest.mark.parametrize("dtype", list(DATATYPES), ids=str)
def test_broadcast_and_all_gather(cp: Any, comm: Any, dtype: np.dtype[Any]) -> None:
    n, me, code = comm.size(), comm.rank_id(), DATATYPES[dtype]
    inputs = [_data(r, 3, dtype) for r in range(n)]
    x, out = cp.asarray(inputs[me]), cp.zeros(3, dtype)
    comm.broadcast(_ptr(x), _ptr(out), 3, code, n - 1, 0)
    assert np.array_equal(cp.asnumpy(out), inputs[n - 1])
    comm.broadcast(_ptr(x), _ptr(x), 3, code, 0, 0)  # in place
    assert np.array_equal(cp.asnumpy(x), inputs[0])
    x, out = cp.asarray(inputs[me]), cp.zeros(3 * n, dtype)
    comm.allGather(_ptr(x), _ptr(out), 3, code, 0)
    assert np.array_equal(cp.asnumpy(out), np.concatenate(inputs))
    out = cp.asarray(np.concatenate(inputs) * 0)
    out[3 * me : 3 * me + 3] = x
    comm.allGather(_ptr(out[3 * me :]), _ptr(out), 3, code, 0)  # in place
    assert np.array_equal(cp.asnumpy(out), np.concatenate(inputs))
    empty = cp.empty(0, dtype)
    comm.allReduce(_ptr(empty), _ptr(empty), 0, code, 0, 0)


def test_grouped_send_recv_ring(cp: Any, comm: Any) -> None:
    """Two messages each way around the ring, all started together by groupEnd."""
    n, me, nccl = comm.size(), comm.rank_id(), cp.cuda.nccl
    right, left = (me + 1) % n, (me - 1) % n
    first, second = cp.asarray(_data(me, 4, BF16)), cp.asarray(_data(me + n, 5, BF16))
    got = [cp.zeros(4, BF16), cp.zeros(5, BF16)]
    nccl.groupStart()
    comm.send(_ptr(first), 4, 9, right, 0)
    comm.send(_ptr(second), 5, 9, right, 0)
    first[...] = 0  # sends are taken when called, as NCCL reads them in stream order
    for buf in got:
        comm.recv(_ptr(buf), buf.size, 9, left, 0)
    assert not got[0].any()  # nothing has moved before groupEnd
    nccl.groupEnd()
    assert np.array_equal(cp.asnumpy(got[0]), _data(left, 4, BF16))
    assert np.array_equal(cp.asnumpy(got[1]), _data(left + n, 5, BF16))


def test_a_subgroup_needs_only_its_members(cp: Any) -> None:
    """Ranks 1.. (all ranks at world size 1), in reverse order: its rank 0, which makes the id,
    is the last world rank; rank 0 of the world takes no part (at world sizes > 1)."""
    world, me, n = mpi().COMM_WORLD, fc.get_rank(), fc.get_world_size()
    members = list(range(n - 1, 0, -1)) or [0]
    sub = world.Split(0 if me in members else 1, key=members.index(me) if me in members else 0)
    try:
        if me not in members:
            return
        uid = sub.bcast(cp.cuda.nccl.get_unique_id() if sub.Get_rank() == 0 else None, root=0)
        c = cp.cuda.nccl.NcclCommunicator(len(members), uid, members.index(me))
        x, out = cp.asarray(np.array([me], np.int32)), cp.zeros(len(members), np.int32)
        c.allGather(_ptr(x), _ptr(out), 1, 2, 0)
        assert out.tolist() == members
        c.destroy()
    finally:
        sub.Free()


def test_invalid_arguments_raise_before_communicating(cp: Any, comm: Any,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    nccl, x = cp.cuda.nccl, cp.zeros(2, BF16)
    with pytest.raises(nccl.NcclError):
        comm.allReduce(_ptr(x), _ptr(x), 2, 10, 0, 0)  # no datatype 10
    with pytest.raises(nccl.NcclError):
        comm.reduce(_ptr(x), _ptr(x), 2, 9, 0, comm.size(), 0)  # no such root
    with pytest.raises(nccl.NcclError):
        nccl.groupEnd()
    monkeypatch.setenv("FAKE_CUPY_NCCL_VERSION", "20903")  # before 2.10: no avg, no bfloat16
    assert nccl.get_version() == 20903
    for datatype, op in ((9, 0), (7, 4)):
        with pytest.raises(nccl.NcclError):
            comm.allReduce(_ptr(x), _ptr(x), 1, datatype, op, 0)


def test_fcoll_all_reduce_runs_on_the_fake_nccl(cp: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """End to end through fcoll's NCCL path, on a group of its own (destroyed afterwards)."""
    monkeypatch.setenv("FCOLL_GPU_TRANSPORT", "nccl")
    group = fc.world().split(color=0)
    cp.cuda.Device(fc.get_rank()).use()  # one device per rank, as NCCL needs (fcoll checks)
    try:
        y = fc.all_reduce(cp.asarray(np.full(3, fc.get_rank() + 1, np.float32)), group=group)
        n = fc.get_world_size()
        assert isinstance(y, cp.ndarray) and cp.asnumpy(y).tolist() == [n * (n + 1) / 2] * 3
        assert isinstance(group.nccl, fake_cupy.NcclCommunicator)
    finally:
        group.destroy()
