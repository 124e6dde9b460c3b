"""Reduction policy for both transports, side by side: how a reduction of ``(dtype, op)``
travels on MPI (`ReductionPlan`) and on NCCL (`NcclPlan`).

Both plans have the same shape: ``wire(x)`` makes the contiguous data that travels,
``op`` is the transport's op code, ``finish(y)`` turns the reduced wire buffer into the
result. Plans never touch a transport: the collectives (and `fcoll.collectives._fold`,
which chooses between MPI's op and fcoll's rank-order fold) carry them out.

MPI: integer and bool data are reduced by MPI's own ops (exact in any order); floating
and complex data are folded by fcoll in group-rank order (``ufunc``), so that results do
not depend on the message size; on one or two ranks a sum or product has only one
possible result (IEEE addition and multiplication are commutative), so MPI's op is used.

NCCL (``nccl.h``) reduces int8, uint8, int32, uint32, int64, uint64, float16, float32,
float64 and (from 2.10) bfloat16 with sum, prod, max, min and (from 2.10) avg. Everything
else fcoll accepts is mapped, exactly:

- bool: uint8 0/1 with max (or: sum/max/bor) or min (and: product/min/band); bxor is the
  parity of an int32 sum;
- int16/uint16: reduced as int32/uint32 and cast back (the same wrap-around as numpy);
- complex: pairs of reals for sum, avg and premul_sum;
- bfloat16 before NCCL 2.10: reduced in float32 and cast back;
- avg before NCCL 2.10: sum, then divide by the group's size;
- premul_sum: cupy does not expose ``ncclRedOpCreatePreMulSum``, so each rank scales its
  input (in the wire dtype) and NCCL sums;
- bitwise ops on integers: NCCL has none, `NotImplementedError` (use the MPI transport).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

import numpy as np

from fcoll.calls import fingerprint
from fcoll.policy.dtypes import BFLOAT16, check_dtype, check_op, wire_dtype, wire_op
from fcoll.policy.ops import (
    NcclOp,
    PremulSum,
    ReduceOp,
    Resolved,
    bool_op,
    mpi_op,
    nccl_op,
    op_name,
    resolve_op,
)
from fcoll.policy.validate import check_array

_UFUNCS = {ReduceOp.SUM: np.add, ReduceOp.AVG: np.add, ReduceOp.PRODUCT: np.multiply,
           ReduceOp.MIN: np.minimum, ReduceOp.MAX: np.maximum}
# The ufunc with MPI's result for each wire op (integer and bitwise ops are exact in any
# order; bool travels as uint8 0/1 with max, min or bxor).
_ANY_ORDER = {**_UFUNCS, ReduceOp.BAND: np.bitwise_and, ReduceOp.BOR: np.bitwise_or,
              ReduceOp.BXOR: np.bitwise_xor}
_COMMUTATIVE_EXACT = (ReduceOp.SUM, ReduceOp.AVG, ReduceOp.PRODUCT)
_AVG = ReduceOp.AVG
_BITWISE = (ReduceOp.BAND, ReduceOp.BOR, ReduceOp.BXOR)
_WIDER = {np.dtype("int16"): np.dtype("int32"), np.dtype("uint16"): np.dtype("uint32")}
V2_10 = 21000  # NCCL_VERSION(2, 10, 0): bfloat16 and ncclAvg


# --- MPI ------------------------------------------------------------------------------


@dataclass(frozen=True)
class ReductionPlan:
    """How one reduction travels on MPI: wire dtype, MPI's op or fcoll's fold, the way back.

    ``ufunc`` is None where MPI's ``op`` reduces; else fcoll folds with it in rank order
    (always for a ``reduce_op`` that is a ufunc: ``op`` is then None).
    """

    reduce_op: Resolved
    op: Any  # the MPI.Op on the wire
    ufunc: np.ufunc | None
    dtype: np.dtype[Any]
    wire_dtype: np.dtype[Any]
    n: int
    is_bool: bool
    simple: bool  # the wire is x's own data and the result needs no conversion
    direct: bool  # simple, and MPI's own op reduces it: a C-contiguous x goes as it is
    fold_ufunc: np.ufunc  # ``ufunc``, or where MPI's op reduces, the ufunc with its result
    fp: int  # the call's fingerprint as an all_reduce (`fcoll.calls.fingerprint`; | kind_bits)

    def wire(self, x: np.ndarray) -> np.ndarray:
        """C-contiguous wire data of ``x``'s shape; ``x`` itself when nothing changes."""
        if self.simple:
            return x if x.flags.c_contiguous else np.asarray(x, order="C")
        if self.is_bool:
            return np.asarray(x, order="C").view(np.uint8)
        data = np.asarray(x, dtype=self.wire_dtype, order="C")
        if isinstance(self.reduce_op, PremulSum):
            factor = np.asarray(self.reduce_op.factor, dtype=self.wire_dtype)
            scaled: np.ndarray = np.multiply(data, factor, dtype=self.wire_dtype)
            return scaled
        return data

    def finish(self, y: np.ndarray) -> np.ndarray:
        """Turn the reduced wire buffer ``y`` (fcoll's own, so reusable) into the result."""
        if self.simple:
            return y
        if self.reduce_op is _AVG:
            np.divide(y, self.n, out=y)
        if self.wire_dtype is not self.dtype:
            return y.view(np.bool_) if self.is_bool else y.astype(self.dtype)
        return y


