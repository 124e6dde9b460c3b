"""Deadlines, debug levels (info logging, detail mismatch checks), monitored_barrier."""

from __future__ import annotations

import logging
import os

import numpy as np
import pytest

import fcoll as fc
from fcoll import runtime


@pytest.fixture
def detail():
    fc.init(debug="detail")
    yield
    fc.init(debug="off")


MISMATCHES = {
    "op name": (lambda g, last: fc.broadcast(np.ones(3), 0, g) if last
                else fc.all_reduce(np.ones(3), group=g), "broadcast"),
    "shape": (lambda g, last: fc.all_reduce(np.ones(4 if last else 3), group=g), "float64[4]"),
    "dtype": (lambda g, last: fc.all_reduce(np.ones(3, np.float32 if last else np.float64),
                                            group=g), "float32[3]"),
    "reduce op": (lambda g, last: fc.all_reduce(np.ones(3), "max" if last else "sum", g), "'max'"),
    "root": (lambda g, last: fc.broadcast(np.ones(3), 1 if last else 0, g), "src"),
}


@pytest.mark.parametrize("case", ["op name", "shape", "dtype", "reduce op", "root"])
def test_detail_mismatch_raises_everywhere_then_recovers(group, detail, case):
    if group.size < 2:
        pytest.skip("needs two ranks")
    call, marker = MISMATCHES[case]
    last = group.rank == group.size - 1
    with pytest.raises(fc.CollectiveMismatchError, match="made different calls") as info:
        call(group.arg, last)
    text = str(info.value)
    assert marker in text and "rank" in text and "seq" in text
    assert len(text.splitlines()) == 2 + group.size  # header, column names, one row per rank
    assert fc.all_reduce(np.ones(3), group=group.arg).tolist() == [group.size] * 3


def test_detail_split_sizes_and_list_forms(group, detail):
    if group.size < 2:
        pytest.skip("needs two ranks")
    n, last = group.size, group.rank == group.size - 1
    ins = [1] * n if last else [2] + [1] * (n - 2) + [0]
    with pytest.raises(fc.CollectiveMismatchError, match="input_split_sizes"):
        fc.all_to_all_single(np.ones((n, 2)), None, ins, group.arg)
    with pytest.raises(fc.CollectiveMismatchError, match="gather"):
        fc.gather(np.ones(2), dst=n - 1 if last else 0, group=group.arg)
    with pytest.raises(fc.CollectiveMismatchError, match="barrier"):
        fc.barrier(group.arg) if last else fc.all_gather(np.ones(1), group.arg)
    assert fc.all_gather_object(group.rank, group.arg) == list(range(n))


def test_detail_catches_a_bad_argument_on_one_rank(group, detail):
    """A rank whose argument is invalid still takes part in the check: it raises its own
    error, the others a mismatch naming it."""
    if group.size < 2:
        pytest.skip("needs two ranks")
    bad = group.rank == 0
    with pytest.raises(ValueError) as info:
        fc.all_reduce(np.ones(3), "total" if bad else "sum", group.arg)
    assert isinstance(info.value, fc.CollectiveMismatchError) is not bad, str(info.value)
    fc.barrier(group.arg)


def test_info_logs_each_collective(group, caplog):
    fc.init(debug="info")
    try:
        with caplog.at_level(logging.INFO, logger="fcoll"):
            fc.all_reduce(np.ones((2, 3), np.float32), "max", group.arg)
    finally:
        fc.init(debug="off")
    assert any(f"rank {group.rank}: all_reduce #" in r.getMessage()
               and "x=float32[2, 3]" in r.getMessage() and "op='max'" in r.getMessage()
               for r in caplog.records)


def test_debug_level_from_environment(monkeypatch):
    monkeypatch.setenv("FCOLL_DEBUG", "DeTaIl")
    assert runtime._debug_level(None) == "detail"
    monkeypatch.setenv("FCOLL_DEBUG", "loud")
    with pytest.raises(ValueError, match="FCOLL_DEBUG: expected one of"):
        runtime._debug_level(None)


