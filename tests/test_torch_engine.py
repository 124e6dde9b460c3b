"""The torch backend's asynchronous work on fcoll's engine, sparse all_reduce, timeouts in
torch's words (issue 41). Rank-agnostic: expected values are computed from every rank's
inputs, which each rank can rebuild."""

from __future__ import annotations

import datetime
import os

import numpy as np
import pytest

import fcoll as fc
from fcoll import runtime
from fcoll.calls.engine import ENGINE
from tests.torch_pg import PG, dist, gloo, group, start, torch


@pytest.fixture(params=["world", "full", "sub"])
def pg(request: pytest.FixtureRequest) -> PG:
    return group(request.param)


def test_async_work_returns_before_the_peers_arrive() -> None:
    """Rank 0's async all_reduce returns while rank 1 has not called yet: rank 1 calls only
    after rank 0 told it (over gloo) that its call returned. Inline, this would hang."""
    start()
    n, r = dist.get_world_size(), dist.get_rank()
    if n < 2:
        pytest.skip("needs two ranks")
    side = gloo()
    flag = torch.zeros(1)
    t = torch.full((1000,), r + 1.0)
    if r == 0:
        w = dist.all_reduce(t, async_op=True)
        dist.send(torch.ones(1), 1, group=side)
        w.wait()
    else:
        if r == 1:
            dist.recv(flag, 0, group=side)
            assert flag.item() == 1.0
        dist.all_reduce(t)
    assert torch.equal(t, torch.full((1000,), n * (n + 1) / 2))


def test_async_calls_on_several_groups_complete_in_issue_order(pg: PG) -> None:
    n, r = pg.size, pg.rank
    ts = [torch.full((i + 1,), float(r + i)) for i in range(6)]
    works = [dist.all_reduce(t, group=pg.pg, async_op=True) for t in ts]
    b = torch.full((3,), float(r))
    inline = ENGINE.ran["inline"]
    dist.broadcast(b, dist.get_global_rank(pg.pg, n - 1) if pg.pg else n - 1, group=pg.pg)  # sync
    assert ENGINE.ran["inline"] == inline + 1  # in this thread, after the queued work
    assert torch.equal(b, torch.full((3,), n - 1.0))
    assert all(w.is_completed() for w in works)  # the sync call ran after them
    for i, (t, w) in enumerate(zip(ts, works, strict=True)):
        assert w.wait() and torch.equal(t, torch.full((i + 1,), float(sum(q + i for q in range(n)))))
        assert w.get_future().value()[0] is t


def test_fcoll_calls_follow_the_torch_work_before_them(pg: PG) -> None:
    n, r = pg.size, pg.rank
    t = torch.full((5,), r + 1.0)
    w = dist.all_reduce(t, group=pg.pg, async_op=True)
    g = pg.pg.fcoll_group if pg.pg is not None else None
    y = fc.all_reduce(np.full(4, r + 2.0), group=g)  # waits for the torch work first
    assert w.is_completed() and torch.equal(t, torch.full((5,), n * (n + 1) / 2))
    assert np.array_equal(y, np.full(4, n * (n + 3) / 2))
    assert ENGINE.drain not in runtime._BEFORE  # idle again: fcoll's fast paths are back


def test_then_callbacks_may_call_collectives(pg: PG) -> None:
    n, r = pg.size, pg.rank

    def again(fut: torch.futures.Future[list[torch.Tensor]]) -> torch.Tensor:
        x = fut.value()[0] * 2
        dist.all_reduce(x, group=pg.pg)  # synchronous, from the thread that completed fut
        y = x.clone()
        return dist.all_reduce(y, group=pg.pg, async_op=True).get_future().wait()[0]

    t = torch.full((3,), r + 1.0)
    got = dist.all_reduce(t, group=pg.pg, async_op=True).get_future().then(again).wait()
    assert torch.equal(got, torch.full((3,), n * n * n * (n + 1.0)))


