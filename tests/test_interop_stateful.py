"""torch tensors and JAX arrays (CPU) through point-to-point messages and the stateful
`fcoll.dp.GradientAverager`: the receiver gets the sender's array type, the averager gives
back the gradients' type, bit for bit what the numpy calls give (issue 16)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import fcoll as fc
from tests.conftest import G
from tests.helpers import BF16, data
from tests.test_interop import dtypes, same, to_kind, to_np

KINDS = ["torch", "jax"]


@pytest.fixture(params=KINDS)
def kind(request: pytest.FixtureRequest) -> str:
    pytest.importorskip(request.param)
    return str(request.param)


def _dtype(name: str) -> np.dtype[Any]:
    return np.dtype(BF16 if name == "bfloat16" else name)


@pytest.mark.parametrize("elements", [3, 5000])  # in the header message, and after it
def test_ring_of_isend_irecv_delivers_the_senders_type(kind: str, group: G, elements: int) -> None:
    n, r = group.size, group.rank
    for name in dtypes(kind):
        mine = data(r, (elements,), _dtype(name), 31)
        x = to_kind(mine, kind)
        sent = fc.isend(x, (r + 1) % n, group.arg)
        got = fc.irecv((r - 1) % n, group.arg).wait()
        sent.wait()
        same(kind, got, data((r - 1) % n, (elements,), _dtype(name), 31))
        assert to_np(x).tobytes() == mine.tobytes()  # the input is untouched


def test_send_recv_of_non_contiguous_and_grad_tensors(kind: str, group: G) -> None:
    if group.size < 2:
        pytest.skip("a blocking send needs another rank")
    r, peer = group.rank, group.rank ^ 1
    if peer >= group.size:
        pytest.skip(f"rank {r} has no partner at world size {group.size}")
    base = data(r, (3, 4), np.float32, 32)
    x = to_kind(base, kind).T
    if kind == "torch":
        x = x.requires_grad_(True) * 1.0  # has a graph: read, not passed on
    if r % 2 == 0:
        fc.send(x, peer, group.arg)
        got = fc.recv(peer, group.arg)
    else:
        got = fc.recv(peer, group.arg)
        fc.send(x, peer, group.arg)
    same(kind, got, np.ascontiguousarray(data(peer, (3, 4), np.float32, 32).T))
    assert not getattr(got, "requires_grad", False)


def test_batch_isend_irecv_and_permute(kind: str, group: G) -> None:
    n, r = group.size, group.rank
    x = to_kind(data(r, (2, 2), np.int32, 33), kind)
    ops = [fc.P2POp(fc.isend, x, (r + 1) % n, group.arg), fc.P2POp(fc.irecv, None, (r - 1) % n, group.arg)]
    got = fc.wait_all(fc.batch_isend_irecv(ops))[1]
    same(kind, got, data((r - 1) % n, (2, 2), np.int32, 33))
    shifted = fc.permute_tensor(x, [(i + 1) % n for i in range(n)], group.arg)
    same(kind, shifted, data((r - 1) % n, (2, 2), np.int32, 33))


def _grads(rank: int, kind: str) -> dict[str, Any]:
    wide = np.float64 if kind == "torch" else np.float16  # JAX has float64 only with x64
    return {"w": data(rank, (3, 2), np.float32, 41), "b": [data(rank, (4,), wide, 42)],
            "h": data(rank, (5,), BF16, 43)}


def _like(tree: dict[str, Any], kind: str) -> dict[str, Any]:
    return {"w": to_kind(tree["w"], kind), "b": [to_kind(tree["b"][0], kind)],
            "h": to_kind(tree["h"], kind)}


def _same_tree(kind: str, got: dict[str, Any], want: dict[str, Any]) -> None:
    same(kind, got["w"], want["w"])
    same(kind, got["b"][0], want["b"][0])
    same(kind, got["h"], want["h"])


@pytest.mark.parametrize("compression", [None, "fp16"])
def test_gradient_averager_on_tensor_trees(kind: str, group: G, compression: str | None) -> None:
    grads = _grads(group.rank, kind)
    numpy_avg, avg = (fc.dp.GradientAverager(group.arg, bucket_cap_mb=0, compression=compression)
                      for _ in range(2))
    _same_tree(kind, avg(_like(grads, kind)), numpy_avg(grads))
    _same_tree(kind, avg.start(_like(grads, kind)).wait(), numpy_avg.start(grads).wait())
    with avg.no_sync(), numpy_avg.no_sync():  # a local sum, then an average of sums
        _same_tree(kind, avg(_like(grads, kind)), numpy_avg(grads))
    _same_tree(kind, avg(_like(grads, kind)), numpy_avg(grads))


def test_gradient_averager_push_and_wait(kind: str, group: G) -> None:
    grads = {f"g{i}": data(group.rank, (i + 1, 3), np.float32, 50 + i) for i in range(4)}
    numpy_avg, avg = fc.dp.GradientAverager(group.arg, bucket_cap_mb=0), \
        fc.dp.GradientAverager(group.arg, bucket_cap_mb=0)
    for key, grad in grads.items():
        avg.push(key, to_kind(grad, kind))
        numpy_avg.push(key, grad)
    got, want = avg.wait(), numpy_avg.wait()
    assert list(got) == list(want)
    for key in want:
        same(kind, got[key], want[key])


def test_gradient_averager_refuses_mixed_steps_before_sending(kind: str, group: G) -> None:
    avg = fc.dp.GradientAverager(group.arg)
    avg.push("a", to_kind(np.ones(2, np.float32), kind))
    with pytest.raises(TypeError, match=r"push: expected grad 'b' to be a .* like the gradients "
                                        r"before it, got numpy\.ndarray"):
        avg.push("b", np.ones(2, np.float32))
    with pytest.raises(TypeError, match=r"GradientAverager: expected leaf \['y'\] to be a .* like "
                                        r"leaf \['x'\], got numpy\.ndarray"):
        fc.dp.GradientAverager(group.arg)({"x": to_kind(np.ones(2), kind), "y": np.ones(2)})


def test_object_collectives_carry_tensors_by_pickle(kind: str, group: G) -> None:
    mine = {"x": to_kind(data(group.rank, (2,), np.float32, 60), kind), "rank": group.rank}
    got = fc.all_gather_object(mine, group.arg)
    assert [g["rank"] for g in got] == list(range(group.size))
    for i, g in enumerate(got):
        same(kind, g["x"], data(i, (2,), np.float32, 60))


def test_a_traced_jax_value_goes_through_lax_and_is_refused_by_array_collectives(
        world_size: int) -> None:
    jax = pytest.importorskip("jax")

    @jax.jit
    def traced(x: Any) -> Any:
        with fc.Mesh((world_size,), ("x",)):
            return fc.lax.psum({"w": x}, "x")["w"]  # a JAX primitive (tests/test_jit.py)

    assert np.asarray(traced(jax.numpy.ones(2))).tolist() == [world_size] * 2
    with pytest.raises(TypeError, match=r"all_reduce: expected x to be a concrete jax\.Array, "
                                        r"got a traced value .*fcoll\.lax"):
        jax.jit(lambda x: fc.all_reduce(x))(jax.numpy.ones(2))
