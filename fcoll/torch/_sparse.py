"""The torch backend's all_reduce of a sparse COO tensor (sum), as gloo's.

Every rank's indices and values are gathered (`fcoll.all_gather`: each rank's number of
non-zeros may differ), concatenated in group rank order and coalesced, which sums the
entries at the same index: every rank gets the same coalesced tensor, bit for bit (the sum
at an index is taken in rank order, as gloo's), and the input tensor is overwritten with it
(``copy_``). The ranks first compare their tensors' sizes, sparse and dense dimensions: a
difference raises `ValueError` on every rank, naming the ranks, before indices move.

Example:
    >>> i = torch.tensor([[r]]); t = torch.sparse_coo_tensor(i, [1.0], (4,))   # rank r of 2
    >>> dist.all_reduce(t); t.to_dense()
    tensor([1., 1., 0., 0.])
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from fcoll import collectives
from fcoll.dispatch import interop
from fcoll.groups.group import Group
from fcoll.policy.ops import Op

FN = "all_reduce"


def all_reduce(t: torch.Tensor, op: Op, g: Group) -> Callable[[], None]:
    """Check a sparse ``all_reduce`` (sum only); the function that runs it on ``g``."""
    if op != "sum":
        raise ValueError(f"{FN}: expected op SUM for a sparse tensor (as gloo), got {op}")
    local = t.coalesce()
    return lambda: _run(t, local, g)


def _layout(t: torch.Tensor) -> np.ndarray:
    """What the ranks must agree on: the sparse and dense dimensions and the size."""
    return np.array([t.sparse_dim(), t.dense_dim(), *t.shape], np.int64)


def _check_layouts(layouts: list[np.ndarray], g: Group) -> None:
    mine = layouts[g.rank]
    others = [r for r, lay in enumerate(layouts) if not np.array_equal(lay, mine)]
    if others:
        described = {r: (int(lay[0]), int(lay[1]), lay[2:].tolist()) for r, lay in enumerate(layouts)}
        raise ValueError(f"{FN}: expected sparse tensors of one size and sparse/dense dimensions "
                         f"on every rank, got (sparse_dim, dense_dim, size) per group rank "
                         f"{described}")


def _run(t: torch.Tensor, local: torch.Tensor, g: Group) -> None:
    _check_layouts(collectives.all_gather(_layout(local), g), g)
    indices = local.indices().t().contiguous()  # [nnz, sparse_dim]: rows gathered
    values = local.values().contiguous()        # [nnz, *dense]
    every_index: list[Any] = collectives.all_gather(interop.to_native(indices, FN, "indices"), g)
    every_value: list[Any] = collectives.all_gather(interop.to_native(values, FN, "values"), g)
    index = torch.cat([interop.back(i, indices).reshape(-1, indices.shape[1]) for i in every_index])
    value = torch.cat([interop.back(v, values).reshape(-1, *values.shape[1:]) for v in every_value])
    total = torch.sparse_coo_tensor(index.t(), value, t.shape, dtype=t.dtype, device=t.device)
    t.copy_(total.coalesce())
