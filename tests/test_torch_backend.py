"""torch.distributed's collectives on the backend "fcoll", checked as torch's own suites
check their backends (test_c10d_gloo.py, distributed_test.py; ../shared/SEEDS.md): expected
values from rank and size, on the default group, ``new_group()`` and a non-contiguous
``new_group``, every ReduceOp, torch's dtypes bit-exact, outputs written in place."""

from __future__ import annotations

import datetime
import math
import re
from functools import reduce

import numpy as np
import pytest

import fcoll as fc
from tests.torch_pg import PG, dist, group, torch

# torch 2.13 renames all_gather_into_tensor and reduce_scatter_tensor (*_single); the old
# names are what code calls today
pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")


@pytest.fixture(params=["world", "full", "sub"])
def pg(request: pytest.FixtureRequest) -> PG:
    return group(request.param)


def t32(values: list[float]) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float32)


# SEEDS 2.2 simple_reduce_tests: (op, input on rank r, expected at size n)
SIMPLE = {
    "SUM": (lambda r: r + 1.0, lambda n: n * (n + 1) / 2),
    "PRODUCT": (lambda r: r + 1.0, lambda n: float(math.factorial(n))),
    "MIN": (lambda r: r + 1.0, lambda n: 1.0),
    "MAX": (lambda r: r + 1.0, lambda n: float(n)),
    "AVG": (lambda r: r + 1.0, lambda n: (n + 1) / 2),
}


@pytest.mark.parametrize("op", sorted(SIMPLE))
def test_all_reduce_ops(pg: PG, op: str) -> None:
    given, expected = SIMPLE[op]
    t = t32([given(pg.rank)] * 3)
    ptr = t.data_ptr()
    assert dist.all_reduce(t, getattr(dist.ReduceOp, op), group=pg.pg) is None
    assert t.tolist() == [expected(pg.size)] * 3 and t.data_ptr() == ptr


@pytest.mark.parametrize("op", ["BAND", "BOR", "BXOR"])
def test_all_reduce_bitwise(pg: PG, op: str) -> None:
    fold = {"BAND": np.bitwise_and, "BOR": np.bitwise_or, "BXOR": np.bitwise_xor}[op]
    for i in range(4):
        mine = reduce(fold, [pg.rank * (i + 1) + j for j in range(i + 1)]) if op != "BAND" \
            else pg.rank | (1 << i)
        everyone = [reduce(fold, [r * (i + 1) + j for j in range(i + 1)]) if op != "BAND"
                    else r | (1 << i) for r in range(pg.size)]
        t = torch.tensor([mine], dtype=torch.int32)
        dist.all_reduce(t, getattr(dist.ReduceOp, op), group=pg.pg)
        assert t.item() == reduce(fold, everyone)


def test_all_reduce_premul_sum_and_complex(pg: PG) -> None:
    t = t32([pg.rank + 1.0])
    dist.all_reduce(t, dist._make_nccl_premul_sum(2.0), group=pg.pg)
    assert t.item() == pg.size * (pg.size + 1)
    c = torch.tensor([(pg.rank + 1) * (1 + 1j)], dtype=torch.complex64)
    dist.all_reduce(c, dist.ReduceOp.AVG, group=pg.pg)
    assert c.item() == (pg.size + 1) / 2 * (1 + 1j)


@pytest.mark.parametrize("dtype", [torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32,
                                   torch.int64, torch.float16, torch.bfloat16, torch.float32,
                                   torch.float64, torch.complex64, torch.complex128])
def test_all_reduce_dtypes(pg: PG, dtype: torch.dtype) -> None:
    t = (torch.arange(6) % 3 + pg.rank).to(dtype)
    dist.all_reduce(t, group=pg.pg)
    rows = [(torch.arange(6) % 3 + r).to(dtype) for r in range(pg.size)]
    expected = reduce(torch.logical_or, rows) if dtype == torch.bool else sum(rows)
    assert t.dtype == dtype and torch.equal(t, expected.to(dtype))


