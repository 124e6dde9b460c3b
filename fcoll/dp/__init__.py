"""fcoll.dp: data-parallel training helpers on pytrees of numpy or cupy arrays.

Gradient averaging (bucketed, overlapped with backprop, optionally compressed),
parameter broadcast and consistency checks, and model averaging (local SGD).
"""

from fcoll.dp.averager import (
    GradientAverager,
    allreduce_hook,
    average_gradients,
    bf16_compress_hook,
    fp16_compress_hook,
)
from fcoll.dp.params import (
    PeriodicModelAverager,
    average_parameters,
    broadcast_parameters,
    check_parameters,
)

__all__ = [
    "GradientAverager",
    "PeriodicModelAverager",
    "allreduce_hook",
    "average_gradients",
    "average_parameters",
    "bf16_compress_hook",
    "broadcast_parameters",
    "check_parameters",
    "fp16_compress_hook",
]
