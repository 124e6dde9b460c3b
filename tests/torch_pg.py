"""torch.distributed on the backend "fcoll" for the tests: the default group, started once
per process with no argument (as under ``mpiexec -n N python train.py``), and the groups the
tests run on: the default group, ``new_group()`` of every rank, and a non-contiguous
``new_group`` (even ranks and the last), made once, in the same order on every rank."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
if not dist.is_available():
    pytest.skip("torch was built without torch.distributed", allow_module_level=True)

import fcoll.torch  # noqa: E402,F401  (registers the backend "fcoll")

_GROUPS: dict[str, Any] = {}


@dataclass(frozen=True)
class PG:
    """A torch group under test: ``pg`` (None for the default group), its global ranks."""

    name: str
    pg: Any
    members: tuple[int, ...]

    @property
    def rank(self) -> int:
        me = dist.get_rank()
        return self.members.index(me) if me in self.members else -1

    @property
    def size(self) -> int:
        return len(self.members)


def start() -> None:
    """``init_process_group("fcoll")`` with no argument, once per process."""
    if not dist.is_initialized():
        dist.init_process_group("fcoll")


def gloo() -> Any:
    """A gloo group of every rank beside the "fcoll" default group, on the default group's
    store (gloo over the loopback interface: the tests run on one node)."""
    start()
    if "gloo" not in _GROUPS:
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        _GROUPS["gloo"] = dist.new_group(backend="gloo")
    return _GROUPS["gloo"]


def group(name: str) -> PG:
    """The group ``name`` (``world``, ``full``, ``sub``), made on first use on every rank;
    ranks outside it skip the test."""
    start()
    n = dist.get_world_size()
    if name not in _GROUPS:
        if name == "world":
            _GROUPS[name] = PG(name, None, tuple(range(n)))
        elif name == "full":
            _GROUPS[name] = PG(name, dist.new_group(), tuple(range(n)))
        else:
            ranks = sorted(set(range(0, n, 2)) | {n - 1})
            _GROUPS[name] = PG(name, dist.new_group(ranks), tuple(ranks))
    g: PG = _GROUPS[name]
    if g.rank < 0:
        pytest.skip(f"rank {dist.get_rank()} is not in {g.members}")
    return g


def forget() -> None:
    """Drop the groups made here (after ``destroy_process_group()``)."""
    _GROUPS.clear()
