"""fcoll.lax: JAX's collective spelling over mesh axis names, on pytrees of arrays.

Inside ``with fc.Mesh(shape, names):`` every function takes ``axis_name`` (one axis name
or a tuple of names) like ``jax.lax`` under ``shard_map``, maps over a pytree, and sends
the leaves in fused messages (one per dtype for reductions, one in all for movement).
Shapes follow JAX: `all_gather` stacks along a new axis unless ``tiled=True``.
A tree of cupy arrays is reshaped and packed with cupy and stays on its device (over
NCCL where that is the transport); a tree of JAX arrays or torch tensors gives one of the
same type back (`fcoll._tree.foreign_leaves`); array types mixed in one tree raise `TypeError`.

Example:
    >>> with fc.Mesh((2, 2), ("dp", "tp")):
    ...     grads = fc.lax.pmean(grads, "dp")          # a pytree, averaged over "dp"
    ...     i = fc.lax.axis_index("tp")
"""

from __future__ import annotations

from collections.abc import Sequence
from types import ModuleType
from typing import Any

import numpy as np
import optree

from fcoll._tree import Array, array_module, foreign_leaves, pack, unpack
from fcoll.collectives import (
    all_gather_into_tensor_coalesced,
    all_reduce_coalesced,
    all_to_all_single,
    reduce_scatter_tensor_coalesced,
)
from fcoll.group import Group
from fcoll.mesh import axis_group
from fcoll.p2p import permute_tensor

AxisName = str | Sequence[str]


def _group(axis_name: AxisName, fn: str) -> Group:
    return axis_group(axis_name, fn)


def _leaves(x: Any, fn: str) -> tuple[list[Array], Any, ModuleType]:
    """The leaves of ``x``, its structure, and their array module (numpy or cupy);
    `TypeError` naming the leaf if numpy and cupy leaves mix. Other leaves of a numpy tree
    (scalars) become numpy arrays."""
    leaves, spec = optree.tree_flatten(x)
    xp = array_module(leaves, fn, x)
    return ([np.asarray(leaf) for leaf in leaves] if xp is np else leaves), spec, xp


def _reduce(x: Any, axis_name: AxisName, op: str, fn: str) -> Any:
    leaves, spec, _ = _leaves(x, fn)
    g = _group(axis_name, fn)
    return optree.tree_unflatten(spec, all_reduce_coalesced(leaves, op, g))


@foreign_leaves
def psum(x: Any, axis_name: AxisName) -> Any:
    """Sum of ``x`` (a pytree) over the ranks along ``axis_name``.

    Example:
        >>> with fc.Mesh((2, 2), ("dp", "tp")):     # mpiexec -n 4; rank r at (r // 2, r % 2)
        ...     fc.lax.psum({"w": np.array([r])}, "dp")
        {'w': array([4])}                         # on ranks 1 and 3 (1 + 3); ranks 0, 2 get [2]
    """
    return _reduce(x, axis_name, "sum", "psum")


@foreign_leaves
def pmean(x: Any, axis_name: AxisName) -> Any:
    """Mean of ``x`` (a pytree of floating arrays) along ``axis_name``.

    Example:
        >>> with fc.Mesh((2, 2), ("dp", "tp")):     # mpiexec -n 4; rank r at (r // 2, r % 2)
        ...     fc.lax.pmean([np.array([float(r)])], "tp")
        [array([0.5])]                              # on ranks 0 and 1; ranks 2, 3 get [2.5]
    """
    return _reduce(x, axis_name, "avg", "pmean")


@foreign_leaves
def pmax(x: Any, axis_name: AxisName) -> Any:
    """Elementwise maximum of ``x`` along ``axis_name``.

    Example:
        >>> with fc.Mesh((2, 2), ("dp", "tp")):     # mpiexec -n 4; rank r at (r // 2, r % 2)
        ...     fc.lax.pmax(np.array([r, -r]), ("dp", "tp"))
        array([3, 0])                               # on every rank
    """
    return _reduce(x, axis_name, "max", "pmax")


@foreign_leaves
def pmin(x: Any, axis_name: AxisName) -> Any:
    """Elementwise minimum of ``x`` along ``axis_name``.

    Example:
        >>> with fc.Mesh((2, 2), ("dp", "tp")):     # mpiexec -n 4; rank r at (r // 2, r % 2)
        ...     fc.lax.pmin(np.array([r]), "dp")
        array([1])                                  # on ranks 1 and 3; ranks 0, 2 get [0]
    """
    return _reduce(x, axis_name, "min", "pmin")


def axis_index(axis_name: AxisName) -> int:
    """This rank's index along ``axis_name`` (row-major over several names).

    Example:
        >>> with fc.Mesh((2, 2), ("dp", "tp")):     # mpiexec -n 4
        ...     fc.lax.axis_index("dp"), fc.lax.axis_index("tp")
        (1, 0)                                      # on rank 2, at (1, 0)
    """
    return _group(axis_name, "axis_index").rank


