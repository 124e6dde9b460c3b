"""GPU logic that needs no GPU: dispatch, mixing errors, the NCCL dtype/op table (checked
against numpy by emulating each plan), transport validation and the CUDA-aware probe."""

from __future__ import annotations

import functools
import sys
import types
from typing import Any

import ml_dtypes
import numpy as np
import pytest

import fcoll as fc
from fcoll import dispatch
from fcoll.backends import mpi as host
from fcoll.backends import staged
from fcoll.backends.nccl import DATATYPES
from fcoll.dispatch import gpu_probe as _probe
from fcoll.dispatch import gpu_settings
from fcoll.policy.ops import NcclOp
from fcoll.policy.plan import V2_10, NcclPlan, nccl_plan
from tests.helpers import ALL_DTYPES, data, reference

AVG, MAX, MIN, PROD, SUM = NcclOp.AVG, NcclOp.MAX, NcclOp.MIN, NcclOp.PROD, NcclOp.SUM

OPS = ["sum", "avg", "product", "min", "max", "band", "bor", "bxor"]
_NUMPY = {SUM: np.add, PROD: np.multiply, MAX: np.maximum, MIN: np.minimum, AVG: np.add}


class FakeCupyArray:
    """Stands in for cupy.ndarray in dispatch checks only (never reaches a backend)."""


@pytest.fixture
def fake_cupy(monkeypatch: pytest.MonkeyPatch) -> type:
    module = types.ModuleType("cupy")
    module.ndarray = FakeCupyArray  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "cupy", module)
    for name in ("cupy.cuda", "cupy.cuda.nccl"):  # a real cupy's (or the stand-in's) hidden
        monkeypatch.setitem(sys.modules, name, None)
    from fcoll.backends import nccl

    monkeypatch.setattr(nccl, "_FOUND", [])  # a real cupy's NCCL, found earlier, is not this one's
    return FakeCupyArray


def test_numpy_arrays_go_to_mpi():
    x = np.ones(3)
    assert not dispatch.is_cupy(x) and dispatch.backend_for(x, None) is host
    assert dispatch.device(x, None) is None and dispatch.device_list([x, x], None, "f", "xs") is None
    assert not dispatch.any_cupy([x, x], "f", "xs") and not dispatch.any_cupy(None, "f", "xs")


def test_fake_cupy_array_is_recognised(fake_cupy):
    assert dispatch.is_cupy(fake_cupy()) and not dispatch.is_cupy(np.ones(1))
    assert dispatch.any_cupy([fake_cupy(), fake_cupy()], "f", "xs")


@pytest.mark.parametrize("call", [
    lambda a, b: fc.all_to_all([a, b] * 2, None),
    lambda a, b: fc.all_reduce_coalesced([a, b]),
    lambda a, b: fc.all_gather_into_tensor_coalesced([a, b]),
    lambda a, b: fc.reduce_scatter_tensor_coalesced([a, b]),
    lambda a, b: fc.reduce_scatter([a, b]),
])
@pytest.mark.parametrize("gpu_first", [True, False])
def test_mixing_numpy_and_cupy_raises_naming_the_entry(fake_cupy, call, gpu_first):
    a, b = (fake_cupy(), np.ones(2)) if gpu_first else (np.ones(2), fake_cupy())
    with pytest.raises(TypeError, match=r"\[(0|1)\].*cannot be mixed") as info:
        call(a, b)
    assert ("[1]" if gpu_first else "[0]") in str(info.value)


@pytest.mark.parametrize("value,expected", [(None, "auto"), ("", "auto"), ("MPI", "mpi"),
                                            ("nccl", "nccl"), (" auto ", "auto")])
def test_transport_values(monkeypatch, value, expected):
    if value is None:
        monkeypatch.delenv(dispatch.ENV, raising=False)
    else:
        monkeypatch.setenv(dispatch.ENV, value)
    assert dispatch.transport() == expected


def test_bad_transport_names_the_variable(monkeypatch):
    monkeypatch.setenv(dispatch.ENV, "gloo")
    with pytest.raises(ValueError, match=r"FCOLL_GPU_TRANSPORT: expected one of .*got 'gloo'"):
        dispatch.transport()


