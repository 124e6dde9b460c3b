"""Deadlines and ``debug="detail"`` on cupy calls (issue 15, part 5): NCCL, CUDA-aware MPI
and staged MPI, on a GPU or on the CPU stand-in (``FCOLL_FAKE_CUPY=1``).

- NCCL under a deadline: work that never completes (the stand-in's `fake_cupy.stall`, so
  these run on the stand-in only) raises `CollectiveTimeoutError` near the deadline on
  every rank, aborts the group's NCCL communicator and leaves the group unusable; without
  a deadline the call returns at once (stream order).
- ``debug="detail"``: ranks passing different shapes, dtypes, ops or roots get
  `CollectiveMismatchError` on every rank before anything is sent (on NCCL the
  communicator is not even made); a rank failing its own checks raises its error and the
  others the mismatch naming it.
- The MPI transports under a deadline: a rank that does not call leaves the caller with
  `CollectiveTimeoutError`.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any

import numpy as np
import pytest

import fcoll as fc
from fcoll import dispatch, runtime
from fcoll.testing import parallel_raises
from tests.test_gpu import REASON, _local_size

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(REASON is not None, reason=str(REASON))]
DEADLINE = 0.3


def _fake() -> bool:
    return str(getattr(sys.modules.get("cupy"), "__version__", "")).endswith("+fake")


def _devices() -> tuple[int, int]:
    """This rank's GPU and the ranks on its node, asked while every rank collects (both
    are collective over the job, and a test body runs on a group's members only)."""
    import fcoll.gpu

    return fcoll.gpu.use_local_device(), _local_size()


DEVICE, LOCAL_SIZE = _devices() if REASON is None else (-1, 0)


@pytest.fixture(autouse=True)
def device() -> int:
    import cupy

    cupy.cuda.Device(DEVICE).use()
    return DEVICE


@pytest.fixture
def cp() -> Iterator[Any]:
    """cupy; debug level and default deadline put back afterwards."""
    import cupy

    yield cupy
    fc.init(debug="off")
    runtime._state.timeout = None


