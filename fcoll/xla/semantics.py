"""JAX's collective semantics (`fcoll.lax`) on lists of numpy or cupy arrays over a `Group`.

`fcoll.lax` runs these on the leaves of a pytree, eagerly; `fcoll.xla` runs the same
functions inside a jitted JAX function, on XLA's buffers, with the group's own duplicate.
The shape rules (`gathered_shape`, `scattered_shape`, `all_to_all_plan`) also give the
shapes JAX traces with. Reductions go in one message per dtype, movement in one message.

Example:
    >>> reduce([np.ones(2), np.zeros(3, np.int32)], g, "sum")      # 2 ranks
    [array([2., 2.]), array([0, 0, 0], dtype=int32)]
"""

from __future__ import annotations

from collections.abc import Sequence
from types import ModuleType
from typing import Any

from fcoll.collectives import (
    all_gather_into_tensor,
    all_gather_into_tensor_coalesced,
    all_reduce,
    all_reduce_coalesced,
    all_to_all_single,
    reduce_scatter_tensor,
    reduce_scatter_tensor_coalesced,
)
from fcoll.collectives.p2p import permute_tensor
from fcoll.dispatch.pytrees import Array, pack, unpack
from fcoll.groups.group import Group

Shape = tuple[int, ...]


def axis(value: object, ndim: int, fn: str, name: str) -> int:
    """``value`` as an axis of an ``ndim``-dimensional array (negative from the end)."""
    if type(value) is not int or not -ndim <= value < ndim:
        raise ValueError(f"{fn}: expected {name} in [{-ndim}, {ndim}), got {value!r}")
    return value % ndim


def _contiguous(a: Array, xp: ModuleType) -> Array:
    """``a`` C-contiguous, 0-d staying 0-d (``ascontiguousarray`` makes it 1-d)."""
    return xp.ascontiguousarray(a).reshape(a.shape)


def reduce(leaves: list[Array], g: Group, op: str) -> list[Array]:
    """Each leaf reduced by ``op`` over ``g`` (one message per dtype; a single leaf by
    `all_reduce`, which the coalesced form equals bit for bit, in less time)."""
    if len(leaves) == 1:
        return [all_reduce(leaves[0], op, g)]
    return all_reduce_coalesced(leaves, op, g)


def gathered_shape(shape: Shape, n: int, dim: int, tiled: bool) -> Shape:
    """The shape `all_gather` gives a leaf of ``shape``: ``n`` stacked at ``dim``, or
    ``dim`` ``n`` times longer when ``tiled``."""
    if tiled:
        d = axis(dim, len(shape), "all_gather", "axis")
        return (*shape[:d], shape[d] * n, *shape[d + 1 :])
    d = axis(dim, len(shape) + 1, "all_gather", "axis")
    return (*shape[:d], n, *shape[d:])


def all_gather(leaves: list[Array], g: Group, dim: int, tiled: bool, xp: ModuleType) -> list[Array]:
    """Every rank's leaves, stacked on a new axis ``dim`` or, ``tiled``, concatenated along it."""
    if len(leaves) == 1:
        gathered = [all_gather_into_tensor(xp.ascontiguousarray(leaves[0]).reshape(-1), g)]
    else:
        gathered = all_gather_into_tensor_coalesced(leaves, g)
    out = []
    for leaf, got in zip(leaves, gathered, strict=True):
        stacked = got.reshape(g.size, *leaf.shape)
        if tiled:
            d = axis(dim, leaf.ndim, "all_gather", "axis")
            out.append(xp.concatenate([stacked[i] for i in range(g.size)], axis=d))
        else:
            out.append(xp.moveaxis(stacked, 0, axis(dim, leaf.ndim + 1, "all_gather", "axis")))
    return [_contiguous(o, xp) for o in out]