def axis_size(axis_name: AxisName) -> int:
    """The number of ranks along ``axis_name``.

    Example:
        >>> with fc.Mesh((2, 3), ("dp", "tp")):     # mpiexec -n 6, on every rank
        ...     fc.lax.axis_size("tp"), fc.lax.axis_size(("dp", "tp"))
        (3, 6)
    """
    return _group(axis_name, "axis_size").size


def _axis(value: int, ndim: int, fn: str, name: str) -> int:
    if type(value) is not int or not -ndim <= value < ndim:
        raise ValueError(f"{fn}: expected {name} in [{-ndim}, {ndim}), got {value!r}")
    return value % ndim


@foreign_leaves
def all_gather(x: Any, axis_name: AxisName, *, axis: int = 0, tiled: bool = False) -> Any:
    """Every rank's ``x`` along ``axis_name``, stacked on a new axis ``axis`` (JAX's
    default), or concatenated along ``axis`` when ``tiled=True``.

    Example:
        >>> with fc.Mesh((2, 2), ("dp", "tp")):     # mpiexec -n 4; rank r holds [r, r]
        ...     fc.lax.all_gather(np.array([r, r]), "dp")
        array([[1, 1],
               [3, 3]])                             # on ranks 1 and 3
        ...     fc.lax.all_gather(np.array([r, r]), "dp", tiled=True)
        array([1, 1, 3, 3])                         # on ranks 1 and 3
    """
    leaves, spec, xp = _leaves(x, "all_gather")
    g = _group(axis_name, "all_gather")
    gathered = all_gather_into_tensor_coalesced(leaves, g)
    out = []
    for leaf, got in zip(leaves, gathered, strict=True):
        stacked = got.reshape(g.size, *leaf.shape)
        if tiled:
            dim = _axis(axis, leaf.ndim, "all_gather", "axis")
            out.append(xp.concatenate([stacked[i] for i in range(g.size)], axis=dim))
        else:
            out.append(xp.moveaxis(stacked, 0, _axis(axis, leaf.ndim + 1, "all_gather", "axis")))
    return optree.tree_unflatten(spec, [xp.ascontiguousarray(o) for o in out])


@foreign_leaves
def psum_scatter(x: Any, axis_name: AxisName, *, scatter_dimension: int = 0,
                 tiled: bool = False) -> Any:
    """Sum along ``axis_name``, then keep this rank's block of ``scatter_dimension``.

    Not tiled (JAX's default): that dimension must equal the axis size and is removed.
    Tiled: it must be divisible by the axis size and shrinks by that factor.

    Example:
        >>> with fc.Mesh((2, 2), ("dp", "tp")):     # mpiexec -n 4; rank r holds [[r], [10 * r]]
        ...     fc.lax.psum_scatter(np.array([[r], [10 * r]]), "tp")
        array([1])                                  # on rank 0 (0 + 1); rank 1 gets [10]
    """
    fn = "psum_scatter"
    leaves, spec, xp = _leaves(x, fn)
    g = _group(axis_name, fn)
    dims = [_axis(scatter_dimension, leaf.ndim, fn, "scatter_dimension") for leaf in leaves]
    for leaf, d in zip(leaves, dims, strict=True):
        if (leaf.shape[d] != g.size) if not tiled else (leaf.shape[d] % g.size):
            raise ValueError(f"{fn}: expected x.shape[{d}] "
                             f"{'== ' if not tiled else 'divisible by '}the axis size {g.size}, "
                             f"got shape {leaf.shape}")
    moved = [xp.ascontiguousarray(xp.moveaxis(leaf, d, 0)) for leaf, d in zip(leaves, dims,
                                                                               strict=True)]
    reduced = reduce_scatter_tensor_coalesced(moved, "sum", g)
    out = [xp.moveaxis(r, 0, d) if tiled else r[0] for r, d in zip(reduced, dims, strict=True)]
    return optree.tree_unflatten(spec, [xp.ascontiguousarray(o) for o in out])


def _exchange(leaves: list[Array], g: Group, split: list[int],
              xp: ModuleType) -> list[list[Array]]:
    """Tiled all-to-all of every leaf in one message: block i of ``split`` goes to rank i;
    returns, per leaf, the blocks received from each rank. Row i of the message holds the
    leaves' blocks i, each at `pack`'s aligned offset (so cupy views of it are aligned)."""
    n = g.size
    blocks = [xp.split(leaf, n, axis=s) for leaf, s in zip(leaves, split, strict=True)]
    rows = xp.concatenate([pack([b[i] for b in blocks], xp) for i in range(n)]).reshape(n, -1)
    received = all_to_all_single(rows, group=g)
    like = [b[0] for b in blocks]
    by_rank = [unpack(received[p], like) for p in range(n)]
    return [[by_rank[p][j] for p in range(n)] for j in range(len(blocks))]


