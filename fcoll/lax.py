"""fcoll.lax: JAX's collective spelling over mesh axis names, on pytrees of arrays.

Inside ``with fc.Mesh(shape, names):`` every function takes ``axis_name`` (one axis name
or a tuple of names) like ``jax.lax`` under ``shard_map``, maps over a pytree, and sends
the leaves in fused messages (one per dtype for reductions, one in all for movement).
Shapes follow JAX: `all_gather` stacks along a new axis unless ``tiled=True``.
A tree of cupy arrays is reshaped and packed with cupy and stays on its device (over
NCCL where that is the transport); a tree of JAX arrays or torch tensors gives one of the
same type back (`fcoll.dispatch.pytrees.foreign_leaves`); array types mixed in one tree raise `TypeError`.

Inside ``jax.jit`` (``grad``, ``vmap``, ``lax.scan``, ``checkpoint``) a tree holding traced
values becomes one of fcoll's JAX primitives (`fcoll.xla`): differentiable (the gradient of
the sum of every rank's loss), batched in one message, run in program order by fcoll's
transports on XLA's thread. torch tensors that require grad raise `NotImplementedError`
(fcoll's array collectives carry their gradients).

Example:
    >>> with fc.Mesh((2, 2), ("dp", "tp")):
    ...     grads = fc.lax.pmean(grads, "dp")          # a pytree, averaged over "dp"
    ...     i = fc.lax.axis_index("tp")
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from typing import Any, TypeVar, cast

import numpy as np
import optree

from fcoll.dispatch.pytrees import Array, array_module, foreign_leaves
from fcoll.groups.group import Group
from fcoll.groups.mesh import axis_group
from fcoll.policy.arrays import T
from fcoll.xla import semantics

AxisName = str | Sequence[str]


def _group(axis_name: AxisName, fn: str) -> Group:
    return axis_group(axis_name, fn)


def _leaves(x: Any, fn: str) -> tuple[list[Array], Any, Any]:
    """The leaves of ``x``, its structure, and their array module (numpy or cupy);
    `TypeError` naming the leaf if numpy and cupy leaves mix. Other leaves of a numpy tree
    (scalars) become numpy arrays."""
    leaves, spec = optree.tree_flatten(x)
    xp = array_module(leaves, fn, x)
    return ([np.asarray(leaf) for leaf in leaves] if xp is np else leaves), spec, xp


def _traced(leaves: list[Any]) -> bool:
    jax = sys.modules.get("jax")
    return jax is not None and any(isinstance(leaf, jax.core.Tracer) for leaf in leaves)


def _refuse_torch_grad(leaves: list[Any], fn: str) -> None:
    torch = sys.modules.get("torch")
    if torch is not None and torch.is_grad_enabled() and any(
            isinstance(leaf, torch.Tensor) and leaf.requires_grad for leaf in leaves):
        raise NotImplementedError(
            f"{fn}: expected torch tensors that do not require grad, got one that does; "
            "fcoll.lax has no torch gradients: use fcoll's array collectives (fc.all_reduce, "
            "...), whose results carry a grad_fn, or call it on .detach()")


def _transformable(kind: str, fn: str, eager: Callable[..., Any], x: T, axis_name: AxisName,
                   **params: Any) -> T:
    """``eager(x)`` (the numpy/cupy/torch/JAX path), or, for a tree holding JAX tracers,
    fcoll's primitive of ``kind`` (`fcoll.xla.primitives.bind`)."""
    leaves, spec = optree.tree_flatten(cast(Any, x))
    if _traced(leaves):
        from fcoll.xla import primitives

        got = primitives.bind(kind, leaves, _group(axis_name, fn), fn, **params)
        return cast(T, optree.tree_unflatten(spec, got))  # x's structure
    _refuse_torch_grad(leaves, fn)
    return eager(x)  # type: ignore[no-any-return]  # a tree of x's structure and array type


F = TypeVar("F", bound=Callable[..., Any])


def _named(name: str) -> Callable[[F], F]:
    """Give the eager body the public name (`foreign_leaves` names it in its errors)."""
    def rename(fn: F) -> F:
        fn.__name__ = name
        return fn
    return rename


