"""cupy arrays on a GPU: NCCL (world size <= GPUs per node) and the MPI transport
(``FCOLL_GPU_TRANSPORT=mpi``, any world size on one GPU), against numpy references.

Skipped, with the reason, where cupy or a CUDA device is missing (as on CI).
``FCOLL_GPU_TRANSPORT=nccl`` or ``mpi`` when pytest starts tests that transport alone
(scripts/gpu-check.sh runs each); unset or ``auto``, both.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import pytest

import fcoll as fc
from tests.helpers import ALL_DTYPES, BF16, BITWISE, bits, data, reduce_error, reference, same_bits


def _gpu_reason() -> str | None:
    try:
        import cupy
    except Exception as error:
        return f"cupy not importable ({type(error).__name__})"
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as error:
        return f"no CUDA device ({type(error).__name__})"
    return None if count > 0 else "no CUDA device"


REASON = _gpu_reason()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(REASON is not None, reason=str(REASON))]
OPS = ["sum", "avg", "product", "min", "max", "band", "bor", "bxor"]


def _transports() -> list[str]:
    """``FCOLL_GPU_TRANSPORT=nccl`` or ``mpi`` when the session starts: that transport alone
    (scripts/gpu-check.sh runs each in turn); unset or ``auto``: both."""
    chosen = os.environ.get("FCOLL_GPU_TRANSPORT", "").strip().lower()
    return [chosen] if chosen in ("nccl", "mpi") else ["nccl", "mpi"]


def _local_size() -> int:
    from fcoll.runtime import mpi

    node = fc.world().comm("test").Split_type(mpi().COMM_TYPE_SHARED)
    try:
        return int(node.Get_size())
    finally:
        node.Free()


@pytest.fixture(scope="module", autouse=True)
def device() -> int:
    import fcoll.gpu

    return fcoll.gpu.use_local_device()


@pytest.fixture(params=_transports())
def transport(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    import cupy

    if request.param == "nccl":
        from fcoll.backends import nccl

        if not nccl.available():
            pytest.skip(f"no NCCL: {nccl.why_unavailable()}")
        if _local_size() > cupy.cuda.runtime.getDeviceCount():
            pytest.skip("NCCL needs one GPU per rank; more ranks than GPUs on this node")
    monkeypatch.setenv("FCOLL_GPU_TRANSPORT", request.param)
    return str(request.param)


def _cp(a: np.ndarray) -> Any:
    import cupy

    return cupy.asarray(a)


def _np(a: Any) -> np.ndarray:
    import cupy

    assert isinstance(a, cupy.ndarray), type(a)
    return cupy.asnumpy(a)


def _dtypes() -> list[np.dtype[Any]]:
    import cupy

    try:
        cupy.asarray(np.zeros(1, BF16))
    except Exception:
        return [d for d in ALL_DTYPES if d != BF16]  # this cupy cannot hold bfloat16
    return ALL_DTYPES


def _all_reduce_error(x: Any, op: str, group: Any) -> type[Exception] | None:
    """The type of what ``fc.all_reduce(x, op, group=group)`` raises, or None."""
    try:
        fc.all_reduce(x, op, group=group)
    except Exception as error:
        return type(error)
    return None


@pytest.mark.parametrize("op", OPS)
def test_all_reduce_every_dtype(transport, group, op):
    """Every dtype: numpy's values; for a pair fcoll refuses, exactly the error the numpy path
    raises (the documented one, `reduce_error`); on NCCL, `NotImplementedError` for bitwise
    ops on integers (docs/gpu.md, "Dtypes and ops on NCCL")."""
    for dtype in _dtypes():
        inputs = [data(r, (3, 2), dtype, salt=1) for r in range(group.size)]
        x = _cp(inputs[group.rank])
        documented = reduce_error(dtype, op)
        if documented is not None:
            on_host = _all_reduce_error(inputs[group.rank], op, group.arg)
            on_device = _all_reduce_error(x, op, group.arg)
            assert on_host is documented and on_device is documented, (
                dtype, op, documented, on_host, on_device)
            continue
        if transport == "nccl" and op in BITWISE and dtype != np.bool_:
            with pytest.raises(NotImplementedError, match=f"NCCL has no {op} reduction for {dtype}"):
                fc.all_reduce(x, op, group=group.arg)
            continue
        want = reference(inputs, op)
        got = _np(fc.all_reduce(x, op, group=group.arg))
        assert got.dtype == dtype and got.shape == (3, 2)
        if op == "avg":
            np.testing.assert_allclose(got.astype(complex), want.astype(complex), rtol=1e-2)
        else:
            assert np.array_equal(got, want), (dtype, op, got, want)
        assert np.array_equal(_np(x), inputs[group.rank])  # input untouched


@pytest.mark.parametrize("shape", [(), (0,), (4, 6)])
def test_all_reduce_shapes_and_non_contiguous(transport, group, shape):
    inputs = [data(r, shape, "float32") for r in range(group.size)]
    got = _np(fc.all_reduce(_cp(inputs[group.rank]), group=group.arg))
    assert got.shape == shape and np.array_equal(got, reference(inputs, "sum"))
    if shape == (4, 6):
        x = _cp(inputs[group.rank]).T[::2]
        got = _np(fc.all_reduce(x, "max", group=group.arg))
        assert np.array_equal(got, reference([a.T[::2] for a in inputs], "max"))


def test_premul_sum(transport, group):
    inputs = [data(r, 5, "float64") for r in range(group.size)]
    got = _np(fc.all_reduce(_cp(inputs[group.rank]), fc.premul_sum(0.5), group=group.arg))
    assert np.allclose(got, sum(0.5 * a for a in inputs))


def test_reduce_and_reduce_scatter(transport, group):
    n = group.size
    inputs = [data(r, (2 * n, 3), "int32") for r in range(n)]
    x = _cp(inputs[group.rank])
    y = fc.reduce(x, dst=n - 1, group=group.arg)
    if group.rank == n - 1:
        assert np.array_equal(_np(y), reference(inputs, "sum"))
    else:
        assert y is None
    want = reference(inputs, "sum")
    got = _np(fc.reduce_scatter_tensor(x, group=group.arg))
    assert np.array_equal(got, want[2 * group.rank : 2 * group.rank + 2])
    got = _np(fc.reduce_scatter_tensor(_cp(np.ascontiguousarray(inputs[group.rank].T)),
                                       group=group.arg, scatter_dim=1))
    assert np.array_equal(got, want.T[:, 2 * group.rank : 2 * group.rank + 2])
    chunks = [_cp(data(group.rank, p + 1, "float32", salt=p)) for p in range(n)]
    got = _np(fc.reduce_scatter(chunks, group=group.arg))
    mine = [data(r, group.rank + 1, "float32", salt=group.rank) for r in range(n)]
    assert np.array_equal(got, reference(mine, "sum"))


def test_movement_is_bit_exact(transport, group):
    n, me = group.size, group.rank
    for dtype in _dtypes():
        xs = [bits(r, (2, 3), dtype) for r in range(n)]
        got = _np(fc.broadcast(_cp(xs[me]), src=n - 1, group=group.arg))
        assert same_bits(got, xs[n - 1])
        got = _np(fc.all_gather_into_tensor(_cp(xs[me]), group=group.arg))
        assert same_bits(got, np.concatenate(xs))
        got = _np(fc.all_gather_into_tensor(_cp(xs[me]), group=group.arg, gather_dim=1))
        assert same_bits(got, np.concatenate(xs, axis=1))


def test_uneven_gather_and_all_to_all(transport, group):
    n, me = group.size, group.rank
    xs = [data(r, (r + 1, 2), "int64") for r in range(n)]
    got = _np(fc.all_gather_into_tensor(_cp(xs[me]), group=group.arg, sizes="auto"))
    assert np.array_equal(got, np.concatenate(xs))
    ys = [_np(y) for y in fc.all_gather(_cp(xs[me]), group=group.arg)]
    assert all(np.array_equal(a, b) for a, b in zip(ys, xs, strict=True))
    ins = [(me + p) % 3 for p in range(n)]
    x = _cp(data(me, (sum(ins), 2), "float32"))
    got = _np(fc.all_to_all_single(x, input_split_sizes=ins, group=group.arg))
    parts = []
    for p in range(n):
        theirs = [(p + q) % 3 for q in range(n)]
        start = sum(theirs[:me])
        parts.append(data(p, (sum(theirs), 2), "float32")[start : start + theirs[me]])
    assert np.array_equal(got, np.concatenate(parts))
    even = _cp(data(me, (2 * n,), "uint8"))
    got = _np(fc.all_to_all_single(even, group=group.arg))
    assert np.array_equal(got, np.concatenate([data(p, (2 * n,), "uint8")[2 * me : 2 * me + 2]
                                               for p in range(n)]))


def test_list_forms(transport, group):
    n, me = group.size, group.rank
    chunks = [_cp(data(me, p + 1, "float16", salt=p)) for p in range(n)]
    got = [_np(y) for y in fc.all_to_all(chunks, group=group.arg)]
    assert all(np.array_equal(got[p], data(p, me + 1, "float16", salt=me)) for p in range(n))
    gathered = fc.gather(_cp(data(me, 3, "int8")), dst=0, group=group.arg)
    if me == 0:
        assert all(np.array_equal(_np(g), data(p, 3, "int8")) for p, g in enumerate(gathered))
    else:
        assert gathered is None
    mine = [_cp(data(p, 2, "complex64")) for p in range(n)] if me == 0 else None
    got = _np(fc.scatter(mine, src=0, group=group.arg))
    assert np.array_equal(got, data(me, 2, "complex64"))


def test_coalesced_and_permute(transport, group):
    n, me = group.size, group.rank
    xs = [data(me, (n, 2), "float32"), data(me, (2 * n,), "int32")]
    got = [_np(y) for y in fc.all_reduce_coalesced([_cp(x) for x in xs], group=group.arg)]
    for i, y in enumerate(got):
        assert np.array_equal(y, reference([[data(r, (n, 2), "float32"), data(r, (2 * n,), "int32")][i]
                                            for r in range(n)], "sum"))
    got = [_np(y) for y in fc.all_gather_into_tensor_coalesced([_cp(x) for x in xs], group=group.arg)]
    assert np.array_equal(got[1], np.concatenate([data(r, (2 * n,), "int32") for r in range(n)]))
    got = [_np(y) for y in fc.reduce_scatter_tensor_coalesced([_cp(x) for x in xs], group=group.arg)]
    full = reference([data(r, (2 * n,), "int32") for r in range(n)], "sum")
    assert np.array_equal(got[1], full[2 * me : 2 * me + 2])
    y = _np(fc.permute_tensor(_cp(np.array([me])), [(r + 1) % n for r in range(n)], group=group.arg))
    assert y.tolist() == [(me - 1) % n]


def test_async_work_is_event_backed(transport, group):
    import cupy

    inputs = [data(r, 1000, "float32") for r in range(group.size)]
    work = fc.all_reduce(_cp(inputs[group.rank]), group=group.arg, async_op=True)
    assert isinstance(work, fc.Work)
    y = work.wait()
    cupy.cuda.get_current_stream().synchronize()
    assert work.is_completed() and np.array_equal(_np(y), reference(inputs, "sum"))


def test_stream_ordering_on_a_side_stream(transport, group):
    """The call is enqueued on the current (non-default) stream; after that stream
    synchronises, the result is right, and a kernel queued before the call is seen."""
    import cupy

    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        x = cupy.zeros(1 << 20, np.float32)
        x += group.rank + 1  # queued before the collective on the same stream
        y = fc.all_reduce(x, group=group.arg)
        z = fc.broadcast(y, src=0, group=group.arg)
    stream.synchronize()
    want = group.size * (group.size + 1) / 2
    assert float(_np(z)[0]) == want and float(_np(y)[-1]) == want


def test_results_live_on_the_input_device(transport, group, device):
    y = fc.all_reduce(_cp(np.ones(2)), group=group.arg)
    assert y.device.id == device
