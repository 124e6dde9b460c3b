"""The public functional collectives, split by kind: reductions, movement, lists, coalesced,
scan (prefix sums), located (maxloc/minloc), neighbors (sendrecv, halo_exchange),
point-to-point (p2p), objects and monitored_barrier (monitor)."""

from fcoll.collectives.coalesced import (
    all_gather_into_tensor_coalesced,
    all_reduce_coalesced,
    reduce_scatter_tensor_coalesced,
)
from fcoll.collectives.lists import all_gather, all_to_all, gather, scatter
from fcoll.collectives.located import maxloc, minloc
from fcoll.collectives.monitor import monitored_barrier
from fcoll.collectives.movement import (
    all_gather_into_tensor,
    all_to_all_single,
    barrier,
    broadcast,
)
from fcoll.collectives.neighbors import halo_exchange, sendrecv
from fcoll.collectives.objects import all_gather_object, broadcast_object, gather_object, scatter_object
from fcoll.collectives.p2p import P2POp, batch_isend_irecv, irecv, isend, permute_tensor, recv, send
from fcoll.collectives.reductions import all_reduce, reduce, reduce_scatter, reduce_scatter_tensor
from fcoll.collectives.scan import exscan, scan

__all__ = [
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
    "exscan",
    "gather",
    "gather_object",
    "halo_exchange",
    "irecv",
    "isend",
    "maxloc",
    "minloc",
    "monitored_barrier",
    "P2POp",
    "permute_tensor",
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
]