def _reducer(fn: str, op: str) -> Callable[[Any, AxisName], Any]:
    @foreign_leaves
    @_named(fn)
    def eager(x: Any, axis_name: AxisName) -> Any:
        leaves, spec, _ = _leaves(x, fn)
        return optree.tree_unflatten(spec, semantics.reduce(leaves, _group(axis_name, fn), op))
    return eager


_REDUCERS = {fn: _reducer(fn, op) for fn, op in
             (("psum", "sum"), ("pmean", "avg"), ("pmax", "max"), ("pmin", "min"))}


def _reduction(x: T, axis_name: AxisName, op: str, fn: str) -> T:
    return _transformable("psum", fn, lambda t: _REDUCERS[fn](t, axis_name), x, axis_name, op=op)


def psum(x: T, axis_name: AxisName) -> T:
    """Sum of ``x`` (a pytree) over the ranks along ``axis_name``.

    Example:
        >>> with fc.Mesh((2, 2), ("dp", "tp")):     # mpiexec -n 4; rank r at (r // 2, r % 2)
        ...     fc.lax.psum({"w": np.array([r])}, "dp")
        {'w': array([4])}                         # on ranks 1 and 3 (1 + 3); ranks 0, 2 get [2]
    """
    return _reduction(x, axis_name, "sum", "psum")


def pmean(x: T, axis_name: AxisName) -> T:
    """Mean of ``x`` (a pytree of floating arrays) along ``axis_name``.

    Example:
        >>> with fc.Mesh((2, 2), ("dp", "tp")):     # mpiexec -n 4; rank r at (r // 2, r % 2)
        ...     fc.lax.pmean([np.array([float(r)])], "tp")
        [array([0.5])]                              # on ranks 0 and 1; ranks 2, 3 get [2.5]
    """
    return _reduction(x, axis_name, "avg", "pmean")


def pmax(x: T, axis_name: AxisName) -> T:
    """Elementwise maximum of ``x`` along ``axis_name`` (no gradient).

    Example:
        >>> with fc.Mesh((2, 2), ("dp", "tp")):     # mpiexec -n 4; rank r at (r // 2, r % 2)
        ...     fc.lax.pmax(np.array([r, -r]), ("dp", "tp"))
        array([3, 0])                               # on every rank
    """
    return _reduction(x, axis_name, "max", "pmax")


def pmin(x: T, axis_name: AxisName) -> T:
    """Elementwise minimum of ``x`` along ``axis_name`` (no gradient).

    Example:
        >>> with fc.Mesh((2, 2), ("dp", "tp")):     # mpiexec -n 4; rank r at (r // 2, r % 2)
        ...     fc.lax.pmin(np.array([r]), "dp")
        array([1])                                  # on ranks 1 and 3; ranks 0, 2 get [0]
    """
    return _reduction(x, axis_name, "min", "pmin")


