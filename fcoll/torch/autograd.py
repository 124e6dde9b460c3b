"""Gradients through fcoll's collectives on torch tensors: one `torch.autograd.Function`
per differentiable collective, whose backward is the transposed collective.

`fcoll.backends.interop` sends here every call made with a tensor that requires grad while
grad mode is on (`run`). The forward is the plain collective on the detached tensor and the
backward is another fcoll collective on the gradient, so both run on the same transport
(MPI or shared memory for CPU tensors, NCCL or MPI for CUDA tensors). Gradients are those of
the sum of every rank's loss, as in torch's functional collectives:

| forward | backward |
|---|---|
| `all_reduce` sum, avg, premul_sum(f) | the same (premul_sum: by conj(f)) |
| `all_gather_into_tensor` (any dim; ``sizes``) | `reduce_scatter_tensor` (``sizes``: `reduce_scatter`) |
| `reduce_scatter_tensor` sum, avg, premul_sum | `all_gather_into_tensor` (avg: / n; premul_sum: * conj(f)) |
| `all_to_all_single` | `all_to_all_single` with the split sizes swapped |
| `broadcast` from ``src`` | `reduce` sum to ``src``; zeros on the other ranks |
| `permute_tensor` | `permute_tensor` with the inverse permutation |

Any other collective, another op, or ``async_op=True`` on a tensor that requires grad
raises `NotImplementedError` naming the function before anything is sent.

Example:
    >>> w = torch.ones(2, requires_grad=True)          # each of 2 ranks
    >>> fc.all_reduce(w * (r + 1)).sum().backward()    # every rank's loss: 3 * (w0 + w1)
    >>> w.grad                                         # d(sum of both losses)/dw on rank r
    tensor([..])                                       # (r + 1) * 2 on rank r
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from functools import cache
from typing import Any

import numpy as np
import torch

from fcoll import collectives, p2p
from fcoll._validate import check_dim, check_permutation, check_splits
from fcoll.group import Group, resolve_group
from fcoll.ops import PremulSum, ReduceOp, premul_sum, resolve_op

# The public functions, typed for numpy arrays, take and return tensors
# (`fcoll.backends.interop`): called here through Any.
C: Any = collectives
P: Any = p2p

LINEAR = (ReduceOp.SUM, ReduceOp.AVG)


def _linear_op(op: object, fn: str, name: str) -> ReduceOp | PremulSum:
    """``op`` if the reduction has a gradient (sum, avg, premul_sum), else
    `NotImplementedError`; an invalid ``op`` raises the collective's own error."""
    resolved = resolve_op(op, fn)
    if isinstance(resolved, PremulSum) or resolved in LINEAR:
        return resolved
    raise NotImplementedError(
        f"{fn}: expected op sum, avg or premul_sum for {name} that requires grad, got "
        f"{resolved.value}; {resolved.value} has no gradient in fcoll: call it on "
        f"{name}.detach() or under torch.no_grad()")


def _adjoint_op(op: ReduceOp | PremulSum) -> ReduceOp | PremulSum:
    """The op of the backward reduction: the same, premul_sum by the conjugate factor."""
    if isinstance(op, PremulSum):
        return premul_sum(op.factor.conjugate() if isinstance(op.factor, complex) else op.factor)
    return op


def _scale(y: torch.Tensor, op: ReduceOp | PremulSum, n: int) -> torch.Tensor:
    """The factor a gathered gradient takes for a reduce-scatter by ``op``."""
    if isinstance(op, PremulSum):
        factor = op.factor.conjugate() if isinstance(op.factor, complex) else op.factor
        return y * factor
    return y / n if op is ReduceOp.AVG else y