@pytest.mark.parametrize("launcher", ["MPI_LOCALNRANKS", "OMPI_COMM_WORLD_LOCAL_SIZE"])
def test_waiting_ranks_yield_only_when_oversubscribed(monkeypatch, launcher):
    names = [*runtime._MPICH_SPINNING, runtime._OPEN_MPI_YIELD]
    for name in [*names, "MPI_LOCALNRANKS", "OMPI_COMM_WORLD_LOCAL_SIZE"]:
        monkeypatch.setenv(name, "")  # so that monkeypatch restores even an unset variable
        monkeypatch.delenv(name)
    cpus = runtime._node_cpus()
    monkeypatch.setenv(launcher, str(cpus))            # one rank per CPU: leave MPI alone
    runtime._yield_when_oversubscribed()
    assert not any(name in os.environ for name in names)
    monkeypatch.setenv(launcher, str(cpus + 1))
    monkeypatch.setenv(runtime._OPEN_MPI_YIELD, "0")  # the user's own choice stands
    runtime._yield_when_oversubscribed()
    assert [os.environ[name] for name in names] == ["mpir"] * 3 + ["0"]


CALLS = {
    "all_reduce": lambda g: fc.all_reduce(np.ones(3), group=g),
    "all_gather": lambda g: fc.all_gather(np.ones(3), g),
    "barrier": lambda g: fc.barrier(g),
    "broadcast_object": lambda g: fc.broadcast_object("x", len(g.ranks) - 1, g),
    "all_to_all_single": lambda g: fc.all_to_all_single(np.ones(2 * len(g.ranks)), group=g),
}


@pytest.mark.parametrize("name", list(CALLS))
def test_deadline_on_a_blocking_call(group, name):
    """Only group rank 0 calls: it raises CollectiveTimeoutError within the group's
    deadline, naming the op, the ranks, the deadline and the sequence number; the group is
    unusable afterwards. The other ranks never use the group."""
    if group.size < 2:
        pytest.skip("needs a rank that does not come")
    g = fc.new_group(list(group.members), timeout=0.3)
    if group.rank == 0:
        with pytest.raises(fc.CollectiveTimeoutError) as info:
            CALLS[name](g)
        assert f"{name} (call #1 on the group)" in str(info.value)
        assert "0.3 s deadline" in str(info.value) and str(list(group.members)) in str(info.value)
        with pytest.raises(RuntimeError, match=f"is unusable: {name}"):
            fc.all_reduce(np.ones(1), group=g)
    fc.barrier(group.arg)


def test_deadline_on_recv(group):
    if group.size < 2:
        pytest.skip("needs a sender that does not send")
    g = fc.new_group(list(group.members), timeout=0.2)
    if group.rank == 0:
        with pytest.raises(fc.CollectiveTimeoutError, match="recv"):
            fc.recv(1, g)
    fc.barrier(group.arg)


@pytest.mark.smoke
def test_monitored_barrier(group):
    fc.monitored_barrier(group.arg, timeout=30)
    if group.size < 2:
        return
    late = group.size - 1
    if group.rank == late:
        # Arrive only after rank 0 has given up: it tells us over the (healthy) group.
        fc.recv(0, group.arg, tag=11)
        with pytest.raises(RuntimeError, match=r"timed out in monitored_barrier|reported"):
            fc.monitored_barrier(group.arg, timeout=0.3)
    elif group.rank == 0:
        with pytest.raises(RuntimeError, match=rf"^Rank {late} failed to pass monitored_barrier"):
            fc.monitored_barrier(group.arg, timeout=0.3)
        fc.send(np.ones(1), late, group.arg, tag=11)
    else:
        with pytest.raises(RuntimeError, match="rank 0 reported a failure"):
            fc.monitored_barrier(group.arg, timeout=0.3)
    fc.barrier(group.arg)


def test_monitored_barrier_wait_all_ranks(group):
    if group.size < 3:
        pytest.skip("needs two late ranks")
    late = list(range(1, group.size))
    if group.rank == 0:
        names = ", ".join(str(r) for r in late)
        with pytest.raises(RuntimeError, match=rf"^Ranks {names} failed to pass"):
            fc.monitored_barrier(group.arg, timeout=0.3, wait_all_ranks=True)
        for r in late:
            fc.send(np.ones(1), r, group.arg, tag=12)
    else:
        fc.recv(0, group.arg, tag=12)
        with pytest.raises(RuntimeError):
            fc.monitored_barrier(group.arg, timeout=0.3, wait_all_ranks=True)
    fc.barrier(group.arg)