def _fold_ufunc(op: Resolved, wire: np.dtype[Any], n: int) -> np.ufunc | None:
    """The ufunc fcoll folds with, or None where MPI's result is already order-free."""
    if isinstance(op, np.ufunc):
        return op  # any binary ufunc: folded in rank order on every transport
    if wire.kind not in "fc":
        return None
    if isinstance(op, PremulSum):
        return None if n <= 2 else np.add
    return None if n <= 2 and op in _COMMUTATIVE_EXACT else _UFUNCS[op]


def _mpi_plan(op: object, dtype: np.dtype[Any], n: int, fn: str) -> ReductionPlan:
    check_dtype(dtype, fn)
    resolved = resolve_op(op, fn)
    check_op(resolved, dtype, fn)
    on_wire = wire_op(resolved, dtype)
    wire = wire_dtype(dtype, resolved)
    wire = dtype if wire == dtype else wire  # identity lets wire()/finish() test with `is`
    ufunc = _fold_ufunc(on_wire, wire, n)
    is_bool = wire is not dtype and dtype == np.bool_
    simple = wire is dtype and not is_bool and resolved is not ReduceOp.AVG and not isinstance(
        resolved, PremulSum)
    direct = simple and ufunc is None
    # ``ufunc`` is set for a ufunc op, so the table is only asked for a ReduceOp
    folds = ufunc or (np.add if isinstance(on_wire, PremulSum) else _ANY_ORDER[cast(ReduceOp, on_wire)])
    return ReductionPlan(resolved, mpi_op(on_wire), ufunc, dtype, wire, n, is_bool, simple, direct,
                         folds, fingerprint.of("all_reduce", op_name(resolved), dtype))


def plan_for(op: object, dtype: Any, n: int, fn: str) -> ReductionPlan:
    """The MPI plan for reducing ``dtype`` with ``op`` over ``n`` ranks, without a group
    (`fcoll.testing.reference_reduce`); the documented errors for a bad dtype or op.

    Example:
        >>> plan_for("avg", "float16", 4, "f").wire_dtype
        dtype('float32')
    """
    return _mpi_plan(op, np.dtype(dtype), n, fn)


def reduction_plan(x: np.ndarray, op: object, group: Any, fn: str) -> ReductionPlan:
    """The MPI plan for reducing ``x`` with ``op`` over the members of ``group``.

    Raises the documented errors for a non-array ``x``, a bad dtype or op. Plans are
    cached on the group per ``(op, dtype)``; unhashable ops are planned afresh (and fail).

    Example:
        >>> reduction_plan(np.ones(2, "float16"), "sum", fc.world(), "f").wire_dtype
        dtype('float32')
    """
    if type(x) is not np.ndarray:
        check_array(x, fn)
    key = (op, x.dtype)
    try:
        return group.plans[key]  # type: ignore[no-any-return]
    except KeyError:
        plan = group.plans[key] = _mpi_plan(op, x.dtype, group.size, fn)
        return plan
    except TypeError:  # unhashable op: _mpi_plan raises the right error for it
        return _mpi_plan(op, x.dtype, group.size, fn)


# --- NCCL -----------------------------------------------------------------------------


