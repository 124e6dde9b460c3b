"""Per-(op, dtype, group size) reduction plans, cached: the small-message hot path."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import numpy as np

from fcoll.dtypes import check_op, from_wire, wire_op
from fcoll.ops import PremulSum, ReduceOp, mpi_op, resolve_op


@dataclass(frozen=True)
class ReductionPlan:
    """How one reduction travels: the op for `to_wire`, the MPI op, and the way back."""

    op: ReduceOp | PremulSum
    mpi_op: Any
    dtype: np.dtype[Any]
    n: int

    def finish(self, y: np.ndarray) -> np.ndarray:
        """Turn the reduced wire buffer ``y`` (fcoll's own) into the result dtype."""
        return from_wire(y, self.dtype, self.op, self.n)


@functools.lru_cache(maxsize=512)
def _plan(op: object, dtype: np.dtype[Any], n: int, fn: str) -> ReductionPlan:
    resolved = resolve_op(op, fn)
    check_op(resolved, dtype, fn)
    return ReductionPlan(resolved, mpi_op(wire_op(resolved, dtype)), dtype, n)


def reduction_plan(x: np.ndarray, op: object, n: int, fn: str) -> ReductionPlan:
    """The plan for reducing ``x`` with ``op`` over ``n`` ranks; raises for bad ops."""
    try:
        return _plan(op, x.dtype, n, fn)
    except TypeError as error:
        if "unhashable" not in str(error):
            raise
        return _plan.__wrapped__(op, x.dtype, n, fn)
