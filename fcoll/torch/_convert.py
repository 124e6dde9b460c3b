"""Tensors in and out of the torch backend: views, ops, and the checks torch's callers skip.

A CPU tensor is seen as a zero-copy numpy view (`fcoll.dispatch.interop`; bfloat16 through
its bits), a CUDA tensor as a cupy array (DLPack). A result is written into an output
tensor through its view where the output is a C-contiguous CPU tensor (`view_out`),
otherwise copied in (`put`). ``ReduceOp`` objects become fcoll's ops (`fcoll_op`).

Example:
    >>> t = torch.zeros(3)
    >>> view_out(t, "allreduce", "tensor")[...] = 1.0     # writes t
    >>> t
    tensor([1., 1., 1.])
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeVar

import ml_dtypes
import numpy as np
import torch

from fcoll.dispatch import interop
from fcoll.policy.ops import Op, premul_sum

BF16 = np.dtype(ml_dtypes.bfloat16)
T = TypeVar("T")

_KINDS = torch.distributed.ReduceOp.RedOpType
_PREMUL = _KINDS.__members__["PREMUL_SUM"]  # torch's stubs omit it
_OPS: dict[Any, Op] = {getattr(_KINDS, name.upper()): name for name in
                       ("sum", "avg", "product", "min", "max", "band", "bor", "bxor")}


def fcoll_op(op: Any, fn: str) -> Op:
    """torch's ``ReduceOp`` (``opts.reduceOp``: a member, or ``PREMUL_SUM`` with its factor)
    as an fcoll op; `ValueError` for one fcoll has not (``UNUSED``).

    Example:
        >>> fcoll_op(dist._make_nccl_premul_sum(0.5), "allreduce")
        premul_sum(0.5)
    """
    kind = getattr(op, "op", op)  # a ReduceOp object holds its RedOpType
    found = _OPS.get(kind)
    if found is not None:
        return found
    if kind == _PREMUL:
        factor = op.factor
        return premul_sum(factor.item() if isinstance(factor, torch.Tensor) else factor)
    raise ValueError(f"{fn}: expected a ReduceOp among {sorted(map(str, _OPS.values()))} or "
                     f"PREMUL_SUM, got {kind}")


def one(tensors: Sequence[T], fn: str, name: str = "tensors") -> T:
    """The one tensor of torch's list argument; `ValueError` for the multi-tensor form."""
    if len(tensors) != 1:
        raise ValueError(f"{fn}: expected {name} to hold one tensor per process, got "
                         f"{len(tensors)}; the backend 'fcoll' has no multi-tensor form")
    return tensors[0]


def view(t: torch.Tensor, fn: str, name: str) -> Any:
    """``t`` as numpy (CPU) or cupy (CUDA), zero-copy; `TypeError` naming ``name`` for a
    device or dtype fcoll does not take."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{fn}: expected {name} to be a torch.Tensor, got {type(t).__name__}")
    if t.is_sparse:
        raise TypeError(f"{fn}: expected {name} to be a dense tensor, got layout {t.layout}")
    return interop.to_native(t, fn, name)


def view_out(t: torch.Tensor, fn: str, name: str) -> np.ndarray | None:
    """A writable C-contiguous numpy view of the output ``t``, or None where results are
    copied in instead (`put`): a non-contiguous or CUDA tensor. On every call's path, so
    it asks torch the least it can."""
    if not isinstance(t, torch.Tensor) or not t.is_cpu or t.is_sparse or not t.is_contiguous() \
            or t.is_conj() or t.is_neg():
        return None
    if t.dtype is torch.bfloat16:
        out: np.ndarray = t.detach().view(torch.int16).numpy().view(BF16)
        return out
    try:
        out = t.detach().numpy()
    except TypeError:  # float8 and the like: view() raises the documented error
        return None
    return out


def put(t: torch.Tensor, y: Any) -> None:
    """Copy the result ``y`` (numpy or cupy, ``t``'s number of elements) into tensor ``t``."""
    result = interop.back(y, t)
    t.copy_(result.reshape(t.shape))


def check_like(t: torch.Tensor, ref: torch.Tensor, fn: str, name: str, numel: int,
               ref_name: str = "the input") -> None:
    """`TypeError`/`ValueError` unless ``t`` has ``ref``'s dtype and device and ``numel``
    elements: raised before anything is sent."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{fn}: expected {name} to be a torch.Tensor, got {type(t).__name__}")
    if t.dtype != ref.dtype:
        raise TypeError(f"{fn}: expected {name} of dtype {ref.dtype} like {ref_name}, got {t.dtype}")
    if t.device != ref.device:
        raise ValueError(f"{fn}: expected {name} on {ref.device} like {ref_name}, got {t.device}")
    if t.numel() != numel:
        raise ValueError(f"{fn}: expected {name} to hold {numel} elements, got {t.numel()} "
                         f"(shape {list(t.shape)})")


def check_list(ts: Sequence[Any], n: int, fn: str, name: str) -> None:
    """`ValueError` unless the list ``ts`` holds ``n`` tensors (one per group rank)."""
    if len(ts) != n:
        raise ValueError(f"{fn}: expected {name} to hold {n} tensors (one per group rank), "
                         f"got {len(ts)}")