def test_all_reduce_master_worker_and_strided(pg: PG) -> None:
    for src in range(pg.size):  # SEEDS 2.5: 2 on src, 10 elsewhere, shape (src+1)^3
        t = torch.full((src + 1,) * 3, 2.0 if pg.rank == src else 10.0)
        dist.all_reduce(t, group=pg.pg)
        assert torch.all(t == 2 + 10 * (pg.size - 1))
    base = torch.zeros(4, 6)
    view = base.t()[::2]  # not contiguous: fcoll's result is copied in
    view.fill_(pg.rank + 1.0)
    dist.all_reduce(view, group=pg.pg)
    assert torch.all(view == pg.size * (pg.size + 1) / 2) and base.sum() == view.sum()


# SEEDS 2.6: broadcast values, bit-exact
BROADCAST = {torch.float32: -1e-10, torch.float64: -1e-100, torch.int8: -2, torch.uint8: 129,
             torch.int32: -100000, torch.int64: -10**15, torch.float16: -0.1,
             torch.bfloat16: -0.1, torch.bool: True, torch.complex64: 1 - 2j}


@pytest.mark.parametrize("dtype", list(BROADCAST), ids=str)
def test_broadcast(pg: PG, dtype: torch.dtype) -> None:
    for src in range(pg.size):
        value = torch.tensor([BROADCAST[dtype]] * 5, dtype=dtype)
        t = value.clone() if pg.rank == src else torch.zeros(5, dtype=dtype)
        dist.broadcast(t, dist.get_global_rank(pg.pg, src) if pg.pg else src, group=pg.pg)
        assert torch.equal(t, value)


def test_reduce(pg: PG) -> None:
    for dst in range(pg.size):
        t = t32([pg.rank + 1.0, 2.0])
        dist.reduce(t, dist.get_global_rank(pg.pg, dst) if pg.pg else dst, dist.ReduceOp.MAX,
                    group=pg.pg)
        assert t.tolist() == ([float(pg.size), 2.0] if pg.rank == dst else [pg.rank + 1.0, 2.0])


def test_all_gather(pg: PG) -> None:
    n = pg.size
    outs = [torch.empty(2, 3) for _ in range(n)]
    dist.all_gather(outs, torch.full((2, 3), float(pg.rank)), group=pg.pg)
    assert all(torch.all(o == i) for i, o in enumerate(outs))
    single = torch.empty(n, 2, 3, dtype=torch.bfloat16)
    ptr = single.data_ptr()
    dist.all_gather_into_tensor(single, torch.full((2, 3), pg.rank, dtype=torch.bfloat16),
                                group=pg.pg)
    assert single.data_ptr() == ptr and all(torch.all(single[i] == i) for i in range(n))
    flat = torch.empty(2 * n, 3, dtype=torch.int64)
    dist.all_gather_into_tensor(flat, torch.full((2, 3), pg.rank), group=pg.pg)
    assert flat[::2, 0].tolist() == list(range(n))


def test_all_gather_uneven_list(pg: PG) -> None:
    outs = [torch.empty(r + 1) for r in range(pg.size)]
    dist.all_gather(outs, torch.full((pg.rank + 1,), float(pg.rank)), group=pg.pg)
    assert all(o.tolist() == [float(r)] * (r + 1) for r, o in enumerate(outs))


@pytest.mark.parametrize("op", ["SUM", "AVG", "PREMUL"])
def test_reduce_scatter(pg: PG, op: str) -> None:
    n, r = pg.size, pg.rank
    rop = dist._make_nccl_premul_sum(0.5) if op == "PREMUL" else getattr(dist.ReduceOp, op)
    scale = {"SUM": 1.0, "AVG": 1.0 / n, "PREMUL": 0.5}[op]
    out = torch.empty(2, 3)
    dist.reduce_scatter(out, [torch.full((2, 3), float(i + r)) for i in range(n)], rop, group=pg.pg)
    assert torch.allclose(out, torch.full((2, 3), scale * (n * r + n * (n - 1) / 2)))
    x = torch.arange(4.0 * n).reshape(2 * n, 2) + r
    single = torch.empty(2, 2)
    dist.reduce_scatter_tensor(single, x, rop, group=pg.pg)
    expected = sum(torch.arange(4.0 * n).reshape(2 * n, 2)[2 * r : 2 * r + 2] + q for q in range(n))
    assert torch.allclose(single, scale * expected)


