"""The torch backend's collectives on one tensor per process (`fcoll.torch.backend`).

Each method is the ``ProcessGroup`` method of the same name, as torch's Python functions
(``dist.all_reduce`` ...) and its C++ callers (DDP, functional collectives) call it: it
checks the output tensors against the inputs before anything is sent, then issues the
function that runs fcoll's collective on the group and writes the outputs
(`fcoll.torch.work.issue`: at once for a synchronous call, else on the engine) and returns
its `FcollWork`. A sparse COO tensor's all_reduce is `fcoll.torch._sparse`'s. The output
of all_reduce, broadcast, all_gather_into_tensor, reduce_scatter_tensor and an evenly split
all_to_all_single, where it is a contiguous CPU tensor, is written by the transport through
its numpy view (`fcoll.collectives._into`); the other outputs (reduce, gather, scatter, the
list forms, strided or CUDA tensors) get fcoll's result copied in.

Example:
    >>> pg.allreduce([t], opts)          # dist.all_reduce(t) on an "fcoll" group
"""

from __future__ import annotations

import datetime
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from fcoll import collectives
from fcoll.calls.engine import ENGINE
from fcoll.collectives import _into
from fcoll.collectives.monitor import MonitoredBarrierError
from fcoll.groups.group import Group
from fcoll.torch import _sparse as sparse
from fcoll.torch._convert import check_like, check_list, fcoll_op, one, put, view, view_out
from fcoll.torch.work import FcollWork, issue


def _op(opts: Any, fn: str) -> Any:
    return fcoll_op(dist.ReduceOp.SUM if opts is None else opts.reduceOp, fn)


def _root(opts: Any) -> int:
    return 0 if opts is None else int(opts.rootRank)