def test_forced_mpi_transport_never_loads_nccl(monkeypatch):
    if "cupy.cuda.nccl" in sys.modules:
        pytest.skip("cupy's NCCL was loaded before this test (a GPU machine, or the stand-in)")
    monkeypatch.setenv(dispatch.ENV, "mpi")
    monkeypatch.setenv(_probe.AWARE_ENV, "0")
    monkeypatch.setattr(gpu_settings, "_AWARE", [])
    assert dispatch.gpu_backend() is staged and "cupy.cuda.nccl" not in sys.modules


def test_cuda_aware_mpi_gets_device_buffers(monkeypatch, fake_cupy):
    from fcoll.backends import cuda_aware

    monkeypatch.setenv(dispatch.ENV, "mpi")
    monkeypatch.setattr(gpu_settings, "_AWARE", [True])
    assert dispatch.backend_for(fake_cupy(), None) is cuda_aware
    assert dispatch.device_list([fake_cupy()], None, "f", "xs") is cuda_aware


def test_nccl_required_but_missing_names_the_variable(monkeypatch, fake_cupy):
    monkeypatch.setenv(dispatch.ENV, "nccl")
    with pytest.raises(RuntimeError, match=r"FCOLL_GPU_TRANSPORT=nccl: expected cupy with NCCL"):
        dispatch.backend_for(fake_cupy(), None)


def test_cuda_aware_probe_does_not_crash(monkeypatch):
    monkeypatch.delenv(_probe.AWARE_ENV, raising=False)
    assert _probe.cuda_aware_mpi() in (False, None)  # no CUDA-aware MPI on CPU machines
    monkeypatch.setenv(_probe.AWARE_ENV, "1")
    assert _probe.cuda_aware_mpi() is True
    monkeypatch.setenv(_probe.AWARE_ENV, "0")
    assert _probe.cuda_aware_mpi() is False


def test_gpu_report_is_strings():
    report = _probe.gpu_report()
    assert "cupy" in report and all(isinstance(k, str) and isinstance(v, str) for k, v in report.items())


def _emulate(plan: NcclPlan, inputs: list[np.ndarray]) -> np.ndarray:
    """What NCCL computes under ``plan``: the plan's own ``wire``/``finish`` (run with numpy
    as the array module), and NCCL's reduction in between emulated in numpy."""
    wires = [plan.wire(x, np) for x in inputs]
    y = functools.reduce(_NUMPY[plan.op], wires).astype(plan.wire_dtype)
    if plan.op == AVG:  # ncclAvg divides on the device
        y = (y / np.asarray(len(inputs), plan.wire_dtype)).astype(plan.wire_dtype)
    return np.asarray(plan.finish(y, len(inputs), inputs[0].shape))


def _mpi_error(dtype: np.dtype[Any], op: str) -> type[Exception] | None:
    try:
        fc.all_reduce(np.zeros(1, dtype), op, group=[fc.get_rank()])
    except (TypeError, ValueError) as error:
        return type(error)
    return None


@pytest.mark.parametrize("version", [22105, 20903])
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
def test_nccl_plan_is_exact_or_refuses(dtype, op, version):
    """Every (dtype, op): the MPI path's errors, NotImplementedError, or the right values."""
    expected_error = _mpi_error(dtype, op)
    if expected_error is not None:
        with pytest.raises(expected_error):
            nccl_plan(dtype, op, version, "all_reduce")
        return
    if op in ("band", "bor", "bxor") and dtype != np.bool_:
        with pytest.raises(NotImplementedError, match=f"NCCL has no {op} reduction for {dtype}"):
            nccl_plan(dtype, op, version, "all_reduce")
        return
    plan = nccl_plan(dtype, op, version, "all_reduce")
    assert plan.wire_dtype in DATATYPES  # a dtype NCCL reduces natively
    assert plan.op != AVG or version >= V2_10
    assert str(plan.wire_dtype) != "bfloat16" or version >= V2_10
    for n in (1, 3):
        inputs = [data(r, (2, 3), dtype, salt=5) for r in range(n)]
        got, want = _emulate(plan, inputs), reference(inputs, op)
        assert got.dtype == want.dtype, (plan, got, want)
        if op == "avg":  # a division rounds: within one unit in the last place
            eps = float(ml_dtypes.finfo(plan.wire_dtype).eps)
            np.testing.assert_allclose(got.astype(complex), want.astype(complex), rtol=2 * eps)
        else:
            assert np.array_equal(got, want), (plan, got, want)


