"""How scripts/test.sh splits the suite across the two cores and folds the transport passes.

Two pytest options, both off unless given (a plain ``pytest`` runs every test as before):

- ``--shard K/N`` keeps every N-th collected test from the K-th (1-based, in collection
  order), so N shards of one world size run side by side as independent jobs and together
  run each test exactly once. Round robin over the order keeps neighbours (a test's
  parameters, a file's slow tests) on different shards, so the shards take about as long.
- ``--transport-passes via-mpi,via-segment,via-numpy`` runs the files each pass is for (`PASSES`)
  once per pass in this one job: every rank switches the transport at the same point, between
  two tests (a session-scoped parameter: pytest runs a pass's tests together, in order), and
  a test's id names its pass (``test_x[world-via-numpy-float32]``). Tests of files no
  selected pass is for, and tests that set the transport themselves under a pass that sets
  only that, are deselected: the plain run covers them.

Example (one rank of ``mpiexec -n 3``)::

    python -m pytest --transport-passes via-mpi,via-numpy tests/test_reductions.py
    python -m pytest --shard 2/2 tests/          # the second of two side-by-side shards
"""

from __future__ import annotations

import gc
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import pytest

# The reduction and movement files: their calls take another path when the setting changes.
FILES = ("test_reductions.py", "test_coalesced.py", "test_movement.py", "test_fast.py",
         "test_detail.py", "test_into.py", "test_shm.py", "test_shm_movement.py",
         "test_shm_alltoall.py", "test_scan.py", "test_custom_ops.py")
# Fixtures that set FCOLL_SHM inside the test (test_scan's and test_custom_ops' `transport`
# parameter, test_shm's `forced`): under a pass that only sets FCOLL_SHM such a test repeats
# the plain run, so that pass leaves it out.
SETS_SHM = ("transport", "forced")


@dataclass(frozen=True)
class Pass:
    """A transport setting (environment variables every rank sees), the files it is for and
    the fixtures whose tests it leaves out (they override the setting)."""

    name: str
    env: dict[str, str] = field(hash=False)
    files: tuple[str, ...] = FILES
    overridden_by: tuple[str, ...] = ()


PASSES = {p.name: p for p in (
    Pass("via-mpi", {"FCOLL_SHM": "0"}, overridden_by=SETS_SHM),  # every size through MPI
    Pass("via-segment", {"FCOLL_SHM": "1"}, overridden_by=SETS_SHM),  # every size, the segment
    # the segment stepped by fcoll's numpy code instead of the compiled core
    Pass("via-numpy", {"FCOLL_SHM": "1", "FCOLL_NATIVE": "0"}),
)}


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("suite plan", "how scripts/test.sh splits the suite (tests/suite_plan.py)")
    group.addoption("--shard", default=None, metavar="K/N",
                    help="run every N-th collected test from the K-th (1-based)")
    group.addoption("--transport-passes", default=None, metavar="NAMES",
                    help=f"run the files each pass is for once per pass: {', '.join(PASSES)}")


def shard(text: str) -> tuple[int, int]:
    """``"K/N"`` as ``(K, N)``; a clear error for anything else.

    Example:
        >>> shard("2/3")
        (2, 3)
    """
    try:
        k, n = (int(part) for part in text.split("/"))
    except ValueError:
        raise pytest.UsageError(f"--shard: expected K/N such as 1/2, got {text!r}") from None
    if not 1 <= k <= n:
        raise pytest.UsageError(f"--shard: expected 1 <= K <= N, got {text!r}")
    return k, n


def passes(text: str) -> list[Pass]:
    """The passes named in ``text`` (comma-separated), in that order.

    Example:
        >>> [p.name for p in passes("via-mpi,via-numpy")]
        ['via-mpi', 'via-numpy']
    """
    names = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in names if name not in PASSES]
    if unknown or not names:
        raise pytest.UsageError(f"--transport-passes: expected names from {', '.join(PASSES)}, "
                                f"got {text!r}")
    return [PASSES[name] for name in names]


def pytest_configure(config: pytest.Config) -> None:
    for option, check in (("shard", shard), ("transport_passes", passes)):
        value = config.getoption(option)
        if value is not None:
            check(value)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    text = metafunc.config.getoption("transport_passes")
    if text is None or "transport_pass" not in metafunc.fixturenames:
        return
    name = Path(str(metafunc.definition.path)).name
    mine = [p for p in passes(text) if name in p.files]
    if mine:
        metafunc.parametrize("transport_pass", mine, indirect=True, scope="session",
                             ids=[p.name for p in mine])


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    keep = list(items)
    if config.getoption("transport_passes") is not None:
        keep = [item for item in keep if _in_pass(item)]
    text = config.getoption("shard")
    if text is not None:
        k, n = shard(text)
        keep = keep[k - 1::n]
    if len(keep) != len(items):
        kept = set(map(id, keep))
        config.hook.pytest_deselected(items=[item for item in items if id(item) not in kept])
        items[:] = keep


def _in_pass(item: pytest.Item) -> bool:
    """Whether ``item`` runs in a pass: parametrized with one, and not overriding its setting."""
    callspec = getattr(item, "callspec", None)
    chosen = None if callspec is None else callspec.params.get("transport_pass")
    fixtures = getattr(item, "fixturenames", ())
    return isinstance(chosen, Pass) and not any(name in fixtures for name in chosen.overridden_by)


@pytest.fixture(scope="session", autouse=True)
def transport_pass(request: pytest.FixtureRequest) -> Iterator[Pass | None]:
    """The pass this test runs in (`PASSES`), set on every rank for the tests between two
    switches, then the settings as they were; None outside ``--transport-passes``."""
    chosen: Pass | None = getattr(request, "param", None)
    if chosen is None:
        yield None
        return
    before = {key: os.environ.get(key) for key in chosen.env}
    _switch(chosen.env)
    _check(chosen)
    yield chosen
    _switch(before)


def _check(chosen: Pass) -> None:
    """Fail the pass's tests unless its setting is what the world's calls now take: the
    segment or not, stepped by the compiled core or by numpy (one 64 KiB all_reduce)."""
    import numpy as np

    import fcoll as fc
    from fcoll.backends import native, shm

    world = fc.world()
    fc.all_reduce(np.ones(1 << 14, np.float32))
    if world.size < 2 or world.shm is False:
        return  # one rank, or a world over several (simulated) nodes: no segment
    numpy_path = chosen.env.get("FCOLL_NATIVE") == "0"
    took = {"mode": shm.settings()[0], "core": bool(world.shm and world.shm.core)}
    want = {"mode": "off" if chosen.env["FCOLL_SHM"] == "0" else "on",
            "core": not numpy_path and native.module() is not None and bool(world.shm)}
    if took != want:
        raise RuntimeError(f"--transport-passes {chosen.name}: expected {want}, got {took}")


def _switch(env: Mapping[str, str | None]) -> None:
    """Set ``env`` on this rank (every rank does the same between the same two tests) and
    make fcoll read it: the settings again, the compiled core's job-wide decision again
    (collective over the world), and new segments, whose layout depends on that decision."""
    from fcoll import runtime
    from fcoll.backends import native
    from fcoll.groups.group import Group, world

    for key, value in env.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    was = native.running()
    if native.agree(world()._comm) != was:
        # A segment keeps the engine it was made with: the next call on each group makes a
        # new one (collective over the group, as at its first call). The old windows are
        # left to MPI_Finalize: freeing them is collective, in an order ranks would have to
        # agree on, and a test run switches at most twice.
        for obj in gc.get_objects():
            if isinstance(obj, Group) and obj.shm:
                obj.shm = None
    runtime.changed()