def scattered_shape(shape: Shape, n: int, dim: int, tiled: bool) -> Shape:
    """The shape `psum_scatter` gives a leaf of ``shape`` (`ValueError` if ``dim`` does
    not split into ``n`` blocks: equal to ``n`` when not ``tiled``)."""
    fn = "psum_scatter"
    d = axis(dim, len(shape), fn, "scatter_dimension")
    if (shape[d] != n) if not tiled else (shape[d] % n):
        raise ValueError(f"{fn}: expected x.shape[{d}] {'== ' if not tiled else 'divisible by '}"
                         f"the axis size {n}, got shape {shape}")
    return (*shape[:d], *((shape[d] // n,) if tiled else ()), *shape[d + 1 :])


def psum_scatter(leaves: list[Array], g: Group, dim: int, tiled: bool, xp: ModuleType) -> list[Array]:
    """The sum over ``g`` of each leaf, then this rank's block of ``dim``."""
    dims = []
    for leaf in leaves:
        scattered_shape(tuple(leaf.shape), g.size, dim, tiled)
        dims.append(axis(dim, leaf.ndim, "psum_scatter", "scatter_dimension"))
    moved = [xp.ascontiguousarray(xp.moveaxis(leaf, d, 0)) for leaf, d in zip(leaves, dims, strict=True)]
    if len(moved) == 1:
        reduced = [reduce_scatter_tensor(moved[0], "sum", g)]
    else:
        reduced = reduce_scatter_tensor_coalesced(moved, "sum", g)
    out = [xp.moveaxis(r, 0, d) if tiled else r[0] for r, d in zip(reduced, dims, strict=True)]
    return [_contiguous(o, xp) for o in out]


def _exchange(leaves: list[Array], g: Group, split: list[int], xp: ModuleType) -> list[list[Array]]:
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


def all_to_all_plan(shape: Shape, n: int, split_axis: int, concat_axis: int,
                    tiled: bool) -> tuple[int | None, int, int, bool]:
    """``(axis to insert first or None, split axis, concat axis, squeeze split axis)``."""
    fn = "all_to_all"
    split = axis(split_axis, len(shape), fn, "split_axis")
    concat = axis(concat_axis, len(shape), fn, "concat_axis")
    if tiled:
        if shape[split] % n:
            raise ValueError(f"{fn}: expected x.shape[{split}] divisible by the axis size {n}, "
                             f"got shape {shape}")
        return None, split, concat, False
    if shape[split] != n:
        raise ValueError(f"{fn}: expected x.shape[{split}] == the axis size {n} (tiled=False), "
                         f"got shape {shape}")
    if split == concat:
        return None, split, concat, False
    if split < concat:
        return concat + 1, split, concat + 1, True
    return concat, split + 1, concat, True


def all_to_all_shape(shape: Shape, n: int, split_axis: int, concat_axis: int, tiled: bool) -> Shape:
    """The shape `all_to_all` gives a leaf of ``shape``."""
    pre, split, concat, squeeze = all_to_all_plan(shape, n, split_axis, concat_axis, tiled)
    full = list(shape) if pre is None else [*shape[:pre], 1, *shape[pre:]]
    full[concat] *= n
    full[split] //= n
    return tuple(s for i, s in enumerate(full) if not (squeeze and i == split))


def all_to_all(leaves: list[Array], g: Group, split_axis: int, concat_axis: int, tiled: bool,
               xp: ModuleType) -> list[Array]:
    """JAX's all_to_all of each leaf (one message for all of them)."""
    plans = [all_to_all_plan(tuple(leaf.shape), g.size, split_axis, concat_axis, tiled)
             for leaf in leaves]
    prepared = [leaf if pre is None else xp.expand_dims(leaf, pre)
                for leaf, (pre, _, _, _) in zip(leaves, plans, strict=True)]
    received = _exchange(prepared, g, [split for _, split, _, _ in plans], xp)
    out = []
    for parts, (_, split, concat, squeeze) in zip(received, plans, strict=True):
        joined = xp.concatenate(parts, axis=concat)
        out.append(joined.squeeze(axis=split) if squeeze else joined)
    return [_contiguous(o, xp) for o in out]


def sources(perm: Sequence[Any], n: int, fn: str = "ppermute") -> tuple[int | None, ...]:
    """``perm``'s ``(src, dst)`` pairs as `permute_tensor`'s ``src_dst`` (``src_dst[src] =
    dst``); `ValueError` unless pairs of indices in ``[0, n)`` with each source once."""
    src_dst: list[int | None] = [None] * n
    for pair in perm:
        if not (isinstance(pair, (tuple, list)) and len(pair) == 2):
            raise ValueError(f"{fn}: expected perm to be (src, dst) pairs, got {perm!r}")
        src, dst = pair
        if not all(type(i) is int and 0 <= i < n for i in (src, dst)):
            raise ValueError(f"{fn}: expected perm's indices in [0, {n}) (the axis size), "
                             f"got {perm!r}")
        if src_dst[src] is not None:
            raise ValueError(f"{fn}: expected each source once in perm, got {perm!r}")
        if dst in src_dst:
            raise ValueError(f"{fn}: expected each destination once in perm, got {perm!r}")
        src_dst[src] = dst
    return tuple(src_dst)


def ppermute(leaves: list[Array], g: Group, src_dst: Sequence[int | None],
             xp: ModuleType) -> list[Array]:
    """Each leaf sent to rank ``src_dst[rank]`` (one message); zeros where nothing arrives."""
    return unpack(permute_tensor(pack(leaves, xp), list(src_dst), g), leaves)


def run(kind: str, leaves: list[Array], g: Group, xp: ModuleType, params: dict[str, Any]) -> list[Array]:
    """The collective ``kind`` (``psum``, ``all_gather``, ``psum_scatter``, ``all_to_all``,
    ``ppermute``) of `fcoll.xla`'s primitives on ``leaves`` with its ``params``.

    Example:
        >>> run("all_gather", [np.ones(2)], g, np, {"axis": 0, "tiled": True})   # 2 ranks
        [array([1., 1., 1., 1.])]
    """
    if kind == "psum":
        return reduce(leaves, g, params["op"])
    if kind == "all_gather":
        return all_gather(leaves, g, params["axis"], params["tiled"], xp)
    if kind == "psum_scatter":
        return psum_scatter(leaves, g, params["axis"], params["tiled"], xp)
    if kind == "all_to_all":
        return all_to_all(leaves, g, params["split_axis"], params["concat_axis"], params["tiled"], xp)
    if kind == "ppermute":
        return ppermute(leaves, g, params["src_dst"], xp)
    raise ValueError(f"fcoll.xla: expected a collective kind, got {kind!r}")
