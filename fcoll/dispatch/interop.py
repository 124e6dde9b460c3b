"""torch tensors and JAX arrays through the numpy and cupy paths.

The rule: **the result has the input's array type and device**. `run` calls a public
collective with every torch tensor or JAX array among its arguments seen as the array the
rest of fcoll takes, and turns the arrays in its result (lists and `Work` results too) back:

- torch on the CPU: a zero-copy numpy view (``detach()``); bfloat16, which numpy lacks, as its bits
  (``view(int16)``, then ``ml_dtypes.bfloat16``). Results come back with ``torch.from_numpy``
  (no copy).
- JAX on the CPU: ``numpy.asarray`` (zero-copy, read-only: fcoll never writes its inputs);
  results come back with ``jax.device_put`` onto the input's device.
- torch on CUDA and JAX on a GPU: DLPack into cupy (no copy), so the GPU path serves them
  (NCCL, or MPI); results come back through DLPack on the same device.

A call with a tensor that requires grad, while torch's grad mode is on, goes to the
autograd rules instead (`fcoll.torch.autograd`, above this layer: `on_grad` installs the
route to them, so nothing here imports upward).

torch and JAX are never imported here: an array is recognised through ``sys.modules``
(`kind`), so numpy users never load them. One call takes one array type: mixing them raises
`TypeError` naming the argument, before anything is sent.
"""

from __future__ import annotations

import inspect
import sys
from collections.abc import Callable, Sequence
from functools import cache
from typing import Any

import ml_dtypes
import numpy as np

from fcoll.calls.work import map_arrays

NAME = "interop"
KINDS = ("torch", "jax")


def kind(x: object) -> str | None:
    """``"torch"`` for a ``torch.Tensor``, ``"jax"`` for a ``jax.Array``, else None (without
    importing either).

    Example:
        >>> kind(torch.ones(2)), kind(np.ones(2))
        ('torch', None)
    """
    if type(x) is np.ndarray:
        return None
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(x, torch.Tensor):
        return "torch"
    jax = sys.modules.get("jax")
    if jax is not None and isinstance(x, jax.Array):
        return "jax"
    return None


def _name(x: object) -> str:
    t = type(x)
    return "torch.Tensor" if kind(x) == "torch" else \
        "jax.Array" if kind(x) == "jax" else f"{t.__module__}.{t.__name__}"


def _torch_in(t: Any, fn: str, name: str) -> Any:
    torch = sys.modules["torch"]
    t = t.detach()
    if t.is_conj():
        t = t.resolve_conj()
    if t.is_neg():
        t = t.resolve_neg()
    if t.device.type == "cuda":
        import cupy

        return cupy.from_dlpack(t)
    if t.device.type != "cpu":
        raise TypeError(f"{fn}: expected {name} on the CPU or a CUDA device, got a tensor on "
                        f"{t.device}")
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    try:
        return t.numpy()
    except TypeError as error:  # a dtype numpy has no view of (float8, ...)
        raise TypeError(f"{fn}: expected {name} to have a dtype fcoll supports, got {t.dtype}") \
            from error


def _jax_in(x: Any, fn: str, name: str) -> Any:
    if isinstance(x, sys.modules["jax"].core.Tracer):
        raise TypeError(f"{fn}: expected {name} to be a concrete jax.Array, got a traced value "
                        f"({type(x).__name__}); fcoll's array collectives run eagerly: inside "
                        "jit/grad/vmap use fcoll.lax (psum, all_gather, ...), or call them "
                        "between jitted steps")
    device = next(iter(x.devices()))
    if device.platform == "cpu":
        return np.asarray(x)
    if device.platform in ("gpu", "cuda", "rocm"):
        import cupy

        return cupy.from_dlpack(x)
    raise TypeError(f"{fn}: expected {name} on the CPU or a GPU, got an array on {device}")


def _on_device(y: Any) -> bool:
    """Whether the result ``y`` is a cupy array (the input was on a GPU)."""
    cupy = sys.modules.get("cupy")
    return cupy is not None and isinstance(y, cupy.ndarray)


