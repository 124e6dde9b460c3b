"""Argument checks that raise the documented errors before anything is sent."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from fcoll.policy.dtypes import SUPPORTED, check_dtype, dtype_from_name


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
    check_count(xs, n, fn, name)
    arrays = [check_array(x, fn, f"{name}[{i}]") for i, x in enumerate(xs)]
    check_same_dtype(arrays, fn, name)
    return arrays


def check_count(xs: Sequence[Any], n: int | None, fn: str, name: str) -> None:
    """`ValueError` unless the list ``xs`` holds ``n`` entries (any ``n`` when None)."""
    if n is not None and len(xs) != n:
        raise ValueError(f"{fn}: expected {name} to hold {n} arrays (one per group rank), "
                         f"got {len(xs)}")


def check_same_dtype(xs: Sequence[Any], fn: str, name: str) -> None:
    """`ValueError` unless every array of ``xs`` (anything with ``.dtype``) has one dtype."""
    if len({a.dtype for a in xs}) <= 1:  # dtype objects: their names cost a microsecond each
        return
    dtypes = sorted({str(a.dtype) for a in xs})
    if len(dtypes) > 1:
        raise ValueError(f"{fn}: expected one dtype across {name}, got tensors with "
                         f"different dtypes {dtypes}")


def check_splits(x: Any, output_split_sizes: object, input_split_sizes: object, n: int,
                 fn: str) -> tuple[list[int], list[int] | None]:
    """`all_to_all_single`'s input and output split sizes, checked against this rank's
    ``x`` (anything with ``.shape``): the input sizes (even when not given) and the output
    sizes, or None when not given."""
    if len(x.shape) == 0:
        raise ValueError(f"{fn}: expected x with at least 1 dimension, got a 0-d array")
    if input_split_sizes is None:
        check_divisible(x.shape, 0, n, fn, "x.shape[0]", " when input_split_sizes is None")
        ins = [x.shape[0] // n] * n
    else:
        ins = check_sizes(input_split_sizes, n, fn, "input_split_sizes")
    if sum(ins) != x.shape[0]:
        raise ValueError(f"{fn}: expected sum(input_split_sizes) == x.shape[0] == {x.shape[0]}, "
                         f"got {ins} (sum {sum(ins)})")
    outs = (None if output_split_sizes is None
            else check_sizes(output_split_sizes, n, fn, "output_split_sizes"))
    return ins, outs


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


def check_divisible(shape: Sequence[int], dim: int, n: int, fn: str, what: str,
                    when: str = "") -> None:
    """`ValueError` unless ``shape[dim]`` splits into ``n`` equal blocks (a 0-d shape never
    does); ``what`` names the length (``"x.shape[0]"``), ``when`` the condition, if any."""
    if len(shape) == 0 or shape[dim] % n:
        raise ValueError(f"{fn}: expected {what} divisible by the group's size {n}{when}, "
                         f"got shape {tuple(shape)}")


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


# Checks of what every rank sent about its call (metadata gathered over MPI): every rank
# holds the same list and finds the same problem, so all raise together.


def sizes_problem(meta: list[Any], dim: int) -> str | None:
    """What disagrees in every rank's all-gather-v metadata ``(shape, dtype, sizes)``.

    Every rank holds the same ``meta`` and so finds the same problem: all raise together.
    """
    shape0, dtype0, _ = meta[0]
    rest0 = shape0[:dim] + shape0[dim + 1 :]
    for p, (shape, dtype, sizes) in enumerate(meta):
        if dtype != dtype0 or len(shape) != len(shape0) or shape[:dim] + shape[dim + 1 :] != rest0:
            return (
                f"rank {p} passed shape {shape} {dtype}, rank 0 passed {shape0} {dtype0} "
                "(only gather_dim may differ)"
            )
        for q, (q_shape, _, _) in enumerate(meta if sizes is not None else ()):
            if sizes[q] != q_shape[dim]:
                return f"rank {p} passed sizes[{q}] = {sizes[q]} but rank {q} passed x of shape {q_shape}"
    return None


def split_problem(meta: list[Any]) -> str | None:
    """What disagrees in every rank's all_to_all_single metadata ``(in, out, row, dtype)``.

    Every rank holds the same ``meta`` and so finds the same problem: all raise together.
    """
    _, _, row0, dtype0 = meta[0]
    for p, (_, outs, row, dtype) in enumerate(meta):
        if (row, dtype) != (row0, dtype0):
            return f"rank {p} passed rows of shape {row} {dtype}, rank 0 {row0} {dtype0}"
        for q, (q_ins, _, _, _) in enumerate(meta if outs is not None else ()):
            if outs[q] != q_ins[p]:
                return (
                    f"rank {p} expects output_split_sizes[{q}] = {outs[q]} rows but "
                    f"rank {q} sends {q_ins[p]} (its input_split_sizes[{p}])"
                )
    return None


def one_dtype(dtypes: list[str], fn: str) -> np.dtype[Any]:
    if len(set(dtypes)) > 1:
        detail = ", ".join(f"rank {r}: {d}" for r, d in enumerate(dtypes))
        raise ValueError(f"{fn}: expected one dtype on every rank, got tensors with different "
                         f"dtypes ({detail})")
    return dtype_from_name(dtypes[0])


def check_permutation(src_dst: object, n: int, fn: str) -> list[int | None]:
    if isinstance(src_dst, (str, bytes)) or not isinstance(src_dst, Sequence):
        raise TypeError(f"{fn}: expected src_dst to be a list of ranks or None, "
                        f"got {type(src_dst).__name__}")
    if len(src_dst) != n:
        raise ValueError(f"{fn}: expected src_dst to have {n} entries (the group's size), "
                         f"got {len(src_dst)}")
    targets = [None if d is None else check_rank(d, n, fn, f"src_dst[{i}]")
               for i, d in enumerate(src_dst)]
    chosen = [d for d in targets if d is not None]
    if len(chosen) != len(set(chosen)):
        raise ValueError(f"{fn}: expected each rank to receive from at most one rank, "
                         f"got src_dst={list(src_dst)}")
    return targets


def check_like(like: Any, fn: str) -> tuple[tuple[int, ...], np.dtype[Any]]:
    """``like``'s shape and dtype: an array (anything with ``shape`` and ``dtype`` fcoll takes)
    or a ``(shape, dtype)`` pair; `ValueError` naming ``like`` otherwise."""
    if isinstance(like, tuple) and len(like) == 2:
        shape, dtype = like
    elif hasattr(like, "shape") and hasattr(like, "dtype"):
        shape, dtype = like.shape, like.dtype
    else:
        raise ValueError(f"{fn}: expected like to be an array or a (shape, dtype) pair, got "
                         f"{type(like).__name__}")
    if isinstance(shape, (int, np.integer)) and not isinstance(shape, bool):
        shape = (shape,)
    if not isinstance(shape, (tuple, list)) or not all(
            isinstance(s, (int, np.integer)) and not isinstance(s, bool) and s >= 0 for s in shape):
        raise ValueError(f"{fn}: expected like's shape to be a tuple of non-negative ints, got "
                         f"{shape!r}")
    try:
        kind = np.dtype(dtype)
    except TypeError as error:
        raise ValueError(f"{fn}: expected like's dtype to be a numpy dtype, got {dtype!r}") \
            from error
    check_dtype(kind, fn, "like")
    return tuple(int(s) for s in shape), kind
