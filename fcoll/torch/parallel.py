"""The replicated convention of tensor-parallel layers (Megatron-LM's "regions"):
`copy_to_group` and `reduce_from_group`.

fcoll's collectives differentiate the sum of every rank's loss. A tensor-parallel layer
instead computes one loss that every rank of the group holds a copy of: the input of a
column-parallel layer is the same on every rank (its gradient is the sum of the ranks'
partial gradients), and the output of a row-parallel layer is the sum of the ranks'
partial outputs (each rank's gradient is the one replicated gradient). These two functions
are the conjugate pair that expresses it.

Example:
    >>> h = fc.torch.copy_to_group(x, tp)           # forward: x; backward: all_reduce
    >>> y = fc.torch.reduce_from_group(h @ w, tp)   # forward: all_reduce; backward: identity
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar, cast

import torch

from fcoll import collectives
from fcoll.groups.group import Group, GroupArg, resolve_group

C: Any = collectives  # typed for numpy; takes and returns tensors (fcoll.dispatch.interop)
_F = TypeVar("_F", bound=Callable[..., Any])


def _eager(fn: _F) -> _F:
    """``fn`` run eagerly under ``torch.compile`` (``torch.compiler.disable``: a graph break,
    not a trace into fcoll), its signature kept for type checkers."""
    return cast(_F, torch.compiler.disable(fn))  # type: ignore[no-untyped-call]


def _group(group: GroupArg, fn: str) -> Group:
    g = resolve_group(group, fn)
    if not g.usable:
        g.comm(fn)  # raises the documented error (a non-member, a destroyed group)
    return g


def _tensor(x: object, fn: str) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{fn}: expected x to be a torch.Tensor, got {type(x).__name__}")
    return x


class _Copy(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, g: Group) -> Any:
        ctx.group = g
        return x.clone()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return C.all_reduce(grad.contiguous(), "sum", ctx.group), None


class _Reduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, g: Group) -> Any:
        return C.all_reduce(x, "sum", g)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad, None


@_eager
def copy_to_group(x: torch.Tensor, group: GroupArg = None) -> torch.Tensor:
    """``x`` (a new tensor) in the forward pass; in the backward pass the gradient summed
    over ``group`` (an all-reduce). Use it where a tensor every rank holds the same copy of
    enters a layer split across the group (a column-parallel linear's input).

    Example:
        >>> h = fc.torch.copy_to_group(x, tp)       # x replicated on the 2 ranks of tp
        >>> (h * (r + 1)).sum().backward()          # rank r's partial loss
        >>> x.grad                                  # on both ranks: 1 + 2
        tensor([3., 3.])
    """
    g = _group(group, "copy_to_group")
    return _Copy.apply(_tensor(x, "copy_to_group"), g)  # type: ignore[no-untyped-call,no-any-return]


@_eager
def reduce_from_group(x: torch.Tensor, group: GroupArg = None) -> torch.Tensor:
    """The sum of ``x`` over ``group`` (an all-reduce) in the forward pass; in the backward
    pass the gradient unchanged (every rank holds the same, replicated one). Use it where
    the partial outputs of a layer split across the group are summed (a row-parallel
    linear's output).

    Example:
        >>> y = fc.torch.reduce_from_group(x, tp)   # 2 ranks; x = [r + 1.]
        >>> y                                       # on both ranks
        tensor([3.], grad_fn=<_ReduceBackward>)
        >>> y.sum().backward(); x.grad              # not multiplied by the group's size
        tensor([1.])
    """
    g = _group(group, "reduce_from_group")
    return _Reduce.apply(_tensor(x, "reduce_from_group"), g)  # type: ignore[no-untyped-call,no-any-return]
