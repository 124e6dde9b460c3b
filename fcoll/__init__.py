"""fcoll: torch.distributed's collectives as pure functions on numpy arrays, over MPI.

Each array collective is the c10d function of the same name with its output argument
removed: the result is returned as a new array and inputs are never modified.

Example:
    >>> import numpy as np, fcoll as fc        # under mpiexec -n 4
    >>> fc.all_reduce(np.array([fc.get_rank() + 1.0]))
    array([10.])
"""

from fcoll import _autograd, debug, dp, lax
from fcoll.calls.work import CollectiveTimeoutError, Work, wait_all
from fcoll.collectives import (
    P2POp,
    all_gather,
    all_gather_into_tensor,
    all_gather_into_tensor_coalesced,
    all_gather_object,
    all_reduce,
    all_reduce_coalesced,
    all_to_all,
    all_to_all_single,
    barrier,
    batch_isend_irecv,
    broadcast,
    broadcast_object,
    exscan,
    gather,
    gather_object,
    halo_exchange,
    irecv,
    isend,
    maxloc,
    minloc,
    monitored_barrier,
    permute_tensor,
    recv,
    reduce,
    reduce_scatter,
    reduce_scatter_tensor,
    reduce_scatter_tensor_coalesced,
    scan,
    scatter,
    scatter_object,
    send,
    sendrecv,
)
from fcoll.diagnostics import excepthook
from fcoll.groups.detail import CollectiveMismatchError
from fcoll.groups.group import Group, get_rank, get_world_size, init, is_initialized, new_group, world
from fcoll.groups.mesh import Mesh
from fcoll.groups.subgroups import new_subgroups, new_subgroups_by_enumeration
from fcoll.policy.ops import ReduceOp, premul_sum
from fcoll.runtime import abort

__version__ = "0.1.0"

excepthook.install()  # an exception that ends one rank's script ends the job (FCOLL_ABORT_ON_ERROR)
_autograd.install()  # tensors that require grad get a grad_fn (fcoll.torch.autograd)

__all__ = [
    "CollectiveMismatchError",
    "CollectiveTimeoutError",
    "Group",
    "Mesh",
    "P2POp",
    "ReduceOp",
    "Work",
    "abort",
    "all_gather",
    "all_gather_into_tensor",
    "all_gather_into_tensor_coalesced",
    "all_gather_object",
    "all_reduce",
    "all_reduce_coalesced",
    "all_to_all",
    "all_to_all_single",
    "barrier",
    "batch_isend_irecv",
    "broadcast",
    "broadcast_object",
    "debug",
    "dp",
    "exscan",
    "gather",
    "gather_object",
    "get_rank",
    "get_world_size",
    "halo_exchange",
    "init",
    "irecv",
    "is_initialized",
    "lax",
    "isend",
    "maxloc",
    "minloc",
    "monitored_barrier",
    "new_group",
    "new_subgroups",
    "new_subgroups_by_enumeration",
    "permute_tensor",
    "premul_sum",
    "recv",
    "reduce",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "reduce_scatter_tensor_coalesced",
    "scan",
    "scatter",
    "scatter_object",
    "send",
    "sendrecv",
    "__version__",
    "wait_all",
    "world",
]
