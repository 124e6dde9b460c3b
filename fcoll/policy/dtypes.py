"""Dtype policy: which dtypes fcoll accepts, and how each travels on the wire.

Data movement is always bit-exact: arrays travel as their raw bytes. Reductions travel
in a *wire dtype* chosen here: float16 and bfloat16 are reduced in float32 and cast back;
bool travels as uint8 0/1 with the op mapped to its logical meaning (`fcoll.policy.ops.bool_op`);
every other dtype is reduced natively by MPI.
"""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np

from fcoll.policy.ops import PremulSum, ReduceOp, Resolved, bool_op

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


def check_op(op: Resolved, dtype: np.dtype[Any], fn: str) -> None:
    """Raise if ``op`` cannot reduce ``dtype`` (the rules of API.md, "Dtypes, ops and errors")."""
    if isinstance(op, np.ufunc):
        _check_ufunc(op, dtype, fn)
        return
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


def _check_ufunc(op: np.ufunc, dtype: np.dtype[Any], fn: str) -> None:
    """`TypeError` unless the binary ufunc ``op`` maps two arrays of ``dtype``'s wire dtype
    to that dtype (a fold keeps its dtype)."""
    wire = wire_dtype(dtype, op)
    try:
        found = op.resolve_dtypes((wire, wire, None))
    except TypeError:
        found = None
    if found != (wire, wire, wire):
        got = "no loop" if found is None else f"{found[0]}, {found[1]} -> {found[2]}"
        raise TypeError(f"{fn}: expected op to map two {wire} arrays to {wire} (the wire dtype "
                        f"of {dtype}), got np.{op.__name__} with {got}")


def wire_dtype(dtype: np.dtype[Any], op: Resolved | None = None) -> np.dtype[Any]:
    """The dtype a reduction of ``dtype`` with ``op`` travels and accumulates in on MPI
    (a ufunc folds bool as bool; the named ops carry it as uint8 0/1)."""
    if dtype in _HALF:
        return np.dtype("float32")
    if dtype == np.bool_ and not isinstance(op, np.ufunc):
        return np.dtype("uint8")
    return dtype


def wire_op(op: Resolved, dtype: np.dtype[Any]) -> Resolved:
    """The op MPI applies to the wire data of ``dtype``."""
    if dtype == np.bool_ and isinstance(op, ReduceOp):
        return bool_op(op)
    return op


_IDENTITY = {ReduceOp.SUM: 0, ReduceOp.PRODUCT: 1, ReduceOp.BOR: 0, ReduceOp.BXOR: 0,
             ReduceOp.BAND: -1}


def identity(op: Resolved, dtype: np.dtype[Any]) -> Any:
    """The value ``e`` of ``dtype`` with ``e op v == v`` (what `fcoll.exscan` gives rank 0), or
    None for an op without one: 0 for sum, 1 for product, -inf/+inf for float max/min and the
    integer dtype's lowest/highest value, all bits set for band; a ufunc's ``identity``.

    Example:
        >>> identity(ReduceOp.MAX, np.dtype("int8")), identity(ReduceOp.BAND, np.dtype("uint8"))
        (np.int8(-128), np.uint8(255))
    """
    if isinstance(op, np.ufunc):
        value = op.identity
        return None if value is None else np.array(value).astype(dtype)[()]
    if isinstance(op, PremulSum) or op is ReduceOp.AVG:
        return None
    if dtype == np.bool_:
        return np.bool_(bool_op(op) is ReduceOp.MIN)  # and: True; or, xor: False
    if op in _ORDERED:
        low = op is ReduceOp.MAX
        if _kind(dtype) == "f":
            return np.array(-np.inf if low else np.inf).astype(dtype)[()]
        info = np.iinfo(dtype)
        return dtype.type(info.min if low else info.max)
    return np.array(_IDENTITY[op]).astype(dtype)[()]


def as_bytes(x: np.ndarray) -> np.ndarray:
    """``x``'s elements in C order as a flat uint8 array (a view when ``x`` is C-contiguous)."""
    return np.ascontiguousarray(x).reshape(-1).view(np.uint8)
