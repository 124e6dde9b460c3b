"""Deterministic per-rank data and numpy references, so any rank can compute every
rank's input and hence the expected result, at any world size."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import ml_dtypes
import numpy as np

BF16 = np.dtype(ml_dtypes.bfloat16)
INTS = [np.dtype(t) for t in ("int8", "int16", "int32", "int64",
                              "uint8", "uint16", "uint32", "uint64")]
FLOATS = [np.dtype("float16"), BF16, np.dtype("float32"), np.dtype("float64")]
COMPLEX = [np.dtype("complex64"), np.dtype("complex128")]
ALL_DTYPES = [np.dtype(bool), *INTS, *FLOATS, *COMPLEX]


def data(rank: int, shape: Sequence[int] | int, dtype: Any, salt: int = 0,
         low: int = 0, high: int = 8) -> np.ndarray:
    """Small integer-valued data of ``dtype`` for ``rank`` (exact in every dtype's sums)."""
    rng = np.random.default_rng([salt, rank])
    dtype = np.dtype(dtype)
    values = rng.integers(low, high, size=shape)
    if dtype == np.bool_:
        return values % 2 == 1
    if dtype.kind == "c":
        return (values + 1j * rng.integers(low, high, size=shape)).astype(dtype)
    return values.astype(dtype)


def bits(rank: int, shape: Sequence[int] | int, dtype: Any, salt: int = 0) -> np.ndarray:
    """Arbitrary bit patterns of ``dtype`` (NaNs, infs, denormals included): for movement."""
    dtype = np.dtype(dtype)
    rng = np.random.default_rng([salt, rank, 7])
    count = int(np.prod(shape)) * dtype.itemsize
    raw = rng.integers(0, 256, size=count, dtype=np.uint8)
    if dtype == np.bool_:
        raw = raw % 2
    return raw.view(dtype).reshape(shape)


def wire(dtype: np.dtype[Any]) -> np.dtype[Any]:
    return np.dtype("float32") if dtype in (np.dtype("float16"), BF16) else dtype


BITWISE = ("band", "bor", "bxor")
_NUMPY_OPS = {"sum": np.add, "avg": np.add, "product": np.multiply, "min": np.minimum,
              "max": np.maximum, "band": np.bitwise_and, "bor": np.bitwise_or,
              "bxor": np.bitwise_xor}
_BOOL_OPS = {"sum": np.logical_or, "max": np.logical_or, "bor": np.logical_or,
             "product": np.logical_and, "min": np.logical_and, "band": np.logical_and,
             "bxor": np.logical_xor}


def reduce_error(dtype: Any, op: str) -> type[Exception] | None:
    """The error fcoll documents for reducing ``dtype`` with ``op`` (API.md, "Dtypes, ops and
    errors"; docs/dtypes.md), raised by every transport before anything is sent, or None.

    Example:
        >>> reduce_error(bool, "avg"), reduce_error("complex64", "max"), reduce_error("int8", "bor")
        (<class 'TypeError'>, <class 'ValueError'>, None)
    """
    dtype = np.dtype(dtype)
    if dtype.kind == "c" and op not in ("sum", "avg"):
        return ValueError  # complex data has no order and no bits (checked first)
    if op == "avg" and dtype not in FLOATS and dtype.kind != "c":
        return TypeError  # integers and bool: use sum and divide
    if op in BITWISE and dtype.kind not in "biu":
        return TypeError
    return None


def tree(values: Sequence[Any], f: Any) -> Any:
    """``values`` (one per rank) combined with ``f`` along the canonical tree of their count
    (API.md "Reduction order"): with ``q = 2**floor(lg p)``, ``m = p - q``, the pairs
    ``f(v[2i], v[2i+1])`` for ``i < m``, then the rest, then level by level, lower on the left.
    Written from the contract, apart from fcoll's own code."""
    p = len(values)
    m = p - (1 << (p.bit_length() - 1))
    level = [f(values[2 * i], values[2 * i + 1]) for i in range(m)] + list(values[2 * m:])
    while len(level) > 1:
        level = [f(level[k], level[k + 1]) for k in range(0, len(level), 2)]
    return level[0]


def scan_tree(values: Sequence[Any], r: int, f: Any) -> Any:
    """Rank ``r``'s inclusive prefix of ``values`` in the scan order (API.md, docs/numeric.md):
    leaf ``i`` (a pair ``2i, 2i+1`` for ``i < m``, else rank ``i + m``) gets
    ``S_k f (... f (S_1 f leaf_i))``, ``S_b`` the tree's subtrees left of it, smallest first;
    the first rank of a pair gets the same chain without its leaf, then ``f`` its own value."""
    p = len(values)
    m = p - (1 << (p.bit_length() - 1))
    leaves = [f(values[2 * i], values[2 * i + 1]) for i in range(m)] + list(values[2 * m:])
    i, first = (r // 2, r % 2 == 0) if r < 2 * m else (r - m, False)
    chain = None if first else leaves[i]
    for b in range(i.bit_length()):
        if i >> b & 1:
            lo = ((i >> b) ^ 1) << b
            left = tree(leaves[lo:lo + (1 << b)], f)
            chain = left if chain is None else f(left, chain)
    if first:
        chain = values[r] if chain is None else f(chain, values[r])
    return chain


def reference(inputs: list[np.ndarray], op: str, prefix_of: int | None = None) -> np.ndarray:
    """numpy's reduction of ``inputs`` along the canonical tree (`tree`), or with
    ``prefix_of=r`` rank r's prefix in the scan order (`scan_tree`), with fcoll's dtype
    rules; for a pair fcoll refuses, the error it documents (`reduce_error`)."""
    dtype = inputs[0].dtype
    error = reduce_error(dtype, op)
    if error is not None:
        raise error(f"reference: fcoll documents {error.__name__} for {op} on {dtype}")
    combine = tree if prefix_of is None else (lambda v, f: scan_tree(v, prefix_of, f))
    if dtype == np.bool_:
        return np.asarray(combine(inputs, _BOOL_OPS[op]))
    w = wire(dtype)
    total = combine([x.astype(w) for x in inputs], _NUMPY_OPS[op])
    if op == "avg":
        total = total / np.asarray(len(inputs), dtype=w)
    return np.asarray(total).astype(dtype)


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    """Equal dtype, shape and bytes."""
    return (a.dtype == b.dtype and a.shape == b.shape
            and np.ascontiguousarray(a).tobytes() == np.ascontiguousarray(b).tobytes())


# Views of a (4, 6) array for the layout tests: a 0-d element, an empty slice, a strided
# view, a Fortran copy, and the array itself (`layout_inputs` makes that one read-only).
LAYOUTS = {"0d": lambda a: a[1, 2][()], "empty": lambda a: a[:0, :],
           "strided": lambda a: a[::2, ::3], "fortran": np.asfortranarray,
           "readonly": lambda a: a}


def layout_inputs(members: Sequence[int], me: int, layout: str, dtype: Any
                  ) -> tuple[list[np.ndarray], np.ndarray]:
    """Every member's input in ``layout`` (`LAYOUTS`) and group rank ``me``'s own (read-only
    for ``"readonly"``)."""
    inputs = [np.asarray(LAYOUTS[layout](data(r, (4, 6), dtype, salt=4))) for r in members]
    x = inputs[me]
    if layout == "readonly":
        x.flags.writeable = False
    return inputs, x


def load_example(name: str) -> ModuleType:
    """examples/<name>.py as a module (loaded once per process)."""
    key = f"_fcoll_example_{name}"
    if key not in sys.modules:
        path = Path(__file__).resolve().parents[1] / "examples" / f"{name}.py"
        spec = importlib.util.spec_from_file_location(key, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[key] = module
        spec.loader.exec_module(module)
    return sys.modules[key]