def test_all_to_all(pg: PG) -> None:
    n, r = pg.size, pg.rank
    outs = [torch.empty(i + 1, dtype=torch.int64) for i in range(n)]  # rank i sends i + 1 here
    dist.all_to_all(outs, [torch.full((r + 1,), 10 * r + i) for i in range(n)], group=pg.pg)
    assert [o.tolist() for o in outs] == [[10 * i + r] * (i + 1) for i in range(n)]
    even = torch.empty(2 * n)
    dist.all_to_all_single(even, torch.arange(2.0 * n) + 100 * r, group=pg.pg)
    assert even.tolist() == [100.0 * i + 2 * r + k for i in range(n) for k in range(2)]
    ins = [i + 1 for i in range(n)]  # uneven: rank r sends i + 1 rows to rank i
    uneven = torch.empty((r + 1) * n, 2)
    x = torch.cat([torch.full((i + 1, 2), 10.0 * r + i) for i in range(n)])
    dist.all_to_all_single(uneven, x, [r + 1] * n, ins, group=pg.pg)
    assert uneven[:, 0].tolist() == [10.0 * i + r for i in range(n) for _ in range(r + 1)]


def test_gather_scatter(pg: PG) -> None:
    n, r = pg.size, pg.rank
    for root in range(n):
        dst = dist.get_global_rank(pg.pg, root) if pg.pg else root
        outs = [torch.empty(3) for _ in range(n)] if r == root else None
        dist.gather(torch.full((3,), r * 1.0), outs, dst=dst, group=pg.pg)
        if r == root:
            assert [o[0].item() for o in outs] == [float(i) for i in range(n)]
        t = torch.empty(2, dtype=torch.int32)
        chunks = [torch.full((2,), 7 * i, dtype=torch.int32) for i in range(n)] if r == root else None
        dist.scatter(t, chunks, src=dst, group=pg.pg)
        assert t.tolist() == [7 * r] * 2


def test_point_to_point(pg: PG) -> None:
    n, r = pg.size, pg.rank
    to, of = (r + 1) % n, (r - 1) % n
    glob = (lambda q: dist.get_global_rank(pg.pg, q)) if pg.pg else (lambda q: q)
    got = torch.empty(3, dtype=torch.float16)
    ops = [dist.P2POp(dist.isend, torch.full((3,), float(r), dtype=torch.float16), glob(to), pg.pg),
           dist.P2POp(dist.irecv, got, glob(of), pg.pg)]
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    assert got.tolist() == [float(of)] * 3
    if r == 0:  # from any rank: recv returns the sender's global rank
        senders = []
        for _ in range(n - 1):
            t = torch.empty(1, dtype=torch.int64)
            source = dist.recv(t, group=pg.pg)
            assert source == glob(int(t.item()))
            senders.append(int(t.item()))
        assert sorted(senders) == list(range(1, n))
    else:
        dist.send(torch.tensor([r]), glob(0), group=pg.pg)
    dist.barrier(group=pg.pg)


def test_the_group_is_its_own_backend_per_device(pg: PG) -> None:
    """torch 2.14's batch_isend_irecv asks the group for its backend on the tensors' device
    and reads ``supports_coalescing`` (a Python group's base method raises there)."""
    group = pg.pg if pg.pg is not None else dist.distributed_c10d._get_default_group()
    for device in (torch.device("cpu"), torch.device("cuda")):
        backend = group._get_backend(device)
        assert backend is group and backend.supports_coalescing is False
        assert backend.supports_splitting is False


def test_coalesced(pg: PG) -> None:
    n, r = pg.size, pg.rank
    ts = [t32([r + 1.0]), t32([r + 2.0, 0.0])]
    dist.all_reduce_coalesced(ts, dist.ReduceOp.MAX, group=pg.pg)
    assert ts[0].item() == n and ts[1].tolist() == [n + 1.0, 0.0]
    from torch.distributed.distributed_c10d import _coalescing_manager

    xs = [t32([r * 1.0, 1.0]), t32([2.0])]
    with _coalescing_manager(group=pg.pg):
        for x in xs:
            dist.all_reduce(x, group=pg.pg)
    assert xs[0].tolist() == [n * (n - 1) / 2, float(n)] and xs[1].item() == 2.0 * n
    outs = [torch.empty(n), torch.empty(2 * n)]
    with _coalescing_manager(group=pg.pg):
        for out, k in zip(outs, (1, 2), strict=True):
            dist.all_gather_into_tensor(out, torch.full((k,), float(r)), group=pg.pg)
    assert outs[1].tolist() == [float(q) for q in range(n) for _ in range(2)]


