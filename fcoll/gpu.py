"""GPU helpers for cupy users: pick this rank's device before allocating arrays.

Importing this module does not import cupy; calling `use_local_device` does.
"""

from __future__ import annotations

from fcoll.backends import nccl
from fcoll.group import world


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

    device = nccl.local_device(world().comm("use_local_device"))
    cupy.cuda.Device(device).use()
    return device
