"""Dtype and op policy on NCCL: which wire dtype and NCCL op each ``(dtype, op)`` uses.

Pure functions of numpy dtypes and NCCL's version number (no cupy needed), so the whole
table is tested without a GPU. NCCL (``nccl.h``) reduces int8, uint8, int32, uint32,
int64, uint64, float16, float32, float64 and (from 2.10) bfloat16 with sum, prod, max,
min and (from 2.10) avg. Everything else fcoll accepts is mapped here, exactly:

- bool: uint8 0/1 with max (or: sum/max/bor) or min (and: product/min/band); bxor is
  the parity of an int32 sum;
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
from dataclasses import dataclass
from typing import Any

import numpy as np

from fcoll.dtypes import BFLOAT16, check_dtype, check_op
from fcoll.ops import PremulSum, ReduceOp, bool_op, resolve_op

# ncclDataType_t and ncclRedOp_t values (nccl.h; stable since NCCL 2.0, bfloat16/avg 2.10).
DATATYPES: dict[np.dtype[Any], int] = {
    np.dtype("int8"): 0, np.dtype("uint8"): 1, np.dtype("int32"): 2, np.dtype("uint32"): 3,
    np.dtype("int64"): 4, np.dtype("uint64"): 5, np.dtype("float16"): 6,
    np.dtype("float32"): 7, np.dtype("float64"): 8, BFLOAT16: 9,
}
SUM, PROD, MAX, MIN, AVG = 0, 1, 2, 3, 4
V2_10 = 21000  # NCCL_VERSION(2, 10, 0): bfloat16 and ncclAvg

_OPS = {ReduceOp.SUM: SUM, ReduceOp.AVG: SUM, ReduceOp.PRODUCT: PROD, ReduceOp.MIN: MIN,
        ReduceOp.MAX: MAX}
_WIDER = {np.dtype("int16"): np.dtype("int32"), np.dtype("uint16"): np.dtype("uint32")}
_BITWISE = (ReduceOp.BAND, ReduceOp.BOR, ReduceOp.BXOR)


@dataclass(frozen=True)
class NcclPlan:
    """How one reduction of ``dtype`` travels on NCCL.

    ``wire``: the dtype the data is cast to (``pairs``: viewed as twice as many reals of
    it); ``datatype``/``op``: NCCL's codes; ``scale``: multiply by it before sending
    (premul_sum); ``divide``: divide the result by the group's size (avg without ncclAvg);
    ``parity``: the result is the low bit of an int32 sum (bool bxor).
    """

    dtype: np.dtype[Any]
    wire: np.dtype[Any]
    datatype: int
    op: int
    pairs: bool = False
    scale: float | complex | None = None
    divide: bool = False
    parity: bool = False

    @property
    def native(self) -> bool:
        """The data goes as it is (no cast, scale or division)."""
        return (self.wire == self.dtype and not self.pairs and self.scale is None
                and not self.divide and not self.parity)


def _unsupported(fn: str, op: ReduceOp | PremulSum, dtype: np.dtype[Any]) -> NotImplementedError:
    name = op.value if isinstance(op, ReduceOp) else repr(op)
    return NotImplementedError(
        f"{fn}: NCCL has no {name} reduction for {dtype}; set FCOLL_GPU_TRANSPORT=mpi to "
        "reduce it through MPI, or use a supported op")


def _bool_plan(op: ReduceOp, dtype: np.dtype[Any]) -> NcclPlan:
    if op == ReduceOp.BXOR:
        return NcclPlan(dtype, np.dtype("int32"), DATATYPES[np.dtype("int32")], SUM, parity=True)
    mapped = bool_op(op)  # MAX (or) or MIN (and) on uint8 0/1
    return NcclPlan(dtype, np.dtype("uint8"), DATATYPES[np.dtype("uint8")], _OPS[mapped])


@functools.lru_cache(maxsize=256)
def _plan(dtype: np.dtype[Any], op: ReduceOp | PremulSum, version: int, fn: str) -> NcclPlan:
    if dtype == np.bool_ and isinstance(op, ReduceOp):
        return _bool_plan(op, dtype)
    if op in _BITWISE:
        raise _unsupported(fn, op, dtype)
    pairs = dtype.kind == "c"
    wire = np.dtype(f"float{dtype.itemsize * 4}") if pairs else _WIDER.get(dtype, dtype)
    if wire == BFLOAT16 and version < V2_10:
        wire = np.dtype("float32")
    if isinstance(op, PremulSum):
        return NcclPlan(dtype, wire, DATATYPES[wire], SUM, pairs, scale=op.factor)
    if op == ReduceOp.AVG and version >= V2_10:
        return NcclPlan(dtype, wire, DATATYPES[wire], AVG, pairs)
    return NcclPlan(dtype, wire, DATATYPES[wire], _OPS[op], pairs, divide=op == ReduceOp.AVG)


def nccl_plan(dtype: Any, op: object, version: int, fn: str) -> NcclPlan:
    """The NCCL plan for reducing ``dtype`` with ``op`` under NCCL ``version``
    (``ncclGetVersion``'s code, e.g. 22105 for 2.21.5).

    Raises the MPI path's errors for a bad dtype or op (`TypeError`, `ValueError`), and
    `NotImplementedError` naming the op and dtype where NCCL cannot reduce exactly.

    Example:
        >>> nccl_plan(np.dtype("int16"), "sum", 22105, "all_reduce").wire
        dtype('int32')
    """
    dtype = np.dtype(dtype)
    check_dtype(dtype, fn)
    resolved = resolve_op(op, fn)
    check_op(resolved, dtype, fn)
    return _plan(dtype, resolved, version, fn)
