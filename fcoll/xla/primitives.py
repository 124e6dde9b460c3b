"""fcoll's collectives as JAX primitives: one per kind (``fcoll_psum``, ``fcoll_all_gather``,
``fcoll_psum_scatter``, ``fcoll_all_to_all``, ``fcoll_ppermute``), each taking every leaf of
a pytree (one message) and carrying one ordered effect, so that the collectives of a jitted
function run in program order on every rank, also across jitted calls.

Lowered, a primitive is a custom call to fcoll's FFI handler (`fcoll.xla.handler`) with
XLA's ordering token threaded through it; evaluated eagerly (under ``jax.grad`` or
``jax.vmap`` without ``jit``), it runs `fcoll.xla.semantics` on the arrays, as `fcoll.lax` does.
Its JVP, transpose and batching rules are in `fcoll.xla.rules`.

Private JAX APIs used (pinned by tests/test_jit.py on the JAX versions the project supports):
``jax._src.effects`` (an ordered effect, allowed in control flow, custom derivatives and
``checkpoint``), ``jax._src.core.abstract_token`` (JAX < 0.11; ``jax.ffi.abstract_token``
after), ``jax._src.dispatch.runtime_tokens`` (`fcoll.xla.handler.wait_for_jitted`).

Example:
    >>> bind("psum", [x_traced], g, op="sum")        # inside jax.jit, in fcoll.lax.psum
    [Traced<ShapedArray(float32[3])>...]
"""

from __future__ import annotations

import contextlib
import re
import sys
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np
from jax._src import effects
from jax.core import ShapedArray
from jax.extend.core import Primitive
from jax.interpreters import mlir

from fcoll.dispatch import interop
from fcoll.groups.group import Group, resolve_group
from fcoll.policy.plan import reduction_plan
from fcoll.xla import channel, handler, rules, semantics

KINDS = ("psum", "all_gather", "psum_scatter", "all_to_all", "ppermute")
TESTED = ((0, 9), (0, 10), (0, 11))  # the minor versions the jit tests passed on (0.9.2, 0.10.2, 0.11.2;
# scripts/jax-versions.sh)


def supported(version: str) -> bool:
    """Whether JAX ``version`` is one whose private APIs fcoll was tested against (`TESTED`).

    Example:
        >>> supported("0.10.2"), supported("0.9.0")
        (True, False)
    """
    numbers = re.match(r"(\d+)\.(\d+)", version)
    return numbers is not None and (int(numbers[1]), int(numbers[2])) in TESTED


if not supported(jax.__version__):
    warnings.warn(f"fcoll.lax inside jax.jit was tested with JAX {', '.join(f'{a}.{b}' for a, b in TESTED)}"
                  f".x, not {jax.__version__}: it uses private JAX APIs that may have changed "
                  "(docs/jax.md, \"Inside jit\")", RuntimeWarning, stacklevel=2)


class CollectiveEffect(effects.Effect):
    """The effect of an fcoll collective: ordered (program order on every rank)."""

    def __str__(self) -> str:
        return "fcoll collective"


EFFECT = CollectiveEffect()
for _allowed in (effects.lowerable_effects, effects.ordered_effects,
                 effects.control_flow_allowed_effects, effects.custom_derivatives_allowed_effects,
                 effects.remat_allowed_effects):
    _allowed.add_type(CollectiveEffect)

ABSTRACT_TOKEN: Any = getattr(jax.ffi, "abstract_token", None)
if ABSTRACT_TOKEN is None:  # JAX < 0.11
    from jax._src.core import abstract_token as ABSTRACT_TOKEN


def _out_shape(kind: str, shape: tuple[int, ...], n: int, params: dict[str, Any]) -> tuple[int, ...]:
    if kind == "all_gather":
        return semantics.gathered_shape(shape, n, params["axis"], params["tiled"])
    if kind == "psum_scatter":
        return semantics.scattered_shape(shape, n, params["axis"], params["tiled"])
    if kind == "all_to_all":
        return semantics.all_to_all_shape(shape, n, params["split_axis"], params["concat_axis"],
                                      params["tiled"])
    return shape


def _abstract_eval(kind: str) -> Callable[..., Any]:
    def rule(*avals: Any, ranks: tuple[int, ...], **params: Any) -> Any:
        outs = [ShapedArray(_out_shape(kind, tuple(a.shape), len(ranks), params), a.dtype)
                for a in avals]
        return outs, {EFFECT}
    return rule