@pytest.mark.parametrize("dtype", ["float32", "complex64", "float16"])
def test_nccl_premul_sum_scales_then_sums(dtype):
    plan = nccl_plan(dtype, fc.premul_sum(0.5), 22105, "all_reduce")
    assert plan.op == SUM and plan.scale == 0.5
    inputs = [data(r, 4, dtype, salt=2) for r in range(3)]
    assert np.array_equal(_emulate(plan, inputs), sum(x * np.asarray(0.5, dtype) for x in inputs))


def test_native_plans():
    assert nccl_plan("float32", "sum", 22105, "f").native
    assert nccl_plan("float16", "avg", 22105, "f").native
    assert not nccl_plan("int16", "sum", 22105, "f").native


# Every public collective that routes cupy arrays, called with device-array arguments.
ROUTED: dict[str, Any] = {
    "all_reduce": lambda a, n: fc.all_reduce(a),
    "reduce": lambda a, n: fc.reduce(a),
    "reduce_scatter_tensor": lambda a, n: fc.reduce_scatter_tensor(a),
    "reduce_scatter": lambda a, n: fc.reduce_scatter([a] * n),
    "broadcast": lambda a, n: fc.broadcast(a),
    "all_gather_into_tensor": lambda a, n: fc.all_gather_into_tensor(a),
    "all_to_all_single": lambda a, n: fc.all_to_all_single(a),
    "all_gather": lambda a, n: fc.all_gather(a),
    "gather": lambda a, n: fc.gather(a),
    "all_to_all": lambda a, n: fc.all_to_all([a] * n),
    "all_reduce_coalesced": lambda a, n: fc.all_reduce_coalesced([a, a]),
    "reduce_scatter_tensor_coalesced": lambda a, n: fc.reduce_scatter_tensor_coalesced([a]),
    "all_gather_into_tensor_coalesced": lambda a, n: fc.all_gather_into_tensor_coalesced([a]),
    "permute_tensor": lambda a, n: fc.permute_tensor(a, list(range(n))),
    "sendrecv": lambda a, n: fc.sendrecv(a, fc.get_rank(), fc.get_rank()),
    "halo_exchange": lambda a, n: fc.halo_exchange(a, fc.Mesh((n,), ("x",)), 1),
}


@pytest.mark.parametrize("name", sorted(ROUTED))
def test_every_routed_function_reaches_the_chosen_backend(monkeypatch, fake_cupy, name):
    from fcoll.gpu import route

    chosen, seen = object(), []
    monkeypatch.setattr(dispatch, "gpu_backend", lambda group=None: chosen)
    monkeypatch.setattr(route, "run", lambda backend, routed, numpy_fn, *args, **kwargs:
                        seen.append((backend, routed, numpy_fn)) or "routed")
    assert ROUTED[name](fake_cupy(), fc.get_world_size()) == "routed"
    assert seen == [(chosen, name, getattr(fc, name))]


def test_scatter_of_device_arrays_reaches_the_chosen_backend(monkeypatch, fake_cupy):
    from fcoll.gpu import route

    chosen, seen = object(), []
    monkeypatch.setattr(dispatch, "gpu_backend", lambda group=None: chosen)
    monkeypatch.setattr(route, "scatter", lambda backend, chunks, src, group, sent_as="":
                        seen.append((backend, len(chunks), src)) or "routed")
    n = fc.get_world_size()
    assert fc.scatter([fake_cupy()] * n, src=0, group=[fc.get_rank()]) == "routed"
    assert seen == [(chosen, n, 0)]


def test_route_tables_name_only_routed_collectives():
    from fcoll.gpu import route

    assert set(route.NCCL) == set(ROUTED)
    assert set(route.AWARE) <= set(ROUTED) and route.TABLES["staged"] == {}


@pytest.mark.parametrize("answer", ["direct", NotImplemented])
def test_route_falls_back_to_staging(monkeypatch, answer):
    """A backend's function answers, or says NotImplemented and the call is staged."""
    from fcoll.backends import cuda_aware
    from fcoll.gpu import route

    monkeypatch.setitem(route.AWARE, "broadcast", lambda backend, *args, **kwargs: answer)
    monkeypatch.setattr(route.staged, "run", lambda numpy_fn, *args, **kwargs: ("staged", numpy_fn))
    got = route.run(cuda_aware, "broadcast", fc.broadcast, "x")
    assert got == ("direct" if answer == "direct" else ("staged", fc.broadcast))
    assert route.run(staged, "broadcast", fc.broadcast, "x") == ("staged", fc.broadcast)
