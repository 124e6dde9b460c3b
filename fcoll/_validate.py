"""Argument checks that raise the documented errors before anything is sent."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from fcoll.dtypes import SUPPORTED, check_dtype


def check_array(x: object, fn: str, name: str = "x") -> np.ndarray:
    """Return ``x`` if it is a numpy array of a supported dtype; else raise `TypeError`."""
    if type(x) is np.ndarray and x.dtype in SUPPORTED:
        return x
    if not isinstance(x, np.ndarray):
        hint = "; pass np.asarray(...)" if isinstance(x, (list, tuple, int, float, complex,
                                                            bool, np.generic)) else ""
        raise TypeError(f"{fn}: expected {name} to be a numpy.ndarray, "
                        f"got {type(x).__name__}{hint}")
    check_dtype(x.dtype, fn, name)
    return x


def check_arrays(xs: object, n: int | None, fn: str, name: str) -> list[np.ndarray]:
    """A list of arrays sharing one dtype (and of length ``n`` unless ``None``)."""
    if isinstance(xs, np.ndarray) or not isinstance(xs, Sequence):
        raise TypeError(f"{fn}: expected {name} to be a list of numpy arrays, "
                        f"got {type(xs).__name__}")
    if n is not None and len(xs) != n:
        raise ValueError(f"{fn}: expected {name} to hold {n} arrays (one per group rank), "
                         f"got {len(xs)}")
    arrays = [check_array(x, fn, f"{name}[{i}]") for i, x in enumerate(xs)]
    dtypes = sorted({str(a.dtype) for a in arrays})
    if len(dtypes) > 1:
        raise ValueError(f"{fn}: expected one dtype across {name}, got tensors with "
                         f"different dtypes {dtypes}")
    return arrays


def check_rank(rank: object, size: int, fn: str, name: str) -> int:
    """A group rank in ``[0, size)``: `TypeError` if not an int, `ValueError` if out of range."""
    if not isinstance(rank, (int, np.integer)) or isinstance(rank, bool):
        raise TypeError(f"{fn}: expected {name} to be an int group rank, "
                        f"got {type(rank).__name__}")
    if not 0 <= rank < size:
        raise ValueError(f"{fn}: invalid root rank: expected 0 <= {name} < {size} "
                         f"(the group's size), got {rank}")
    return int(rank)


def check_dim(x: np.ndarray, dim: object, fn: str, name: str) -> int:
    """A dimension of ``x``, negative counting from the end."""
    if type(dim) is not int and (not isinstance(dim, (int, np.integer)) or isinstance(dim, bool)):
        raise TypeError(f"{fn}: expected {name} to be an int, got {type(dim).__name__}")
    if x.ndim == 0:
        raise ValueError(f"{fn}: expected x with at least 1 dimension for {name}, "
                         "got a 0-d array")
    if not -x.ndim <= dim < x.ndim:
        raise ValueError(f"{fn}: expected {name} in [{-x.ndim}, {x.ndim}) for an array of "
                         f"shape {x.shape}, got {dim}")
    return int(dim) % x.ndim


def check_sizes(sizes: object, n: int, fn: str, name: str) -> list[int]:
    """A list of ``n`` non-negative ints."""
    if isinstance(sizes, (str, bytes, np.ndarray)) or not isinstance(sizes, Sequence):
        raise TypeError(f"{fn}: expected {name} to be a list of ints, "
                        f"got {type(sizes).__name__}")
    if not all(isinstance(s, (int, np.integer)) and not isinstance(s, bool) for s in sizes):
        raise TypeError(f"{fn}: expected {name} to be a list of ints, got {list(sizes)!r}")
    if len(sizes) != n:
        raise ValueError(f"{fn}: expected {name} to have {n} entries (the group's size), "
                         f"got {len(sizes)}")
    if any(s < 0 for s in sizes):
        raise ValueError(f"{fn}: expected non-negative {name}, got {list(sizes)}")
    return [int(s) for s in sizes]