def _select(transport: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """``nccl``, ``aware`` (CUDA-aware MPI) or ``staged`` (MPI through host copies)."""
    import cupy

    from fcoll.backends import nccl
    from fcoll.dispatch import gpu_probe

    if transport == "nccl":
        if not nccl.available():
            pytest.skip(f"no NCCL: {nccl.why_unavailable()}")
        if cupy.cuda.runtime.getDeviceCount() < LOCAL_SIZE:
            pytest.skip("NCCL needs one GPU per rank; more ranks than GPUs on this node")
    if transport == "aware" and not _fake() and not gpu_probe.cuda_aware_mpi():
        pytest.skip("MPI is not CUDA-aware here")
    monkeypatch.setenv("FCOLL_GPU_TRANSPORT", "nccl" if transport == "nccl" else "mpi")
    monkeypatch.setenv("FCOLL_CUDA_AWARE_MPI", "1" if transport == "aware" else "0")
    dispatch.forget()


@pytest.fixture(params=["nccl", "aware", "staged"])
def transport(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    _select(request.param, monkeypatch)
    yield str(request.param)
    monkeypatch.undo()
    dispatch.forget()


@pytest.fixture
def on_nccl(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    _select("nccl", monkeypatch)
    yield
    monkeypatch.undo()
    dispatch.forget()


@pytest.fixture
def stuck(on_nccl: None) -> Callable[[], AbstractContextManager[None]]:
    """NCCL work enqueued inside ``with stuck():`` never completes: the stand-in's events
    recorded there are never done (`fake_cupy.stall`). Not on a real GPU: aborting a
    communicator with work still queued (what a timeout does) is left to a job of its own."""
    if not _fake():
        pytest.skip("needs the CPU stand-in's stall() (FCOLL_FAKE_CUPY=1)")
    from tests import fake_cupy

    @contextmanager
    def stalled() -> Iterator[None]:
        fake_cupy.stall(True)
        try:
            yield
        finally:
            fake_cupy.stall(False)

    return stalled


def _x(cupy: Any, n: int, dtype: Any = np.float32) -> Any:
    return cupy.asarray(np.arange(2 * n, dtype=dtype).reshape(n, 2))


# name -> a call of that collective on cupy array x in group g (n ranks)
CALLS: dict[str, Callable[[Any, Any], Any]] = {
    "all_reduce": lambda x, g: fc.all_reduce(x, group=g),
    "async all_reduce": lambda x, g: fc.all_reduce(x, group=g, async_op=True).wait(),
    "broadcast": lambda x, g: fc.broadcast(x, src=g.size - 1, group=g),
    "all_gather_into_tensor": lambda x, g: fc.all_gather_into_tensor(x, group=g),
    "all_to_all_single": lambda x, g: fc.all_to_all_single(x, group=g),
    "all_gather": lambda x, g: fc.all_gather(x, g),
    "all_reduce_coalesced": lambda x, g: fc.all_reduce_coalesced([x, x[:1]], group=g),
    "scatter": lambda x, g: fc.scatter(list(x) if g.rank == 0 else None, 0, g),
}


@pytest.mark.parametrize("name", list(CALLS))
def test_stuck_nccl_work_times_out_and_aborts(group, cp, stuck, name):
    """Every rank raises near the deadline; the NCCL communicator is aborted and dropped;
    the next call raises the documented error."""
    g = fc.new_group(list(group.members), timeout=DEADLINE)
    x = _x(cp, g.size)
    CALLS[name](x, g)  # makes the communicator
    comm = g.nccl
    assert comm is not None
    fn = name.split()[-1]
    started = time.monotonic()
    with stuck(), parallel_raises(fc.CollectiveTimeoutError, on="all", group=group.arg,
                                    match=rf"^{fn} \(call #2 on the group\) .*{DEADLINE:g} s "
                                    rf"deadline on group ranks \[{', '.join(map(str, g.ranks))}\]"):
        CALLS[name](x, g)
    took = time.monotonic() - started
    assert DEADLINE <= took < DEADLINE + 2.5, took
    assert g.nccl is None and not g.usable
    if _fake():
        assert comm.aborted
    with pytest.raises(RuntimeError, match=rf"is unusable: {fn} \(call #2 on the group\)"):
        fc.all_reduce(x, group=g)


def test_waiting_on_stuck_async_nccl_work_with_a_timeout(group, cp, stuck):
    """No deadline on the call: ``Work.wait(timeout=...)`` polls the work's CUDA event on
    the host and, once late, aborts the communicator and raises on every rank."""
    g = fc.new_group(list(group.members))
    x = _x(cp, g.size)
    fc.all_reduce(x, group=g)
    comm = g.nccl
    with stuck():
        work = fc.all_reduce(x, group=g, async_op=True)  # returns at once: no deadline
        started = time.monotonic()
        with parallel_raises(fc.CollectiveTimeoutError, on="all", group=group.arg,
                             match=r"^all_reduce \(call #2 on the group\)"):
            work.wait(timeout=DEADLINE)
    assert DEADLINE <= time.monotonic() - started < DEADLINE + 2.5
    assert g.nccl is None and not g.usable and (not _fake() or comm.aborted)


def test_stuck_nccl_work_times_out_under_the_default_deadline(group, cp, stuck):
    """``fc.init(timeout=...)`` applies to a group without a deadline of its own."""
    g = fc.new_group(list(group.members))
    x = _x(cp, g.size)
    fc.all_reduce(x, group=g)
    fc.init(timeout=DEADLINE)
    with stuck(), parallel_raises(fc.CollectiveTimeoutError, on="all", group=group.arg,
                                    match=r"all_reduce \(call #2 on the group\)"):
        fc.all_reduce(x, group=g)
    assert g.nccl is None


def test_without_a_deadline_nccl_calls_do_not_wait(group, cp, stuck):
    """No deadline: the call enqueues and returns, however long the stream takes."""
    g = fc.new_group(list(group.members))
    x = _x(cp, g.size)
    fc.all_reduce(x, group=g)  # makes the communicator
    with stuck():
        started = time.monotonic()
        y = fc.all_reduce(x, group=g)
        assert time.monotonic() - started < 1.5
    np.testing.assert_array_equal(cp.asnumpy(y), cp.asnumpy(x) * g.size)
    assert g.nccl is not None and g.usable


# name -> (call on cupy array x, whether this rank is the odd one out)
MISMATCHES: dict[str, Callable[[Any, Any, bool], Any]] = {
    "shape": lambda x, g, odd: fc.all_reduce(x[:1] if odd else x, group=g),
    "dtype": lambda x, g, odd: fc.all_reduce(x.astype(np.float64) if odd else x, group=g),
    "op": lambda x, g, odd: fc.all_reduce(x, "max" if odd else "sum", group=g),
    "root": lambda x, g, odd: fc.broadcast(x, src=1 if odd else 0, group=g),
    "gather dtype": lambda x, g, odd: fc.all_gather_into_tensor(
        x.astype(np.int32) if odd else x, group=g),
    "list shapes": lambda x, g, odd: fc.all_reduce_coalesced([x, x[:1] if odd else x], group=g),
}


@pytest.mark.parametrize("case", list(MISMATCHES))
def test_detail_mismatch_on_every_rank_before_sending(group, cp, transport, case):
    if group.size < 2:
        pytest.skip("needs two ranks to disagree")
    g = fc.new_group(list(group.members))
    x = _x(cp, g.size)
    fc.init(debug="detail")
    with parallel_raises(fc.CollectiveMismatchError, on="all", group=group.arg,
                         match="made different calls"):
        MISMATCHES[case](x, g, g.rank == g.size - 1)
    if transport == "nccl":
        assert g.nccl is None  # the NCCL communicator was never made: nothing was sent
    y = fc.all_reduce(x, group=g)  # the group still works, call numbers agree
    np.testing.assert_array_equal(cp.asnumpy(y), cp.asnumpy(x) * g.size)


def test_detail_names_the_rank_that_failed_its_own_checks(group, cp, transport):
    if group.size < 2:
        pytest.skip("needs two ranks to disagree")
    g = fc.new_group(list(group.members))
    x = _x(cp, g.size)
    fc.init(debug="detail")
    last = g.size - 1
    with parallel_raises(ValueError, on="all", group=group.arg) as info:
        fc.broadcast(x, src=g.size if g.rank == last else 0, group=g)
    if g.rank == last:
        assert type(info.value) is ValueError and "src" in str(info.value)
    else:
        assert isinstance(info.value, fc.CollectiveMismatchError)
        assert f"group rank(s) [{last}]" in str(info.value)
    if transport == "nccl":
        assert g.nccl is None


def test_detail_lets_matching_calls_through(group, cp, transport):
    """Every collective routed on the GPU, scatter's root included, checks alike on every
    rank under detail (a rank that skipped the check would leave the others waiting)."""
    g = fc.new_group(list(group.members), timeout=30)
    x = _x(cp, g.size)
    fc.init(debug="detail")
    for call in CALLS.values():
        call(x, g)
    got = fc.scatter(list(x) if g.rank == 0 else None, 0, g)
    np.testing.assert_array_equal(cp.asnumpy(got), cp.asnumpy(x)[g.rank])


@pytest.mark.parametrize("name", ["all_reduce", "broadcast", "all_gather_into_tensor", "all_gather"])
def test_mpi_transport_deadline_when_a_rank_does_not_call(group, cp, transport, name):
    if transport == "nccl":
        pytest.skip("a rank missing an NCCL call: the communicator's own start would block")
    if group.size < 2:
        pytest.skip("needs a rank that does not come")
    g = fc.new_group(list(group.members), timeout=DEADLINE)
    x = _x(cp, g.size)
    with parallel_raises(fc.CollectiveTimeoutError, group=group.arg,
                         match=rf"^{name} \(call #1 on the group\) .*{DEADLINE:g} s deadline") as info:
        if g.rank == 0:
            CALLS[name](x, g)
    assert info.ranks == [0]
    if g.rank == 0:
        with pytest.raises(RuntimeError, match=f"is unusable: {name}"):
            fc.all_reduce(x, group=g)


@pytest.mark.parametrize("setting", ["nccl", "auto"])
def test_nccl_deadline_when_a_rank_misses_the_first_call(group, cp, on_nccl, monkeypatch,
                                                         setting):
    """The exchange before a group's NCCL communicator exists (every rank's GPU, NCCL's
    unique id; unset FCOLL_GPU_TRANSPORT: which transport) is bounded by the deadline."""
    if group.size < 2:
        pytest.skip("needs a rank that does not come")
    if setting == "auto":
        monkeypatch.delenv("FCOLL_GPU_TRANSPORT")
        dispatch.forget()
    g = fc.new_group(list(group.members), timeout=DEADLINE)
    x = _x(cp, g.size)
    with parallel_raises(fc.CollectiveTimeoutError, group=group.arg,
                         match=r"^all_reduce \(call #1 on the group\)") as info:
        if g.rank == 0:
            fc.all_reduce(x, group=g)
    assert info.ranks == [0]
    assert g.nccl is None


def test_the_transport_choice_is_part_of_the_first_call(group, cp, on_nccl, monkeypatch):
    """Unset FCOLL_GPU_TRANSPORT: the first call on a group also decides its transport; it
    still counts once, so later calls and their errors are numbered as on numpy."""
    monkeypatch.delenv("FCOLL_GPU_TRANSPORT")
    dispatch.forget()
    g = fc.new_group(list(group.members))
    x = _x(cp, g.size)
    fc.all_reduce(x, group=g)
    assert g.gpu_shared == [] and g.nccl is not None and g.seq == 1
    fc.broadcast(x, group=g)
    assert g.seq == 2