def test_ddp_buckets_run_on_the_engine() -> None:
    start()
    before = dict(ENGINE.ran)
    torch.manual_seed(0)
    net = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(40, 40), bucket_cap_mb=0.001)
    net(torch.ones(2, 40)).sum().backward()
    w = net.module.weight.grad
    assert torch.equal(w, torch.ones_like(w) * w[0, 0])  # every rank's gradient is the same
    assert ENGINE.ran["engine"] + ENGINE.ran["caller"] > before["engine"] + before["caller"]


def test_async_timeout_is_a_dist_backend_error() -> None:
    start()
    n, r = dist.get_world_size(), dist.get_rank()
    g = dist.new_group(timeout=datetime.timedelta(seconds=1))
    if n > 1 and r > 0:  # rank 0 never joins
        w = dist.all_reduce(torch.ones(2), group=g, async_op=True)
        fut = w.get_future()
        with pytest.raises(dist.DistBackendError, match=r" Timed out after 1 s "):
            w.wait()
        assert isinstance(w.exception(), dist.DistBackendError) and not w.is_success()
        with pytest.raises(RuntimeError, match="Timed out"):
            fut.wait()
    dist.destroy_process_group(g)
    dist.barrier()


def test_fork_drains_the_engine_first() -> None:
    start()
    r = dist.get_rank()
    t = torch.full((4,), r + 1.0)
    w = dist.all_reduce(t, async_op=True)
    pid = os.fork()
    if pid == 0:  # the child: an empty engine, no thread; it leaves at once
        os._exit(0 if not ENGINE.busy() and ENGINE._threads == 0 else 1)
    assert w.is_completed()  # drained before the fork
    assert os.waitpid(pid, 0)[1] == 0


def sparse_input(rank: int, dense: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """Rank ``rank``'s sparse (8, 5, *dense) tensor: rank + 1 non-zeros (none on rank 2),
    some at indices other ranks also use, one index twice (uncoalesced)."""
    g = torch.Generator().manual_seed(rank)
    nnz = 0 if rank == 2 else rank + 1
    idx = torch.stack([torch.randint(0, 8, (nnz,), generator=g), torch.randint(0, 5, (nnz,), generator=g)])
    if nnz:
        idx = torch.cat([idx, idx[:, :1]], 1)
    values = (torch.arange(idx.shape[1] * int(np.prod(dense)), dtype=torch.float64)
              .reshape(idx.shape[1], *dense) + rank).to(dtype)
    return torch.sparse_coo_tensor(idx, values, (8, 5, *dense))


@pytest.mark.parametrize(("dense", "dtype"), [((), torch.float32), ((3,), torch.float64),
                                              ((2, 2), torch.int64), ((), torch.bfloat16)])
def test_sparse_all_reduce_sums_as_gloo(pg: PG, dense: tuple[int, ...], dtype: torch.dtype) -> None:
    ins = [sparse_input(q, dense, dtype) for q in range(pg.size)]
    t = ins[pg.rank].clone()
    dist.all_reduce(t, group=pg.pg)
    assert t.is_sparse and t.is_coalesced()
    expected = sum(x.to_dense().to(torch.float64) for x in ins)
    assert torch.equal(t.to_dense().to(torch.float64), expected.to(dtype).to(torch.float64))
    mine = t.to_dense()
    every = [torch.empty_like(mine) for _ in range(pg.size)]
    dist.all_gather(every, mine, group=pg.pg)
    assert all(torch.equal(x, mine) for x in every)  # the same bits on every rank


def test_sparse_all_reduce_checks_before_sending(pg: PG) -> None:
    t = sparse_input(pg.rank, (), torch.float32)
    with pytest.raises(ValueError, match="expected op SUM for a sparse tensor"):
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=pg.pg)
    if pg.size > 1:
        bad = torch.sparse_coo_tensor(torch.zeros(2, 0, dtype=torch.int64), torch.zeros(0),
                                      (8, 5 + (pg.rank == pg.size - 1)))
        with pytest.raises(ValueError, match=r"expected sparse tensors of one size"):
            dist.all_reduce(bad, group=pg.pg)
    dist.barrier(group=pg.pg)
