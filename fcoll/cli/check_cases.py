"""The self-test of ``python -m fcoll check``: every public collective on small arrays.

Each check runs on every rank of the job, with inputs that depend on the rank, and
compares fcoll's result with the same computation done by numpy on all ranks' inputs
(which every rank can build locally). A check returns nothing on success and raises
`AssertionError` (or any other exception) on failure.

The checks run on numpy arrays, or on cupy arrays after `use_arrays` ("cupy"): inputs go
through `put` (to the current array type) and `same` then also requires results of that
type (a cupy array sent arrives as cupy), compared with the same numpy values. Checks in
`HOST_ONLY` take no arrays and run on numpy only.

Example:
    >>> use_arrays("cupy")           # this rank's GPU (fcoll.gpu.use_local_device)
    >>> CHECKS["broadcast"](rank, size)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import ml_dtypes
import numpy as np

import fcoll as fc

Check = Callable[[int, int], None]
CHECKS: dict[str, Check] = {}
HOST_ONLY: set[str] = set()  # checks without arrays: numpy only
ARRAYS = ("numpy", "cupy")
_N = 6  # elements per rank in most checks
_xp: Any = np  # the array module the checks run on (`use_arrays`)


def _case(name: str, *, host_only: bool = False) -> Callable[[Check], Check]:
    def register(fn: Check) -> Check:
        CHECKS[name] = fn
        if host_only:
            HOST_ONLY.add(name)
        return fn

    return register


def cupy_unavailable() -> str | None:
    """Why this process cannot run the checks on cupy arrays, or None when it can."""
    try:
        import cupy
    except Exception as error:
        return f"cupy not importable ({type(error).__name__}: {error})"
    try:
        count = int(cupy.cuda.runtime.getDeviceCount())
    except Exception as error:
        return f"no CUDA device ({type(error).__name__}: {error})"
    return None if count > 0 else "no CUDA device"


def use_arrays(kind: str) -> None:
    """Run the checks on ``kind`` arrays from now on: "numpy", or "cupy" on this rank's GPU
    (`fcoll.gpu.use_local_device`, collective over the job)."""
    global _xp
    if kind not in ARRAYS:
        raise ValueError(f"use_arrays: expected kind in {ARRAYS}, got {kind!r}")
    if kind == "numpy":
        _xp = np
        return
    import cupy

    import fcoll.gpu

    fcoll.gpu.use_local_device()
    _xp = cupy


def put(x: np.ndarray) -> Any:
    """``x`` as an array of the current type (numpy: ``x`` itself; cupy: a device copy)."""
    return x if _xp is np else _xp.asarray(x)


def _to_numpy(got: Any, what: str) -> np.ndarray:
    if _xp is np:
        assert isinstance(got, (np.ndarray, np.generic)), (
            f"{what}: expected a numpy array, got {type(got).__name__}")
        return np.asarray(got)
    assert isinstance(got, _xp.ndarray), (
        f"{what}: expected a {_xp.__name__}.ndarray, got {type(got).__module__}.{type(got).__name__}")
    return np.asarray(_xp.asnumpy(got))


def data(rank: int, dtype: Any = np.float64, n: int = _N) -> np.ndarray:
    """Rank ``rank``'s input: small values, distinct per rank, exact in every dtype."""
    return ((np.arange(n) % 3) + rank + 1).astype(dtype)


def same(got: Any, want: Any, what: str = "result", tol: float = 0.0) -> None:
    """Raise `AssertionError` unless ``got`` equals the numpy ``want`` (values, shape and
    dtype) and is an array of the current type (`use_arrays`)."""
    if want is None or got is None:
        assert got is None and want is None, f"{what}: expected {want!r}, got {got!r}"
        return
    got, want = _to_numpy(got, what), np.asarray(want)
    assert got.dtype == want.dtype, f"{what}: expected dtype {want.dtype}, got {got.dtype}"
    assert got.shape == want.shape, f"{what}: expected shape {want.shape}, got {got.shape}"
    if tol:
        ok = np.allclose(got.astype(np.float64), want.astype(np.float64), rtol=tol, atol=tol)
    else:
        ok = np.array_equal(got, want)
    assert ok, f"{what}: expected {want.tolist()}, got {got.tolist()}"


_NUMPY_OPS: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "sum": lambda s: s.sum(0),
    "avg": lambda s: s.mean(0),
    "product": lambda s: s.prod(0),
    "min": lambda s: s.min(0),
    "max": lambda s: s.max(0),
    "band": lambda s: np.bitwise_and.reduce(s, 0),
    "bor": lambda s: np.bitwise_or.reduce(s, 0),
    "bxor": lambda s: np.bitwise_xor.reduce(s, 0),
}
_HALF = (np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16))
_BITWISE = ("band", "bor", "bxor")


