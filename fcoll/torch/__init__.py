"""fcoll for torch: the torch.distributed backend ``"fcoll"``, gradients through collectives,
and the tensor-parallel conventions.

Importing this module registers the backend ``"fcoll"`` with torch.distributed
(`fcoll.torch.plugin`): under ``mpiexec -n N``, ``dist.init_process_group("fcoll")`` needs no
other argument, and DDP, FSDP2 and torch's collectives run over fcoll
(`fcoll.torch.backend`). fcoll's own collectives take torch tensors without this module; a
tensor that requires grad gives a result with a ``grad_fn`` (`fcoll.torch.autograd`). What
this module adds there is the replicated-loss convention of tensor-parallel layers,
`copy_to_group` and `reduce_from_group` (`fcoll.torch.parallel`). Importing it imports torch.

Example:
    >>> import fcoll.torch, torch.distributed as dist
    >>> dist.init_process_group("fcoll")                 # mpiexec -n 2 python train.py
    >>> y = fcoll.torch.reduce_from_group(x @ w_shard, group=tp)
"""

import torch.distributed as _dist

from fcoll.torch.parallel import copy_to_group, reduce_from_group

__all__ = ["copy_to_group", "reduce_from_group"]

if _dist.is_available():  # torch builds without distributed support have no process groups
    from fcoll.torch.backend import ProcessGroupFcoll, monitored_barrier
    from fcoll.torch.plugin import register

    register()
    __all__ += ["ProcessGroupFcoll", "monitored_barrier", "register"]
