"""The public functional collectives, split by kind."""

from fcoll.collectives.coalesced import (
    all_gather_into_tensor_coalesced,
    all_reduce_coalesced,
    reduce_scatter_tensor_coalesced,
)
from fcoll.collectives.lists import all_gather, all_to_all, gather, scatter
from fcoll.collectives.located import maxloc, minloc
from fcoll.collectives.movement import (
    all_gather_into_tensor,
    all_to_all_single,
    barrier,
    broadcast,
)
from fcoll.collectives.neighbors import halo_exchange, sendrecv
from fcoll.collectives.reductions import all_reduce, reduce, reduce_scatter, reduce_scatter_tensor
from fcoll.collectives.scan import exscan, scan

__all__ = [
    "all_gather",
    "all_gather_into_tensor",
    "all_gather_into_tensor_coalesced",
    "all_reduce",
    "all_reduce_coalesced",
    "all_to_all",
    "all_to_all_single",
    "barrier",
    "broadcast",
    "exscan",
    "gather",
    "halo_exchange",
    "maxloc",
    "minloc",
    "reduce",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "reduce_scatter_tensor_coalesced",
    "scan",
    "scatter",
    "sendrecv",
]
