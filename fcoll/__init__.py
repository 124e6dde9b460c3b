"""fcoll: torch.distributed's collectives as pure functions on numpy arrays, over MPI.

Each array collective is the c10d function of the same name with its output argument
removed: the result is returned as a new array and inputs are never modified.

Example:
    >>> import numpy as np, fcoll as fc        # under mpiexec -n 4
    >>> fc.all_reduce(np.array([fc.get_rank() + 1.0]))
    array([10.])
"""

from fcoll import _autograd, collectives, debug, dp, lax
from fcoll.calls.errors import CollectiveTimeoutError
from fcoll.calls.work import Work, wait_all
from fcoll.collectives import *  # noqa: F403  (the public collectives: collectives.__all__)
from fcoll.diagnostics import excepthook
from fcoll.groups.detail import CollectiveMismatchError
from fcoll.groups.group import Group, get_rank, get_world_size, init, is_initialized, new_group, world
from fcoll.groups.mesh import Mesh
from fcoll.groups.subgroups import new_subgroups, new_subgroups_by_enumeration
from fcoll.policy.ops import ReduceOp, premul_sum
from fcoll.runtime import abort, finalize

__version__ = "0.1.0"

finalize.install()  # free fcoll's MPI objects before MPI_Finalize (runs after the hook's check)
excepthook.install()  # an exception that ends one rank's script ends the job (FCOLL_ABORT_ON_ERROR)
_autograd.install()  # tensors that require grad get a grad_fn (fcoll.torch.autograd)

__all__ = [
    "CollectiveMismatchError",
    "CollectiveTimeoutError",
    "Group",
    "Mesh",
    "ReduceOp",
    "Work",
    "abort",
    "debug",
    "dp",
    "get_rank",
    "get_world_size",
    "init",
    "is_initialized",
    "lax",
    "new_group",
    "new_subgroups",
    "new_subgroups_by_enumeration",
    "premul_sum",
    "__version__",
    "wait_all",
    "world",
]
__all__ += collectives.__all__