class AllReduce(torch.autograd.Function):
    """`all_reduce` by sum, avg or premul_sum; backward: the same all_reduce."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, op: ReduceOp | PremulSum, g: Group) -> Any:
        ctx.op, ctx.group = op, g
        return C.all_reduce(x, op, g)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        return C.all_reduce(grad.contiguous(), _adjoint_op(ctx.op), ctx.group), None, None


class AllGather(torch.autograd.Function):
    """`all_gather_into_tensor` along ``dim`` (``sizes``: each rank's length there, or None
    when even); backward: the sum over ranks of each rank's block."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, g: Group, dim: int,
                sizes: list[int] | None) -> Any:
        ctx.group, ctx.dim, ctx.sizes, ctx.shape = g, dim, sizes, x.shape
        return C.all_gather_into_tensor(x, g, gather_dim=dim, sizes=sizes)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:
        g, dim = ctx.group, ctx.dim
        if ctx.sizes is None:
            block = C.reduce_scatter_tensor(grad.contiguous(), "sum", g, scatter_dim=dim)
        else:
            block = C.reduce_scatter(list(torch.split(grad, ctx.sizes, dim)), "sum", g)
        return block.reshape(ctx.shape), None, None, None


class ReduceScatter(torch.autograd.Function):
    """`reduce_scatter_tensor` along ``dim``; backward: the gathered gradient."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, op: ReduceOp | PremulSum, g: Group,
                dim: int) -> Any:
        ctx.op, ctx.group, ctx.dim = op, g, dim
        return C.reduce_scatter_tensor(x, op, g, scatter_dim=dim)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:
        gathered = C.all_gather_into_tensor(grad.contiguous(), ctx.group, gather_dim=ctx.dim)
        return _scale(gathered, ctx.op, ctx.group.size), None, None, None


class AllToAll(torch.autograd.Function):
    """`all_to_all_single` with explicit split sizes; backward: the splits swapped."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, outs: list[int] | None, ins: list[int] | None,
                g: Group) -> Any:
        ctx.outs, ctx.ins, ctx.group = outs, ins, g
        return C.all_to_all_single(x, outs, ins, g)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:
        return C.all_to_all_single(grad.contiguous(), ctx.ins, ctx.outs, ctx.group), None, None, None


class Broadcast(torch.autograd.Function):
    """`broadcast` from ``src``; backward: the gradients summed onto ``src``, zeros elsewhere."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, src: int, g: Group) -> Any:
        ctx.src, ctx.group = src, g
        return C.broadcast(x, src, g)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        summed = C.reduce(grad.contiguous(), ctx.src, "sum", ctx.group)
        return (torch.zeros_like(grad) if summed is None else summed), None, None


class Permute(torch.autograd.Function):
    """`permute_tensor`; backward: the gradients sent back along the inverse permutation."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, src_dst: list[int | None], g: Group) -> Any:
        inverse: list[int | None] = [None] * g.size
        for i, d in enumerate(src_dst):
            if d is not None:
                inverse[d] = i
        ctx.inverse, ctx.group = inverse, g
        return P.permute_tensor(x, src_dst, g)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        return P.permute_tensor(grad.contiguous(), ctx.inverse, ctx.group), None, None


def _all_reduce(fn: str, a: dict[str, Any], g: Group) -> torch.Tensor:
    op = _linear_op(a["op"], fn, "x")
    return AllReduce.apply(a["x"], op, g)  # type: ignore[no-untyped-call,no-any-return]


def _gathered_sizes(x: torch.Tensor, dim: int, sizes: object, g: Group) -> list[int] | None:
    """`all_gather_into_tensor`'s ``sizes`` as a list (``"auto"``: exchanged now), or None."""
    if isinstance(sizes, str) and sizes == "auto":
        mine = np.array([x.shape[dim] if x.ndim else 1], np.int64)
        return [int(s) for s in C.all_gather_into_tensor(mine, g)]
    return None if sizes is None else list(sizes)  # type: ignore[call-overload]


