"""Point-to-point: send/recv (no template), tags, any source, isend/irecv,
batch_isend_irecv, permute_tensor; on groups with group ranks."""

from __future__ import annotations

import numpy as np
import pytest

import fcoll as fc
from fcoll.collectives.p2p import INLINE_LIMIT
from tests.helpers import ALL_DTYPES, bits, same_bits

SHAPES = [(), (0,), (3, 4), (INLINE_LIMIT // 8 + 5,)]  # the last one travels in two messages


@pytest.mark.smoke
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_send_recv_every_pair(group, shape):
    n, me = group.size, group.rank
    for sender in range(n):
        if me == sender:
            for peer in range(n):
                if peer != me:
                    fc.send(bits(group.members[me], shape, np.float64, salt=peer), peer, group.arg)
        else:
            got = fc.recv(sender, group.arg)
            assert same_bits(got, bits(group.members[sender], shape, np.float64, salt=me))


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
def test_send_recv_dtypes_and_layouts(group, dtype):
    if group.size < 2:
        pytest.skip("needs two ranks")
    base = bits(group.members[0], (6, 4), dtype)
    if group.rank == 0:
        fc.send(base[::2, 1:], 1, group.arg, tag=3)
        fc.send(np.asfortranarray(base), 1, group.arg, tag=4)
    elif group.rank == 1:
        assert same_bits(fc.recv(0, group.arg, tag=3), base[::2, 1:])
        assert same_bits(fc.recv(0, group.arg, tag=4), base)


def test_tags_select_messages(group):
    if group.size < 2:
        pytest.skip("needs two ranks")
    if group.rank == 0:
        for tag in (5, 1, 9):
            fc.send(np.full(3, tag), 1, group.arg, tag=tag)
    elif group.rank == 1:
        for tag in (9, 5, 1):  # received in another order than sent
            assert fc.recv(0, group.arg, tag=tag).tolist() == [tag] * 3


def test_any_source(group):
    n, me = group.size, group.rank
    senders = []
    for dst in range(n):
        if me != dst:
            fc.send(np.full(10, me), dst, group.arg)
            fc.send(np.full(10, me), dst, group.arg)
        else:
            for _ in range(n - 1):
                y, src = fc.recv(group=group.arg, return_source=True)
                assert (y == src).all()
                w = fc.irecv(group=group.arg)
                assert (w.wait() == w.source_rank()).all()
                senders += [src, w.source_rank()]
    everyone = fc.all_gather_object(senders, group.arg)
    flat = [s for part in everyone for s in part]
    assert all(flat.count(r) == 2 * (n - 1) for r in range(n))


@pytest.mark.smoke
def test_isend_irecv(group):
    n, me = group.size, group.rank
    x = np.full((2, 3), float(me))
    sends = [fc.isend(x, p, group.arg, tag=1) for p in range(n) if p != me]
    x[:] = -1  # isend copied x at the call
    recvs = {p: fc.irecv(p, group.arg, tag=1) for p in range(n) if p != me}
    for p, w in recvs.items():
        assert same_bits(w.wait(), np.full((2, 3), float(p))) and w.source_rank() == p
        assert w.is_completed()
    fc.wait_all(sends)
    assert all(s.is_completed() for s in sends)


@pytest.mark.smoke
def test_batch_ring_self_and_partial(group):
    n, me = group.size, group.rank
    ring = [fc.P2POp(fc.isend, np.full(4, me), (me + 1) % n, group.arg),
            fc.P2POp(fc.irecv, None, (me - 1) % n, group.arg)]
    _, got = [w.wait() for w in fc.batch_isend_irecv(ring)]
    assert got.tolist() == [(me - 1) % n] * 4
    pairs = [op for src in range(n) for op in (
        fc.P2POp(fc.irecv, None, src, group.arg, tag=2),
        fc.P2POp(fc.isend, np.full((src + 1,) * 2, src), src, group.arg, tag=2))]
    works = fc.batch_isend_irecv(pairs)
    for src in range(n):
        assert same_bits(works[2 * src].wait(), np.full((me + 1,) * 2, me))
    fc.wait_all(works)
    if n >= 3 and me in (1, 2):  # only ranks 1 and 2 exchange
        peer = 3 - me
        a, b = fc.batch_isend_irecv([fc.P2POp(fc.isend, np.array([me]), peer, group.arg),
                                     fc.P2POp(fc.irecv, None, peer, group.arg)])
        assert b.wait().tolist() == [peer] and a.wait() is None


def test_p2p_errors(group):
    with pytest.raises(ValueError, match=r"^Invalid ``op``"):
        fc.P2POp(fc.broadcast, np.ones(1), 0)
    with pytest.raises(ValueError, match=r"^Invalid ``p2p_op_list``"):
        fc.batch_isend_irecv([1, 2])
    with pytest.raises(ValueError, match=r"^Invalid ``p2p_op_list``"):
        fc.batch_isend_irecv([])
    with pytest.raises(TypeError, match="tensor=None for irecv"):
        fc.P2POp(fc.irecv, np.ones(1), 0)
    me = group.rank
    with pytest.raises(ValueError, match="All ops need to use the same group"):
        fc.batch_isend_irecv([fc.P2POp(fc.irecv, None, 0), fc.P2POp(fc.irecv, None, 0, [0])])
    with pytest.raises(ValueError, match="other than this rank"):
        fc.send(np.ones(1), me, group.arg)
    with pytest.raises(ValueError, match="other than this rank"):
        fc.recv(me, group.arg)
    with pytest.raises(ValueError, match="invalid root rank"):
        fc.send(np.ones(1), group.size, group.arg)
    with pytest.raises(ValueError, match="expected tag"):
        fc.isend(np.ones(1), me, group.arg, tag=-1)
    with pytest.raises(TypeError, match=r"numpy\.ndarray"):
        fc.isend([1.0], 0, group.arg)


@pytest.mark.parametrize("shape", [(), (3,), (2, 3, 4)], ids=str)
def test_permute_tensor(group, shape):
    n, me = group.size, group.rank
    x = bits(group.members[me], shape, np.int16)
    shift = [(i + 1) % n for i in range(n)]
    assert same_bits(fc.permute_tensor(x, shift, group.arg),
                     bits(group.members[(me - 1) % n], shape, np.int16))
    partial = [None] * n
    partial[0] = n - 1  # only rank 0 sends, to the last rank
    got = fc.permute_tensor(x, partial, group.arg)
    expected = bits(group.members[0], shape, np.int16) if me == n - 1 else np.zeros(shape, np.int16)
    assert same_bits(got, expected)
    if n > 1:
        with pytest.raises(ValueError, match="at most one rank"):
            fc.permute_tensor(x, [0] * n, group.arg)
    with pytest.raises(ValueError, match=r"expected src_dst to have \d+ entries"):
        fc.permute_tensor(x, [0] * (n + 1), group.arg)