@dataclass(frozen=True)
class NcclPlan:
    """How one reduction of ``dtype`` travels on NCCL.

    ``wire_dtype``: the dtype the data is cast to, one NCCL reduces natively (``pairs``:
    viewed as twice as many reals of it); ``op``: NCCL's op code; ``scale``: multiply by it before sending
    (premul_sum); ``divide``: divide the result by the group's size (avg without ncclAvg);
    ``parity``: the result is the low bit of an int32 sum (bool bxor).
    """

    dtype: np.dtype[Any]
    wire_dtype: np.dtype[Any]
    op: NcclOp
    pairs: bool = False
    scale: float | complex | None = None
    divide: bool = False
    parity: bool = False

    @property
    def native(self) -> bool:
        """The data goes as it is (no cast, scale or division)."""
        return (self.wire_dtype == self.dtype and not self.pairs and self.scale is None
                and not self.divide and not self.parity)

    def wire(self, x: Any, xp: Any) -> Any:
        """Flat C-contiguous wire data of ``x`` (cast, scaled, or complex viewed as reals);
        ``xp`` is ``x``'s array module (cupy, or numpy to emulate)."""
        flat = xp.ascontiguousarray(x).reshape(-1)
        if self.scale is not None and self.pairs:
            flat = xp.multiply(flat, xp.asarray(self.scale, dtype=flat.dtype))
        if self.pairs:
            return flat.view(self.wire_dtype)
        if self.wire_dtype != flat.dtype:
            flat = flat.astype(self.wire_dtype)
        if self.scale is not None:
            flat = xp.multiply(flat, xp.asarray(self.scale, dtype=flat.dtype))
        return flat

    def finish(self, y: Any, n: int, shape: Sequence[int]) -> Any:
        """The reduced wire buffer ``y`` (fcoll's own) as an array of ``dtype`` and ``shape``."""
        if self.divide:
            y /= n
        if self.parity:
            y = (y & 1).astype(np.bool_)
        elif self.pairs:
            y = y.view(self.dtype)
        elif y.dtype != self.dtype:
            y = y.astype(self.dtype)
        return y.reshape(tuple(shape))


def _unsupported(fn: str, op: Resolved, dtype: np.dtype[Any]) -> NotImplementedError:
    name = op.value if isinstance(op, ReduceOp) else repr(op)
    return NotImplementedError(
        f"{fn}: NCCL has no {name} reduction for {dtype}; set FCOLL_GPU_TRANSPORT=mpi to "
        "reduce it through MPI, or use a supported op")


def _nccl(dtype: np.dtype[Any], wire: np.dtype[Any], op: NcclOp, **how: Any) -> NcclPlan:
    return NcclPlan(dtype, wire, op, **how)


def _bool_plan(op: ReduceOp, dtype: np.dtype[Any]) -> NcclPlan:
    if op == ReduceOp.BXOR:
        return _nccl(dtype, np.dtype("int32"), NcclOp.SUM, parity=True)
    return _nccl(dtype, np.dtype("uint8"), nccl_op(bool_op(op)))  # max (or), min (and)


@functools.lru_cache(maxsize=256)
def _nccl_plan(dtype: np.dtype[Any], op: Resolved, version: int, fn: str) -> NcclPlan:
    if dtype == np.bool_ and isinstance(op, ReduceOp):
        return _bool_plan(op, dtype)
    if op in _BITWISE or isinstance(op, np.ufunc):  # a ufunc: `fcoll.gpu.route` stages it first
        raise _unsupported(fn, op, dtype)
    pairs = dtype.kind == "c"
    wire = np.dtype(f"float{dtype.itemsize * 4}") if pairs else _WIDER.get(dtype, dtype)
    if wire == BFLOAT16 and version < V2_10:
        wire = np.dtype("float32")
    if isinstance(op, PremulSum):
        return _nccl(dtype, wire, NcclOp.SUM, pairs=pairs, scale=op.factor)
    if op == ReduceOp.AVG and version >= V2_10:
        return _nccl(dtype, wire, NcclOp.AVG, pairs=pairs)
    return _nccl(dtype, wire, nccl_op(op), pairs=pairs, divide=op == ReduceOp.AVG)


def nccl_plan(dtype: Any, op: object, version: int, fn: str) -> NcclPlan:
    """The NCCL plan for reducing ``dtype`` with ``op`` under NCCL ``version``
    (``ncclGetVersion``'s code, e.g. 22105 for 2.21.5).

    Raises the MPI path's errors for a bad dtype or op (`TypeError`, `ValueError`), and
    `NotImplementedError` naming the op and dtype where NCCL cannot reduce exactly.

    Example:
        >>> nccl_plan(np.dtype("int16"), "sum", 22105, "all_reduce").wire_dtype
        dtype('int32')
    """
    dtype = np.dtype(dtype)
    check_dtype(dtype, fn)
    resolved = resolve_op(op, fn)
    check_op(resolved, dtype, fn)
    return _nccl_plan(dtype, resolved, version, fn)
