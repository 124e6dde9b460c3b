"""Where a public collective goes with cupy arrays: the table of each device backend.

The public functions call `run` with the backend `fcoll.dispatch.backend_for` chose. The
tables name, for each backend, the function that moves cupy arrays without staging; a
collective not in its backend's table (or whose function answers ``NotImplemented`` for
this call) runs on host copies through `fcoll.backends.staged`. Results are cupy arrays on
the input's device.

Debug checks and deadlines are applied here, once for every GPU collective (`guarded`):
under ``debug="detail"`` the call is compared across ranks as on the numpy path, before
its first message; under a deadline an NCCL call waits on the host (`fcoll.backends.nccl.wait`).
The MPI transports honour the deadline themselves, and staged calls are numpy calls.
"""

from __future__ import annotations

import inspect
import sys
import warnings
from collections.abc import Callable, Sequence
from typing import Any, TypeVar, cast

import numpy as np

from fcoll import runtime
from fcoll.backends import Backend, cuda_aware, nccl, staged
from fcoll.backends import mpi as host
from fcoll.calls.work import Call
from fcoll.dispatch import interop
from fcoll.dispatch.gpu_settings import mpi_for_device, transport
from fcoll.gpu import collectives, lists, neighbors
from fcoll.groups import detail
from fcoll.groups.group import Group, resolve_group
from fcoll.groups.membership import member
from fcoll.policy.dtypes import check_dtype, dtype_from_name
from fcoll.policy.ops import is_custom
from fcoll.policy.validate import check_count, check_rank, check_same_dtype

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
    "sendrecv": neighbors.sendrecv,
    "halo_exchange": neighbors.halo_exchange,
}
# Not compared across `group` by `guarded`: sendrecv is not collective, and halo_exchange
# checks its own call across its mesh (block shapes may differ between ranks).
OWN_CHECKS = frozenset({"sendrecv", "halo_exchange"})

# CUDA-aware MPI: the single-message collectives hand device buffers to MPI (all_reduce
# only where MPI's own op reduces; the rank-order fold runs staged).
AWARE: dict[str, Callable[..., Any]] = {
    "all_reduce": collectives.all_reduce,
    "broadcast": collectives.broadcast,
    "all_gather_into_tensor": collectives.all_gather_into_tensor,
    "all_to_all_single": collectives.all_to_all_single,
}

R = TypeVar("R")

TABLES: dict[str, dict[str, Callable[..., Any]]] = {nccl.NAME: NCCL, cuda_aware.NAME: AWARE,
                                                    staged.NAME: {}}


def run(backend: Backend, name: str, numpy_fn: Callable[..., R], *args: Any, **kwargs: Any) -> R:
    """Run the public collective ``name`` on cupy arguments over ``backend``.

    ``numpy_fn`` is the public function itself, which staging calls on host copies; the
    group travels as the keyword ``group`` (`choose` reads it).
    """
    if backend is cast(Backend, interop):  # torch tensors, JAX arrays (`fcoll.dispatch.INTEROP`)
        return interop.run(numpy_fn, name, *args, **kwargs)  # type: ignore[no-any-return]
    if any(is_custom(a) for a in (*args, *kwargs.values())):
        return staged.run(numpy_fn, *args, **kwargs)  # type: ignore[no-any-return]  # ufunc op
    group = kwargs.get("group")
    backend = choose(backend, name, args[0] if args else None, group)
    impl = TABLES[backend.NAME].get(name)
    if impl is not None:
        result = impl(backend, *args, **kwargs) if name in OWN_CHECKS else guarded(
            name, group, lambda: _fields(numpy_fn, args, kwargs), lambda: impl(backend, *args, **kwargs))
        if result is not NotImplemented:
            if backend is nccl:
                return _waited(resolve_group(group, name).call, result)  # type: ignore[no-any-return]
            return result  # type: ignore[no-any-return]
    return staged.run(numpy_fn, *args, **kwargs)  # type: ignore[no-any-return]


