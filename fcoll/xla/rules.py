"""JVP, transpose and batching rules of fcoll's primitives (`fcoll.xla.primitives`).

Every collective but ``pmax``/``pmin`` is linear, so its JVP is the same collective on the
tangents, and its transpose is the adjoint collective, as for JAX's own ``psum`` outside
``shard_map``'s replication checks and as for fcoll's torch autograd: the gradient of the
sum of every rank's loss.

| primitive | transpose |
|---|---|
| psum sum, avg | the same psum |
| all_gather (axis, tiled) | psum_scatter (that axis, tiled) |
| psum_scatter (axis, tiled) | all_gather (that axis, tiled) |
| all_to_all (split, concat, tiled) | all_to_all (concat, split, tiled) |
| ppermute (src_dst) | ppermute (the inverse) |

Batching moves the vmapped axis to the front of every leaf (broadcasting unbatched ones)
and shifts non-negative axis parameters by one: the whole batch travels in one message.

Example:
    >>> register(PRIMITIVES, apply)       # once, by fcoll.xla.primitives
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
from jax.interpreters import ad as _ad
from jax.interpreters import batching as _batching

ad: Any = _ad  # JAX's rule helpers are untyped: called through Any
batching: Any = _batching
Apply = Callable[[str, Sequence[Any], tuple[int, ...], dict[str, Any]], list[Any]]
LINEAR_OPS = ("sum", "avg")
AXES = {"all_gather": ("axis",), "psum_scatter": ("axis",), "all_to_all": ("split_axis", "concat_axis")}


def _transposed(kind: str, params: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """The adjoint collective of ``kind`` with ``params``."""
    if kind == "all_gather":
        return "psum_scatter", params
    if kind == "psum_scatter":
        return "all_gather", params
    if kind == "all_to_all":
        return kind, {**params, "split_axis": params["concat_axis"],
                      "concat_axis": params["split_axis"]}
    if kind == "ppermute":
        inverse: list[int | None] = [None] * len(params["src_dst"])
        for src, dst in enumerate(params["src_dst"]):
            if dst is not None:
                inverse[dst] = src
        return kind, {**params, "src_dst": tuple(inverse)}
    return kind, params


def _ct_aval(aval: Any) -> Any:
    """The cotangent's aval (``to_ct_aval`` in newer JAX, ``to_tangent_aval`` before)."""
    return aval.to_ct_aval() if hasattr(aval, "to_ct_aval") else aval.to_tangent_aval()


def _no_gradient(kind: str, params: dict[str, Any]) -> str | None:
    if kind == "psum" and params["op"] not in LINEAR_OPS:
        return f"p{params['op']}"
    return None


def _jvp(kind: str, apply: Apply) -> Callable[..., Any]:
    def jvp(primals: Sequence[Any], tangents: Sequence[Any], *, ranks: tuple[int, ...],
            **params: Any) -> tuple[list[Any], list[Any]]:
        out = apply(kind, primals, ranks, params)
        if all(type(t) is ad.Zero for t in tangents):
            return out, [ad.Zero(jax.typeof(y).to_tangent_aval()) for y in out]
        if (name := _no_gradient(kind, params)) is not None:
            raise NotImplementedError(f"{name}: expected a collective with a gradient (psum, "
                                      f"pmean, all_gather, psum_scatter, all_to_all, ppermute), "
                                      f"got {name}, which has none")
        return out, apply(kind, [ad.instantiate_zeros(t) for t in tangents], ranks, params)
    return jvp


def _transpose(kind: str, apply: Apply) -> Callable[..., Any]:
    def transpose(cts: Sequence[Any], *args: Any, ranks: tuple[int, ...],
                  **params: Any) -> list[Any]:
        if all(type(ct) is ad.Zero for ct in cts):
            return [ad.Zero(_ct_aval(a.aval)) if ad.is_undefined_primal(a) else None for a in args]
        adjoint, adjoint_params = _transposed(kind, params)
        got = apply(adjoint, [ad.instantiate_zeros(ct) for ct in cts], ranks, adjoint_params)
        return [g if ad.is_undefined_primal(a) else None for g, a in zip(got, args, strict=True)]
    return transpose


def _batch(kind: str, apply: Apply) -> Callable[..., Any]:
    def batch(args: Sequence[Any], dims: Sequence[int | None], *, ranks: tuple[int, ...],
              **params: Any) -> tuple[list[Any], list[int]]:
        size = next(a.shape[d] for a, d in zip(args, dims, strict=True) if d is not None)
        front = [batching.bdim_at_front(a, d, size) for a, d in zip(args, dims, strict=True)]
        shifted = {k: (v + 1 if k in AXES.get(kind, ()) and v >= 0 else v) for k, v in params.items()}
        out = apply(kind, front, ranks, shifted)
        return out, [0] * len(out)
    return batch


def register(primitives: dict[str, Any], apply: Apply) -> None:
    """Install the rules of each primitive of ``primitives`` (by kind)."""
    for kind, p in primitives.items():
        ad.primitive_jvps[p] = _jvp(kind, apply)
        ad.primitive_transposes[p] = _transpose(kind, apply)
        batching.primitive_batchers[p] = _batch(kind, apply)
