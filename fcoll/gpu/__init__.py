"""fcoll on GPUs: cupy arrays over NCCL, CUDA-aware MPI, or MPI through host memory.

The public helper is `use_local_device`. The package holds the collectives written over a
device transport (`collectives`, `lists`, `neighbors`; the transports themselves,
`fcoll.backends.nccl`, `cuda_aware` and `staged`, sit with the host ones), the table that
routes a public collective to them (`route`), NCCL's fast paths (`fast`) and async `Work`
on CUDA events (`events`). Importing it does not import cupy (nor anything else:
submodules load when used).
"""

from __future__ import annotations


def use_local_device() -> int:
    """Make this rank's GPU cupy's current device and return its number.

    The device is ``FCOLL_GPU_DEVICE`` if set, else the node-local rank (ranks sharing
    this node, ``MPI_Comm_split_type(COMM_TYPE_SHARED)``) modulo the visible devices.
    Collective over the job. Call it before allocating cupy arrays: NCCL allows one rank
    per GPU, and fcoll's NCCL communicator lives on the device of the first array passed.

    Example:
        >>> import fcoll.gpu, cupy as cp
        >>> fcoll.gpu.use_local_device()          # rank 3 of 2 nodes x 2 GPUs
        1
    """
    import cupy

    from fcoll.backends import nccl
    from fcoll.groups.group import world

    device = nccl.local_device(world().comm("use_local_device"))
    cupy.cuda.Device(device).use()
    return device