def test_object_collectives(pg: PG) -> None:
    n, r = pg.size, pg.rank
    got: list[object] = [None] * n
    dist.all_gather_object(got, {"rank": r, "data": list(range(r))}, group=pg.pg)
    assert got == [{"rank": q, "data": list(range(q))} for q in range(n)]
    root = dist.get_global_rank(pg.pg, n - 1) if pg.pg else n - 1
    objs: list[object] = [("from", n - 1)] if r == n - 1 else [None]
    dist.broadcast_object_list(objs, src=root, group=pg.pg)
    assert objs == [("from", n - 1)]
    out: list[object] = [None]
    dist.scatter_object_list(out, [q * "x" for q in range(n)] if r == n - 1 else None, src=root,
                             group=pg.pg)
    assert out == [r * "x"]


def test_async_work_and_future(pg: PG) -> None:
    t = t32([pg.rank + 1.0])
    w = dist.all_reduce(t, group=pg.pg, async_op=True)  # queued on the engine
    assert w.wait() and w.is_completed() and w.is_success() and w.exception() is None
    fut = w.get_future().then(lambda f: f.value()[0] * 2)
    assert fut.wait().item() == pg.size * (pg.size + 1)


def test_monitored_barrier(pg: PG) -> None:
    import fcoll.torch as ft

    ft.monitored_barrier(pg.pg, timeout=datetime.timedelta(seconds=60))
    # torch's own accepts gloo groups only (2.13, 2.14 alike): fcoll.torch puts its own in place
    dist.monitored_barrier(pg.pg, timeout=datetime.timedelta(seconds=60), wait_all_ranks=True)
    dist.monitored_barrier(pg.pg, 30.0)  # seconds, as torch takes them (with a warning)
    with pytest.raises(dist.DistBackendError, match=f"Rank {pg.rank} timed out in monitoredBarrier"):
        dist.monitored_barrier(pg.pg, datetime.timedelta(seconds=0))  # raises before sending


def test_wrong_outputs_raise_before_sending(pg: PG) -> None:
    n = pg.size
    with pytest.raises(ValueError, match=rf"all_gather_into_tensor: expected output_tensor to "
                                         rf"hold {3 * n} elements, got {3 * n + 1}"):
        dist.all_gather_into_tensor(torch.empty(3 * n + 1), torch.ones(3), group=pg.pg)
    with pytest.raises(TypeError, match=r"expected input of dtype torch\.float32 like output"):
        dist.reduce_scatter_tensor(torch.empty(2), torch.ones(2 * n, dtype=torch.float64),
                                   group=pg.pg)
    with pytest.raises(ValueError, match="expected tensor_list to hold"):
        dist.all_gather([torch.empty(1)] * (n + 1), torch.ones(1), group=pg.pg)
    with pytest.raises(TypeError, match="dtype fcoll supports"):
        dist.all_reduce(torch.ones(2).to(torch.float8_e4m3fn), group=pg.pg)
    t = t32([1.0])  # nothing was sent: the group still works
    dist.all_reduce(t, group=pg.pg)
    assert t.item() == n


def test_timeout_is_the_deadline() -> None:
    n, r = dist.get_world_size(), dist.get_rank()
    g = dist.new_group(timeout=datetime.timedelta(seconds=1))
    assert g.fcoll_group.timeout == 1.0 and dist.get_backend(g) == "fcoll"
    if n > 1 and r > 0:  # rank 0 never joins: torch's error, in torch's words
        words = (rf"\[fcoll\] all_reduce on group ranks {re.escape(str(list(range(n))))} "
                 rf"Timed out after 1 s \(call #\d+\): .*1 s deadline")
        with pytest.raises(dist.DistBackendError, match=words) as e:
            dist.all_reduce(torch.ones(1), group=g)
        assert isinstance(e.value.__cause__, fc.CollectiveTimeoutError)
    dist.destroy_process_group(g)
    dist.barrier()


