"""The flight recorder (`fcoll.debug`, `fcoll.diagnostics.flight`): each rank's last calls, gathered
and printed side by side, the first divergence marked."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

import fcoll as fc
from fcoll import runtime
from fcoll.diagnostics import flight, flight_report
from fcoll.testing import parallel_assert


@pytest.fixture(autouse=True)
def recording() -> Iterator[None]:
    """The recorder on (64 calls), as a job starts; no default deadline; no fast path
    learned by an earlier test (a first call takes the whole path)."""
    if not flight.RING:
        pytest.skip("FCOLL_TRACE=0: the recorder is off")
    runtime.changed()
    yield
    runtime._state.timeout = None
    runtime.changed()


def _last(n: int) -> list[tuple[object, ...]]:
    return fc.debug.record()[-n:]


def test_calls_are_recorded_with_group_number_arguments_and_state(rank: int, world_size: int) -> None:
    x = np.ones(4, np.float32)
    fc.all_reduce(x)
    fc.all_reduce(x)  # the fast path, once learned
    fc.broadcast(np.arange(3), src=world_size - 1)
    entries = _last(3)
    assert [e[2] for e in entries] == ["all_reduce", "all_reduce", "broadcast"]
    assert all(e[0] == fc.world().key and e[5] == "completed" for e in entries), entries
    seqs = [e[1] for e in entries]
    assert seqs == [seqs[0], seqs[0] + 1, seqs[0] + 2] and seqs[-1] == fc.world().seq
    assert entries[0][4] == entries[1][4] == "float32[4]"  # whole path and fast path alike
    assert "src=" in str(entries[2][3]) and entries[2][4] == "int64[3]"
    assert all(isinstance(e[6], float) and e[6] >= 0 for e in entries)


def test_refused_calls_keep_no_number(rank: int) -> None:
    fc.all_reduce(np.ones(2))
    before = [e[:3] for e in fc.debug.record()]
    with pytest.raises(ValueError):
        fc.broadcast(np.ones(2), src=10**6)
    assert [e[:3] for e in fc.debug.record()] == before


def test_agreeing_ranks_report_no_divergence(rank: int, world_size: int) -> None:
    group = fc.world().split(color=0)
    for i in range(3):
        fc.all_reduce(np.full(2, float(i)), group=group)
    fc.all_gather_into_tensor(np.ones((1, 2)), group=group)
    report = fc.debug.dump(timeout=30, file=None)
    title = f"group {list(range(world_size))} (group #{group.key[1]} of the job):"
    parallel_assert(title in report and "no answer" not in report, f"rank {rank}: {report}")
    table = report.split(title)[1].split("\ngroup ")[0]  # this test's group alone
    parallel_assert("the ranks' records agree on every call" in table
                    and "first difference" not in table, f"rank {rank}: {report}")


@pytest.mark.mpi(min_size=2)
def test_a_rank_that_skips_a_call_is_named_with_the_op_and_call_number(rank: int) -> None:
    group = fc.world().split(color=0)
    group.timeout = 1.0
    x = np.ones(3, np.float32)
    for _ in range(2):
        fc.all_reduce(x, group=group)
    if rank != 1:
        with pytest.raises(fc.CollectiveTimeoutError) as caught:
            fc.all_reduce(x, group=group)  # rank 1 skips it
        report = caught.value.flight_record
    else:
        report = fc.debug.dump(timeout=30, file=None)
    title = f"(group #{group.key[1]} of the job):"
    table = report.split(title)[1].split("\ngroup ")[0] if title in report else ""
    expected = ("first difference at call #3:", "rank 1 made no call #3 (last: #2 all_reduce)",
                "all_reduce float32[3]")
    parallel_assert(all(text in table for text in expected), f"rank {rank}: {report}")
    marked = [line for line in table.splitlines() if "<<< first difference" in line]
    parallel_assert(len(marked) == 1 and marked[0].lstrip().startswith("#3"), f"rank {rank}: {report}")


def test_the_report_marks_a_different_op_and_names_ranks_that_do_not_answer() -> None:
    """Pure formatting: records made up for three ranks, one of them silent."""
    world = ((0, 1, 2), 0)
    ar = (world, 1, "all_reduce", "float32[2]", "float32[2]", "completed", 1e-5)
    records = {0: [ar, (world, 2, "all_reduce", "float32[2]", "float32[2]", "sent", 3.0)],
               1: [ar, (world, 2, "broadcast", "int64[2] src=0", "int64[2]", "sent", 3.0)]}
    text = flight_report.report(records, [2], "test", 5.0)
    assert "first difference at call #2: rank 0 made all_reduce float32[2]; rank 1 made broadcast" \
        in text, text
    assert "no answer within 5 s from rank(s) 2" in text


def test_recording_off_keeps_nothing() -> None:
    fc.debug.trace(0)
    try:
        fc.all_reduce(np.ones(2))
        assert fc.debug.record() == []
    finally:
        fc.debug.trace(flight.DEFAULT)
    fc.all_reduce(np.ones(2))
    assert fc.debug.record()[-1][2] == "all_reduce"


def test_bad_trace_sizes_are_refused() -> None:
    with pytest.raises(ValueError, match=r"trace: expected size to be an int >= 0, got -1"):
        fc.debug.trace(-1)


def test_the_table_names_arguments_as_the_contract_does_in_columns_that_line_up() -> None:
    """One line per rank and call: op, arguments by name (arrays as dtype[shape], ops by
    name), state and time, each column starting at the same place on every line."""
    import numpy as np

    from fcoll.policy.ops import ReduceOp

    world = ((0, 1), 0)
    fast = (world, 15, "all_reduce", "numpy", (4,), np.dtype("float32"), 1.0)
    full = (world, 16, "all_gather_into_tensor",
            (("x", (np.ndarray, (4, 2), np.dtype("float32"))), ("gather_dim", 1), ("sizes", None)), 2.0)
    reduce = (world, 15, "all_reduce", (("x", (np.ndarray, (4,), np.dtype("float32"))),
                                        ("op", ReduceOp.SUM)), 1.0)
    ring = flight.Ring(8)
    for i, entry in enumerate([fast, full]):
        ring.calls[i], ring.ends[i] = entry, 1.5 if i == 0 else 0.0
    ring.pos[0] = 2
    saved, flight.RING = flight.RING, ring
    try:
        mine = flight_report.snapshot()
    finally:
        flight.RING = saved
    other = [(world, 15, "all_reduce", *flight_report._args(reduce[3]), "completed", 2e-5)]
    text = flight_report.report({0: mine, 1: other}, [], "test", 1.0)
    lines = text.splitlines()
    assert "x=float32[4, 2] gather_dim=1 sizes=None" in text and "x=float32[4] op=sum" in text, text
    rows = [line for line in lines if line.startswith("  #") or line.startswith("        ")]
    header = next(line for line in lines if line.lstrip().startswith("call"))
    for column in ("rank", "op", "arguments", "state", "time"):
        start = header.index(column)
        assert all(row[start - 2 : start] == "  " for row in rows if len(row) > start), text
    assert "(no call #16; last: #15)" in text and "<<< first difference" in text, text