def _impl(kind: str) -> Callable[..., Any]:
    """Eager evaluation: `fcoll.xla.semantics` on the arrays (numpy or cupy views), as `fcoll.lax`."""
    def impl(*leaves: Any, ranks: tuple[int, ...], **params: Any) -> list[Any]:
        g = group_of(ranks)
        native = [interop.to_native(leaf, f"fcoll_{kind}", f"leaf {i}") for i, leaf in enumerate(leaves)]
        xp = np if all(isinstance(a, np.ndarray) for a in native) else sys.modules["cupy"]
        got = semantics.run(kind, native, g, xp, params)
        return [interop.back(y, like) for y, like in zip(got, leaves, strict=True)]
    return impl


def _lowering(kind: str, platform: str) -> Callable[..., Any]:
    def lower(ctx: Any, *operands: Any, ranks: tuple[int, ...], **params: Any) -> Any:
        target = handler.register(platform)
        attrs = channel.OFF
        if platform == "cpu":
            attrs = channel.prepare(kind, group_of(ranks), jit_of, list(ctx.avals_in), params)
        if attrs is channel.OFF:  # the Python handler: eager calls wait for jitted ones
            handler.arm()
        token = ctx.tokens_in.get(EFFECT)
        with_token = ctx.replace(avals_in=(*ctx.avals_in, ABSTRACT_TOKEN),
                                 avals_out=(*ctx.avals_out, ABSTRACT_TOKEN))
        aliases = {} if attrs is channel.OFF else {i: i for i in range(len(operands))}
        rule = jax.ffi.ffi_lowering(target, has_side_effect=True, operand_output_aliases=aliases)
        results = list(rule(with_token, *operands, token, **attrs,
                            **{handler.ATTRIBUTE: handler.describe(kind, ranks, params)}))
        ctx.set_tokens_out(mlir.TokenSet({EFFECT: results.pop()}))
        return results
    return lower


def _primitive(kind: str) -> Primitive:
    p: Any = Primitive(f"fcoll_{kind}")  # JAX's Primitive methods are untyped
    p.multiple_results = True
    p.def_impl(_impl(kind))
    p.def_effectful_abstract_eval(_abstract_eval(kind))
    mlir.register_lowering(p, _lowering(kind, "cpu"), platform="cpu")
    with contextlib.suppress(NotImplementedError):  # no CUDA plugin in this JAX
        mlir.register_lowering(p, _lowering(kind, "cuda"), platform="cuda")
    return p  # type: ignore[no-any-return]


PRIMITIVES: dict[str, Any] = {kind: _primitive(kind) for kind in KINDS}


def jit_of(user: Group) -> Group:
    """The duplicate of ``user`` that jitted calls use (`fcoll.xla.handler.jit_group`)."""
    return handler.jit_group(user.ranks)


def group_of(ranks: tuple[int, ...]) -> Group:
    """The group a traced call named (by its global ranks)."""
    g = handler.USER_GROUPS.get(ranks)
    return g if g is not None else resolve_group(list(ranks), "fcoll.lax")


def apply(kind: str, leaves: Sequence[Any], ranks: tuple[int, ...], params: dict[str, Any]) -> list[Any]:
    """Bind the primitive of ``kind`` (as the rules do: no checks)."""
    return PRIMITIVES[kind].bind(*leaves, ranks=ranks, **params)  # type: ignore[no-any-return]


def bind(kind: str, leaves: Sequence[Any], g: Group, fn: str, **params: Any) -> list[Any]:
    """The collective ``kind`` on the leaves of a traced pytree, as a primitive: checked
    here, at trace time, on every rank as the eager call checks (non-member groups,
    reduction dtypes; the shape rules in the abstract evaluation).

    Example:
        >>> bind("psum", [x_traced], g, "psum", op="sum")
        [Traced<ShapedArray(float32[3])>...]
    """
    if not g.usable:
        g.comm(fn)  # raises the documented error
    arrays = [jax.numpy.asarray(leaf) for leaf in leaves]
    if kind == "psum":
        for a in arrays:
            reduction_plan(np.empty((0,), a.dtype), params["op"], g, fn)
    handler.USER_GROUPS[g.ranks] = g
    return apply(kind, arrays, g.ranks, params)


rules.register(PRIMITIVES, apply)