def test_subgroups_and_destroy() -> None:
    n, r = dist.get_world_size(), dist.get_rank()
    odd = [list(range(1, n, 2))] if n > 1 else []
    mine, groups = dist.new_subgroups_by_enumeration([[q] for q in range(0, n, 2)] + odd)
    t = t32([r + 1.0])
    dist.all_reduce(t, group=mine)
    assert t.item() == (r + 1 if r % 2 == 0 else sum(q + 1 for q in range(1, n, 2)))
    fcoll_group = mine.fcoll_group
    dist.destroy_process_group(mine)
    assert not fcoll_group.usable
    with pytest.raises(ValueError, match="destroyed"):
        fc.all_reduce(np.ones(1), group=fcoll_group)
    for g in groups:
        if g is not mine:
            dist.destroy_process_group(g)


def test_flight_recorder_and_mismatch_checks(pg: PG) -> None:
    n, r = pg.size, pg.rank
    dist.all_gather_into_tensor(torch.empty(2 * n), torch.ones(2), group=pg.pg)
    key, _, op = fc.debug.record()[-1][:3]  # key: the group's ranks and its serial
    assert op == "all_gather_into_tensor" and key[0] == pg.members
    if n == 1:
        return
    fc.init(debug="detail")
    try:  # rank 0 passes another shape: every rank raises, nothing is sent
        with pytest.raises(fc.CollectiveMismatchError, match="made different calls"):
            dist.all_reduce(torch.ones(3 if r == 0 else 4), group=pg.pg)
    finally:
        fc.init(debug="off")
    t = torch.ones(2)
    dist.all_reduce(t, group=pg.pg)
    assert t.tolist() == [float(n)] * 2


def test_device_mesh_subgroups() -> None:
    from torch.distributed.device_mesh import init_device_mesh

    n, r = dist.get_world_size(), dist.get_rank()
    if n % 2:
        pytest.skip("a (2, n/2) mesh needs an even world size")
    mesh = init_device_mesh("cpu", (2, n // 2), mesh_dim_names=("dp", "tp"))
    for name, members in (("dp", [q for q in range(n) if q % (n // 2) == r % (n // 2)]),
                          ("tp", [q for q in range(n) if q // (n // 2) == r // (n // 2)])):
        pg = mesh.get_group(name)
        assert dist.get_backend(pg) == "fcoll" and pg.fcoll_group.ranks == tuple(members)
        t = t32([r + 1.0])
        dist.all_reduce(t, group=pg)
        assert t.item() == sum(q + 1 for q in members)


def test_contiguous_outputs_are_filled_without_a_copy(pg: PG, monkeypatch: pytest.MonkeyPatch) -> None:
    """The out= path: a contiguous CPU output is written by fcoll through its numpy view,
    never by copying a result in (`put` fails here if it is called)."""
    from fcoll.torch import _collectives

    def no_put(t: torch.Tensor, y: object) -> None:
        raise AssertionError("a result was copied into a contiguous CPU output")

    monkeypatch.setattr(_collectives, "put", no_put)
    n, r = pg.size, pg.rank
    t = t32([r + 1.0] * 3)
    dist.all_reduce(t, group=pg.pg)
    assert t.tolist() == [n * (n + 1) / 2] * 3
    b = torch.full((4,), r, dtype=torch.bfloat16)
    dist.broadcast(b, dist.get_global_rank(pg.pg, n - 1) if pg.pg else n - 1, group=pg.pg)
    assert b.tolist() == [n - 1.0] * 4
    out = torch.empty(2 * n)
    dist.all_gather_into_tensor(out, torch.full((2,), float(r)), group=pg.pg)
    assert out.tolist() == [float(q) for q in range(n) for _ in range(2)]
    block = torch.empty(2, dtype=torch.int64)
    dist.reduce_scatter_tensor(block, torch.arange(2 * n) + r, group=pg.pg)
    assert block.tolist() == [n * (2 * r + k) + n * (n - 1) // 2 for k in range(2)]
    swapped = torch.empty(n)
    dist.all_to_all_single(swapped, torch.arange(float(n)) + 10 * r, group=pg.pg)
    assert swapped.tolist() == [10.0 * q + r for q in range(n)]