class Collectives:
    """The collectives of `fcoll.torch.backend.ProcessGroupFcoll` on one tensor per rank."""

    fcoll_group: Group

    def allreduce(self, tensors: list[torch.Tensor], opts: Any = None) -> FcollWork:
        """``dist.all_reduce``: ``tensors[0]`` reduced in place (every ``ReduceOp``)."""
        fn = "all_reduce"
        t = one(tensors, fn)
        if t.layout == torch.sparse_coo:
            return issue(sparse.all_reduce(t, _op(opts, fn), self.fcoll_group), [t])
        op, out, g = _op(opts, fn), view_out(t, fn, "tensor"), self.fcoll_group
        if out is not None:
            return issue(lambda: _into.all_reduce(out, out, op, g), [t])  # in place
        x = view(t, fn, "tensor")
        return issue(lambda: put(t, collectives.all_reduce(x, op, g)), [t])

    def broadcast(self, tensors: list[torch.Tensor], opts: Any = None) -> FcollWork:
        """``dist.broadcast``: every rank's ``tensors[0]`` becomes group rank ``rootRank``'s."""
        fn = "broadcast"
        t = one(tensors, fn)
        out, root, g = view_out(t, fn, "tensor"), _root(opts), self.fcoll_group
        if out is not None:
            return issue(lambda: _into.broadcast(out, root, g), [t])
        x = view(t, fn, "tensor")
        return issue(lambda: put(t, collectives.broadcast(x, root, g)), [t])

    def reduce(self, tensors: list[torch.Tensor], opts: Any = None) -> FcollWork:
        """``dist.reduce``: the reduction lands in ``tensors[0]`` on ``rootRank`` only."""
        fn = "reduce"
        t = one(tensors, fn)
        x, root, op, g = view(t, fn, "tensor"), _root(opts), _op(opts, fn), self.fcoll_group

        def run() -> None:
            y = collectives.reduce(x, root, op, g)
            if y is not None:
                put(t, y)

        return issue(run, [t])

    def allgather(self, output_lists: list[list[torch.Tensor]], tensors: list[torch.Tensor],
                  opts: Any = None) -> FcollWork:
        """``dist.all_gather``: ``output_lists[0][r]`` gets group rank ``r``'s tensor."""
        fn = "all_gather"
        t, outs = one(tensors, fn), one(output_lists, fn, "tensor_list")
        g = self.fcoll_group
        check_list(outs, g.size, fn, "tensor_list")
        for i, o in enumerate(outs):
            check_like(o, t, fn, f"tensor_list[{i}]", o.numel() if i != g.rank else t.numel())
        x = view(t, fn, "tensor")

        def run() -> None:
            if isinstance(x, np.ndarray) and all(o.numel() == t.numel() for o in outs):
                flat = np.empty(x.size * g.size, x.dtype)
                _into.all_gather(x.reshape(-1), flat, g)
                ys = np.split(flat, g.size)
            else:
                ys = collectives.all_gather(x, g)
            for o, y in zip(outs, ys, strict=True):
                put(o, y)

        return issue(run, outs)

    def all_gather_single(self, output: torch.Tensor, tensor: torch.Tensor,
                          opts: Any = None) -> FcollWork:
        """``dist.all_gather_into_tensor``: every rank's tensor, in rank order, in ``output``."""
        return issue(self._all_gather_single(output, tensor), [output])

    def _all_gather_single(self, output: torch.Tensor, tensor: torch.Tensor) -> Callable[[], None]:
        """Check the arguments of `all_gather_single`; the function that runs it."""
        fn = "all_gather_into_tensor"
        g = self.fcoll_group
        check_like(output, tensor, fn, "output_tensor", tensor.numel() * g.size)
        x, out = view(tensor, fn, "input_tensor").reshape(-1), view_out(output, fn, "output_tensor")
        if out is not None and isinstance(x, np.ndarray):
            return lambda: _into.all_gather(x, out.reshape(-1), g)
        return lambda: put(output, collectives.all_gather_into_tensor(x, g))

    _allgather_base = all_gather_single  # the name before torch 2.13

    def reduce_scatter(self, outputs: list[torch.Tensor], input_lists: list[list[torch.Tensor]],
                       opts: Any = None) -> FcollWork:
        """``dist.reduce_scatter``: ``outputs[0]`` gets the reduction of every rank's
        ``input_lists[0][rank]``."""
        fn = "reduce_scatter"
        t, chunks = one(outputs, fn, "output"), one(input_lists, fn, "input_list")
        g = self.fcoll_group
        check_list(chunks, g.size, fn, "input_list")
        for i, c in enumerate(chunks):
            check_like(c, t, fn, f"input_list[{i}]", c.numel() if i != g.rank else t.numel())
        views = [view(c, fn, f"input_list[{i}]") for i, c in enumerate(chunks)]
        op = _op(opts, fn)
        return issue(lambda: put(t, collectives.reduce_scatter(views, op, g)), [t])

    def reduce_scatter_single(self, output: torch.Tensor, tensor: torch.Tensor,
                              opts: Any = None) -> FcollWork:
        """``dist.reduce_scatter_tensor``: block ``rank`` of the reduction of every rank's
        ``tensor`` (split evenly, in order) in ``output``."""
        return issue(self._reduce_scatter_single(output, tensor, opts), [output])

    def _reduce_scatter_single(self, output: torch.Tensor, tensor: torch.Tensor,
                               opts: Any) -> Callable[[], None]:
        """Check the arguments of `reduce_scatter_single`; the function that runs it."""
        fn = "reduce_scatter_tensor"
        g, op = self.fcoll_group, _op(opts, fn)
        check_like(tensor, output, fn, "input", output.numel() * g.size, "output")
        x, out = view(tensor, fn, "input").reshape(-1), view_out(output, fn, "output")
        if out is not None and isinstance(x, np.ndarray):
            return lambda: _into.reduce_scatter(x, out.reshape(-1), op, g)
        return lambda: put(output, collectives.reduce_scatter_tensor(x, op, g))

    _reduce_scatter_base = reduce_scatter_single  # the name before torch 2.13

    def alltoall(self, outputs: list[torch.Tensor], tensors: list[torch.Tensor],
                 opts: Any = None) -> FcollWork:
        """``dist.all_to_all``: ``outputs[r]`` gets group rank ``r``'s ``tensors[rank]``."""
        fn = "all_to_all"
        g = self.fcoll_group
        check_list(outputs, g.size, fn, "output_tensor_list")
        check_list(tensors, g.size, fn, "input_tensor_list")
        for i, o in enumerate(outputs):
            check_like(o, tensors[0], fn, f"output_tensor_list[{i}]", o.numel())
        views = [view(t, fn, f"input_tensor_list[{i}]") for i, t in enumerate(tensors)]

        def run() -> None:
            for o, y in zip(outputs, collectives.all_to_all(views, g), strict=True):
                check_like(o, tensors[0], fn, "output_tensor_list[...]", y.size)
                put(o, y)

        return issue(run, outputs)

    def all_to_all_single(self, output: torch.Tensor, tensor: torch.Tensor,
                          output_split_sizes: list[int], input_split_sizes: list[int],
                          opts: Any = None) -> FcollWork:
        """``dist.all_to_all_single``: rows of ``tensor`` to each rank, by the split sizes
        (empty lists: even); the rows received, in rank order, in ``output``."""
        fn = "all_to_all_single"
        g = self.fcoll_group
        outs, ins = list(output_split_sizes) or None, list(input_split_sizes) or None
        x = view(tensor, fn, "input")
        if outs is None and ins is None:
            check_like(output, tensor, fn, "output", tensor.numel())
            out = view_out(output, fn, "output")
            if out is not None and isinstance(x, np.ndarray):
                return issue(lambda: _into.all_to_all(x, out.reshape(x.shape), g), [output])
        elif outs is not None:
            row = tensor[0].numel() if tensor.dim() else 1
            check_like(output, tensor, fn, "output", sum(outs) * row)

        def run() -> None:
            y = collectives.all_to_all_single(x, outs, ins, g)
            check_like(output, tensor, fn, "output", y.size)
            put(output, y)

        return issue(run, [output])

    alltoall_base = all_to_all_single  # the name before torch 2.13

    def gather(self, output_lists: list[list[torch.Tensor]], tensors: list[torch.Tensor],
               opts: Any = None) -> FcollWork:
        """``dist.gather``: on ``rootRank``, ``output_lists[0][r]`` gets rank ``r``'s tensor."""
        fn = "gather"
        t, g, root = one(tensors, fn), self.fcoll_group, _root(opts)
        outs: list[torch.Tensor] = one(output_lists, fn, "gather_list") if g.rank == root else []
        if g.rank == root:
            check_list(outs, g.size, fn, "gather_list")
            for i, o in enumerate(outs):
                check_like(o, t, fn, f"gather_list[{i}]", o.numel() if i != root else t.numel())
        x = view(t, fn, "tensor")

        def run() -> None:
            for o, y in zip(outs, collectives.gather(x, root, g) or [], strict=True):
                put(o, y)

        return issue(run, outs)

    def scatter(self, outputs: list[torch.Tensor], input_lists: list[list[torch.Tensor]],
                opts: Any = None) -> FcollWork:
        """``dist.scatter``: ``outputs[0]`` gets ``rootRank``'s ``input_lists[0][rank]``."""
        fn = "scatter"
        t, g, root = one(outputs, fn, "tensor"), self.fcoll_group, _root(opts)
        chunks = None
        if g.rank == root:
            given = one(input_lists, fn, "scatter_list")
            check_list(given, g.size, fn, "scatter_list")
            check_like(given[root], t, fn, f"scatter_list[{root}]", t.numel())
            chunks = [view(c, fn, f"scatter_list[{i}]") for i, c in enumerate(given)]
        return issue(lambda: put(t, collectives.scatter(chunks, root, g)), [t])

    def barrier(self, opts: Any = None) -> FcollWork:
        """``dist.barrier``: returns once every rank of the group has called it."""
        g = self.fcoll_group
        return issue(lambda: collectives.barrier(g), [])

    def monitored_barrier(self, timeout: Any = None, wait_all_ranks: bool = False) -> None:
        """``dist.monitored_barrier`` on the group (`fcoll.monitored_barrier`), failing in
        gloo's words: "Rank 1 failed to pass monitoredBarrier in 2000 ms" on group rank 0,
        "Rank 2 successfully reached monitoredBarrier, but received errors while waiting
        for send/recv from rank 0" on the others; a timeout of zero fails at once."""
        rank = self.fcoll_group.rank
        seconds = timeout.total_seconds() if isinstance(timeout, datetime.timedelta) else timeout
        if seconds is not None and seconds <= 0:
            raise dist.DistBackendError(f"Rank {rank} timed out in monitoredBarrier after 0 ms")
        g = self.fcoll_group
        try:
            ENGINE.inline(lambda: collectives.monitored_barrier(g, seconds,
                                                                 wait_all_ranks=wait_all_ranks))
        except MonitoredBarrierError as error:
            raise _gloo_words(error) from error


def _gloo_words(error: MonitoredBarrierError) -> RuntimeError:
    """gloo's message for a failed monitored barrier (torch's tests and users match it)."""
    ms = f"{error.seconds * 1000:g} ms"
    if error.kind == "late":
        names = (f"Rank {error.late[0]}" if len(error.late) == 1
                 else "Ranks " + ", ".join(map(str, error.late)))
        return dist.DistBackendError(f"{names} failed to pass monitoredBarrier in {ms}: {error}")
    if error.kind == "no verdict":
        return dist.DistBackendError(f"Rank {error.rank} timed out in monitoredBarrier after "
                                     f"{ms}: {error}")
    return dist.DistBackendError(
        f"Rank {error.rank} successfully reached monitoredBarrier, but received errors while "
        f"waiting for send/recv from rank 0. Please check rank 0 logs for faulty rank: {error}")
