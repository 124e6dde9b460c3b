"""Pytrees of one array kind, for `fcoll.lax` and `fcoll.dp`: which array module (numpy or
cupy) a tree's leaves belong to, and the leaves packed into one flat byte buffer of that
module and back.

A tree whose leaves are cupy arrays is worked on with cupy's own functions (it stays on
its device, and travels over NCCL where that is the transport); any other tree with
numpy's. cupy is never imported here: a cupy leaf means the caller already imported it
(`fcoll.dispatch.is_cupy` looks in ``sys.modules``). A tree that mixes numpy and cupy
leaves raises `TypeError` naming the first leaf of the wrong kind, before anything is sent.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any, TypeVar

import numpy as np
import optree

from fcoll.dispatch import interop, is_cupy

Array = Any  # a numpy.ndarray or a cupy.ndarray (cupy has no type stubs)
ALIGN = 16  # byte alignment of each leaf in a packed buffer (GPU loads need aligned data)


def kind(x: object) -> str:
    """The full name of ``x``'s type: ``numpy.ndarray``, ``cupy.ndarray``, ``builtins.list``."""
    if is_cupy(x):
        return "cupy.ndarray"
    return f"{type(x).__module__}.{type(x).__qualname__}"


def path_name(path: Sequence[Any]) -> str:
    """A leaf's path as indexing: ``['l1']['w']``, ``[0][1]``; ``<root>`` for a bare leaf."""
    return "".join(f"[{p!r}]" for p in path) or "<root>"


def _leaf_name(tree: object, index: int) -> str:
    if tree is None:
        return f"leaf {index}"
    paths = optree.tree_flatten_with_path(tree)[0]  # type: ignore[arg-type]
    return f"leaf {path_name(paths[index])}"


def array_module(leaves: Sequence[object], fn: str, tree: object = None, *,
                 arrays_only: bool = False) -> ModuleType:
    """numpy, or cupy when the leaves (of ``tree``, which names them in errors) are cupy
    arrays; `TypeError` if some are and others are not. ``arrays_only``: other leaves
    than numpy arrays (scalars, lists) raise `TypeError` too.

    Example:
        >>> array_module([np.ones(2)], "psum") is np
        True
        >>> array_module([cupy.ones(2), np.ones(2)], "psum", {"a": ..., "b": ...})
        TypeError: psum: expected leaf ['b'] to be a cupy.ndarray like leaf ['a'], got numpy.ndarray; ...
    """
    first = next((i for i, leaf in enumerate(leaves) if is_cupy(leaf)), None)
    if first is None:
        if arrays_only:
            for i, leaf in enumerate(leaves):
                if not isinstance(leaf, np.ndarray):
                    raise TypeError(f"{fn}: expected {_leaf_name(tree, i)} to be a numpy.ndarray, "
                                    f"cupy.ndarray, torch.Tensor or jax.Array, got {kind(leaf)}")
        return np
    for i, leaf in enumerate(leaves):
        if not is_cupy(leaf):
            raise TypeError(f"{fn}: expected {_leaf_name(tree, i)} to be a cupy.ndarray like "
                            f"{_leaf_name(tree, first)}, got {kind(leaf)}; numpy and cupy "
                            "arrays cannot be mixed in one call")
    return sys.modules["cupy"]


def _offsets(leaves: Sequence[Array]) -> tuple[list[int], int]:
    """Each leaf's byte offset in a packed buffer (multiples of `ALIGN`), and its size."""
    offsets, end = [], 0
    for leaf in leaves:
        offsets.append(end)
        end += -(-leaf.nbytes // ALIGN) * ALIGN
    return offsets, end


def pack(leaves: Sequence[Array], xp: ModuleType) -> Array:
    """The leaves' bytes (each in C order, starting at a multiple of `ALIGN`) in one new
    flat uint8 array of module ``xp``; the padding between them is left unset.

    Example:
        >>> pack([np.ones(1, np.int8), np.zeros(1)], np).shape     # 1 byte, 15 of padding, 8
        (32,)
    """
    offsets, total = _offsets(leaves)
    buf = xp.empty(total, np.uint8)
    for leaf, offset in zip(leaves, offsets, strict=True):
        buf[offset : offset + leaf.nbytes] = xp.ascontiguousarray(leaf).reshape(-1).view(np.uint8)
    return buf


def unpack(buf: Array, like: Sequence[Array]) -> list[Array]:
    """Arrays shaped and typed like ``like``, viewing `pack`'s layout of ``buf``.

    Example:
        >>> leaves = [np.arange(3), np.ones((2, 2), np.float32)]
        >>> [a.shape for a in unpack(pack(leaves, np), leaves)]
        [(3,), (2, 2)]
    """
    offsets, _ = _offsets(like)
    return [buf[offset : offset + a.nbytes].view(a.dtype).reshape(a.shape)
            for a, offset in zip(like, offsets, strict=True)]


F = TypeVar("F", bound=Callable[..., Any])


def native_leaves(leaves: Sequence[Any], tree: object, fn: str) -> tuple[list[Any], Any]:
    """The leaves with torch tensors and JAX arrays seen as numpy or cupy arrays
    (`fcoll.dispatch.interop`), and the first such leaf (``None`` if there is none): the
    results go back to its type and device with `back`. A tree mixing them with other arrays
    raises `TypeError` naming the leaf.

    Example:
        >>> native_leaves([torch.ones(2)], None, "psum")
        ([array([1., 1.], dtype=float32)], tensor([1., 1.]))
    """
    first = next((i for i, leaf in enumerate(leaves) if interop.kind(leaf)), None)
    if first is None:
        return list(leaves), None
    like = leaves[first]
    for i, leaf in enumerate(leaves):
        if getattr(leaf, "shape", None) is not None and interop.kind(leaf) != interop.kind(like):
            raise TypeError(f"{fn}: expected {_leaf_name(tree, i)} to be a {kind(like)} like "
                            f"{_leaf_name(tree, first)}, got {kind(leaf)}; array types cannot be "
                            "mixed in one call")
    return [interop.to_native(leaf, fn, _leaf_name(tree, i)) for i, leaf in enumerate(leaves)], like


def back(tree: Any, like: Any) -> Any:
    """``tree`` with its array leaves as arrays of ``like``'s type and device (``like``
    ``None``: ``tree`` itself).

    Example:
        >>> back({"w": np.ones(2)}, torch.zeros(1))
        {'w': tensor([1., 1.], dtype=torch.float64)}
    """
    return tree if like is None else optree.tree_map(lambda y: interop.back(y, like), tree)


def foreign_leaves(fn: F) -> F:
    """Let ``fn`` (whose first argument is a pytree) take trees of torch tensors or JAX
    arrays: their leaves are seen as numpy or cupy arrays (`native_leaves`), and the
    result's array leaves come back as the input's type and device. A tree mixing them with
    other arrays raises `TypeError` naming the leaf, before anything is sent.

    Example:
        >>> psum = foreign_leaves(psum)
        >>> psum({"w": jnp.ones(2)}, "dp")          # 2 ranks along "dp"
        {'w': Array([2., 2.], dtype=float32)}
    """
    name = fn.__name__

    @functools.wraps(fn)
    def wrapper(x: Any, *args: Any, **kwargs: Any) -> Any:
        leaves, spec = optree.tree_flatten(x)
        native, like = native_leaves(leaves, x, name)
        if like is None:
            return fn(x, *args, **kwargs)
        return back(fn(optree.tree_unflatten(spec, native), *args, **kwargs), like)

    return wrapper  # type: ignore[return-value]