def reduced(size: int, op: str, dtype: Any) -> np.ndarray:
    """What numpy says ``op`` over every rank's `data` is (halves reduced in float32)."""
    dtype = np.dtype(dtype)
    stack = np.stack([data(r, dtype) for r in range(size)])
    if dtype in _HALF:
        return _NUMPY_OPS[op](stack.astype(np.float32)).astype(dtype)
    return _NUMPY_OPS[op](stack).astype(dtype)


def _all_reduce(op: str, dtype: Any) -> Check:
    def check(rank: int, size: int) -> None:
        tol = 1e-2 if np.dtype(dtype) in _HALF else 0.0
        try:
            got = fc.all_reduce(put(data(rank, dtype)), op)
        except NotImplementedError as error:
            # cupy arrays on NCCL, which has no bitwise ops: refused as docs/gpu.md says
            if _xp is np or op not in _BITWISE or "NCCL has no" not in str(error):
                raise
            return
        same(got, reduced(size, op, dtype), tol=tol)

    return check


for _op, _dtype in [("sum", "float64"), ("avg", "float64"), ("product", "float64"), ("min", "float64"),
                    ("max", "float64"), ("sum", "float32"), ("sum", "int64"), ("max", "int32"),
                    ("sum", "complex128"), ("sum", "float16"), ("sum", "bfloat16"),
                    ("band", "int32"), ("bor", "uint8"), ("bxor", "int64")]:
    _dt = ml_dtypes.bfloat16 if _dtype == "bfloat16" else _dtype
    _case(f"all_reduce {_op} {_dtype}")(_all_reduce(_op, _dt))


@_case("all_reduce sum bool")
def _all_reduce_bool(rank: int, size: int) -> None:
    flag = np.array([rank == 0, rank == size - 1, True, False])
    same(fc.all_reduce(put(flag)), np.array([True, True, True, False]))


@_case("reduce")
def _reduce(rank: int, size: int) -> None:
    dst = size - 1
    same(fc.reduce(put(data(rank)), dst=dst), reduced(size, "sum", np.float64) if rank == dst else None)


@_case("broadcast")
def _broadcast(rank: int, size: int) -> None:
    same(fc.broadcast(put(data(rank, np.int16)), src=size - 1), data(size - 1, np.int16))


@_case("all_gather_into_tensor")
def _all_gather_into_tensor(rank: int, size: int) -> None:
    x = put(data(rank).reshape(2, 3))
    want = np.concatenate([data(r).reshape(2, 3) for r in range(size)], axis=1)
    same(fc.all_gather_into_tensor(x, gather_dim=1), want)


@_case("all_gather_into_tensor sizes=auto")
def _all_gather_v(rank: int, size: int) -> None:
    want = np.concatenate([data(r, n=r + 1) for r in range(size)])
    same(fc.all_gather_into_tensor(put(data(rank, n=rank + 1)), sizes="auto"), want)


@_case("reduce_scatter_tensor")
def _reduce_scatter_tensor(rank: int, size: int) -> None:
    x = put(np.concatenate([data(rank + b) for b in range(size)]))
    want = sum(np.concatenate([data(r + b) for b in range(size)]) for r in range(size))
    same(fc.reduce_scatter_tensor(x), np.split(want, size)[rank])


@_case("all_to_all_single")
def _all_to_all_single(rank: int, size: int) -> None:
    x = put(np.arange(size * 2) + 100 * rank)  # block i (2 rows) goes to rank i
    want = np.concatenate([np.arange(2 * rank, 2 * rank + 2) + 100 * r for r in range(size)])
    same(fc.all_to_all_single(x), want)


@_case("all_to_all_single uneven splits")
def _all_to_all_single_v(rank: int, size: int) -> None:
    sends = [i + 1 for i in range(size)]  # every rank sends i+1 rows to rank i
    x = put(np.concatenate([np.full(k, 10 * rank + i) for i, k in enumerate(sends)]))
    want = np.concatenate([np.full(rank + 1, 10 * r + rank) for r in range(size)])
    same(fc.all_to_all_single(x, input_split_sizes=sends), want)


@_case("all_gather (list)")
def _all_gather(rank: int, size: int) -> None:
    got = fc.all_gather(put(data(rank, n=rank + 1)))
    assert len(got) == size, f"expected {size} arrays, got {len(got)}"
    for r, y in enumerate(got):
        same(y, data(r, n=r + 1), f"entry {r}")


@_case("gather (list)")
def _gather(rank: int, size: int) -> None:
    got = fc.gather(put(data(rank)), dst=0)
    if rank != 0:
        same(got, None)
        return
    assert got is not None and len(got) == size, f"expected {size} arrays, got {got!r}"
    for r, y in enumerate(got):
        same(y, data(r), f"entry {r}")


@_case("scatter (list)")
def _scatter(rank: int, size: int) -> None:
    chunks = [put(data(r, np.int32)) for r in range(size)] if rank == 0 else None
    same(fc.scatter(chunks, src=0), data(rank, np.int32))