def guarded(fn: str, group: Any, fields: Callable[[], dict[str, object]],
            body: Callable[[], R]) -> R:
    """``body()``, a GPU collective, under the numpy path's debug check (`fcoll.groups.detail`).

    With ``debug="off"`` it just calls ``body``. Otherwise the comparison of ``fields()``
    across the group waits in the call context (`fcoll.calls.work.Call.check`) and runs at the
    call's first message, after ``body``'s local checks; if those raise first, this rank
    joins the comparison with its error and raises it, as `fcoll.groups.detail.checked` does.

    Example:
        >>> guarded("broadcast", g, lambda: {"x": x, "src": src},
        ...         lambda: collectives.broadcast(nccl, x, src, g))
        CollectiveMismatchError: broadcast: ...     # every rank, when another passed src=1
    """
    if not runtime._state.checking:
        return body()
    g, call = member(group, fn)
    described = fields()
    call.check = lambda: detail.compare(g, call, fn, described, None)
    try:
        return body()
    except Exception as error:
        if call.check is not None:  # it failed its local checks before sending anything
            call.check = None
            detail.compare(g, call, fn, described, error)
        raise
    finally:
        call.check = None


_SIGNATURES: dict[Callable[..., Any], inspect.Signature] = {}


def _fields(numpy_fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
            ) -> dict[str, object]:
    """What the numpy path's debug check compares for this call: every argument of the
    public function but ``group`` and ``async_op``, in its order."""
    signature = _SIGNATURES.get(numpy_fn)
    if signature is None:
        signature = _SIGNATURES[numpy_fn] = inspect.signature(numpy_fn)
    bound = signature.bind(*args, **kwargs)
    bound.apply_defaults()
    return {k: v for k, v in bound.arguments.items() if k not in ("group", "async_op")}


def choose(backend: Backend, fn: str, x: Any, group: Any, call: Call | None = None) -> Backend:
    """``backend``, or the MPI backend where NCCL cannot serve ``group``: with
    ``FCOLL_GPU_TRANSPORT`` unset (auto), a group with ranks that share a GPU uses MPI.

    Decided once per group, together (`fcoll.backends.nccl.sharing` gathers every member's GPU),
    at its first NCCL-bound call, before anything else travels (``call``: the call in
    progress, if it began; its deadline bounds the exchange); the group's rank 0 warns
    once, naming the ranks. ``FCOLL_GPU_TRANSPORT=nccl`` skips this, and the NCCL
    communicator's own check raises instead.
    """
    if backend is not nccl or transport() != "auto":
        return backend
    g = resolve_group(group, fn)
    if g.gpu_shared is None:
        if g.rank < 0 or not g.usable:
            return backend  # the collective raises the documented error
        if call is None:
            g, call = member(g, fn)
        counted = call.counted
        g.gpu_shared = nccl.sharing(call, _device_id(x))[0]
        if not counted:  # the exchange is part of the call, which its first operation counts
            call.counted, g.seq = False, g.seq - 1
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


def scatter(backend: Backend, chunks: Sequence[Any] | None, src: int, group: Any,
            sent_as: str = "") -> Any:
    """`fcoll.scatter` on the root, whose chunks are cupy arrays: the metadata tells the
    other ranks (which pass ``chunks=None``) to receive onto their current device
    (``sent_as`` prefixes it when the chunks were torch tensors or JAX arrays)."""
    return guarded("scatter", group, lambda: {"src": src},
                   lambda: _scatter(backend, chunks, src, group, sent_as))


def _scatter(backend: Backend, chunks: Sequence[Any] | None, src: int, group: Any,
             sent_as: str) -> Any:
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
    host.scatter_obj(call, [(tuple(c.shape), sent_as + TAG + str(c.dtype)) for c in chunks], root)
    backend = choose(backend, fn, chunks, g, call)  # after the metadata, as on the other ranks
    if backend is nccl:
        return _waited(call, lists.scatter_send(g, chunks, root))
    copies = [staged.to_host(c) for c in chunks]
    send = np.concatenate([np.ascontiguousarray(h).reshape(-1).view(np.uint8) for h in copies])
    mine = host.scatterv(call, send, [h.nbytes for h in copies], np.empty_like(copies[root]), root)
    return staged.to_device(mine, int(chunks[root].device.id))


def scatter_receive(backend: Backend, g: Group, shape: tuple[int, ...], name: str,
                    root: int) -> Any:
    """A non-root rank's part of a scatter of cupy arrays (see `scatter`)."""
    dtype = dtype_from_name(name[len(TAG):])
    backend = choose(backend, "scatter", None, g, g.call)
    if backend is nccl:
        return _waited(g.call, lists.scatter_receive(g, shape, dtype, root))
    out = host.scatterv(g.call, None, [], np.empty(shape, dtype), root)
    return staged.to_device(out, staged.device_of([]))


def _waited(call: Call, result: R) -> R:
    """``result``, once the NCCL work of ``call`` is done under a deadline (`nccl.wait`)."""
    nccl.wait(call)
    return result
