"""cupy arrays: the public collectives route here (`fcoll._dispatch`) and go to NCCL, or
to MPI (CUDA-aware or staged through host memory) when NCCL is not there or
``FCOLL_GPU_TRANSPORT=mpi``. Results are cupy arrays on the input's device.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import numpy as np

from fcoll._dispatch import gpu_backend
from fcoll.work import Operation, Work

R = TypeVar("R")


class EventOperation(Operation):
    """GPU work enqueued on a stream, marked by a CUDA event recorded after it.

    Completing it never blocks the host: the current stream waits on the event.
    """

    def __init__(self, name: str, group: Any, event: Any, value: Any) -> None:
        super().__init__(name, group)
        self._event = event
        self._value = value

    def _advance(self) -> bool:
        if self._event.done:  # cudaEventQuery: never blocks
            self.value = self._value
            return True
        return False

    def finish(self, timeout: float | None) -> Any:
        """Make cupy's current stream wait for the event, and return the result at once."""
        if not self.done:
            import cupy

            cupy.cuda.get_current_stream().wait_event(self._event)
            self.value = self._value
            self._complete()
        return self.value


def event_work(name: str, group: Any, value: Any) -> Work:
    """A `Work` for GPU work just enqueued on the current stream, with result ``value``."""
    import cupy

    event = cupy.cuda.Event(block=False, disable_timing=True, interprocess=False)
    event.record(cupy.cuda.get_current_stream())
    return Work(EventOperation(name, group, event, value))


def run(name: str, numpy_fn: Callable[..., R], *args: Any, **kwargs: Any) -> R:
    """Run the public collective ``name`` on cupy arguments, on the chosen GPU transport.

    ``numpy_fn`` is the public function itself, which the MPI path calls on host copies.
    """
    if gpu_backend() == "nccl":
        from fcoll.collectives import gpu_nccl, gpu_nccl_lists

        impl = getattr(gpu_nccl, name, None) or getattr(gpu_nccl_lists, name, None)
        if impl is not None:
            return impl(*args, **kwargs)  # type: ignore[no-any-return]
    from fcoll.collectives import gpu_mpi

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
        from fcoll.collectives import gpu_nccl_lists

        return gpu_nccl_lists.scatter_send(g, chunks, root)
    from fcoll.collectives import gpu_mpi

    host = [gpu_mpi.to_host(c) for c in chunks]
    send = np.concatenate([np.ascontiguousarray(h).reshape(-1).view(np.uint8) for h in host])
    mine = backend.scatterv(call, send, [h.nbytes for h in host], np.empty_like(host[root]), root)
    return gpu_mpi.to_device(mine, int(chunks[root].device.id))


def scatter_receive(g: Any, shape: tuple[int, ...], name: str, root: int) -> Any:
    """A non-root rank's part of a scatter of cupy arrays (see `scatter`)."""
    from fcoll.dtypes import dtype_from_name

    dtype = dtype_from_name(name[len(TAG):])
    if gpu_backend() == "nccl":
        from fcoll.collectives import gpu_nccl_lists

        return gpu_nccl_lists.scatter_receive(g, shape, dtype, root)
    import cupy

    from fcoll.backends import mpi as backend
    from fcoll.collectives import gpu_mpi

    out = backend.scatterv(g.call, None, [], np.empty(shape, dtype), root)
    return gpu_mpi.to_device(out, int(cupy.cuda.Device().id))