@_case("reduce_scatter (list)")
def _reduce_scatter(rank: int, size: int) -> None:
    chunks = [put(data(rank + i, n=i + 1)) for i in range(size)]
    want = sum(data(r + rank, n=rank + 1) for r in range(size))
    same(fc.reduce_scatter(chunks), want)


@_case("all_to_all (list)")
def _all_to_all(rank: int, size: int) -> None:
    got = fc.all_to_all([put(np.full(i + 1, 10 * rank + i)) for i in range(size)])
    for r, y in enumerate(got):
        same(y, np.full(rank + 1, 10 * r + rank), f"entry {r}")


@_case("barrier", host_only=True)
def _barrier(rank: int, size: int) -> None:
    fc.barrier()


@_case("monitored_barrier", host_only=True)
def _monitored_barrier(rank: int, size: int) -> None:
    fc.monitored_barrier(timeout=30)


@_case("send/recv ring")
def _send_recv(rank: int, size: int) -> None:
    if size == 1:
        return
    right, left = (rank + 1) % size, (rank - 1) % size
    if rank % 2 == 0:
        fc.send(put(data(rank)), right)
        got = fc.recv(left)
    else:
        got = fc.recv(left)
        fc.send(put(data(rank)), right)
    same(got, data(left))


@_case("isend/irecv")
def _isend_irecv(rank: int, size: int) -> None:
    right, left = (rank + 1) % size, (rank - 1) % size
    receive = fc.irecv(left, tag=3)
    send = fc.isend(put(data(rank, np.float32, n=5000)), right, tag=3)  # past the inline limit
    same(receive.wait(), data(left, np.float32, n=5000))
    send.wait()


@_case("batch_isend_irecv")
def _batch(rank: int, size: int) -> None:
    right, left = (rank + 1) % size, (rank - 1) % size
    works = fc.batch_isend_irecv([fc.P2POp(fc.isend, put(data(rank)), right),
                                  fc.P2POp(fc.irecv, None, left)])
    same(fc.wait_all(works)[1], data(left))


@_case("permute_tensor")
def _permute(rank: int, size: int) -> None:
    shift = [(i + 1) % size for i in range(size)]
    same(fc.permute_tensor(put(data(rank)), shift), data((rank - 1) % size))


@_case("objects", host_only=True)
def _objects(rank: int, size: int) -> None:
    mine = {"rank": rank, "name": f"r{rank}"}
    assert fc.all_gather_object(mine) == [{"rank": r, "name": f"r{r}"} for r in range(size)]
    assert fc.broadcast_object(mine, src=size - 1) == {"rank": size - 1, "name": f"r{size - 1}"}
    gathered = fc.gather_object(rank * rank, dst=0)
    assert gathered == ([r * r for r in range(size)] if rank == 0 else None), gathered
    objs = [("to", r) for r in range(size)] if rank == 0 else None
    assert fc.scatter_object(objs, src=0) == ("to", rank)


@_case("coalesced")
def _coalesced(rank: int, size: int) -> None:
    xs = [put(data(rank)), put(data(rank, np.int32, n=2 * size))]
    total = sum(data(r, np.int32, n=2 * size) for r in range(size))
    got = fc.all_reduce_coalesced(xs)
    same(got[0], reduced(size, "sum", np.float64), "all_reduce_coalesced[0]")
    same(got[1], total, "all_reduce_coalesced[1]")
    gathered = fc.all_gather_into_tensor_coalesced(xs)
    same(gathered[1], np.concatenate([data(r, np.int32, n=2 * size) for r in range(size)]))
    scattered = fc.reduce_scatter_tensor_coalesced([xs[1]])
    same(scattered[0], np.split(total, size)[rank], "reduce_scatter_tensor_coalesced[0]")


@_case("async (Work)")
def _async(rank: int, size: int) -> None:
    x = put(data(rank))
    works = [fc.all_reduce(x, "max", async_op=True),
             fc.broadcast(x, src=0, async_op=True),
             fc.all_gather_into_tensor(x, async_op=True).then(lambda y: y.sum())]
    x += 1000  # inputs are snapshotted at the call (cupy: read in stream order)
    top, bcast, total = fc.wait_all(works, timeout=30)
    same(top, reduced(size, "max", np.float64), "all_reduce max")
    same(bcast, data(0), "broadcast")
    same(total, np.float64(sum(data(r).sum() for r in range(size))), "then(sum)")


@_case("subgroup (split)")
def _subgroup(rank: int, size: int) -> None:
    group = fc.world().split(color=rank % 2)
    try:
        members = [r for r in range(size) if r % 2 == rank % 2]
        want = sum(data(r) for r in members)
        same(fc.all_reduce(put(data(rank)), group=group), want)
    finally:
        group.destroy()