def axis_index(axis_name: AxisName) -> int:
    """This rank's index along ``axis_name`` (row-major over several names); a Python int,
    also inside ``jit`` (each process is one index).

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


@foreign_leaves
@_named("all_gather")
def _gather(x: Any, axis_name: AxisName, axis: int, tiled: bool) -> Any:
    leaves, spec, xp = _leaves(x, "all_gather")
    return optree.tree_unflatten(spec, semantics.all_gather(leaves, _group(axis_name, "all_gather"),
                                                        axis, tiled, xp))


def all_gather(x: T, axis_name: AxisName, *, axis: int = 0, tiled: bool = False) -> T:
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
    return _transformable("all_gather", "all_gather", lambda t: _gather(t, axis_name, axis, tiled),
                          x, axis_name, axis=axis, tiled=tiled)


@foreign_leaves
@_named("psum_scatter")
def _scatter(x: Any, axis_name: AxisName, dim: int, tiled: bool) -> Any:
    leaves, spec, xp = _leaves(x, "psum_scatter")
    g = _group(axis_name, "psum_scatter")
    return optree.tree_unflatten(spec, semantics.psum_scatter(leaves, g, dim, tiled, xp))


def psum_scatter(x: T, axis_name: AxisName, *, scatter_dimension: int = 0,
                 tiled: bool = False) -> T:
    """Sum along ``axis_name``, then keep this rank's block of ``scatter_dimension``.

    Not tiled (JAX's default): that dimension must equal the axis size and is removed.
    Tiled: it must be divisible by the axis size and shrinks by that factor.

    Example:
        >>> with fc.Mesh((2, 2), ("dp", "tp")):     # mpiexec -n 4; rank r holds [[r], [10 * r]]
        ...     fc.lax.psum_scatter(np.array([[r], [10 * r]]), "tp")
        array([1])                                  # on rank 0 (0 + 1); rank 1 gets [10]
    """
    return _transformable("psum_scatter", "psum_scatter",
                          lambda t: _scatter(t, axis_name, scatter_dimension, tiled),
                          x, axis_name, axis=scatter_dimension, tiled=tiled)


@foreign_leaves
@_named("all_to_all")
def _to_all(x: Any, axis_name: AxisName, split_axis: int, concat_axis: int, tiled: bool) -> Any:
    leaves, spec, xp = _leaves(x, "all_to_all")
    g = _group(axis_name, "all_to_all")
    return optree.tree_unflatten(spec, semantics.all_to_all(leaves, g, split_axis, concat_axis, tiled, xp))


def all_to_all(x: T, axis_name: AxisName, split_axis: int, concat_axis: int, *,
               tiled: bool = False) -> T:
    """Split each leaf along ``split_axis`` into one block per rank, send block ``i`` to
    rank ``i``, and concatenate what arrives along ``concat_axis`` (JAX's semantics: not
    tiled, ``x.shape[split_axis]`` must equal the axis size, that axis is removed and a new
    one of that size inserted at ``concat_axis``).

    Example:
        >>> with fc.Mesh((2, 2), ("dp", "tp")):     # mpiexec -n 4; rank r holds [10 * r, 10 * r + 1]
        ...     fc.lax.all_to_all(np.array([10 * r, 10 * r + 1]), "tp", 0, 0)
        array([ 1, 11])                             # on rank 1 (element 1 of ranks 0 and 1)
    """
    return _transformable("all_to_all", "all_to_all",
                          lambda t: _to_all(t, axis_name, split_axis, concat_axis, tiled),
                          x, axis_name, split_axis=split_axis, concat_axis=concat_axis, tiled=tiled)


@foreign_leaves
@_named("ppermute")
def _permute(x: Any, axis_name: AxisName, perm: Sequence[tuple[int, int]]) -> Any:
    leaves, spec, xp = _leaves(x, "ppermute")
    g = _group(axis_name, "ppermute")
    return optree.tree_unflatten(spec, semantics.ppermute(leaves, g, semantics.sources(perm, g.size), xp))


def ppermute(x: T, axis_name: AxisName, perm: Sequence[tuple[int, int]]) -> T:
    """Send ``x`` from ``src`` to ``dst`` for each ``(src, dst)`` in ``perm`` (indices along
    ``axis_name``); ranks that receive nothing get zeros.

    Example:
        >>> with fc.Mesh((2, 2), ("dp", "tp")):     # mpiexec -n 4; rank r holds [r]
        ...     fc.lax.ppermute(np.array([r]), "dp", [(0, 1)])
        array([0])                                  # on rank 2 (from rank 0); ranks 0, 1 get [0] (zeros)
        array([1])                                  # on rank 3 (from rank 1)
    """
    src_dst = semantics.sources(perm, _group(axis_name, "ppermute").size)
    return _transformable("ppermute", "ppermute", lambda t: _permute(t, axis_name, perm),
                          x, axis_name, src_dst=src_dst)


def pshuffle(x: T, axis_name: AxisName, perm: Sequence[int]) -> T:
    """`ppermute` with ``perm[i]`` = the index whose ``x`` rank ``i`` receives.

    Example:
        >>> with fc.Mesh((2, 2), ("dp", "tp")):     # mpiexec -n 4; rank r holds [r]
        ...     fc.lax.pshuffle(np.array([r]), "tp", [1, 0])     # swap along "tp"
        array([0])                                  # on rank 1; rank 0 gets [1], 2 and 3 swap too
    """
    return ppermute(x, axis_name, [(src, dst) for dst, src in enumerate(perm)])