def _torch_out(y: Any, like: Any) -> Any:
    torch = sys.modules["torch"]
    if _on_device(y):  # the input was on a CUDA device
        return torch.from_dlpack(y)
    if y.dtype == ml_dtypes.bfloat16:
        return torch.from_numpy(np.ascontiguousarray(y).view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(y if y.flags.writeable else y.copy())


def _jax_out(y: Any, like: Any) -> Any:
    jax = sys.modules["jax"]
    if _on_device(y):
        return jax.dlpack.from_dlpack(y)
    return jax.device_put(y, next(iter(like.devices())))


def as_kind(y: Any, k: str) -> Any:
    """The numpy or cupy array ``y`` as a ``k`` (``"torch"``, ``"jax"``) array, without a
    template: a numpy array on the CPU (JAX: its default device), a cupy array on its device.
    Used where no input says where the result goes (`fcoll.recv`).

    Example:
        >>> as_kind(np.ones(2, np.float32), "torch")
        tensor([1., 1.])
    """
    if k == "torch":
        return _torch_out(y, None)
    jax = sys.modules["jax"]
    return jax.dlpack.from_dlpack(y) if _on_device(y) else jax.device_put(y)


def to_native(value: Any, fn: str, name: str) -> Any:
    """``value`` with its torch tensors and JAX arrays seen as numpy or cupy arrays (also
    inside lists and tuples)."""
    k = kind(value)
    if k == "torch":
        return _torch_in(value, fn, name)
    if k == "jax":
        return _jax_in(value, fn, name)
    if isinstance(value, (list, tuple)):
        return type(value)(to_native(v, fn, f"{name}[{i}]") for i, v in enumerate(value))
    return value


def back(value: Any, like: Any) -> Any:
    """The arrays in a result (also inside lists, tuples and `Work` results) as arrays of
    ``like``'s type and device."""
    out = _torch_out if kind(like) == "torch" else _jax_out
    return map_arrays(value, _is_native, lambda v: out(v, like))


def _is_native(value: object) -> bool:
    return isinstance(value, np.ndarray) or type(value).__module__.split(".")[0] == "cupy"


@cache
def _parameters(fn: Callable[..., Any]) -> tuple[str, ...]:
    return tuple(inspect.signature(fn).parameters)


def _arrays(value: Any, name: str) -> list[tuple[str, Any]]:
    if isinstance(value, (list, tuple)):
        return [a for i, v in enumerate(value) for a in _arrays(v, f"{name}[{i}]")]
    array = getattr(value, "shape", None) is not None and getattr(value, "dtype", None) is not None
    return [(name, value)] if array and not isinstance(value, type) else []  # not a fcoll.Mesh


# The route to the autograd rules (`fcoll._autograd.route`), installed by `fcoll/__init__`.
_GRAD: list[Callable[..., Any]] = []


def on_grad(route: Callable[..., Any]) -> None:
    """Send calls with a torch tensor that requires grad to ``route(numpy_fn, fn, args,
    kwargs)`` (while torch's grad mode is on)."""
    _GRAD[:] = [route]


def _requires_grad(named: Sequence[tuple[str, Any]]) -> bool:
    """Whether grad mode is on and one of the call's tensors requires grad."""
    if not sys.modules["torch"].is_grad_enabled():
        return False
    return any(getattr(a, "requires_grad", False) for name, value in named
               for _, a in _arrays(value, name))


def _one_kind(fn: str, named: Sequence[tuple[str, Any]]) -> Any:
    """The first torch/JAX array among the call's arrays; `TypeError` naming an argument
    of another array type."""
    arrays = [(name, a) for name, value in named for name, a in _arrays(value, name)]
    first = next((a for _, a in arrays if kind(a) is not None), None)
    for name, a in arrays:
        if first is not None and kind(a) != kind(first):
            raise TypeError(f"{fn}: expected {name} to be a {_name(first)} like the call's other "
                            f"arrays, got {_name(a)}; array types cannot be mixed in one call")
    return first


def run(numpy_fn: Callable[..., Any], fn: str, *args: Any, **kwargs: Any) -> Any:
    """``numpy_fn(*args, **kwargs)`` (a public collective) with torch/JAX arrays seen as
    numpy or cupy; the result's arrays of the input's type and device.

    Example:
        >>> y = run(fc.all_reduce, "all_reduce", torch.ones(2))   # every rank of 2
        >>> y
        tensor([2., 2.])
    """
    names = _parameters(numpy_fn)
    named = [*zip(names, args, strict=False), *kwargs.items()]
    like = _one_kind(fn, named)
    if _GRAD and kind(like) == "torch" and _requires_grad(named):
        return _GRAD[0](numpy_fn, fn, args, kwargs)
    native_args = tuple(to_native(a, fn, n) for n, a in zip(names, args, strict=False))
    native_kwargs = {k: to_native(v, fn, k) for k, v in kwargs.items()}
    return back(numpy_fn(*native_args, **native_kwargs), like)