@foreign_leaves
def all_to_all(x: Any, axis_name: AxisName, split_axis: int, concat_axis: int, *,
               tiled: bool = False) -> Any:
    """Split each leaf along ``split_axis`` into one block per rank, send block ``i`` to
    rank ``i``, and concatenate what arrives along ``concat_axis`` (JAX's semantics: not
    tiled, ``x.shape[split_axis]`` must equal the axis size, that axis is removed and a new
    one of that size inserted at ``concat_axis``).

    Example:
        >>> with fc.Mesh((2, 2), ("dp", "tp")):     # mpiexec -n 4; rank r holds [10 * r, 10 * r + 1]
        ...     fc.lax.all_to_all(np.array([10 * r, 10 * r + 1]), "tp", 0, 0)
        array([ 1, 11])                             # on rank 1 (element 1 of ranks 0 and 1)
    """
    fn = "all_to_all"
    leaves, spec, xp = _leaves(x, fn)
    g = _group(axis_name, fn)
    plans = [_all_to_all_plan(leaf, g.size, split_axis, concat_axis, tiled) for leaf in leaves]
    prepared = [leaf if pre is None else xp.expand_dims(leaf, pre)
                for leaf, (pre, _, _, _) in zip(leaves, plans, strict=True)]
    received = _exchange(prepared, g, [split for _, split, _, _ in plans], xp)
    out = []
    for parts, (_, split, concat, squeeze) in zip(received, plans, strict=True):
        joined = xp.concatenate(parts, axis=concat)
        out.append(joined.squeeze(axis=split) if squeeze else joined)
    return optree.tree_unflatten(spec, [xp.ascontiguousarray(o) for o in out])


def _all_to_all_plan(leaf: Array, n: int, split_axis: int, concat_axis: int,
                     tiled: bool) -> tuple[int | None, int, int, bool]:
    """``(axis to insert first or None, split axis, concat axis, squeeze split axis)``."""
    fn = "all_to_all"
    split = _axis(split_axis, leaf.ndim, fn, "split_axis")
    concat = _axis(concat_axis, leaf.ndim, fn, "concat_axis")
    if tiled:
        if leaf.shape[split] % n:
            raise ValueError(f"{fn}: expected x.shape[{split}] divisible by the axis size {n}, "
                             f"got shape {leaf.shape}")
        return None, split, concat, False
    if leaf.shape[split] != n:
        raise ValueError(f"{fn}: expected x.shape[{split}] == the axis size {n} (tiled=False), "
                         f"got shape {leaf.shape}")
    if split == concat:
        return None, split, concat, False
    if split < concat:
        return concat + 1, split, concat + 1, True
    return concat, split + 1, concat, True


@foreign_leaves
def ppermute(x: Any, axis_name: AxisName, perm: Sequence[tuple[int, int]]) -> Any:
    """Send ``x`` from ``src`` to ``dst`` for each ``(src, dst)`` in ``perm`` (indices along
    ``axis_name``); ranks that receive nothing get zeros.

    Example:
        >>> with fc.Mesh((2, 2), ("dp", "tp")):     # mpiexec -n 4; rank r holds [r]
        ...     fc.lax.ppermute(np.array([r]), "dp", [(0, 1)])
        array([0])                                  # on rank 2 (from rank 0); ranks 0, 1 get [0] (zeros)
        array([1])                                  # on rank 3 (from rank 1)
    """
    fn = "ppermute"
    leaves, spec, xp = _leaves(x, fn)
    g = _group(axis_name, fn)
    src_dst: list[int | None] = [None] * g.size
    for pair in perm:
        if not (isinstance(pair, (tuple, list)) and len(pair) == 2):
            raise ValueError(f"{fn}: expected perm to be (src, dst) pairs, got {perm!r}")
        src, dst = pair
        if src_dst[src] is not None:
            raise ValueError(f"{fn}: expected each source once in perm, got {perm!r}")
        src_dst[src] = dst
    return optree.tree_unflatten(spec, unpack(permute_tensor(pack(leaves, xp), src_dst, g),
                                              leaves))


@foreign_leaves
def pshuffle(x: Any, axis_name: AxisName, perm: Sequence[int]) -> Any:
    """`ppermute` with ``perm[i]`` = the index whose ``x`` rank ``i`` receives.

    Example:
        >>> with fc.Mesh((2, 2), ("dp", "tp")):     # mpiexec -n 4; rank r holds [r]
        ...     fc.lax.pshuffle(np.array([r]), "tp", [1, 0])     # swap along "tp"
        array([0])                                  # on rank 1; rank 0 gets [1], 2 and 3 swap too
    """
    return ppermute(x, axis_name, [(src, dst) for dst, src in enumerate(perm)])
