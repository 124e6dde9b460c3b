"""Per-(op, dtype, group size) reduction plans, cached: the small-message hot path.

A plan knows how a reduction travels. Integer and bool data are reduced by MPI's own ops
(exact in any order). Floating and complex data are folded by fcoll in group-rank order
(`fcoll.collectives._fold`), so that their results do not depend on the message size;
on one or two ranks a sum or product has only one possible result (IEEE addition and
multiplication are commutative), so MPI's own op is used there.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from fcoll._validate import check_array
from fcoll.backends import mpi as backend
from fcoll.collectives import _fold
from fcoll.dtypes import check_dtype, check_op, wire_dtype, wire_op
from fcoll.group import Group
from fcoll.ops import PremulSum, ReduceOp, mpi_op, resolve_op
from fcoll.work import Call

_UFUNCS = {ReduceOp.SUM: np.add, ReduceOp.AVG: np.add, ReduceOp.PRODUCT: np.multiply,
           ReduceOp.MIN: np.minimum, ReduceOp.MAX: np.maximum}
_COMMUTATIVE_EXACT = (ReduceOp.SUM, ReduceOp.AVG, ReduceOp.PRODUCT)
_AVG = ReduceOp.AVG


@dataclass(frozen=True)
class ReductionPlan:
    """How one reduction travels: wire dtype, MPI's op or fcoll's fold, and the way back."""

    op: ReduceOp | PremulSum
    mpi_op: Any
    ufunc: np.ufunc | None  # None: MPI reduces; else fcoll folds with this ufunc
    dtype: np.dtype[Any]
    wire_dtype: np.dtype[Any]
    n: int
    is_bool: bool
    simple: bool  # the wire is x's own data and the result needs no conversion
    direct: bool  # simple, and MPI's own op reduces it: a C-contiguous x goes as it is

    def wire(self, x: np.ndarray) -> np.ndarray:
        """C-contiguous wire data of ``x``'s shape; ``x`` itself when nothing changes."""
        if self.simple:
            return x if x.flags.c_contiguous else np.asarray(x, order="C")
        if self.is_bool:
            return np.asarray(x, order="C").view(np.uint8)
        data = np.asarray(x, dtype=self.wire_dtype, order="C")
        if isinstance(self.op, PremulSum):
            factor = np.asarray(self.op.factor, dtype=self.wire_dtype)
            scaled: np.ndarray = np.multiply(data, factor, dtype=self.wire_dtype)
            return scaled
        return data

    def finish(self, y: np.ndarray) -> np.ndarray:
        """Turn the reduced wire buffer ``y`` (fcoll's own, so reusable) into the result."""
        if self.simple:
            return y
        if self.op is _AVG:
            np.divide(y, self.n, out=y)
        if self.wire_dtype is not self.dtype:
            return y.view(np.bool_) if self.is_bool else y.astype(self.dtype)
        return y

    def allreduce(self, call: Call, wire: np.ndarray) -> np.ndarray:
        if self.ufunc is None:
            return backend.allreduce(call, wire, self.mpi_op)
        return _fold.allreduce(call, wire.reshape(-1), self.ufunc).reshape(wire.shape)

    def reduce(self, call: Call, wire: np.ndarray, root: int) -> np.ndarray | None:
        if self.ufunc is None:
            return backend.reduce(call, wire, self.mpi_op, root)
        y = _fold.reduce(call, wire.reshape(-1), self.ufunc, root)
        return None if y is None else y.reshape(wire.shape)

    def reduce_scatter(self, call: Call, wire: np.ndarray, counts: Sequence[int]) -> np.ndarray:
        wire = wire.reshape(-1)
        if self.ufunc is not None:
            return _fold.reduce_scatter(call, wire, counts, self.ufunc)
        if len(set(counts)) == 1:
            return backend.reduce_scatter_block(call, wire, self.mpi_op)
        return backend.reduce_scatter(call, wire, counts, self.mpi_op)


def _fold_ufunc(op: ReduceOp | PremulSum, wire: np.dtype[Any], n: int) -> np.ufunc | None:
    """The ufunc fcoll folds with, or None where MPI's result is already order-free."""
    if wire.kind not in "fc":
        return None
    if isinstance(op, PremulSum):
        return None if n <= 2 else np.add
    return None if n <= 2 and op in _COMMUTATIVE_EXACT else _UFUNCS[op]


def _plan(op: object, dtype: np.dtype[Any], n: int, fn: str) -> ReductionPlan:
    check_dtype(dtype, fn)
    resolved = resolve_op(op, fn)
    check_op(resolved, dtype, fn)
    on_wire = wire_op(resolved, dtype)
    wire = wire_dtype(dtype)
    wire = dtype if wire == dtype else wire  # identity lets wire()/finish() test with `is`
    ufunc = _fold_ufunc(on_wire, wire, n)
    is_bool = dtype == np.bool_
    simple = wire is dtype and not is_bool and resolved is not ReduceOp.AVG and not isinstance(
        resolved, PremulSum)
    direct = simple and ufunc is None
    return ReductionPlan(resolved, mpi_op(on_wire), ufunc, dtype, wire, n, is_bool, simple, direct)


def reduction_plan(x: np.ndarray, op: object, group: Group, fn: str) -> ReductionPlan:
    """The plan for reducing ``x`` with ``op`` over the members of ``group``.

    Raises the documented errors for a non-array ``x``, a bad dtype or op. Plans are
    cached on the group per ``(op, dtype)``; unhashable ops are planned afresh (and fail).
    """
    if type(x) is not np.ndarray:
        check_array(x, fn)
    key = (op, x.dtype)
    try:
        return group.plans[key]  # type: ignore[no-any-return]
    except KeyError:
        plan = group.plans[key] = _plan(op, x.dtype, group.size, fn)
        return plan
    except TypeError:  # unhashable op: _plan raises the right error for it
        return _plan(op, x.dtype, group.size, fn)
