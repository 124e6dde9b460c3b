"""The implementations the benchmark compares, one callable per (impl, op, size).

- ``fcoll``: the fcoll function; each result is kept until the next call returns, as
  ``y = f(x)`` in a loop does.
- ``raw``: mpi4py's buffer call into an output preallocated once (the transport's limit).
- ``raw2``: the same, alternating between two preallocated outputs: the memory a loop
  ``y = f(x)`` keeps alive (the previous result while the next is made).
- ``pickle``: mpi4py's lowercase, pickle-based call, plus the numpy step that gives the
  same array as fcoll (concatenate, sum of blocks).
- ``gloo``: torch.distributed with the gloo backend on CPU tensors, outputs preallocated.

Every rank's input is small integers stored as float32, so every sum is exact and every
implementation's first result is checked against numpy's (`expected`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from common import DP_LEAVES

import fcoll

DTYPE = np.dtype(np.float32)


@dataclass
class Impl:
    """One implementation of one cell: ``call`` is timed, ``first`` returns a checkable result."""

    call: Callable[[], Any]
    first: Callable[[], np.ndarray]


class Unsupported(Exception):
    """This implementation has no such collective (e.g. gloo's reduce_scatter)."""


def count_for(op: str, nbytes: int, n: int) -> int:
    """float32 elements of one rank's input: divisible by n where the op splits it."""
    count = max(1, nbytes // DTYPE.itemsize)
    if op in ("reduce_scatter_tensor", "all_to_all_single"):
        count = -(-count // n) * n
    if op == "dp_average":
        count = -(-count // DP_LEAVES) * DP_LEAVES
    return count


def data(count: int, rank: int) -> np.ndarray:
    return ((np.arange(count, dtype=np.int64) * 7 + rank) % 13).astype(DTYPE)


def expected(op: str, impl: str, count: int, rank: int, n: int) -> np.ndarray:
    """numpy's result for this rank (raw's and raw2's dp_average is the plain fused sum)."""
    xs = [data(count, r) for r in range(n)]
    total = functools.reduce(np.add, xs)
    if op == "all_reduce" or (op == "dp_average" and impl in ("raw", "raw2")):
        return total
    if op == "dp_average":
        return total / np.float32(n)
    if op == "all_gather_into_tensor":
        return np.concatenate(xs)
    if op == "reduce_scatter_tensor":
        return np.split(total, n)[rank]
    if op == "all_to_all_single":
        return np.concatenate([np.split(x, n)[rank] for x in xs])
    return xs[0]


def _keeping(fn: Callable[[], Any]) -> Impl:
    last: list[Any] = [None]

    def call() -> None:
        last[0] = fn()

    def first() -> np.ndarray:
        call()
        y = last[0]
        return np.concatenate(list(y.values())) if isinstance(y, dict) else np.asarray(y)

    return Impl(call, first)


def _leaves(x: np.ndarray) -> dict[str, np.ndarray]:
    return {f"leaf{i:03d}": leaf for i, leaf in enumerate(np.split(x, DP_LEAVES))}


def make_fcoll(op: str, x: np.ndarray, comm: Any) -> Impl:
    if op == "dp_average":
        grads = _leaves(x)
        return _keeping(lambda: fcoll.dp.average_gradients(grads))
    fn = getattr(fcoll, op)
    return _keeping(lambda: fn(x))


def make_raw(op: str, x: np.ndarray, comm: Any, outputs: int = 1) -> Impl:
    """mpi4py's buffer call into preallocated output(s); with ``outputs=2`` calls alternate
    between two, the working set of ``y = f(x)`` in a loop (two results alive)."""
    from mpi4py import MPI

    n = comm.Get_size()
    size = {"all_gather_into_tensor": x.size * n, "reduce_scatter_tensor": x.size // n}
    outs = [np.empty(size.get(op, x.size), DTYPE) for _ in range(outputs)]
    calls: dict[str, Callable[[np.ndarray], Any]] = {
        "all_reduce": lambda out: comm.Allreduce(x, out, MPI.SUM),
        "dp_average": lambda out: comm.Allreduce(x, out, MPI.SUM),
        "all_gather_into_tensor": lambda out: comm.Allgather(x, out),
        "reduce_scatter_tensor": lambda out: comm.Reduce_scatter_block(x, out, MPI.SUM),
        "all_to_all_single": lambda out: comm.Alltoall(x, out),
        "broadcast": lambda out: comm.Bcast(out, root=0),  # in place: root's out holds its x
    }
    for out in outs:
        out[...] = x if op == "broadcast" and comm.Get_rank() == 0 else 0
    move = calls[op]
    turn = [0]

    def call() -> None:
        turn[0] ^= outputs - 1  # 0, 0, ... for one output; 1, 0, 1, ... for two
        move(outs[turn[0]])

    def first() -> np.ndarray:
        call()
        return outs[turn[0]].copy()

    return Impl(call, first)


def make_pickle(op: str, x: np.ndarray, comm: Any) -> Impl:
    n, rank = comm.Get_size(), comm.Get_rank()
    add = functools.partial(functools.reduce, np.add)
    calls: dict[str, Callable[[], Any]] = {
        "all_reduce": lambda: comm.allreduce(x),
        "all_gather_into_tensor": lambda: np.concatenate(comm.allgather(x)),
        # mpi4py has no pickle reduce_scatter: all-to-all of the blocks, summed in rank order.
        "reduce_scatter_tensor": lambda: add(comm.alltoall(np.split(x, n))),
        "all_to_all_single": lambda: np.concatenate(comm.alltoall(np.split(x, n))),
        "broadcast": lambda: comm.bcast(x if rank == 0 else None, root=0),
        # What an mpi4py user writes for a gradient tree: flatten, allreduce, divide.
        "dp_average": lambda: comm.allreduce(np.concatenate(list(leaves.values()))) / np.float32(n),
    }
    leaves = _leaves(x) if op == "dp_average" else {}
    return _keeping(calls[op])


def make_gloo(op: str, x: np.ndarray, comm: Any) -> Impl:
    import torch
    import torch.distributed as dist

    n, rank = comm.Get_size(), comm.Get_rank()
    t = torch.from_numpy(x.copy())
    # torch 2.13 renamed the tensor forms (the old names warn).
    _gather = getattr(dist, "all_gather_single", dist.all_gather_into_tensor)
    _scatter = getattr(dist, "reduce_scatter_single", dist.reduce_scatter_tensor)
    sizes = {"all_gather_into_tensor": x.size * n, "reduce_scatter_tensor": x.size // n}
    out = torch.empty(sizes.get(op, x.size), dtype=torch.float32)
    calls: dict[str, Callable[[], Any]] = {
        # In place: the timed calls run on zeros (set below) so repeated sums stay finite.
        "all_reduce": lambda: dist.all_reduce(t),
        "all_gather_into_tensor": lambda: _gather(out, t),
        "reduce_scatter_tensor": lambda: _scatter(out, t),
        "all_to_all_single": lambda: dist.all_to_all_single(out, t),
        "broadcast": lambda: dist.broadcast(t, src=0),
    }
    if op == "dp_average":  # what DDP does per bucket: copy the grads in, all-reduce, divide
        grads = [torch.from_numpy(leaf.copy()) for leaf in np.split(x, DP_LEAVES)]

        def dp() -> torch.Tensor:
            flat = torch.cat(grads)
            dist.all_reduce(flat)
            return flat.div_(n)

        return _keeping(dp)
    call = calls[op]
    in_place = op in ("all_reduce", "broadcast")

    def first() -> np.ndarray:
        try:
            call()
        except (RuntimeError, ValueError) as e:
            raise Unsupported(str(e).splitlines()[0]) from None
        result = (t if in_place else out).numpy().copy()
        if op == "all_reduce":
            t.zero_()
        return result

    if rank != 0 and op == "broadcast":
        t.zero_()
    return Impl(call, first)


MAKERS: dict[str, Callable[[str, np.ndarray, Any], Impl]] = {
    "fcoll": make_fcoll, "raw": make_raw, "raw2": functools.partial(make_raw, outputs=2),
    "pickle": make_pickle, "gloo": make_gloo}


def start_gloo(comm: Any) -> str | None:
    """Join a gloo process group over TCP (rank 0's host); None, or why it is unavailable."""
    try:
        import torch
        import torch.distributed as dist
    except ImportError:
        return "torch is not installed (pip install -e '.[bench-torch]')"
    import os
    import socket

    torch.set_num_threads(1)
    if comm.Get_rank() == 0:
        with socket.socket() as s:
            s.bind(("", 0))
            port = s.getsockname()[1]
        host = socket.gethostname()
    else:
        port, host = 0, ""
    port, host = comm.bcast((port, host), root=0)
    single_node = all(comm.allgather(socket.gethostname() == host))
    address = "127.0.0.1" if single_node else host
    if single_node:
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group("gloo", init_method=f"tcp://{address}:{port}",
                            rank=comm.Get_rank(), world_size=comm.Get_size())
    return None
