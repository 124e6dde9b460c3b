"""Fixtures shared by the suite; the MPI session plugin is fcoll.testing (docs/testing.md)."""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

import fcoll as fc

pytest_plugins = ["fcoll.testing", "tests.suite_plan"]
FAKE_CUPY_ENV = "FCOLL_FAKE_CUPY"


def pytest_configure(config: pytest.Config) -> None:
    """``FCOLL_FAKE_CUPY=1``: ``import cupy`` gives tests/fake_cupy.py (numpy and MPI on the
    CPU), so the cupy and NCCL tests (test_gpu.py) run without a GPU."""
    if os.environ.get(FAKE_CUPY_ENV, "").strip() == "1":
        from tests import fake_cupy

        fake_cupy.install()


def pytest_report_header(config: pytest.Config) -> list[str]:
    lines = []
    if os.environ.get(FAKE_CUPY_ENV, "").strip() == "1":
        lines.append(f"cupy: tests/fake_cupy.py ({FAKE_CUPY_ENV}=1; numpy and MPI on the CPU, no GPU)")
    missing = [name for name in ("torch", "jax") if importlib.util.find_spec(name) is None]
    if missing:
        lines.append(f"interop: {' and '.join(missing)} not installed, so the tests that need "
                     f"{'them' if len(missing) > 1 else 'it'} skip (scripts/test.sh installs the "
                     "CPU builds where it can: README, Quick start)")
    return lines


def pytest_unconfigure(config: pytest.Config) -> None:
    if os.environ.get(FAKE_CUPY_ENV, "").strip() == "1":
        from tests import fake_cupy

        fake_cupy.uninstall()


@pytest.fixture(autouse=True, scope="module")
def _jitted_collectives_done() -> Iterator[None]:
    """A module that traced collectives inside jax.jit arms the wait of eager calls for
    jitted ones, which keeps the fast paths off for the rest of the process: disarm it after
    the module, so that later modules see fcoll as a program without jit does."""
    yield
    if "fcoll.xla.handler" in sys.modules:
        sys.modules["fcoll.xla.handler"].disarm()


@pytest.fixture(autouse=True)
def _gpu_transport_read_afresh() -> None:
    """fcoll reads FCOLL_GPU_TRANSPORT once per process; tests that set it (monkeypatch)
    need it read again, and fast paths learned under another setting dropped."""
    from fcoll.dispatch import gpu_settings
    from fcoll.gpu import fast

    gpu_settings._SETTING.clear()
    fast.reset()


@dataclass(frozen=True)
class G:
    """A group under test: ``arg`` is what tests pass as ``group=``."""

    name: str
    arg: Any
    members: tuple[int, ...]

    @property
    def rank(self) -> int:
        return self.members.index(fc.get_rank()) if fc.get_rank() in self.members else -1

    @property
    def size(self) -> int:
        return len(self.members)


def list_ranks(world_size: int) -> list[int]:
    """A non-contiguous rank list: even ranks plus the last (ws 4: [0, 2, 3]; ws 3: [0, 2])."""
    return sorted(set(range(0, world_size, 2)) | {world_size - 1})


_GROUPS: dict[str, G] = {}


def _make(name: str) -> G:
    ws, me = fc.get_world_size(), fc.get_rank()
    if name == "world":
        return G(name, None, tuple(range(ws)))
    if name == "split":
        g = fc.world().split(color=me % 2)
        return G(name, g, g.ranks)
    ranks = list_ranks(ws)
    return G(name, ranks, tuple(ranks))


@pytest.fixture(params=["world", "split", "ranks"])
def group(request: pytest.FixtureRequest) -> G:
    """The world, a split (ranks of equal parity) and a non-contiguous rank list.
    Processes outside the group skip the test."""
    name = request.param
    if name not in _GROUPS:
        _GROUPS[name] = _make(name)
    g = _GROUPS[name]
    if g.rank < 0:
        pytest.skip(f"global rank {fc.get_rank()} is not in {g.members}")
    return g


@pytest.fixture
def rank() -> int:
    return fc.get_rank()


@pytest.fixture
def world_size() -> int:
    return fc.get_world_size()
