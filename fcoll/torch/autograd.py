"""Gradients through fcoll's collectives on torch tensors: one `torch.autograd.Function`
per differentiable collective, whose backward is the transposed collective.

`fcoll.dispatch.interop` sends here every call made with a tensor that requires grad while
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

from fcoll import collectives
from fcoll.collectives import p2p
from fcoll.dispatch import interop
from fcoll.groups.group import Group, resolve_group, world
from fcoll.policy.ops import PremulSum, ReduceOp, premul_sum, resolve_op
from fcoll.policy.validate import check_dim, check_permutation, check_splits

# The public functions, called on the tensors' numpy (CPU) or cupy (CUDA) views, the
# results made tensors again on the same device: the steps `fcoll.dispatch.interop.run`
# takes for any call, without its search of the arguments.
C: Any = collectives
P: Any = p2p


def _native(t: torch.Tensor) -> Any:
    return interop.to_native(t, "autograd", "x")


def _call(fn: Callable[..., Any], t: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
    """``fn(t, ...)`` (a public collective) with ``t`` as numpy or cupy, the result a
    tensor like ``t``; a ``t`` that requires grad (double backward) takes the public
    route, whose result is differentiable again."""
    if t.requires_grad and torch.is_grad_enabled():
        return fn(t, *args, **kwargs)
    return interop.back(fn(_native(t), *args, **kwargs), t)

LINEAR = (ReduceOp.SUM, ReduceOp.AVG)


def _linear_op(op: object, fn: str, name: str) -> ReduceOp | PremulSum:
    """``op`` if the reduction has a gradient (sum, avg, premul_sum), else
    `NotImplementedError`; an invalid ``op`` raises the collective's own error."""
    resolved = resolve_op(op, fn)
    if isinstance(resolved, PremulSum) or resolved in LINEAR:
        return resolved
    shown = resolved.value if isinstance(resolved, ReduceOp) else f"the ufunc {resolved.__name__}"
    raise NotImplementedError(
        f"{fn}: expected op sum, avg or premul_sum for {name} that requires grad, got "
        f"{shown}; {shown} has no gradient in fcoll: call it on "
        f"{name}.detach() or under torch.no_grad()")


def _arg(g: Group) -> Group | None:
    """``g`` as the collectives' ``group`` argument: None for the world group, so that its
    fast paths serve the calls."""
    return None if g is world() else g


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
        return _call(C.all_reduce, x, op, _arg(g))

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        return _call(C.all_reduce, grad, _adjoint_op(ctx.op), _arg(ctx.group)), None, None


class AllGather(torch.autograd.Function):
    """`all_gather_into_tensor` along ``dim`` (``sizes``: each rank's length there, or None
    when even); backward: the sum over ranks of each rank's block."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, g: Group, dim: int,
                sizes: list[int] | None) -> Any:
        ctx.group, ctx.dim, ctx.sizes, ctx.shape = g, dim, sizes, x.shape
        return _call(C.all_gather_into_tensor, x, _arg(g), gather_dim=dim, sizes=sizes)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:
        g, dim = ctx.group, ctx.dim
        if ctx.sizes is None:
            block = _call(C.reduce_scatter_tensor, grad, "sum", _arg(g), scatter_dim=dim)
        else:
            block = C.reduce_scatter(list(torch.split(grad, ctx.sizes, dim)), "sum", _arg(g))
        return block.reshape(ctx.shape), None, None, None


class ReduceScatter(torch.autograd.Function):
    """`reduce_scatter_tensor` along ``dim``; backward: the gathered gradient."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, op: ReduceOp | PremulSum, g: Group,
                dim: int) -> Any:
        ctx.op, ctx.group, ctx.dim = op, g, dim
        return _call(C.reduce_scatter_tensor, x, op, _arg(g), scatter_dim=dim)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:
        gathered = _call(C.all_gather_into_tensor, grad, _arg(ctx.group), gather_dim=ctx.dim)
        return _scale(gathered, ctx.op, ctx.group.size), None, None, None


class AllToAll(torch.autograd.Function):
    """`all_to_all_single` with explicit split sizes; backward: the splits swapped."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, outs: list[int] | None, ins: list[int] | None,
                g: Group) -> Any:
        ctx.outs, ctx.ins, ctx.group = outs, ins, g
        return _call(C.all_to_all_single, x, outs, ins, _arg(g))

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:
        return _call(C.all_to_all_single, grad, ctx.ins, ctx.outs, _arg(ctx.group)), None, None, None


class Broadcast(torch.autograd.Function):
    """`broadcast` from ``src``; backward: the gradients summed onto ``src``, zeros elsewhere."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, src: int, g: Group) -> Any:
        ctx.src, ctx.group = src, g
        return _call(C.broadcast, x, src, _arg(g))

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        summed = _call(C.reduce, grad, ctx.src, "sum", _arg(ctx.group))
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
        return _call(P.permute_tensor, x, src_dst, _arg(g))

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        return _call(P.permute_tensor, grad, ctx.inverse, _arg(ctx.group)), None, None


