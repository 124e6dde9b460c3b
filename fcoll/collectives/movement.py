"""Data movement on one array: broadcast, all_gather_into_tensor, all_to_all_single, barrier.

Arrays travel as raw bytes, so every dtype moves bit-exact. Results are new arrays; inputs
are never written.

Two repetitions are deliberate. Each function opens with its own fast-path lookup, as in
`fcoll.collectives.reductions` (a shared helper would put one more Python call per call:
34 ns (`timeit` of the table lookup and call, inline 64 ns, through a helper 98 ns), 4 %
of an 8 B all_reduce at n = 2 (0.84 us, bench/run.py)). And each public function has two
``@overload`` stubs, ``async_op=False`` returning the array's type and ``True`` a `Work`
of it, which differ in that one line: Python has no shorter spelling, and mypy and pyright
read them (tests/test_typing.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, overload

import numpy as np

from fcoll.backends import mpi as backend
from fcoll.backends import native, nodes
from fcoll.calls.fingerprint import of as fingerprint
from fcoll.calls.work import Call, Work, complete_pending
from fcoll.collectives import _alltoall, _fast, _fast_alltoall
from fcoll.collectives._common import c_order, dim_back, dim_first, nbytes_of
from fcoll.collectives.nonblocking import launch, private
from fcoll.dispatch import across_nodes, device, on_node, shm_range
from fcoll.gpu import fast as gpu_fast
from fcoll.gpu import route
from fcoll.groups import detail
from fcoll.groups.group import Group, GroupArg
from fcoll.groups.membership import member
from fcoll.policy.arrays import A
from fcoll.policy.validate import (
    check_array,
    check_dim,
    check_rank,
    check_sizes,
    check_splits,
    sizes_problem,
)


@overload
def broadcast(x: A, src: int = ..., group: GroupArg = ..., *, async_op: Literal[False] = ...) -> A: ...
@overload
def broadcast(x: A, src: int = ..., group: GroupArg = ..., *, async_op: Literal[True]) -> Work[A]: ...


def broadcast(  # type: ignore[misc]  # the numpy path (fcoll.policy.arrays)
    x: np.ndarray, src: int = 0, group: GroupArg = None, *, async_op: bool = False
) -> np.ndarray | Work[np.ndarray]:
    """Every rank gets group rank ``src``'s ``x`` (a new array on every rank, ``src`` too).

    Every rank passes an array of the same shape and dtype; only ``src``'s values are read.

    Example:
        >>> y = fc.broadcast(np.array([r]), src=1)      # rank r
        >>> y                                           # on every rank
        array([1])
    """
    if group is None and not async_op and type(src) is int:
        if type(x) is np.ndarray:
            fast = _fast.BROADCAST.get((src, x.dtype))
        else:
            fast = gpu_fast.BROADCAST.get((src, x.dtype)) if type(x) in gpu_fast.ARRAY else None
        y = fast(x) if fast is not None else None
        if y is not None:
            return y
    elif type(group) is Group and not async_op and type(src) is int and type(x) is np.ndarray:
        fast = _fast.BROADCAST.get((group, (src, x.dtype)))  # a group's own fast path
        if fast is not None and (y := fast(x)) is not None:
            return y
    if type(x) is not np.ndarray and (on := device(x, group)) is not None:
        return route.run(  # type: ignore[no-any-return]
            on, "broadcast", broadcast, x, src, group=group, async_op=async_op)
    g, call = member(group, "broadcast")
    with detail.checked(g, call, "broadcast", x=x, src=src):
        root = check_rank(src, g.size, "broadcast", "src")
        check_array(x, "broadcast")
    if not async_op and type(src) is int:
        key = _fast.key(group, (src, x.dtype))
        _fast.learn(_fast.BROADCAST, key, g, _fast.broadcast, backend.BYTE, root,
                    shm_range(g, "broadcast"), x.dtype, native.running(), key)
    if not async_op and (shared := on_node(call, x.nbytes, "broadcast")) is not None:
        fp = fingerprint("broadcast", "", x.dtype, root)
        return shared.broadcast(call, x, root, fp)  # type: ignore[no-any-return]
    if not async_op and (h := across_nodes(call, "broadcast", x.nbytes)) is not None:
        return nodes.broadcast(call, h, x, root, fingerprint("broadcast", "", x.dtype, root))
    if not async_op and x.nbytes >= backend.PIPELINE_BYTES and x.flags.c_contiguous and \
            g.shm is not False:  # across nodes one Bcast measured faster (bench/nodes.py)
        return backend.bcast_copy(call, x, root)
    buf = np.array(x, order="C", copy=True) if g.rank == root else np.empty(x.shape, x.dtype)
    if async_op:
        return launch("broadcast", g, backend.ibcast(call, buf, root), lambda: buf, buf)
    return backend.bcast(call, buf, root)


def barrier(group: GroupArg = None) -> None:
    """Block until every rank of ``group`` has called `barrier`.

    First completes every operation this rank started on ``group`` with
    ``async_op=True`` (or `isend`/`irecv`) and has not waited for.

    Example:
        >>> fc.barrier()      # every rank; returns once all have arrived
    """
    g, call = member(group, "barrier")
    with detail.checked(g, call, "barrier"):
        pass
    complete_pending(call)
    if native.running() and (shared := on_node(call, 0, "barrier")) is not None:
        shared.barrier(call)  # one step of the group's segment: a long wait sleeps there
    elif (h := across_nodes(call, "barrier")) is not None:
        nodes.barrier(call, h)  # a step of the node's segment, then MPI's on k ranks
    else:
        backend.barrier(call)


def _gathered_shape(x: np.ndarray, dim: int, total: int) -> tuple[int, ...]:
    """The shape of ``dim_first(x, dim)`` with its first axis replaced by ``total``."""
    rest = x.shape[:dim] + x.shape[dim + 1 :]
    return (total, *rest)


def _all_gather_v(
    call: Call, g: Group, x: np.ndarray, dim: int, sizes: list[int] | None, async_op: bool
) -> np.ndarray | Work[np.ndarray]:
    fn = "all_gather_into_tensor"
    meta = backend.allgather_obj(call, (x.shape, str(x.dtype), sizes))
    problem = sizes_problem(meta, dim)
    if problem is not None:
        raise ValueError(f"{fn}: ranks disagree: {problem}")
    lengths = [m[0][dim] for m in meta]
    row = nbytes_of(_gathered_shape(x, dim, 1), x.dtype)
    out = np.empty(_gathered_shape(x, dim, sum(lengths)), x.dtype)
    send, counts = c_order(dim_first(x, dim)), [s * row for s in lengths]
    if async_op:
        send = private(send, x)
        request = backend.iallgatherv(call, send, out, counts)
        return launch(fn, g, request, lambda: dim_back(out, dim), send)
    return dim_back(backend.allgatherv(call, send, out, counts), dim)


@overload
def all_gather_into_tensor(
    x: A,
    group: GroupArg = ...,
    *,
    gather_dim: int = ...,
    sizes: Sequence[int] | Literal["auto"] | None = ...,
    async_op: Literal[False] = ...,
) -> A: ...
@overload
def all_gather_into_tensor(
    x: A,
    group: GroupArg = ...,
    *,
    gather_dim: int = ...,
    sizes: Sequence[int] | Literal["auto"] | None = ...,
    async_op: Literal[True],
) -> Work[A]: ...


def all_gather_into_tensor(  # type: ignore[misc]  # the numpy path (fcoll.policy.arrays)
    x: np.ndarray,
    group: GroupArg = None,
    *,
    gather_dim: int = 0,
    sizes: Sequence[int] | Literal["auto"] | None = None,
    async_op: bool = False,
) -> np.ndarray | Work[np.ndarray]:
    """Every rank's ``x`` concatenated along ``gather_dim``, in group-rank order.

    Without ``sizes`` every rank passes the same shape and the result has
    ``shape[gather_dim] * n`` there. With ``sizes=[...]`` (one entry per rank) or
    ``sizes="auto"`` ranks may differ along ``gather_dim`` (all-gather-v); disagreeing
    sizes or shapes raise `ValueError` on every rank. A 0-d ``x`` gathers to shape ``(n,)``.

    Example:
        >>> y = fc.all_gather_into_tensor(np.full((1, 2), r))    # rank r of 2 ranks
        >>> y                                                    # on every rank
        array([[0, 0],
               [1, 1]])
    """
    if group is None and not async_op and sizes is None and type(gather_dim) is int and gather_dim == 0:
        if type(x) is np.ndarray:
            fast = _fast.ALL_GATHER.get(x.dtype)
        else:
            fast = gpu_fast.ALL_GATHER.get(x.dtype) if type(x) in gpu_fast.ARRAY else None
        y = fast(x) if fast is not None else None
        if y is not None:
            return y
    elif type(group) is Group and not async_op and sizes is None and type(gather_dim) is int \
            and gather_dim == 0 and type(x) is np.ndarray:
        fast = _fast.ALL_GATHER.get((group, x.dtype))  # a group's own fast path
        if fast is not None and (y := fast(x)) is not None:
            return y
    fn = "all_gather_into_tensor"
    if type(x) is not np.ndarray and (on := device(x, group)) is not None:
        return route.run(on, fn, all_gather_into_tensor, x, group=group,  # type: ignore[no-any-return]
                         gather_dim=gather_dim, sizes=sizes, async_op=async_op)
    g, call = member(group, fn)
    with detail.checked(g, call, fn, x=x, gather_dim=gather_dim, sizes=sizes):
        check_array(x, fn)
        flat = x.reshape(1) if x.ndim == 0 else x
        dim = check_dim(flat, gather_dim, fn, "gather_dim")
        checked = _checked_sizes(flat, dim, sizes, g, gather_dim)
    if not async_op and sizes is None and dim == 0 and x.ndim and x.flags.c_contiguous:  # the common case
        if type(gather_dim) is int:
            key = _fast.key(group, x.dtype)
            _fast.learn(_fast.ALL_GATHER, key, g, _fast.all_gather, backend.BYTE,
                        shm_range(g, "all_gather"), x.dtype, native.running(), key)
        out = np.empty((x.shape[0] * g.size, *x.shape[1:]), x.dtype)
        return allgather(call, x, out)
    x = flat
    if sizes is None:
        out = np.empty(_gathered_shape(x, dim, x.shape[dim] * g.size), x.dtype)
        send = c_order(dim_first(x, dim))
        if async_op:
            send = private(send, x)
            request = backend.iallgather(call, send, out)
            return launch(fn, g, request, lambda: dim_back(out, dim), send)
        return dim_back(allgather(call, send, out), dim)
    return _all_gather_v(call, g, x, dim, checked, async_op)


def allgather(call: Call, send: np.ndarray, out: np.ndarray) -> np.ndarray:
    """The blocking all-gather of C-contiguous ``send`` into ``out`` (C-contiguous, ``n``
    times ``send``'s bytes): on-node shared memory where `fcoll.dispatch.on_node` says so,
    else MPI. `all_gather_into_tensor` and its coalesced form call it."""
    if (shared := on_node(call, send.nbytes, "all_gather")) is not None:
        fp = fingerprint("all_gather_into_tensor", "", send.dtype)
        return shared.allgather(call, send, out, fp)  # type: ignore[no-any-return]
    if (h := across_nodes(call, "all_gather", send.nbytes)) is not None:
        return nodes.allgather(call, h, send, out, fingerprint("all_gather_into_tensor", "",
                                                                send.dtype))
    return backend.allgather(call, send, out)


def _checked_sizes(x: np.ndarray, dim: int, sizes: object, g: Group,
                   gather_dim: object) -> list[int] | None:
    """``sizes`` of `all_gather_into_tensor` checked against this rank's ``x``; ``None``
    for ``None`` and ``"auto"``."""
    fn = "all_gather_into_tensor"
    if sizes is None or (isinstance(sizes, str) and sizes == "auto"):
        return None
    checked = check_sizes(sizes, g.size, fn, "sizes")
    if checked[g.rank] != x.shape[dim]:
        raise ValueError(f"{fn}: expected x.shape[{gather_dim}] == sizes[{g.rank}] == "
                         f"{checked[g.rank]}, got shape {x.shape}")
    return checked


def _splits(x: np.ndarray, output_split_sizes: object, input_split_sizes: object,
            n: int) -> tuple[list[int], list[int] | None]:
    """`all_to_all_single`'s split sizes (`check_splits`), after the array check."""
    check_array(x, "all_to_all_single")
    return check_splits(x, output_split_sizes, input_split_sizes, n, "all_to_all_single")


@overload
def all_to_all_single(
    x: A,
    output_split_sizes: Sequence[int] | None = ...,
    input_split_sizes: Sequence[int] | None = ...,
    group: GroupArg = ...,
    *,
    async_op: Literal[False] = ...,
) -> A: ...
@overload
def all_to_all_single(
    x: A,
    output_split_sizes: Sequence[int] | None = ...,
    input_split_sizes: Sequence[int] | None = ...,
    group: GroupArg = ...,
    *,
    async_op: Literal[True],
) -> Work[A]: ...


def all_to_all_single(  # type: ignore[misc]  # the numpy path (fcoll.policy.arrays)
    x: np.ndarray,
    output_split_sizes: Sequence[int] | None = None,
    input_split_sizes: Sequence[int] | None = None,
    group: GroupArg = None,
    *,
    async_op: bool = False,
) -> np.ndarray | Work[np.ndarray]:
    """Exchange rows (axis 0): block ``i`` of ``x`` goes to rank ``i``; the result is the
    blocks received, in rank order.

    ``None`` splits mean an even split. When only ``input_split_sizes`` is given the output
    sizes are exchanged; split sizes that disagree between ranks raise `ValueError` on
    every rank.

    Example:
        >>> y = fc.all_to_all_single(np.array([10 * r, 10 * r + 1]))   # rank r of 2
        >>> y                                                           # on rank 1
        array([ 1, 11])
    """
    if group is None and not async_op and output_split_sizes is None and input_split_sizes is None:
        if type(x) is np.ndarray:
            fast = _fast.ALL_TO_ALL.get(x.dtype)
        else:
            fast = gpu_fast.ALL_TO_ALL.get(x.dtype) if type(x) in gpu_fast.ARRAY else None
        y = fast(x) if fast is not None else None
        if y is not None:
            return y
    elif type(group) is Group and not async_op and output_split_sizes is None \
            and input_split_sizes is None and type(x) is np.ndarray:
        fast = _fast.ALL_TO_ALL.get((group, x.dtype))  # a group's own fast path
        if fast is not None and (y := fast(x)) is not None:
            return y
    if input_split_sizes is not None and not async_op and type(x) is np.ndarray and (
            fast_v := _fast.ALL_TO_ALL_V.get(_fast.key(group, x.dtype))) is not None and (
            y := fast_v(x, output_split_sizes, input_split_sizes)) is not None:
        return y
    fn = "all_to_all_single"
    if type(x) is not np.ndarray and (on := device(x, group)) is not None:
        return route.run(on, fn, all_to_all_single, x, output_split_sizes,  # type: ignore[no-any-return]
                         input_split_sizes, group=group, async_op=async_op)
    g, call = member(group, fn)
    n = g.size
    with detail.checked(g, call, fn, x=x, output_split_sizes=output_split_sizes,
                        input_split_sizes=input_split_sizes):
        ins, outs = _splits(x, output_split_sizes, input_split_sizes, n)
    if output_split_sizes is None and input_split_sizes is None:  # the common case
        if async_op:
            send, out = private(c_order(x), x), np.empty(x.shape, x.dtype)
            return launch(fn, g, backend.ialltoall(call, send, out), lambda: out, send)
        shared, key = _alltoall.shared(call), _fast.key(group, x.dtype)
        _fast.learn(_fast.ALL_TO_ALL, key, g, _fast_alltoall.all_to_all, backend.BYTE,
                    x.dtype if shared else None, key, native.running())
        return _alltoall.even(call, c_order(x))
    if async_op:
        return _uneven_async(call, x, ins, outs)
    if input_split_sizes is not None and native.running() and _alltoall.shared(call):
        _fast.learn(_fast.ALL_TO_ALL_V, _fast.key(group, x.dtype), g, _fast_alltoall.all_to_all_v,
                    x.dtype)
    return _alltoall.uneven(call, c_order(x), ins, outs)


def _uneven_async(call: Call, x: np.ndarray, ins: list[int], outs: list[int] | None) -> Work[np.ndarray]:
    """`all_to_all_single` with uneven splits, started: the metadata now, then ``Ialltoallv``."""
    received = _alltoall.pickled_sizes(call, x, ins, outs)
    row = nbytes_of(x.shape[1:], x.dtype)
    out = np.empty((sum(received), *x.shape[1:]), x.dtype)
    send = private(c_order(x), x)
    request = backend.ialltoallv(call, send, [s * row for s in ins], out, [s * row for s in received])
    return launch(call.fn, call.group, request, lambda: out, send)
