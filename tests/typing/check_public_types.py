"""The public signatures, as type checkers see them: checked by ``mypy --strict`` and by
pyright (standard mode) in tests/test_typing.py, never run.

Each function family infers the result's type from the input's, for numpy, torch, JAX and a
cupy-shaped array (`CupyArray`: cupy ships no type stubs yet, so a real ``cupy.ndarray`` is
``Any`` to both checkers and every call on it is accepted with an ``Any`` result). The calls
at the end pass non-arrays and must be rejected: each carries mypy's and pyright's ignore
comment, and both checkers report an ignore that hides no error, so a call that became
accepted fails the check as surely as a wrong ``assert_type``.
"""

from __future__ import annotations

from typing import Any, assert_type

import jax
import numpy as np
import numpy.typing as npt
import torch

import fcoll as fc
import fcoll.torch
from fcoll import Work

F64 = npt.NDArray[np.float64]


class CupyArray:
    """The attributes ``cupy.ndarray`` has that fcoll's array protocol reads."""

    shape: tuple[int, ...]
    dtype: np.dtype[Any]
    ndim: int


def reductions(x: F64, t: torch.Tensor, j: jax.Array, c: CupyArray) -> None:
    assert_type(fc.all_reduce(x), F64)
    assert_type(fc.all_reduce(t, "avg"), torch.Tensor)
    assert_type(fc.all_reduce(j, fc.ReduceOp.MAX), jax.Array)
    assert_type(fc.all_reduce(c), CupyArray)
    assert_type(fc.reduce(t, dst=0), torch.Tensor | None)
    assert_type(fc.reduce(j), jax.Array | None)
    assert_type(fc.reduce_scatter_tensor(t, scatter_dim=0), torch.Tensor)
    assert_type(fc.reduce_scatter_tensor(c), CupyArray)
    assert_type(fc.reduce_scatter([x, x]), F64)
    assert_type(fc.reduce_scatter([t, t], "sum"), torch.Tensor)


def movement(x: F64, t: torch.Tensor, j: jax.Array, c: CupyArray) -> None:
    assert_type(fc.broadcast(x, src=0), F64)
    assert_type(fc.broadcast(j), jax.Array)
    assert_type(fc.all_gather_into_tensor(t, gather_dim=1), torch.Tensor)
    assert_type(fc.all_gather_into_tensor(c, sizes="auto"), CupyArray)
    assert_type(fc.all_to_all_single(j, [1], [1]), jax.Array)
    assert_type(fc.barrier(), None)


def lists(x: F64, t: torch.Tensor, j: jax.Array, c: CupyArray) -> None:
    assert_type(fc.all_gather(t), list[torch.Tensor])
    assert_type(fc.all_gather(c), list[CupyArray])
    assert_type(fc.gather(j, dst=0), list[jax.Array] | None)
    assert_type(fc.scatter([x, x]), F64)
    assert_type(fc.scatter((t, t), src=1), torch.Tensor)
    assert_type(fc.scatter(None, src=0), Any)  # a non-root: the sender's type, known at run time
    assert_type(fc.all_to_all([j, j]), list[jax.Array])


def coalesced(x: F64, t: torch.Tensor, j: jax.Array) -> None:
    assert_type(fc.all_reduce_coalesced([t, t], "avg"), list[torch.Tensor])
    assert_type(fc.all_gather_into_tensor_coalesced([j]), list[jax.Array])
    assert_type(fc.reduce_scatter_tensor_coalesced([x]), list[F64])


def asynchronous(x: F64, t: torch.Tensor, j: jax.Array, c: CupyArray) -> None:
    work = fc.all_reduce(t, async_op=True)
    assert_type(work, Work[torch.Tensor])
    assert_type(work.wait(), torch.Tensor)
    assert_type(work.wait(timeout=5), torch.Tensor)
    assert_type(work.then(lambda y: y.shape), Work[torch.Size])
    assert_type(fc.reduce(j, async_op=True), Work[jax.Array | None])
    assert_type(fc.broadcast(c, async_op=True), Work[CupyArray])
    assert_type(fc.reduce_scatter_tensor(x, async_op=True), Work[F64])
    assert_type(fc.all_gather_into_tensor(j, async_op=True), Work[jax.Array])
    assert_type(fc.all_to_all_single(t, async_op=True), Work[torch.Tensor])
    assert_type(fc.wait_all([work, work]), list[torch.Tensor])


