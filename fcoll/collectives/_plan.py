"""Per-(op, dtype, group size) reduction plans, cached: the small-message hot path.

A plan knows how a reduction travels: integer and bool data are reduced by MPI's own ops
(exact in any order); floating and complex data are folded by fcoll in group-rank order
(`fcoll.collectives._fold`), so their results do not depend on the message size.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from fcoll.backends import mpi as backend
from fcoll.collectives import _fold
from fcoll.dtypes import check_op, from_wire, wire_dtype, wire_op
from fcoll.ops import PremulSum, ReduceOp, mpi_op, resolve_op

_UFUNCS = {ReduceOp.SUM: np.add, ReduceOp.AVG: np.add, ReduceOp.PRODUCT: np.multiply,
           ReduceOp.MIN: np.minimum, ReduceOp.MAX: np.maximum}


@dataclass(frozen=True)
class ReductionPlan:
    """How one reduction travels: the op for `to_wire`, MPI's op or fcoll's fold, the way back."""

    op: ReduceOp | PremulSum
    mpi_op: Any
    ufunc: np.ufunc | None
    dtype: np.dtype[Any]
    n: int

    def allreduce(self, comm: Any, wire: np.ndarray) -> np.ndarray:
        if self.ufunc is None:
            return backend.allreduce(comm, wire, self.mpi_op)
        return _fold.allreduce(comm, wire, self.ufunc)

    def reduce(self, comm: Any, wire: np.ndarray, root: int) -> np.ndarray | None:
        if self.ufunc is None:
            return backend.reduce(comm, wire, self.mpi_op, root)
        return _fold.reduce(comm, wire, self.ufunc, root)

    def reduce_scatter(self, comm: Any, wire: np.ndarray, counts: Sequence[int]) -> np.ndarray:
        if self.ufunc is not None:
            return _fold.reduce_scatter(comm, wire, counts, self.ufunc)
        if len(set(counts)) == 1:
            return backend.reduce_scatter_block(comm, wire, self.mpi_op)
        return backend.reduce_scatter(comm, wire, counts, self.mpi_op)

    def finish(self, y: np.ndarray) -> np.ndarray:
        """Turn the reduced wire buffer ``y`` (fcoll's own) into the result dtype."""
        return from_wire(y, self.dtype, self.op, self.n)


@functools.lru_cache(maxsize=512)
def _plan(op: object, dtype: np.dtype[Any], n: int, fn: str) -> ReductionPlan:
    resolved = resolve_op(op, fn)
    check_op(resolved, dtype, fn)
    on_wire = wire_op(resolved, dtype)
    ufunc = None
    if wire_dtype(dtype).kind in "fc":
        ufunc = np.add if isinstance(on_wire, PremulSum) else _UFUNCS[on_wire]
    return ReductionPlan(resolved, mpi_op(on_wire), ufunc, dtype, n)


def reduction_plan(x: np.ndarray, op: object, n: int, fn: str) -> ReductionPlan:
    """The plan for reducing ``x`` with ``op`` over ``n`` ranks; raises for bad ops."""
    try:
        return _plan(op, x.dtype, n, fn)
    except TypeError as error:
        if "unhashable" not in str(error):
            raise
        return _plan.__wrapped__(op, x.dtype, n, fn)
