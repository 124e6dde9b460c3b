"""Gradients through the collectives on torch tensors (issue 28, `fcoll.torch.autograd`).

Each rank's loss is ``sum(c_r * y_r)`` with weights ``c_r`` known to every rank, so the
gradient of the sum of every rank's loss is computed here in numpy from rank and size, and
compared with what ``backward()`` leaves in ``x.grad``; on three groups at any world size.
`torch.autograd.gradcheck` then checks each op in float64 against finite differences of the
whole job's function (every rank's input stacked, replicated on every rank)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import fcoll as fc
from tests.conftest import G

torch = pytest.importorskip("torch")
import fcoll.torch as ft  # noqa: E402  (after importorskip: it imports torch)


def value(r: int, shape: tuple[int, ...], salt: int = 0) -> np.ndarray:
    return np.random.default_rng([salt, r]).standard_normal(shape)


def leaf(r: int, shape: tuple[int, ...]) -> Any:
    return torch.tensor(value(r, shape), requires_grad=True)


def loss_grad(g: G, shape: tuple[int, ...], fn: Callable[[Any], Any],
              out_shape: tuple[int, ...]) -> np.ndarray:
    """``x.grad`` after ``backward()`` of this rank's loss ``sum(c_r * fn(x))``."""
    x = leaf(g.rank, shape)
    y = fn(x)
    assert y.grad_fn is not None and tuple(y.shape) == out_shape
    (torch.tensor(value(g.rank, out_shape, salt=1)) * y).sum().backward()
    return x.grad.numpy()


def c(r: int, shape: tuple[int, ...]) -> np.ndarray:
    """Rank ``r``'s loss weights (``value`` with salt 1, as `loss_grad` uses)."""
    return value(r, shape, salt=1)


@pytest.mark.parametrize("op", ["sum", "avg", "premul"])
def test_all_reduce(group: G, op: str) -> None:
    n, shape = group.size, (2, 3)
    arg = fc.premul_sum(0.5) if op == "premul" else op
    got = loss_grad(group, shape, lambda x: fc.all_reduce(x, arg, group.arg), shape)
    factor = {"sum": 1.0, "avg": 1.0 / n, "premul": 0.5}[op]
    np.testing.assert_allclose(got, factor * sum(c(r, shape) for r in range(n)))


@pytest.mark.parametrize("dim", [0, 1, -1])
def test_all_gather_into_tensor(group: G, dim: int) -> None:
    n, shape = group.size, (2, 3)
    out = tuple(s * n if i == dim % 2 else s for i, s in enumerate(shape))
    got = loss_grad(group, shape,
                    lambda x: fc.all_gather_into_tensor(x, group.arg, gather_dim=dim), out)
    blocks = [np.split(c(r, out), n, axis=dim)[group.rank] for r in range(n)]
    np.testing.assert_allclose(got, sum(blocks))


@pytest.mark.parametrize("sizes", ["list", "auto"])
def test_all_gather_uneven(group: G, sizes: str) -> None:
    n = group.size
    lengths = [r % 3 + 1 for r in range(n)]  # 1, 2, 3, 1: every length differs somewhere
    shape, out = (3, lengths[group.rank]), (3, sum(lengths))
    arg = lengths if sizes == "list" else "auto"
    got = loss_grad(group, shape,
                    lambda x: fc.all_gather_into_tensor(x, group.arg, gather_dim=1, sizes=arg), out)
    start = sum(lengths[: group.rank])
    expected = sum(c(r, out)[:, start : start + lengths[group.rank]] for r in range(n))
    np.testing.assert_allclose(got, expected)


