"""Collectives into a given buffer: the internal ``out=`` path of the torch backend.

fcoll's public functions return new arrays. torch's process groups fill output tensors
instead (`fcoll.torch.backend`), so these write the result into ``out`` (a C-contiguous,
writable numpy array; for `all_reduce` it may be ``x`` itself) wherever the transport can
fill a given buffer: MPI's reductions and data movement, the compiled core's all-reduce and
all-gather, the numpy segment's all-reduce. Elsewhere (a float fold over MPI, a widened wire
dtype, the segment's broadcast and reduce-scatter) the result is copied into ``out``. Each
call runs the public function's checks, debug comparison and flight-recorder entry under the
public name; the callers check ``out``'s size and dtype, these only its layout.

Example:
    >>> out = np.empty(3)
    >>> all_reduce(np.ones(3), out, "sum", None)      # each of 2 ranks
    >>> out
    array([2., 2., 2.])
"""

from __future__ import annotations

import numpy as np

from fcoll.backends import mpi as backend
from fcoll.calls.fingerprint import of as fingerprint
from fcoll.collectives import _alltoall, _fold
from fcoll.collectives.movement import allgather
from fcoll.dispatch import on_node, shm_limit
from fcoll.groups import detail
from fcoll.groups.group import Group
from fcoll.groups.membership import member
from fcoll.policy.ops import Op
from fcoll.policy.plan import reduction_plan
from fcoll.policy.validate import check_array, check_divisible, check_rank


def _writable(out: np.ndarray, fn: str, nbytes: int) -> np.ndarray:
    """``out`` as the transports take it; `ValueError` (an internal caller's mistake) unless
    it is a writable C-contiguous array of ``nbytes`` bytes."""
    if not (isinstance(out, np.ndarray) and out.flags.c_contiguous and out.flags.writeable
            and out.nbytes == nbytes):
        raise ValueError(f"{fn}: expected out to be a writable C-contiguous numpy array of "
                         f"{nbytes} bytes, got {type(out).__name__} of "
                         f"{getattr(out, 'nbytes', '?')} bytes")
    return out


def all_reduce(x: np.ndarray, out: np.ndarray, op: Op, group: Group | None) -> None:
    """`fcoll.all_reduce` of ``x`` into ``out`` (``x``'s shape and dtype; ``x`` itself for
    in place).

    Example:
        >>> x = np.array([r + 1.0]); all_reduce(x, x, "sum", None)   # rank r of 2
        >>> x
        array([3.])
    """
    g, call = member(group, "all_reduce")
    with detail.checked(g, call, "all_reduce", x=x, op=op):
        plan = reduction_plan(x, op, g, "all_reduce")
        _writable(out, "all_reduce", x.nbytes)
    if x.shape != out.shape:
        out = out.reshape(x.shape)
    if out is not x and np.may_share_memory(x, out):  # overlapping, not the same: apart
        x = x.copy()
    if plan.direct and x.flags.c_contiguous and x.nbytes < shm_limit(g):
        backend.allreduce(call, x, plan.op, out)  # MPI reduces x as it is
    else:
        _fold.allreduce(call, plan, x, out)


def reduce_scatter(x: np.ndarray, out: np.ndarray, op: Op, group: Group | None) -> None:
    """`fcoll.reduce_scatter_tensor` of a 1-D ``x`` into ``out`` (``x.size // n`` elements).

    Example:
        >>> out = np.empty(2); reduce_scatter(np.arange(4.0), out, "sum", None)  # 2 ranks
        >>> out                                                # rank 0; rank 1: [4., 6.]
        array([0., 2.])
    """
    fn = "reduce_scatter_tensor"
    g, call = member(group, fn)
    with detail.checked(g, call, fn, x=x, op=op, scatter_dim=0):
        plan = reduction_plan(x, op, g, fn)
        check_divisible(x.shape, 0, g.size, fn, "x.shape[0]")
        _writable(out, fn, x.nbytes // g.size)
    out = out.reshape(-1)
    data = x.reshape(-1) if x.flags.c_contiguous else np.ascontiguousarray(x).reshape(-1)
    if plan.direct and x.nbytes < shm_limit(g, "reduce_scatter") and \
            not np.may_share_memory(out, data):
        backend.reduce_scatter_block(call, data, plan.op, out)
        return
    np.copyto(out, _fold.reduce_scatter(call, plan, data, [data.size // g.size] * g.size))


def all_gather(x: np.ndarray, out: np.ndarray, group: Group | None) -> None:
    """`fcoll.all_gather_into_tensor` of a 1-D ``x`` into ``out`` (``n`` times its size).

    Example:
        >>> out = np.empty(2); all_gather(np.array([r * 1.0]), out, None)   # 2 ranks
        >>> out
        array([0., 1.])
    """
    fn = "all_gather_into_tensor"
    g, call = member(group, fn)
    with detail.checked(g, call, fn, x=x, gather_dim=0, sizes=None):
        check_array(x, fn)
        _writable(out, fn, x.nbytes * g.size)
    data = x.reshape(-1) if x.flags.c_contiguous else np.ascontiguousarray(x).reshape(-1)
    if np.may_share_memory(data, out):  # FSDP gathers from its own block of the output
        data = data.copy()
    allgather(call, data, out.reshape(-1))


def broadcast(buf: np.ndarray, src: int, group: Group | None) -> None:
    """`fcoll.broadcast` in place: ``buf`` (C-contiguous) ends as group rank ``src``'s.

    Example:
        >>> buf = np.array([r]); broadcast(buf, 1, None)      # rank r
        >>> buf                                               # on every rank
        array([1])
    """
    g, call = member(group, "broadcast")
    with detail.checked(g, call, "broadcast", x=buf, src=src):
        root = check_rank(src, g.size, "broadcast", "src")
        check_array(buf, "broadcast")
        _writable(buf, "broadcast", buf.nbytes)
    if (shared := on_node(call, buf.nbytes, "broadcast")) is not None:
        y = shared.broadcast(call, buf, root, fingerprint("broadcast", "", buf.dtype, root))
        if g.rank != root:
            np.copyto(buf, y)
        return
    backend.bcast(call, buf, root)


def all_to_all(x: np.ndarray, out: np.ndarray, group: Group | None) -> None:
    """`fcoll.all_to_all_single` with even splits into ``out`` (``x``'s size).

    Example:
        >>> out = np.empty(2); all_to_all(np.array([10.0 * r, 10.0 * r + 1]), out, None)
        >>> out                                                # rank 1 of 2
        array([ 1., 11.])
    """
    fn = "all_to_all_single"
    g, call = member(group, fn)
    with detail.checked(g, call, fn, x=x, output_split_sizes=None, input_split_sizes=None):
        check_array(x, fn)
        check_divisible(x.shape if x.ndim else (1,), 0, g.size, fn, "x.shape[0]")
        _writable(out, fn, x.nbytes)
    data = x if x.flags.c_contiguous and not np.may_share_memory(x, out) else x.copy()
    _alltoall.even(call, data, out)
