"""The route from `fcoll.dispatch.interop` to torch's autograd rules (`fcoll.torch.autograd`).

A call with a torch tensor that requires grad is sent here; `fcoll.torch.autograd` (which
imports torch) is imported at that first call, when torch is loaded anyway, so importing
fcoll never imports torch. `install` is called once by ``fcoll/__init__``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from fcoll.dispatch import interop


def route(numpy_fn: Callable[..., Any], fn: str, args: Sequence[Any], kwargs: dict[str, Any]) -> Any:
    """`fcoll.torch.autograd.run`: the collective with its gradient, or `NotImplementedError`."""
    from fcoll.torch import autograd

    return autograd.run(numpy_fn, fn, args, kwargs)


def install() -> None:
    """Make `fcoll.dispatch.interop` send tensors that require grad to `route`."""
    interop.on_grad(route)