def _all_gather(fn: str, a: dict[str, Any], g: Group) -> torch.Tensor:
    x = a["x"]
    dim = check_dim(_shaped(x.reshape(1) if x.ndim == 0 else x), a["gather_dim"], fn, "gather_dim")
    return AllGather.apply(x, g, dim, _gathered_sizes(x, dim, a["sizes"], g))  # type: ignore[no-untyped-call,no-any-return]


def _reduce_scatter(fn: str, a: dict[str, Any], g: Group) -> torch.Tensor:
    op = _linear_op(a["op"], fn, "x")
    dim = check_dim(_shaped(a["x"]), a["scatter_dim"], fn, "scatter_dim")
    return ReduceScatter.apply(a["x"], op, g, dim)  # type: ignore[no-untyped-call,no-any-return]


def _all_to_all(fn: str, a: dict[str, Any], g: Group) -> torch.Tensor:
    x, outs, ins = a["x"], a["output_split_sizes"], a["input_split_sizes"]
    if outs is not None or ins is not None:
        ins, outs = check_splits(x, outs, ins, g.size, fn)
        if outs is None:  # the sizes this rank receives, which its backward sends back
            outs = [int(s) for s in C.all_to_all_single(np.array(ins, np.int64), group=g)]
    return AllToAll.apply(x, outs, ins, g)  # type: ignore[no-untyped-call,no-any-return]


def _broadcast(fn: str, a: dict[str, Any], g: Group) -> torch.Tensor:
    return Broadcast.apply(a["x"], a["src"], g)  # type: ignore[no-untyped-call,no-any-return]


def _permute(fn: str, a: dict[str, Any], g: Group) -> torch.Tensor:
    targets = check_permutation(a["src_dst"], g.size, fn)
    return Permute.apply(a["x"], targets, g)  # type: ignore[no-untyped-call,no-any-return]


def _shaped(x: torch.Tensor) -> np.ndarray:
    """A stand-in with ``x``'s shape for fcoll's argument checks (which read ndim and shape)."""
    return np.broadcast_to(np.empty((), np.uint8), tuple(x.shape))


RULES: dict[str, Callable[[str, dict[str, Any], Group], torch.Tensor]] = {
    "all_reduce": _all_reduce,
    "all_gather_into_tensor": _all_gather,
    "reduce_scatter_tensor": _reduce_scatter,
    "all_to_all_single": _all_to_all,
    "broadcast": _broadcast,
    "permute_tensor": _permute,
}


@cache
def _signature(numpy_fn: Callable[..., Any]) -> inspect.Signature:
    return inspect.signature(numpy_fn)


def run(numpy_fn: Callable[..., Any], fn: str, args: Sequence[Any],
        kwargs: dict[str, Any]) -> Any:
    """The public collective ``fn`` (``numpy_fn``) on arguments holding a tensor that
    requires grad: its `torch.autograd.Function`, or `NotImplementedError` when it has no
    gradient (another collective, op, or ``async_op=True``).

    Example:
        >>> run(fc.all_reduce, "all_reduce", (w,), {}).grad_fn     # w requires grad
        <torch.autograd.function.AllReduceBackward object at ...>
    """
    rule = RULES.get(fn)
    if rule is None:
        raise NotImplementedError(
            f"{fn}: expected tensors that do not require grad, got one that does; {fn} has no "
            "gradient in fcoll (docs/torch.md, \"Gradients\"): call it on .detach() or under "
            "torch.no_grad()")
    bound = _signature(numpy_fn).bind(*args, **kwargs)
    bound.apply_defaults()
    a = bound.arguments
    if a.get("async_op"):
        raise NotImplementedError(
            f"{fn}: expected async_op=False for tensors that require grad, got async_op=True; "
            "a Work carries no gradient: call it blocking, or on .detach()")
    g = resolve_group(a["group"], fn)
    if not g.usable:
        g.comm(fn)  # raises the documented error (a non-member, a destroyed group)
    return rule(fn, a, g)
