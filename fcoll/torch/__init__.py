"""fcoll for torch: gradients through collectives and the tensor-parallel conventions.

fcoll's collectives take torch tensors without this module; a tensor that requires grad
gives a result with a ``grad_fn`` (`fcoll.torch.autograd`). What this module adds is the
replicated-loss convention of tensor-parallel layers, `copy_to_group` and
`reduce_from_group` (`fcoll.torch.parallel`). Importing it imports torch.

Example:
    >>> import fcoll.torch
    >>> y = fcoll.torch.reduce_from_group(x @ w_shard, group=tp)
"""

from fcoll.torch.parallel import copy_to_group, reduce_from_group

__all__ = ["copy_to_group", "reduce_from_group"]
