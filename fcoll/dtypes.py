"""Dtype policy: which dtypes fcoll accepts, and how each travels on the wire.

Data movement is always bit-exact: arrays travel as their raw bytes. Reductions travel
in a *wire dtype* chosen here: float16 and bfloat16 are reduced in float32 and cast back;
bool travels as uint8 0/1 with the op mapped to its logical meaning (`fcoll.ops.bool_op`);
every other dtype is reduced natively by MPI.
"""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np

from fcoll.ops import PremulSum, ReduceOp, bool_op

BFLOAT16 = np.dtype(ml_dtypes.bfloat16)

SUPPORTED: frozenset[np.dtype[Any]] = frozenset(
    np.dtype(name)
    for name in (
        "bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
        "float16", "float32", "float64", "complex64", "complex128",
    )
) | {BFLOAT16}

_BY_NAME = {str(d): d for d in SUPPORTED}
_HALF = frozenset({np.dtype("float16"), BFLOAT16})
_BITWISE = (ReduceOp.BAND, ReduceOp.BOR, ReduceOp.BXOR)
_ORDERED = (ReduceOp.MIN, ReduceOp.MAX)


def check_dtype(dtype: np.dtype[Any], fn: str, name: str = "x") -> None:
    """Raise `TypeError` unless ``dtype`` is one fcoll moves."""
    if dtype not in SUPPORTED:
        names = sorted(str(d) for d in SUPPORTED)
        raise TypeError(f"{fn}: expected {name} to have a dtype in {names}, got {dtype}")


def dtype_from_name(name: str) -> np.dtype[Any]:
    """The supported dtype whose ``str()`` is ``name`` (names travel in metadata)."""
    return _BY_NAME[name]


def _kind(dtype: np.dtype[Any]) -> str:
    return "f" if dtype in _HALF else dtype.kind


def check_op(op: ReduceOp | PremulSum, dtype: np.dtype[Any], fn: str) -> None:
    """Raise if ``op`` cannot reduce ``dtype`` (the rules of API.md, "Dtypes, ops and errors")."""
    kind = _kind(dtype)
    if kind == "c" and (op == ReduceOp.PRODUCT or op in _ORDERED or op in _BITWISE):
        raise ValueError(f"{fn}: expected op sum, avg or premul_sum for {dtype} (complex data "
                         f"has no order and no bits), got {op.value}")
    if isinstance(op, PremulSum) or op == ReduceOp.AVG:
        if kind not in "fc":
            raise TypeError(f"{fn}: expected a floating or complex dtype for {op!r}, "
                            f"got {dtype}; use op='sum' and divide yourself")
        if isinstance(op, PremulSum) and kind == "f" and isinstance(op.factor, complex):
            raise TypeError(f"{fn}: expected a real premul_sum factor for {dtype}, "
                            f"got {op.factor!r}")
    if op in _BITWISE and kind not in "biu":
        raise TypeError(f"{fn}: expected an integer or bool dtype for {op.value}, got {dtype}")


def wire_dtype(dtype: np.dtype[Any]) -> np.dtype[Any]:
    """The dtype a reduction of ``dtype`` travels and accumulates in on MPI."""
    if dtype in _HALF:
        return np.dtype("float32")
    if dtype == np.bool_:
        return np.dtype("uint8")
    return dtype


def wire_op(op: ReduceOp | PremulSum, dtype: np.dtype[Any]) -> ReduceOp | PremulSum:
    """The op MPI applies to the wire data of ``dtype``."""
    if dtype == np.bool_ and isinstance(op, ReduceOp):
        return bool_op(op)
    return op


def as_bytes(x: np.ndarray) -> np.ndarray:
    """``x``'s elements in C order as a flat uint8 array (a view when ``x`` is C-contiguous)."""
    return np.ascontiguousarray(x).reshape(-1).view(np.uint8)
