"""torch tensors and JAX arrays (CPU) through the collectives: each call's result equals the
numpy call's bit for bit, with the input's array type, on three groups at any world size
(issue 16, first part: `fcoll.dispatch.interop`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import ml_dtypes
import numpy as np
import pytest

import fcoll as fc
from tests.conftest import G
from tests.helpers import BF16, data, reduce_error

KINDS = ["torch", "jax"]
TORCH_DTYPES = ["bool", "int8", "int16", "int32", "int64", "uint8", "float16", "bfloat16",
                "float32", "float64", "complex64", "complex128"]
JAX_DTYPES = ["bool", "int8", "int16", "int32", "uint8", "uint16", "uint32", "float16",
              "bfloat16", "float32", "complex64"]  # 64-bit types need jax_enable_x64


@pytest.fixture(params=KINDS)
def kind(request: pytest.FixtureRequest) -> str:
    pytest.importorskip(request.param)
    return str(request.param)


def dtypes(kind: str) -> list[str]:
    return TORCH_DTYPES if kind == "torch" else JAX_DTYPES


def to_kind(a: np.ndarray, kind: str) -> Any:
    """A tensor/array of ``kind`` holding ``a``'s values (a copy)."""
    if kind == "torch":
        import torch

        if a.dtype == BF16:
            return torch.from_numpy(a.view(np.int16).copy()).view(torch.bfloat16)
        return torch.from_numpy(a.copy())
    import jax.numpy as jnp

    return jnp.asarray(a)


def to_np(y: Any) -> np.ndarray:
    """``y``'s values as numpy (bfloat16 as ml_dtypes')."""
    if type(y).__module__.startswith("torch"):
        import torch

        if y.dtype == torch.bfloat16:
            return y.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
        return y.numpy()
    return np.asarray(y)


def same(kind: str, got: Any, expected: np.ndarray) -> None:
    """``got`` is of ``kind``, with ``expected``'s dtype, shape and bits."""
    modules = ("torch",) if kind == "torch" else ("jax", "jaxlib")
    assert type(got).__module__.split(".")[0] in modules, type(got)
    values = to_np(got)
    assert values.dtype == expected.dtype and values.shape == expected.shape, (values, expected)
    np.testing.assert_array_equal(values.reshape(-1).view(np.uint8),
                                  np.ascontiguousarray(expected).reshape(-1).view(np.uint8))


def _call(fn: Callable[[Any], Any], x: np.ndarray, kind: str) -> tuple[Any, Any]:
    """``fn`` on numpy ``x`` and on its ``kind`` twin; the errors they raise instead. Each
    input's bytes are the same after the call (fcoll never writes its inputs)."""
    results = []
    before = x.tobytes()
    for arg in (x, to_kind(x, kind)):
        try:
            results.append(fn(arg))
        except (TypeError, ValueError, NotImplementedError) as error:
            results.append(type(error))
        assert to_np(arg).tobytes() == before, f"{fn} wrote its input"
    return results[0], results[1]


REDUCTIONS: dict[str, Callable[[str, G], Callable[[Any], Any]]] = {
    "all_reduce": lambda op, g: lambda x: fc.all_reduce(x, op, group=g.arg),
    "reduce_scatter_tensor": lambda op, g: lambda x: fc.reduce_scatter_tensor(x, op, group=g.arg),
    "reduce": lambda op, g: lambda x: fc.reduce(x, 0, op, group=g.arg),
}


@pytest.mark.parametrize("name", list(REDUCTIONS))
@pytest.mark.parametrize("op", ["sum", "avg", "max", "bxor"])
def test_reductions_equal_the_numpy_call(kind: str, group: G, name: str, op: str) -> None:
    for dtype in dtypes(kind):
        x = data(group.rank, (2 * group.size, 3), np.dtype(BF16 if dtype == "bfloat16" else dtype))
        want, got = _call(REDUCTIONS[name](op, group), x, kind)
        if isinstance(want, type):  # numpy refuses this (dtype, op): so must the tensor call
            assert got is want and want is reduce_error(x.dtype, op), (dtype, op, want, got)
        elif want is None:
            assert got is None  # reduce: not the root
        else:
            same(kind, got, want)


