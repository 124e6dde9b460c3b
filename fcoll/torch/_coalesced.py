"""The torch backend's coalesced collectives and point-to-point operations.

The coalesced forms are what torch's ``_coalescing_manager`` (and FSDP) call with several
tensors at once: `allreduce_coalesced` fuses them into one fcoll call per dtype; the
all-gathers and reduce-scatters run one fcoll call per pair of tensors, each writing its
output in place, all in one job (`fcoll.torch.work.issue`). ``send``/``recv`` start fcoll's
`isend`/`irecv` at once (after the engine's queued jobs) and return work in flight
(`FcollWork`): a blocking send could deadlock a ring of ``batch_isend_irecv``.

Example:
    >>> ops = [dist.P2POp(dist.isend, a, (r + 1) % n), dist.P2POp(dist.irecv, b, (r - 1) % n)]
    >>> for w in dist.batch_isend_irecv(ops): w.wait()     # b holds rank r - 1's a
"""

from __future__ import annotations

from typing import Any

import torch

from fcoll import collectives
from fcoll.calls.engine import ENGINE
from fcoll.groups.group import Group
from fcoll.torch._collectives import _op
from fcoll.torch._convert import check_like, check_list, one, put, view
from fcoll.torch.work import FcollWork, done, issue


def _land(t: torch.Tensor, fn: str) -> Any:
    """What a receive does with the message: check it against ``t``, copy it in."""

    def finish(y: Any) -> None:
        if str(y.dtype) != str(t.dtype).removeprefix("torch.") or y.size != t.numel():
            raise ValueError(f"{fn}: expected a message of {t.numel()} elements of {t.dtype} "
                             f"for tensor, got {y.size} of {y.dtype}")
        put(t, y)

    return finish


class Coalesced:
    """The coalesced and point-to-point methods of `fcoll.torch.backend.ProcessGroupFcoll`."""

    fcoll_group: Group

    def allreduce_coalesced(self, tensors: list[torch.Tensor], opts: Any = None) -> FcollWork:
        """``dist.all_reduce_coalesced``: each tensor reduced in place, in one fused call per dtype."""
        fn = "all_reduce_coalesced"
        views = [view(t, fn, f"tensors[{i}]") for i, t in enumerate(tensors)]
        op, g = _op(opts, fn), self.fcoll_group

        def run() -> None:
            if views:
                for t, y in zip(tensors, collectives.all_reduce_coalesced(views, op, g), strict=True):
                    put(t, y)

        return issue(run, tensors)

    def all_gather_single_coalesced(self, outputs: list[torch.Tensor], tensors: list[torch.Tensor],
                                    opts: Any = None) -> FcollWork:
        """`all_gather_single` of each pair ``(outputs[i], tensors[i])``."""
        self._check_pairs(outputs, tensors, "all_gather_into_tensor_coalesced", "outputs")
        runs = [self._all_gather_single(o, t)  # type: ignore[attr-defined]
                for o, t in zip(outputs, tensors, strict=True)]
        return issue(lambda: [run() for run in runs], outputs)

    allgather_into_tensor_coalesced = all_gather_single_coalesced  # the name before torch 2.13

    def reduce_scatter_single_coalesced(self, outputs: list[torch.Tensor],
                                        tensors: list[torch.Tensor], opts: Any = None) -> FcollWork:
        """`reduce_scatter_single` of each pair ``(outputs[i], tensors[i])``."""
        self._check_pairs(tensors, outputs, "reduce_scatter_tensor_coalesced", "inputs")
        runs = [self._reduce_scatter_single(o, t, opts)  # type: ignore[attr-defined]
                for o, t in zip(outputs, tensors, strict=True)]
        return issue(lambda: [run() for run in runs], outputs)

    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced  # before torch 2.13

    def _check_pairs(self, big: list[torch.Tensor], small: list[torch.Tensor], fn: str,
                     name: str) -> None:
        """Each ``big[i]`` (argument ``name``) is like ``small[i]``, with the group's size
        times its elements: checked for every pair before anything is sent."""
        check_list(big, len(small), fn, name)
        for b, s in zip(big, small, strict=True):
            check_like(b, s, fn, f"{name}[...]", s.numel() * self.fcoll_group.size)

    def allgather_coalesced(self, output_lists: list[list[torch.Tensor]],
                            tensors: list[torch.Tensor], opts: Any = None) -> FcollWork:
        """``dist.all_gather_coalesced``: ``output_lists[r][i]`` gets rank ``r``'s ``tensors[i]``."""
        fn = "all_gather_coalesced"
        g = self.fcoll_group
        check_list(output_lists, g.size, fn, "output_tensor_lists")
        for r, outs in enumerate(output_lists):
            check_list(outs, len(tensors), fn, f"output_tensor_lists[{r}]")
            for i, (o, t) in enumerate(zip(outs, tensors, strict=True)):
                check_like(o, t, fn, f"output_tensor_lists[{r}][{i}]", o.numel() if r != g.rank
                           else t.numel())
        views = [view(t, fn, f"input_tensor_list[{i}]") for i, t in enumerate(tensors)]

        def run() -> None:
            for i, x in enumerate(views):
                for r, y in enumerate(collectives.all_gather(x, g)):
                    put(output_lists[r][i], y)

        return issue(run, [o for outs in output_lists for o in outs])

    def _start_coalescing(self, device: Any = None) -> None:
        """Nothing to start: each call inside torch's coalescing manager is issued at once."""

    def _end_coalescing(self, device: Any = None) -> FcollWork:
        """The work of the calls made since `_start_coalescing`: done when the latest job
        issued is (the engine runs them in order)."""
        last = ENGINE.last
        if last is None or last.finished:
            return done([])
        work = FcollWork([])
        work._job = last
        return work

    start_coalescing = _start_coalescing  # the names torch's C++ side looks up
    end_coalescing = _end_coalescing

    def send(self, tensors: list[torch.Tensor], dst: int, tag: int = 0) -> FcollWork:
        """``dist.send``/``isend``: ``tensors[0]`` to group rank ``dst`` (work in flight)."""
        t = one(tensors, "send")
        x, g = view(t, "send", "tensor"), self.fcoll_group
        return FcollWork([t], ENGINE.inline(lambda: collectives.isend(x, dst, g, tag)))

    def recv(self, tensors: list[torch.Tensor], src: int, tag: int = 0) -> FcollWork:
        """``dist.recv``/``irecv``: ``tensors[0]`` gets group rank ``src``'s message on `wait`."""
        t, g = one(tensors, "recv"), self.fcoll_group
        return FcollWork([t], ENGINE.inline(lambda: collectives.irecv(src, g, tag)), _land(t, "recv"))

    def recv_anysource(self, tensors: list[torch.Tensor], tag: int = 0) -> FcollWork:
        """``dist.recv(src=None)``: from any rank; the work's ``_source_rank()`` names it."""
        t, g = one(tensors, "recv"), self.fcoll_group
        return FcollWork([t], ENGINE.inline(lambda: collectives.irecv(None, g, tag)), _land(t, "recv"))