def _all_reduce(fn: str, a: dict[str, Any], g: Group) -> torch.Tensor:
    op = _linear_op(a["op"], fn, "x")
    return AllReduce.apply(a["x"], op, g)  # type: ignore[no-untyped-call,no-any-return]


def _gathered_sizes(x: torch.Tensor, dim: int, sizes: object, g: Group) -> list[int] | None:
    """`all_gather_into_tensor`'s ``sizes`` as a list (``"auto"``: exchanged now), or None."""
    if isinstance(sizes, str) and sizes == "auto":
        mine = np.array([x.shape[dim] if x.ndim else 1], np.int64)
        return [int(s) for s in C.all_gather_into_tensor(mine, _arg(g))]
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
            outs = [int(s) for s in C.all_to_all_single(np.array(ins, np.int64), group=_arg(g))]
    return AllToAll.apply(x, outs, ins, g)  # type: ignore[no-untyped-call,no-any-return]


def _broadcast(fn: str, a: dict[str, Any], g: Group) -> torch.Tensor:
    return Broadcast.apply(a["x"], a["src"], g)  # type: ignore[no-untyped-call,no-any-return]


def _permute(fn: str, a: dict[str, Any], g: Group) -> torch.Tensor:
    targets = check_permutation(a["src_dst"], g.size, fn)
    return Permute.apply(a["x"], targets, g)  # type: ignore[no-untyped-call,no-any-return]


class _Shaped:
    """A stand-in with a tensor's shape for fcoll's argument checks (which read ndim and shape)."""

    __slots__ = ("ndim", "shape")

    def __init__(self, x: torch.Tensor) -> None:
        self.shape, self.ndim = tuple(x.shape), x.ndim


def _shaped(x: torch.Tensor) -> np.ndarray:
    return _Shaped(x)  # type: ignore[return-value]


RULES: dict[str, Callable[[str, dict[str, Any], Group], torch.Tensor]] = {
    "all_reduce": _all_reduce,
    "all_gather_into_tensor": _all_gather,
    "reduce_scatter_tensor": _reduce_scatter,
    "all_to_all_single": _all_to_all,
    "broadcast": _broadcast,
    "permute_tensor": _permute,
}


@cache
def _parameters(numpy_fn: Callable[..., Any]) -> tuple[tuple[str, ...], dict[str, Any]]:
    """The parameter names of a public function, and their defaults."""
    parameters = inspect.signature(numpy_fn).parameters
    return tuple(parameters), {k: p.default for k, p in parameters.items()
                               if p.default is not inspect.Parameter.empty}


def _arguments(numpy_fn: Callable[..., Any], args: Sequence[Any],
               kwargs: dict[str, Any]) -> dict[str, Any]:
    """The call's arguments by name, defaults filled in (`TypeError` for an unknown one)."""
    names, defaults = _parameters(numpy_fn)
    if len(args) > len(names) or any(k not in names for k in kwargs):
        inspect.signature(numpy_fn).bind(*args, **kwargs)  # raises Python's own TypeError
    return {**defaults, **dict(zip(names, args, strict=False)), **kwargs}


# TorchDynamo runs this eagerly: a graph break, not a trace into fcoll.
@torch.compiler.disable  # type: ignore[untyped-decorator]
def run(numpy_fn: Callable[..., Any], fn: str, args: Sequence[Any],
        kwargs: dict[str, Any]) -> Any:
    """The public collective ``fn`` (``numpy_fn``) on arguments holding a tensor that
    requires grad: its `torch.autograd.Function`, or `NotImplementedError` when it has no
    gradient (another collective, op, or ``async_op=True``). Under ``torch.compile`` it runs
    eagerly (``torch.compiler.disable``).

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
    a = _arguments(numpy_fn, args, kwargs)
    if a.get("async_op"):
        raise NotImplementedError(
            f"{fn}: expected async_op=False for tensors that require grad, got async_op=True; "
            "a Work carries no gradient: call it blocking, or on .detach()")
    g = resolve_group(a["group"], fn)
    if not g.usable:
        g.comm(fn)  # raises the documented error (a non-member, a destroyed group)
    return rule(fn, a, g)