MOVEMENT: dict[str, Callable[[G], Callable[[Any], Any]]] = {
    "broadcast": lambda g: lambda x: fc.broadcast(x, src=g.size - 1, group=g.arg),
    "all_gather_into_tensor": lambda g: lambda x: fc.all_gather_into_tensor(x, group=g.arg),
    "all_gather_into_tensor dim 1": lambda g: lambda x: fc.all_gather_into_tensor(
        x, group=g.arg, gather_dim=1),
    "all_to_all_single": lambda g: lambda x: fc.all_to_all_single(x, group=g.arg),
    "all_gather": lambda g: lambda x: fc.all_gather(x, g.arg),
    "gather": lambda g: lambda x: fc.gather(x, 0, g.arg),
}


@pytest.mark.parametrize("name", list(MOVEMENT))
def test_data_movement_equals_the_numpy_call_bit_for_bit(kind: str, group: G, name: str) -> None:
    for dtype in dtypes(kind):
        x = data(group.rank, (group.size, 2), np.dtype(BF16 if dtype == "bfloat16" else dtype), 3)
        want, got = _call(MOVEMENT[name](group), x, kind)
        if isinstance(want, list):
            assert isinstance(got, list) and len(got) == len(want)
            for w, y in zip(want, got, strict=True):
                same(kind, y, w)
        elif want is None:
            assert got is None
        else:
            same(kind, got, want)


def test_coalesced_and_async_forms(kind: str, group: G) -> None:
    xs = [data(group.rank, (group.size, 2), np.float32, i) for i in range(3)]
    ts = [to_kind(x, kind) for x in xs]
    for fn in (fc.all_reduce_coalesced, fc.all_gather_into_tensor_coalesced,
               fc.reduce_scatter_tensor_coalesced):
        for w, y in zip(fn(xs, group=group.arg), fn(ts, group=group.arg), strict=True):
            same(kind, y, w)
    work = fc.all_reduce(ts[0], group=group.arg, async_op=True)
    same(kind, work.wait(), fc.all_reduce(xs[0], group=group.arg))


def test_scatter_from_a_tensor_root(kind: str, group: G) -> None:
    chunks = [data(i, (2,), np.int32, 5) for i in range(group.size)]
    root = group.rank == 0
    got = fc.scatter([to_kind(c, kind) for c in chunks] if root else None, 0, group.arg)
    same(kind, got, chunks[group.rank])  # non-roots too: the root's type comes with the data


def test_inputs_are_untouched_and_may_be_non_contiguous(kind: str, group: G) -> None:
    base = data(group.rank, (4, 2 * group.size), np.float32, 7)
    x = to_kind(base, kind)
    y = fc.all_reduce(x.T, group=group.arg)  # torch: a strided view; JAX: a transpose
    same(kind, y, fc.all_reduce(np.ascontiguousarray(base.T), group=group.arg))
    np.testing.assert_array_equal(to_np(x), base)  # the input's values are unchanged


def test_zero_d_and_empty(kind: str, group: G) -> None:
    for shape in ((), (0,), (0, 3)):
        x = data(group.rank, shape, np.float32, 9)
        same(kind, fc.all_reduce(to_kind(x, kind), group=group.arg), fc.all_reduce(x, group=group.arg))


def test_requires_grad_is_read_and_passed_on(group: G) -> None:
    torch = pytest.importorskip("torch")
    w = torch.ones(3, requires_grad=True)
    y = fc.all_reduce(w * 2, group=group.arg)  # a non-leaf with a graph: gradients flow (test_autograd.py)
    assert y.requires_grad and y.grad_fn is not None and y.tolist() == [2.0 * group.size] * 3
    with torch.no_grad():
        assert not fc.all_reduce(w * 2, group=group.arg).requires_grad


def test_mixing_array_types_names_the_argument_before_sending(kind: str, group: G) -> None:
    x = to_kind(np.ones(2, np.float32), kind)
    with pytest.raises(TypeError, match=r"expected xs\[1\] to be a .* like the call's other arrays, "
                                        r"got numpy\.ndarray"):
        fc.all_reduce_coalesced([x, np.ones(2, np.float32)], group=group.arg)
    same(kind, fc.all_reduce(x, group=group.arg), np.full(2, group.size, np.float32))


