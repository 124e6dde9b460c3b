"""async_op=True: Work handles backed by MPI's nonblocking collectives."""

from __future__ import annotations

import gc
import warnings

import numpy as np
import pytest

import fcoll as fc
from fcoll.calls.work import map_arrays
from tests.helpers import BF16, data, same_bits


def _calls(group, x, n):
    """(name, call) pairs: each call takes async_op and returns the result or a Work."""
    rows = np.concatenate([x] * n)
    return [
        ("all_reduce", lambda a: fc.all_reduce(x, "sum", group.arg, async_op=a)),
        ("all_reduce avg", lambda a: fc.all_reduce(x, "avg", group.arg, async_op=a)),
        ("all_reduce max", lambda a: fc.all_reduce(x, "max", group.arg, async_op=a)),
        ("reduce", lambda a: fc.reduce(x, n - 1, "sum", group.arg, async_op=a)),
        ("reduce min", lambda a: fc.reduce(x, 0, "min", group.arg, async_op=a)),
        ("reduce_scatter_tensor", lambda a: fc.reduce_scatter_tensor(rows, "sum", group.arg,
                                                                     async_op=a)),
        ("reduce_scatter_tensor dim 1", lambda a: fc.reduce_scatter_tensor(
            np.concatenate([x] * n, axis=1), "max", group.arg, scatter_dim=1, async_op=a)),
        ("broadcast", lambda a: fc.broadcast(x, n - 1, group.arg, async_op=a)),
        ("all_gather_into_tensor", lambda a: fc.all_gather_into_tensor(x, group.arg,
                                                                       async_op=a)),
        ("all_gather_into_tensor dim -1", lambda a: fc.all_gather_into_tensor(
            x, group.arg, gather_dim=-1, async_op=a)),
        ("all_gather_into_tensor auto", lambda a: fc.all_gather_into_tensor(
            x[: group.rank % 2 + 1], group.arg, sizes="auto", async_op=a)),
        ("all_to_all_single", lambda a: fc.all_to_all_single(rows, group=group.arg, async_op=a)),
        ("all_to_all_single uneven", lambda a: fc.all_to_all_single(
            rows[: n + group.rank], None, [1] * (n - 1) + [1 + group.rank], group.arg,
            async_op=a)),
    ]


@pytest.mark.smoke
@pytest.mark.parametrize("dtype", [np.float64, np.float32, BF16, np.int32, np.complex64])
def test_async_equals_blocking(group, dtype):
    n = group.size
    x = data(group.members[group.rank], (3, 2), dtype, salt=1, low=1, high=5)
    for name, call in _calls(group, x, n):
        if np.dtype(dtype).kind == "c" and name.endswith(("max", "min", "dim 1")):
            continue
        if name.endswith("avg") and np.dtype(dtype).kind in "iu":
            continue
        work = call(True)
        assert isinstance(work, fc.Work), name
        expected = call(False)
        got = work.wait()
        assert (got is None and expected is None) or same_bits(got, expected), name


def test_input_may_change_after_the_call(group):
    n = group.size
    x = np.full((4, 2), float(group.rank))
    works = [fc.all_reduce(x, group=group.arg, async_op=True),
             fc.broadcast(x, 0, group.arg, async_op=True),
             fc.all_gather_into_tensor(x, group.arg, async_op=True),
             fc.all_to_all_single(np.repeat(x, n, axis=0), group=group.arg, async_op=True),
             fc.reduce_scatter_tensor(np.repeat(x, n, axis=0), "sum", group.arg, async_op=True)]
    x[:] = -100.0  # the caller reuses its buffer at once
    total = sum(range(n))
    results = fc.wait_all(works)
    assert (results[0] == total).all()
    assert (results[1] == 0).all()
    assert same_bits(results[2], np.concatenate([np.full((4, 2), float(r)) for r in range(n)]))
    assert same_bits(results[3], np.concatenate([np.full((4, 2), float(r)) for r in range(n)]))
    assert (results[4] == total).all()


