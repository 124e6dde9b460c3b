"""Helpers shared by the collectives: byte layouts and shape bookkeeping."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np


def nbytes_of(shape: Sequence[int], dtype: np.dtype[Any]) -> int:
    """Bytes of a C-contiguous array of ``shape`` and ``dtype``."""
    return math.prod(shape) * dtype.itemsize


def c_order(x: np.ndarray) -> np.ndarray:
    """``x`` if C-contiguous, else a C-ordered copy (0-d stays 0-d)."""
    return x if x.flags.c_contiguous else np.asarray(x, order="C")


def from_bytes(buf: np.ndarray, dtype: np.dtype[Any], shape: Sequence[int]) -> np.ndarray:
    """View the flat uint8 buffer ``buf`` (fcoll's own) as an array of ``dtype`` and ``shape``."""
    return buf.view(dtype).reshape(tuple(shape))


def split_bytes(
    buf: np.ndarray, dtype: np.dtype[Any], shapes: Sequence[Sequence[int]]
) -> list[np.ndarray]:
    """Cut ``buf`` into consecutive arrays of ``shapes`` (views of ``buf``)."""
    out, offset = [], 0
    for shape in shapes:
        size = nbytes_of(shape, dtype)
        out.append(from_bytes(buf[offset : offset + size], dtype, shape))
        offset += size
    return out


def dim_first(x: np.ndarray, dim: int) -> np.ndarray:
    """``x`` with axis ``dim`` moved to the front (a view)."""
    return x if dim == 0 else np.moveaxis(x, dim, 0)


def dim_back(y: np.ndarray, dim: int) -> np.ndarray:
    """Undo `dim_first`, as a C-contiguous array."""
    return y if dim == 0 else np.ascontiguousarray(np.moveaxis(y, 0, dim))