@pytest.mark.parametrize(("op", "dim"), [("sum", 0), ("avg", 1), ("premul", -1)])
def test_reduce_scatter_tensor(group: G, op: str, dim: int) -> None:
    n = group.size
    shape = (2 * n, 3 * n)
    out = tuple(s // n if i == dim % 2 else s for i, s in enumerate(shape))
    arg = fc.premul_sum(-2.0) if op == "premul" else op
    got = loss_grad(group, shape,
                    lambda x: fc.reduce_scatter_tensor(x, arg, group.arg, scatter_dim=dim), out)
    factor = {"sum": 1.0, "avg": 1.0 / n, "premul": -2.0}[op]
    np.testing.assert_allclose(got, factor * np.concatenate([c(r, out) for r in range(n)], axis=dim))


def sends(s: int, r: int) -> int:
    """Rows rank ``s`` sends to rank ``r`` in the uneven all-to-all test (0 included)."""
    return (s + 2 * r) % 3


@pytest.mark.parametrize("splits", ["even", "both", "input only", "output only"])
def test_all_to_all_single(group: G, splits: str) -> None:
    n, me = group.size, group.rank
    ins = [sends(me, r) for r in range(n)] if splits in ("both", "input only") else [2] * n
    outs = [sends(s, me) for s in range(n)] if splits in ("both", "input only") else [2] * n
    args = {"even": (None, None), "both": (outs, ins), "input only": (None, ins),
            "output only": (outs, None)}[splits]
    got = loss_grad(group, (sum(ins), 2),
                    lambda x: fc.all_to_all_single(x, *args, group=group.arg), (sum(outs), 2))
    # rows of rank r's output that came from this rank, in the order this rank sent them
    parts = []
    for r in range(n):
        received = [sends(s, r) for s in range(n)] if splits in ("both", "input only") else [2] * n
        start = sum(received[:me])
        parts.append(c(r, (sum(received), 2))[start : start + received[me]])
    np.testing.assert_allclose(got, np.concatenate(parts))


def test_broadcast(group: G) -> None:
    n, shape = group.size, (3,)
    src = n - 1
    got = loss_grad(group, shape, lambda x: fc.broadcast(x, src, group.arg), shape)
    expected = sum(c(r, shape) for r in range(n)) if group.rank == src else np.zeros(shape)
    np.testing.assert_allclose(got, expected)


@pytest.mark.parametrize("pattern", ["shift", "partial"])
def test_permute_tensor(group: G, pattern: str) -> None:
    n, shape = group.size, (2,)
    src_dst: list[int | None] = [(i + 1) % n for i in range(n)]
    if pattern == "partial":  # rank 0 sends nothing; its target receives zeros
        src_dst[0] = None
    got = loss_grad(group, shape, lambda x: fc.permute_tensor(x, src_dst, group.arg), shape)
    dst = src_dst[group.rank]
    np.testing.assert_allclose(got, np.zeros(shape) if dst is None else c(dst, shape))


def test_copy_to_group_and_reduce_from_group(group: G) -> None:
    n, shape = group.size, (3,)
    x = torch.tensor(value(0, shape), requires_grad=True)  # replicated: the same on every rank
    h = ft.copy_to_group(x, group.arg)
    assert torch.equal(h, x) and h.data_ptr() != x.data_ptr()
    (torch.tensor(c(group.rank, shape)) * h).sum().backward()  # rank r's partial loss
    np.testing.assert_allclose(x.grad.numpy(), sum(c(r, shape) for r in range(n)))
    z = leaf(group.rank, shape)
    y = ft.reduce_from_group(z, group.arg)
    np.testing.assert_allclose(y.detach().numpy(), sum(value(r, shape) for r in range(n)))
    (torch.tensor(c(0, shape)) * y).sum().backward()  # one loss, replicated on every rank
    np.testing.assert_allclose(z.grad.numpy(), c(0, shape))


def whole_job(g: G, op: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """The job's function of every rank's input ``X`` (stacked, the same on every rank) to
    every rank's output (stacked): rank r runs ``op`` on ``X[r]``, and the outputs are
    summed into their slots (replicated convention), so finite differences taken on every
    rank in lockstep see the same function that backward differentiates."""
    def f(stacked: Any) -> Any:
        y = op(ft.copy_to_group(stacked, g.arg)[g.rank])
        slots = torch.zeros((g.size, *y.shape), dtype=y.dtype, device=y.device)
        slots[g.rank] = y
        return ft.reduce_from_group(slots, g.arg)
    return f


GRADCHECK: dict[str, tuple[tuple[int, ...], Callable[[Any, G], Any]]] = {
    "all_reduce sum": ((2,), lambda x, g: fc.all_reduce(x, "sum", g.arg)),
    "all_reduce avg": ((2,), lambda x, g: fc.all_reduce(x, "avg", g.arg)),
    "all_reduce premul_sum": ((2,), lambda x, g: fc.all_reduce(x, fc.premul_sum(3.0), g.arg)),
    "all_gather_into_tensor": ((2, 2), lambda x, g: fc.all_gather_into_tensor(x, g.arg, gather_dim=1)),
    "reduce_scatter_tensor": ((4, 3), lambda x, g: fc.reduce_scatter_tensor(
        x.repeat(g.size, 1), "avg", g.arg)),
    "all_to_all_single": ((4, 2), lambda x, g: fc.all_to_all_single(
        x.repeat(g.size, 1), group=g.arg)),
    "broadcast": ((3,), lambda x, g: fc.broadcast(x, 0, g.arg)),
    "permute_tensor": ((2,), lambda x, g: fc.permute_tensor(
        x, [(i + 1) % g.size for i in range(g.size)], g.arg)),
}


@pytest.mark.parametrize("name", GRADCHECK)
def test_gradcheck(group: G, name: str) -> None:
    shape, op = GRADCHECK[name]
    stacked = torch.tensor(value(7, (group.size, *shape)), requires_grad=True)
    assert torch.autograd.gradcheck(whole_job(group, lambda x: op(x, group)), (stacked,))


def test_gradcheck_complex(group: G) -> None:
    stacked = torch.tensor(value(7, (group.size, 2)) + 1j * value(8, (group.size, 2)),
                           requires_grad=True)
    op = fc.premul_sum(0.5 - 2j)
    assert torch.autograd.gradcheck(whole_job(group, lambda x: fc.all_reduce(x, op, group.arg)),
                                    (stacked,))


def test_shapes_zero_d_empty_and_non_contiguous(group: G) -> None:
    n = group.size
    x = torch.tensor(2.0 + group.rank, dtype=torch.float64, requires_grad=True)
    y = fc.all_reduce(x, group=group.arg)
    assert y.shape == () and float(y.detach()) == sum(2.0 + r for r in range(n))
    y.backward()
    assert x.grad.shape == () and float(x.grad) == n
    gathered = fc.all_gather_into_tensor(x, group.arg)  # 0-d gathers to (n,)
    assert gathered.shape == (n,)
    gathered.sum().backward()
    assert float(x.grad) == 2 * n
    empty = torch.zeros((0, 3), requires_grad=True)
    fc.all_gather_into_tensor(empty, group.arg, gather_dim=1).sum().backward()
    assert empty.grad.shape == (0, 3)
    base = torch.tensor(value(group.rank, (3, 2)), requires_grad=True)
    t = base.t()  # non-contiguous
    out = fc.all_gather_into_tensor(t, group.arg, gather_dim=1)
    (out * torch.tensor(c(group.rank, (2, 3 * n)))).sum().backward()
    expected = sum(c(r, (2, 3 * n))[:, 3 * group.rank : 3 * group.rank + 3] for r in range(n))
    np.testing.assert_allclose(base.grad.numpy(), expected.T)


def test_double_backward(group: G) -> None:
    n = group.size
    x = leaf(group.rank, (2,))
    y = fc.all_reduce(x, group=group.arg)  # S = sum_s x_s on every rank
    (gx,) = torch.autograd.grad((y * y).sum(), x, create_graph=True)  # all_reduce(2S) = 2nS
    assert gx.grad_fn is not None
    np.testing.assert_allclose(gx.detach().numpy(), 2 * n * sum(value(r, (2,)) for r in range(n)))
    gx.sum().backward()  # the sum over ranks of sum(2nS) is 2n^2 sum(S)
    np.testing.assert_allclose(x.grad.numpy(), np.full(2, 2.0 * n * n))


NO_GRADIENT: dict[str, Callable[[Any, G], Any]] = {
    "all_reduce max": lambda x, g: fc.all_reduce(x, "max", g.arg),
    "all_reduce product": lambda x, g: fc.all_reduce(x, "product", g.arg),
    "reduce_scatter_tensor min": lambda x, g: fc.reduce_scatter_tensor(
        x.repeat(g.size), "min", g.arg),
    "reduce": lambda x, g: fc.reduce(x, 0, "sum", g.arg),
    "gather": lambda x, g: fc.gather(x, 0, g.arg),
    "all_gather": lambda x, g: fc.all_gather(x, g.arg),
    "all_to_all": lambda x, g: fc.all_to_all([x] * g.size, g.arg),
    "reduce_scatter": lambda x, g: fc.reduce_scatter([x] * g.size, "sum", g.arg),
    "all_reduce_coalesced": lambda x, g: fc.all_reduce_coalesced([x], "sum", g.arg),
    "all_reduce async_op": lambda x, g: fc.all_reduce(x, group=g.arg, async_op=True),
    "all_reduce logaddexp": lambda x, g: fc.all_reduce(x, np.logaddexp, g.arg),
    "scan": lambda x, g: fc.scan(x, group=g.arg),
    "exscan": lambda x, g: fc.exscan(x, group=g.arg),
    "maxloc": lambda x, g: fc.maxloc(x, group=g.arg),
}


@pytest.mark.parametrize("name", NO_GRADIENT)
def test_ops_without_gradient_raise_at_the_call(group: G, name: str) -> None:
    x = torch.ones(2, requires_grad=True)
    fn = name.split()[0]
    with pytest.raises(NotImplementedError, match=f"^{fn}: expected .*(grad|async_op=False)"):
        NO_GRADIENT[name](x, group)
    with torch.no_grad():  # no grad mode: the plain collective
        y = NO_GRADIENT[name](x, group)
    if isinstance(y, fc.Work):
        y = y.wait()
    assert y is None or isinstance(y, (list, tuple, torch.Tensor))
    assert fc.all_reduce(torch.ones(1), group=group.arg).item() == group.size  # nothing left over


def test_invalid_arguments_keep_their_errors(group: G) -> None:
    x = torch.ones(2, requires_grad=True)
    with pytest.raises(ValueError, match="all_reduce: expected op in"):
        fc.all_reduce(x, "nope", group.arg)
    with pytest.raises(ValueError, match="gather_dim"):
        fc.all_gather_into_tensor(x, group.arg, gather_dim=3)
    with pytest.raises(TypeError, match=r"copy_to_group: expected x to be a torch\.Tensor"):
        ft.copy_to_group(np.ones(2), group.arg)


def test_non_members_raise_value_error() -> None:
    if fc.get_world_size() < 2:
        pytest.skip("needs a rank outside the group")
    me = fc.get_rank()
    others = fc.new_group([r for r in range(fc.get_world_size()) if r != 0])
    if me == 0:
        x = torch.ones(1, requires_grad=True)
        for call in (lambda: fc.all_reduce(x, group=others), lambda: ft.copy_to_group(x, others)):
            with pytest.raises(ValueError, match="does not contain global rank 0"):
                call()


def test_dp_is_unaffected(group: G) -> None:
    params = {"w": torch.ones(2, requires_grad=True)}
    got = fc.dp.broadcast_parameters(params, 0, group.arg)
    assert got["w"].grad_fn is None and not got["w"].requires_grad
    avg = fc.dp.average_gradients({"w": torch.full((2,), float(group.rank))}, group.arg)
    assert avg["w"].tolist() == [sum(range(group.size)) / group.size] * 2


def test_lax_on_tensors_that_require_grad_raises(group: G) -> None:
    expected = "psum: expected torch tensors that do not require grad"
    with fc.Mesh((group.size,), ("x",), group=group.arg), \
            pytest.raises(NotImplementedError, match=expected):
        fc.lax.psum({"w": torch.ones(1, requires_grad=True)}, "x")


def test_torch_compile_does_not_break(group: G) -> None:
    def step(x: Any) -> Any:
        y = torch.sin(x) * 2
        return (fc.all_reduce(y, "avg", group.arg) ** 2).sum()

    compiled = torch.compile(step, backend="aot_eager")
    x = leaf(group.rank, (3,))
    compiled(x).backward()
    x_eager = leaf(group.rank, (3,))
    step(x_eager).backward()
    torch.testing.assert_close(x.grad, x_eager.grad)


def _cuda() -> Any:
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    cupy = pytest.importorskip("cupy")
    return torch.device("cuda", cupy.cuda.Device().id)


@pytest.mark.gpu
@pytest.mark.parametrize("name", GRADCHECK)
def test_gradcheck_on_cuda_tensors(group: G, name: str) -> None:
    """The same checks on a GPU (scripts/gpu-check.sh): forward and backward go through the
    GPU path (NCCL, or MPI), and the results stay on the device."""
    device = _cuda()
    shape, op = GRADCHECK[name]
    stacked = torch.tensor(value(7, (group.size, *shape)), device=device, requires_grad=True)
    y = op(stacked[group.rank].detach().requires_grad_(True), group)
    assert y.device == device and y.grad_fn is not None
    assert torch.autograd.gradcheck(whole_job(group, lambda x: op(x, group)), (stacked,))
