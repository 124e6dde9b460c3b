"""Where a public collective goes with cupy arrays: the table of each device backend.

The public functions call `run` with the backend `fcoll._dispatch.backend_for` chose. The
tables name, for each backend, the function that moves cupy arrays without staging; a
collective not in its backend's table (or whose function answers ``NotImplemented`` for
this call) runs on host copies through `fcoll.gpu.staged`. Results are cupy arrays on
the input's device.
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import numpy as np

from fcoll._dispatch import mpi_for_device, transport
from fcoll._validate import check_count, check_rank, check_same_dtype
from fcoll.backends import Backend
from fcoll.backends import mpi as host
from fcoll.dtypes import check_dtype, dtype_from_name
from fcoll.gpu import aware, collectives, lists, nccl, staged
from fcoll.group import Group, member, resolve_group

# NCCL moves every collective that has a function here; the others (e.g. reduce_scatter
# on lists over MPI) are staged.
NCCL: dict[str, Callable[..., Any]] = {
    "all_reduce": collectives.all_reduce,
    "reduce": collectives.reduce,
    "reduce_scatter_tensor": collectives.reduce_scatter_tensor,
    "reduce_scatter": collectives.reduce_scatter,
    "broadcast": collectives.broadcast,
    "all_gather_into_tensor": collectives.all_gather_into_tensor,
    "all_to_all_single": collectives.all_to_all_single,
    "all_gather": lists.all_gather,
    "gather": lists.gather,
    "all_to_all": lists.all_to_all,
    "all_reduce_coalesced": lists.all_reduce_coalesced,
    "reduce_scatter_tensor_coalesced": lists.reduce_scatter_tensor_coalesced,
    "all_gather_into_tensor_coalesced": lists.all_gather_into_tensor_coalesced,
    "permute_tensor": lists.permute_tensor,
}

# CUDA-aware MPI: the single-message collectives hand device buffers to MPI (all_reduce
# only where MPI's own op reduces; the rank-order fold runs staged).
AWARE: dict[str, Callable[..., Any]] = {
    "all_reduce": collectives.all_reduce,
    "broadcast": collectives.broadcast,
    "all_gather_into_tensor": collectives.all_gather_into_tensor,
    "all_to_all_single": collectives.all_to_all_single,
}

R = TypeVar("R")

TABLES: dict[str, dict[str, Callable[..., Any]]] = {nccl.NAME: NCCL, aware.NAME: AWARE,
                                                    staged.NAME: {}}


def run(backend: Backend, name: str, numpy_fn: Callable[..., R], *args: Any, **kwargs: Any) -> R:
    """Run the public collective ``name`` on cupy arguments over ``backend``.

    ``numpy_fn`` is the public function itself, which staging calls on host copies; the
    group travels as the keyword ``group`` (`choose` reads it).
    """
    backend = choose(backend, name, args[0] if args else None, kwargs.get("group"))
    impl = TABLES[backend.NAME].get(name)
    if impl is not None:
        result = impl(backend, *args, **kwargs)
        if result is not NotImplemented:
            return result  # type: ignore[no-any-return]
    return staged.run(numpy_fn, *args, **kwargs)  # type: ignore[no-any-return]


def choose(backend: Backend, fn: str, x: Any, group: Any) -> Backend:
    """``backend``, or the MPI backend where NCCL cannot serve ``group``: with
    ``FCOLL_GPU_TRANSPORT`` unset (auto), a group with ranks that share a GPU uses MPI.

    Decided once per group, together (`fcoll.gpu.nccl.sharing` gathers every member's GPU),
    at its first NCCL-bound call, before anything else travels; the group's rank 0 warns
    once, naming the ranks. ``FCOLL_GPU_TRANSPORT=nccl`` skips this, and the NCCL
    communicator's own check raises instead.
    """
    if backend is not nccl or transport() != "auto":
        return backend
    g = resolve_group(group, fn)
    if g.gpu_shared is None:
        if g.rank < 0 or not g.usable:
            return backend  # the collective raises the documented error
        g.gpu_shared = nccl.sharing(g.comm(fn), _device_id(x))
        if g.gpu_shared and g.rank == 0:
            warnings.warn(f"fcoll: {nccl.describe(g.gpu_shared)} in group {list(g.ranks)}; NCCL "
                          "needs one GPU per rank, so cupy collectives on this group use the MPI "
                          "transport (FCOLL_GPU_TRANSPORT=mpi says so and silences this)",
                          RuntimeWarning, stacklevel=4)
    return mpi_for_device() if g.gpu_shared else backend


def _device_id(x: Any) -> int:
    """The device of ``x`` (a cupy array, or a list of them: its first), else the current one."""
    if isinstance(x, (list, tuple)) and x:
        x = x[0]
    data = getattr(x, "data", None)
    device = getattr(data, "device_id", None)
    if isinstance(device, int):
        return device
    return int(sys.modules["cupy"].cuda.runtime.getDevice())


TAG = "cupy:"  # prefixes the dtype names a root scattering cupy arrays sends


def scatter(backend: Backend, chunks: Sequence[Any] | None, src: int, group: Any) -> Any:
    """`fcoll.scatter` on the root, whose chunks are cupy arrays: the metadata tells the
    other ranks (which pass ``chunks=None``) to receive onto their current device."""
    fn = "scatter"
    g, call = member(group, fn)
    root = check_rank(src, g.size, fn, "src")
    if g.rank != root or chunks is None:
        raise ValueError(f"{fn}: expected chunks=None on ranks other than src={root}, "
                         f"got {type(chunks).__name__} on rank {g.rank}")
    check_count(chunks, g.size, fn, "chunks")
    for i, c in enumerate(chunks):
        check_dtype(c.dtype, fn, f"chunks[{i}]")
    check_same_dtype(chunks, fn, "chunks")
    host.scatter_obj(call, [(tuple(c.shape), TAG + str(c.dtype)) for c in chunks], root)
    backend = choose(backend, fn, chunks, g)  # after the metadata, as on the other ranks
    if backend is nccl:
        return lists.scatter_send(g, chunks, root)
    copies = [staged.to_host(c) for c in chunks]
    send = np.concatenate([np.ascontiguousarray(h).reshape(-1).view(np.uint8) for h in copies])
    mine = host.scatterv(call, send, [h.nbytes for h in copies], np.empty_like(copies[root]), root)
    return staged.to_device(mine, int(chunks[root].device.id))


def scatter_receive(backend: Backend, g: Group, shape: tuple[int, ...], name: str,
                    root: int) -> Any:
    """A non-root rank's part of a scatter of cupy arrays (see `scatter`)."""
    dtype = dtype_from_name(name[len(TAG):])
    backend = choose(backend, "scatter", None, g)
    if backend is nccl:
        return lists.scatter_receive(g, shape, dtype, root)
    out = host.scatterv(g.call, None, [], np.empty(shape, dtype), root)
    return staged.to_device(out, staged.device_of([]))
