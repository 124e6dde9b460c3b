"""The transport protocol: what a backend offers, whatever memory its buffers live in.

A backend is a module whose functions move C-contiguous buffers of one array kind
(numpy for `fcoll.backends.mpi`; cupy for `fcoll.backends.nccl`, `fcoll.backends.cuda_aware` and
`fcoll.backends.staged`). Each takes the call in progress first (`fcoll.calls.work.Call`: group,
communicator, deadline, call number), never validates its arguments and never applies
dtype policy (`fcoll.policy.plan` does). Reductions allocate and return their result in
``send``'s dtype, with ``op`` the transport's own op code (``MPI.Op`` or `fcoll.policy.ops.NcclOp`);
data movement writes the bytes into the ``out`` the caller allocated and returns it.
`fcoll.dispatch.backend_for` is the one place that picks a backend for an array.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from fcoll.calls.work import Call


class Backend(Protocol):
    """The operations every transport implements with these names and signatures.

    ``NAME`` is the backend's name in `fcoll.dispatch` and ``fcoll info``.

    Example:
        >>> from fcoll import dispatch
        >>> dispatch.backend_for(np.ones(2)).NAME       # on every rank
        'mpi'
    """

    NAME: str

    def allreduce(self, call: Call, send: Any, op: Any) -> Any: ...

    def reduce(self, call: Call, send: Any, op: Any, root: int) -> Any | None: ...

    def reduce_scatter_block(self, call: Call, send: Any, op: Any) -> Any: ...

    def bcast(self, call: Call, buf: Any, root: int) -> Any: ...

    def allgather(self, call: Call, send: Any, out: Any) -> Any: ...

    def alltoall(self, call: Call, send: Any, out: Any) -> Any: ...

    def alltoallv(self, call: Call, send: Any, send_counts: Sequence[int], out: Any,
                  recv_counts: Sequence[int]) -> Any: ...