def point_to_point(x: F64, t: torch.Tensor, j: jax.Array) -> None:
    assert_type(fc.send(t, dst=1), None)
    assert_type(fc.isend(j, dst=1), Work[None])
    assert_type(fc.recv(src=0), Any)  # the sender's type, known at run time
    assert_type(fc.recv(return_source=True), tuple[Any, int])
    assert_type(fc.irecv(src=0), Work[Any])
    assert_type(fc.batch_isend_irecv([fc.P2POp(fc.isend, x, 1), fc.P2POp(fc.irecv, None, 1)]),
                list[Work[Any]])
    assert_type(fc.permute_tensor(t, [1, 0]), torch.Tensor)


def numeric(x: F64, t: torch.Tensor, j: jax.Array, mesh: fc.Mesh) -> None:
    assert_type(fc.scan(t), torch.Tensor)
    assert_type(fc.scan(j, with_total=True), tuple[jax.Array, jax.Array])
    assert_type(fc.scan(x, async_op=True), Work[F64])
    assert_type(fc.exscan(t, "max"), torch.Tensor)
    assert_type(fc.exscan(x, np.logaddexp), F64 | None)  # a ufunc may have no identity
    assert_type(fc.exscan(j, with_total=True, async_op=True), Work[tuple[jax.Array, jax.Array]])
    assert_type(fc.sendrecv(t, dst=1, src=0), torch.Tensor)
    assert_type(fc.sendrecv(j, dst=1, src=None), None)
    assert_type(fc.sendrecv(x, dst=None, src=0 if fc.get_rank() else None), F64 | None)
    assert_type(fc.halo_exchange(t, mesh, 1, periodic=True), torch.Tensor)
    assert_type(fc.maxloc(j), tuple[jax.Array, jax.Array])
    assert_type(fc.minloc(x), tuple[F64, F64])


def lax_pytrees(j: jax.Array, t: torch.Tensor) -> None:
    tree = {"w": j, "b": j}
    assert_type(fc.lax.psum(tree, "dp"), dict[str, jax.Array])
    assert_type(fc.lax.pmean(j, ("dp", "tp")), jax.Array)
    assert_type(fc.lax.pmax([t, t], "dp"), list[torch.Tensor])
    assert_type(fc.lax.pmin(t, "dp"), torch.Tensor)
    assert_type(fc.lax.all_gather(tree, "dp", tiled=True), dict[str, jax.Array])
    assert_type(fc.lax.psum_scatter(j, "dp", scatter_dimension=0), jax.Array)
    assert_type(fc.lax.all_to_all(j, "dp", 0, 0), jax.Array)
    assert_type(fc.lax.ppermute(tree, "dp", [(0, 1), (1, 0)]), dict[str, jax.Array])
    assert_type(fc.lax.pshuffle(t, "dp", [1, 0]), torch.Tensor)
    assert_type(fc.lax.axis_index("dp"), int)


def data_parallel(x: F64, t: torch.Tensor, j: jax.Array) -> None:
    grads = {"w": t, "b": t}
    assert_type(fc.dp.average_gradients(grads), dict[str, torch.Tensor])
    assert_type(fc.dp.broadcast_parameters({"w": j}), dict[str, jax.Array])
    assert_type(fc.dp.average_parameters([x]), list[F64])
    averager = fc.dp.GradientAverager()
    assert_type(averager(grads), dict[str, torch.Tensor])
    assert_type(averager.start(grads), Work[dict[str, torch.Tensor]])
    assert_type(fc.dp.allreduce_hook(t, None), Work[torch.Tensor])
    assert_type(fc.dp.PeriodicModelAverager(4).average_parameters(grads), dict[str, torch.Tensor])
    assert_type(fcoll.torch.copy_to_group(t), torch.Tensor)


def rejected(x: F64) -> None:
    """Non-arrays: each call must be an error for both checkers."""
    fc.all_reduce(1.0)  # type: ignore[call-overload]  # pyright: ignore[reportArgumentType]
    fc.all_reduce([1.0, 2.0], async_op=True)  # type: ignore[call-overload]  # pyright: ignore[reportArgumentType, reportCallIssue]
    fc.broadcast("abc")  # type: ignore[call-overload]  # pyright: ignore[reportArgumentType]
    fc.all_gather([1, 2])  # type: ignore[type-var]  # pyright: ignore[reportArgumentType]
    fc.reduce_scatter([1.0, 2.0])  # type: ignore[type-var]  # pyright: ignore[reportArgumentType]
    fc.all_reduce_coalesced(["a"])  # type: ignore[type-var]  # pyright: ignore[reportArgumentType]
    fc.send(3, dst=1)  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]
    fc.permute_tensor([1.0, 2.0], [1, 0])  # type: ignore[type-var]  # pyright: ignore[reportArgumentType]
    fc.scan(2)  # type: ignore[call-overload]  # pyright: ignore[reportArgumentType]