LAX: dict[str, Callable[[int], Callable[[Any], Any]]] = {
    "psum": lambda n: lambda t: fc.lax.psum(t, "x"),
    "pmean": lambda n: lambda t: fc.lax.pmean(t, "x"),
    "pmax": lambda n: lambda t: fc.lax.pmax(t, "x"),
    "all_gather": lambda n: lambda t: fc.lax.all_gather(t, "x"),
    "all_gather tiled": lambda n: lambda t: fc.lax.all_gather(t, "x", tiled=True),
    "psum_scatter": lambda n: lambda t: fc.lax.psum_scatter(t, "x", tiled=True),
    "ppermute": lambda n: lambda t: fc.lax.ppermute(t, "x", [(i, (i + 1) % n) for i in range(n)]),
}


@pytest.mark.parametrize("name", list(LAX))
def test_lax_on_trees_of_tensors_gives_the_same_type_back(kind: str, world_size: int, rank: int,
                                                           name: str) -> None:
    tree = {"w": data(rank, (2 * world_size, 3), np.float32, 11),
            "b": [data(rank, (world_size,), np.float32, 12), data(rank, (world_size, 2), np.int32, 13)]}
    call = LAX[name](world_size)
    with fc.Mesh((world_size,), ("x",)):
        if name == "pmean":
            tree["b"] = tree["b"][:1]  # pmean takes floating leaves
        want = call(tree)
        got = call({"w": to_kind(tree["w"], kind), "b": [to_kind(b, kind) for b in tree["b"]]})
    same(kind, got["w"], want["w"])
    for g, w in zip(got["b"], want["b"], strict=True):
        same(kind, g, w)


def test_lax_refuses_a_tree_mixing_array_types(kind: str, world_size: int) -> None:
    with fc.Mesh((world_size,), ("x",)), pytest.raises(
            TypeError, match=r"psum: expected leaf \['b'\] to be a .* like leaf \['a'\], got numpy"):
        fc.lax.psum({"a": to_kind(np.ones(2, np.float32), kind), "b": np.ones(2)}, "x")


DP: dict[str, Callable[[G], Callable[[Any], Any]]] = {
    "average_gradients": lambda g: lambda t: fc.dp.average_gradients(t, g.arg, bucket_cap_mb=0),
    "average_parameters": lambda g: lambda t: fc.dp.average_parameters(t, g.arg),
    "broadcast_parameters": lambda g: lambda t: fc.dp.broadcast_parameters(t, g.size - 1, g.arg),
}


@pytest.mark.parametrize("name", list(DP))
def test_dp_on_trees_of_tensors_gives_the_same_type_back(kind: str, group: G, name: str) -> None:
    tree = {"w": data(group.rank, (3, 2), np.float32, 21), "b": [data(group.rank, (4,), np.float32, 22)],
            "h": data(group.rank, (2,), BF16, 23)}
    call = DP[name](group)
    want = call(tree)
    got = call({"w": to_kind(tree["w"], kind), "b": [to_kind(tree["b"][0], kind)],
                "h": to_kind(tree["h"], kind)})
    same(kind, got["w"], want["w"])
    same(kind, got["b"][0], want["b"][0])
    same(kind, got["h"], want["h"])


def test_dp_checks_tensor_parameters_and_refuses_mixed_trees(kind: str, group: G) -> None:
    params = {"w": to_kind(np.ones((2, 2), np.float32), kind)}
    fc.dp.check_parameters(params, group.arg)  # equal on every rank: no error
    with pytest.raises(TypeError, match=r"average_gradients: expected leaf \['b'\] to be a .* like "
                                        r"leaf \['a'\], got numpy\.ndarray"):
        fc.dp.average_gradients({"a": params["w"], "b": np.ones(2)}, group.arg)


def test_jax_64_bit_dtypes_under_enable_x64(group: G) -> None:
    jax = pytest.importorskip("jax")
    if not hasattr(jax, "enable_x64"):
        pytest.skip(f"jax {jax.__version__} has no enable_x64 context")
    with jax.enable_x64(True):
        for dtype in ("int64", "uint64", "float64", "complex128"):
            x = data(group.rank, (group.size, 2), np.dtype(dtype), 14)
            for fn in (REDUCTIONS["all_reduce"]("sum", group), MOVEMENT["all_gather_into_tensor"](group)):
                want, got = _call(fn, x, "jax")
                same("jax", got, want)
