"""cupy arrays: the public collectives route here (`fcoll._dispatch`) and go to NCCL, or
to MPI (CUDA-aware or staged through host memory) when NCCL is not there or
``FCOLL_GPU_TRANSPORT=mpi``. Results are cupy arrays on the input's device.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import numpy as np

from fcoll._dispatch import gpu_backend
from fcoll.collectives import gpu_mpi, gpu_nccl, gpu_nccl_lists

# The NCCL implementation of each public collective that has one (the others, e.g.
# reduce_scatter on lists, go through gpu_mpi). Named here so that a reader (and a
# static tool) can go from a public function to its NCCL call.
NCCL: dict[str, Callable[..., Any]] = {
    "all_reduce": gpu_nccl.all_reduce,
    "reduce": gpu_nccl.reduce,
    "reduce_scatter_tensor": gpu_nccl.reduce_scatter_tensor,
    "reduce_scatter": gpu_nccl.reduce_scatter,
    "broadcast": gpu_nccl.broadcast,
    "all_gather_into_tensor": gpu_nccl.all_gather_into_tensor,
    "all_to_all_single": gpu_nccl.all_to_all_single,
    "all_gather": gpu_nccl_lists.all_gather,
    "gather": gpu_nccl_lists.gather,
    "all_to_all": gpu_nccl_lists.all_to_all,
    "all_reduce_coalesced": gpu_nccl_lists.all_reduce_coalesced,
    "reduce_scatter_tensor_coalesced": gpu_nccl_lists.reduce_scatter_tensor_coalesced,
    "all_gather_into_tensor_coalesced": gpu_nccl_lists.all_gather_into_tensor_coalesced,
    "permute_tensor": gpu_nccl_lists.permute_tensor,
}

R = TypeVar("R")


def run(name: str, numpy_fn: Callable[..., R], *args: Any, **kwargs: Any) -> R:
    """Run the public collective ``name`` on cupy arguments, on the chosen GPU transport.

    ``numpy_fn`` is the public function itself, which the MPI path calls on host copies.
    """
    if gpu_backend() == "nccl":
        impl = NCCL.get(name)
        if impl is not None:
            return impl(*args, **kwargs)  # type: ignore[no-any-return]
    return gpu_mpi.run(name, numpy_fn, *args, **kwargs)  # type: ignore[no-any-return]


TAG = "cupy:"  # prefixes the dtype names a root scattering cupy arrays sends


def scatter(chunks: Sequence[Any] | None, src: int, group: Any) -> Any:
    """`fcoll.scatter` on the root, whose chunks are cupy arrays: the metadata tells the
    other ranks (which pass ``chunks=None``) to receive onto their current device."""
    from fcoll._validate import check_rank
    from fcoll.backends import mpi as backend
    from fcoll.group import member

    fn = "scatter"
    g, call = member(group, fn)
    root = check_rank(src, g.size, fn, "src")
    if g.rank != root or chunks is None:
        raise ValueError(f"{fn}: expected chunks=None on ranks other than src={root}, "
                         f"got {type(chunks).__name__} on rank {g.rank}")
    if len(chunks) != g.size:
        raise ValueError(f"{fn}: expected chunks to hold {g.size} arrays (one per group rank), "
                         f"got {len(chunks)}")
    from fcoll.dtypes import check_dtype

    for i, c in enumerate(chunks):
        check_dtype(c.dtype, fn, f"chunks[{i}]")
    if len({str(c.dtype) for c in chunks}) > 1:
        raise ValueError(f"{fn}: expected one dtype across chunks, got tensors with different "
                         f"dtypes {sorted({str(c.dtype) for c in chunks})}")
    backend.scatter_obj(call, [(tuple(c.shape), TAG + str(c.dtype)) for c in chunks], root)
    if gpu_backend() == "nccl":
        return gpu_nccl_lists.scatter_send(g, chunks, root)
    host = [gpu_mpi.to_host(c) for c in chunks]
    send = np.concatenate([np.ascontiguousarray(h).reshape(-1).view(np.uint8) for h in host])
    mine = backend.scatterv(call, send, [h.nbytes for h in host], np.empty_like(host[root]), root)
    return gpu_mpi.to_device(mine, int(chunks[root].device.id))


def scatter_receive(g: Any, shape: tuple[int, ...], name: str, root: int) -> Any:
    """A non-root rank's part of a scatter of cupy arrays (see `scatter`)."""
    from fcoll.dtypes import dtype_from_name

    dtype = dtype_from_name(name[len(TAG):])
    if gpu_backend() == "nccl":
        return gpu_nccl_lists.scatter_receive(g, shape, dtype, root)
    import cupy

    from fcoll.backends import mpi as backend

    out = backend.scatterv(g.call, None, [], np.empty(shape, dtype), root)
    return gpu_mpi.to_device(out, int(cupy.cuda.Device().id))
