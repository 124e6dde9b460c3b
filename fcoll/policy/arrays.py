"""The array types of the public signatures: `ArrayProtocol`, ``A`` and ``T``.

Every public collective is generic in the array type, as the contract is (numpy in, numpy
out; a ``torch.Tensor`` in, a ``torch.Tensor`` out; likewise cupy and JAX):
``def all_reduce(x: A, ...) -> A``, lists ``Sequence[A] -> list[A]``, pytrees (`fcoll.lax`,
`fcoll.dp`) ``T -> T``, and ``async_op=True`` gives a ``Work[A]``. So ``mypy --strict`` and
pyright infer ``torch.Tensor`` from a tensor and ``jax.Array`` from a JAX array, and reject
an ``int``, a ``list`` or a ``str``. Nothing here imports cupy, torch or JAX: the protocol
is structural, and typing costs nothing at run time.

The bodies work on numpy arrays: other array types are routed (`fcoll.gpu.route.run`,
`fcoll.dispatch.interop.run`) before a body reads them, and come back as their own type.
So a function with overloads (``async_op``, ``with_total``, ...) keeps the numpy types of
its body on its implementation, and mypy's check that the implementation accepts what the
overloads accept is waived there (``type: ignore[misc]``, marked "the numpy path"); a
function without overloads takes ``A`` and reads the numpy array its checks return
(`fcoll.policy.validate.check_array`). Either way the numpy result goes back as the caller's
``A`` (``type: ignore``, marked "numpy in, numpy out").

Example:
    >>> def total(x: A) -> A:              # a user's own generic helper
    ...     return fc.all_reduce(x)        # mypy: torch.Tensor in, torch.Tensor out
"""

from __future__ import annotations

from typing import Protocol, TypeVar


class ArrayProtocol(Protocol):
    """What the public signatures ask of an array: ``shape``, ``dtype`` and ``ndim``.

    `numpy.ndarray`, ``cupy.ndarray``, ``torch.Tensor`` and ``jax.Array`` all have them
    (nothing to register); ``int``, ``list`` and ``str`` do not. The runtime checks stay
    those of each function (`TypeError` for a non-array, an unsupported dtype, ...).
    """

    @property
    def shape(self) -> tuple[int, ...]: ...

    @property
    def dtype(self) -> object: ...

    @property
    def ndim(self) -> int: ...


A = TypeVar("A", bound=ArrayProtocol)  # one array type per call: the input's is the result's
T = TypeVar("T")  # a pytree of arrays (fcoll.lax, fcoll.dp): the result has its structure