def test_thousand_outstanding_any_wait_order(group):
    n, me = group.size, group.members[group.rank]
    works = [fc.all_reduce(np.array([i + group.rank]), group=group.arg, async_op=True)
             for i in range(1000)]
    order = np.random.default_rng(me).permutation(1000)  # a different order on each rank
    results = {}
    for i in order[:500]:
        results[i] = works[i].wait()
    results.update(zip(range(1000), fc.wait_all(works), strict=True))
    for i in range(1000):
        assert results[i].tolist() == [i * n + n * (n - 1) // 2], f"Mismatch in iteration {i}"


def test_barrier_completes_unwaited_work(group):
    n = group.size
    works = [fc.all_reduce(np.full((100, 100), float(i)), group=group.arg, async_op=True)
             for i in range(16)]
    fc.barrier(group.arg)
    assert all(w._op.done for w in works)
    assert all((w.wait() == i * n).all() for i, w in enumerate(works))


def test_dropped_work_warns_and_still_completes(group):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fc.all_reduce(np.ones(3), group=group.arg, async_op=True)
        gc.collect()
    assert any(issubclass(w.category, ResourceWarning) and "all_reduce" in str(w.message)
               for w in caught)
    fc.barrier(group.arg)  # completes it; afterwards the group has nothing in flight
    from fcoll.groups.group import resolve_group
    g = group.arg if isinstance(group.arg, fc.Group) else resolve_group(group.arg, "t")
    assert g.pending == []


def test_then_and_is_completed(group):
    n = group.size
    w = fc.all_reduce(np.array([1.0]), group=group.arg, async_op=True)
    chained = w.then(lambda y: y * 10).then(lambda y: y + 1)
    assert chained.wait().tolist() == [10.0 * n + 1]
    assert w.is_completed() and chained.is_completed()
    assert w.wait().tolist() == [float(n)]
    with pytest.raises(ValueError, match="source_rank"):
        w.source_rank()


@pytest.mark.smoke
def test_wait_timeout_raises_then_completes(group):
    """The last member posts its all_reduce only after every other member saw its wait
    time out (they tell it over COMM_WORLD, outside the group's communicator). A timeout
    makes the group unusable, so the test runs on a group of its own."""
    if group.size < 2:
        pytest.skip("needs a peer that is late")
    from mpi4py import MPI
    world = MPI.COMM_WORLD
    own = fc.new_group(list(group.members))
    late_rank = group.members[-1]
    if fc.get_rank() == late_rank:
        for member in group.members[:-1]:
            world.recv(source=member, tag=77)
        w = fc.all_reduce(np.array([1]), group=own, async_op=True)
    else:
        w = fc.all_reduce(np.array([1]), group=own, async_op=True)
        with pytest.raises(fc.CollectiveTimeoutError, match=r"all_reduce \(call #1 on the group\)"
                           r".* 0.2 s deadline on group ranks"):
            w.wait(timeout=0.2)
        assert not w.is_completed()
        with pytest.raises(RuntimeError, match="is unusable: all_reduce"):
            fc.all_reduce(np.array([1]), group=own)
        world.send("timed out", dest=late_rank, tag=77)
    assert w.wait().tolist() == [group.size]


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.complex64])
def test_large_folded_all_reduce_in_several_steps(group, dtype):
    """Above the doubling limit, async float all-reduces at n >= 3 run the halving schedule
    (tagged point-to-point steps, moved on by every wait); several in flight, waited in a
    different order on each rank, must give the blocking call's bits."""
    from fcoll.backends.tree import doubling_limit

    count = doubling_limit(group.size) // np.dtype(dtype).itemsize + 7  # uneven blocks
    xs = [data(group.rank, (count + k, 1), dtype, salt=k) for k in range(5)]
    works = [fc.all_reduce(x, "sum" if k % 2 else "avg", group.arg, async_op=True)
             for k, x in enumerate(xs)]
    order = np.random.default_rng(group.rank).permutation(len(works))
    got = {int(k): works[k].wait() for k in order}
    for k, x in enumerate(xs):
        want = fc.all_reduce(x, "sum" if k % 2 else "avg", group.arg)
        assert same_bits(got[k], want), k


@pytest.mark.parametrize("irecv_first", [True, False])
def test_waiting_on_a_collective_advances_a_pending_irecv(irecv_first):
    """Rank 0 waits on an async all-reduce while its irecv of a large message is pending;
    rank 1 sends that message with a blocking send first. The wait must post the receive
    (by polling) rather than block in MPI, or both ranks hang."""
    if fc.get_world_size() < 2:
        pytest.skip("needs two ranks")
    me, big = fc.get_rank(), np.arange(1 << 18, dtype=np.float64)  # 2 MiB: a rendezvous send
    x = np.full(3, float(me))
    if me == 0:
        if irecv_first:
            received, reduced = fc.irecv(1), fc.all_reduce(x, async_op=True)
        else:
            reduced = fc.all_reduce(x, async_op=True)
            received = fc.irecv(1)
        total = reduced.wait()
        np.testing.assert_array_equal(received.wait(), big)
    else:
        if me == 1:
            fc.send(big, 0)
        total = fc.all_reduce(x, async_op=True).wait()
    np.testing.assert_array_equal(total, np.full(3, sum(range(fc.get_world_size())), float))


def test_map_arrays_reaches_arrays_in_lists_tuples_and_work(group):
    """The walk that sends a result back as the caller's arrays (torch, JAX, cupy staged):
    arrays inside lists and tuples, and a `Work`'s result once waited for."""
    x = np.arange(3.0)
    work = fc.all_reduce(x, group=group.arg, async_op=True)
    got = map_arrays([x, (x, "kept"), work, 7], lambda v: isinstance(v, np.ndarray), lambda v: -v)
    assert type(got) is list and type(got[1]) is tuple and got[1][1] == "kept" and got[3] == 7
    assert np.array_equal(got[0], -x) and np.array_equal(got[1][0], -x)
    assert isinstance(got[2], fc.Work)
    assert np.array_equal(got[2].wait(), -x * group.size)
