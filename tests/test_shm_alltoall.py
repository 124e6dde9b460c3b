"""all_to_all_single (even and uneven splits) and all_to_all through on-node shared memory
(fcoll/backends/shm_alltoall.py, the compiled core's alltoall and alltoallv): the same bytes as
MPI (FCOLL_SHM=0) for every dtype, shape and layout with FCOLL_SHM=1, on every group kind;
messages over several steps; the default group's fast path taking one step; ranks that
disagree raising on every rank, the group usable after; words that cannot carry the metadata
(many dims, dtypes that differ) falling back alike on every rank."""

from __future__ import annotations

import math

import numpy as np
import pytest

import fcoll as fc
from fcoll.backends import native, shm, shm_alltoall
from fcoll.collectives import _alltoall
from fcoll.groups.group import resolve_group
from tests.helpers import ALL_DTYPES, bits, same_bits
from tests.test_shm import _both, _set, forced  # noqa: F401  (the fixture)

ROWS = [0, 1, 3]  # rows per block


def _blocks(n: int, rank: int, rows: int, dtype, tail=(2,), salt: int = 0) -> np.ndarray:
    return bits(rank, (n * rows, *tail), dtype, salt)


def _uneven(n: int, p: int, scale: int = 1) -> list[int]:
    """Rank p's input split sizes: differ by rank and by destination, some zero."""
    return [(p + 2 * j) % 3 * scale for j in range(n)]


def _taken(group) -> int:
    seg = resolve_group(group.arg, "test").shm
    return seg.taken if seg else 0


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
def test_even_splits_are_bit_identical(group, forced, dtype):  # noqa: F811
    n = group.size
    for rows in ROWS:
        for tail in ((), (2,), (0, 3)):
            x = _blocks(n, group.rank, rows, dtype, tail)
            mpi, on_node = _both(fc.all_to_all_single, x, group=group.arg)
            truth = np.concatenate([np.split(_blocks(n, p, rows, dtype, tail), n)[group.rank]
                                    for p in range(n)])
            assert same_bits(mpi, on_node) and same_bits(on_node, truth), (rows, tail)


def test_layouts(group, forced):  # noqa: F811
    """Non-contiguous, Fortran-ordered and read-only inputs; the into form."""
    n = group.size
    base = bits(group.rank, (4 * n, 6), np.float64, salt=4)
    for x in (base[::2, ::2], np.asfortranarray(base)):
        x.flags.writeable = False
        mpi, on_node = _both(fc.all_to_all_single, x, group=group.arg)
        assert same_bits(mpi, on_node) and on_node.flags.c_contiguous
        assert not np.shares_memory(on_node, x)


@pytest.mark.parametrize("dtype", [np.float32, np.int8, np.complex128, np.bool_], ids=str)
@pytest.mark.parametrize("given", ["both", "inputs"])
def test_uneven_splits_are_bit_identical(group, forced, dtype, given):  # noqa: F811
    n, r = group.size, group.rank
    for scale in (1, 5):
        ins = _uneven(n, r, scale)
        outs = [_uneven(n, p, scale)[r] for p in range(n)]
        x = bits(r, (sum(ins), 3), dtype, salt=scale)
        args = (outs if given == "both" else None, ins)
        mpi, on_node = _both(fc.all_to_all_single, x, *args, group=group.arg)
        parts = [np.split(bits(p, (sum(_uneven(n, p, scale)), 3), dtype, salt=scale),
                          np.cumsum(_uneven(n, p, scale))[:-1])[r] for p in range(n)]
        assert same_bits(mpi, on_node) and same_bits(on_node, np.concatenate(parts)), scale


@pytest.mark.parametrize("dtype", [np.float32, np.int8], ids=str)
def test_messages_over_several_steps(group, forced, dtype):  # noqa: F811
    """Blocks of 2.3 steps' pieces (`shm_alltoall.piece`), even and uneven."""
    n, r = group.size, group.rank
    rows = int(2.3 * shm_alltoall.piece(n, 1 << 40)) // np.dtype(dtype).itemsize
    x = _blocks(n, r, rows, dtype, (), salt=7)
    mpi, on_node = _both(fc.all_to_all_single, x, group=group.arg)
    assert same_bits(mpi, on_node)
    ins = _uneven(n, r, rows // 2)
    x = bits(r, (sum(ins),), dtype, salt=8)
    mpi, on_node = _both(fc.all_to_all_single, x, None, ins, group=group.arg)
    assert same_bits(mpi, on_node)


def test_lists_are_bit_identical(group, forced):  # noqa: F811
    """Chunks of different shapes (0-d, empty, 6-d) per destination, aligned in the result."""
    n, r = group.size, group.rank
    for ndim_extra in (0, 4):
        def shape(p: int, j: int, extra: int = ndim_extra) -> tuple[int, ...]:
            return (() if (p + j) % 4 == 3 else ((p + j) % 3, j + 1)) + (1,) * extra
        chunks = [bits(r, shape(r, j), np.int16, salt=j) for j in range(n)]
        mpi, on_node = _both(fc.all_to_all, chunks, group=group.arg)
        assert len(on_node) == n
        for p in range(n):
            truth = bits(p, shape(p, r), np.int16, salt=r)
            assert same_bits(mpi[p], on_node[p]) and same_bits(on_node[p], truth), (p, ndim_extra)
            assert on_node[p].flags.aligned


def test_the_default_groups_fast_path_takes_one_step(world_size, rank, forced, monkeypatch):  # noqa: F811
    """Once the world's segment exists, an even all_to_all_single of the default group takes
    one step from the fast path, without the full path (the compiled core running)."""
    if world_size == 1:
        pytest.skip("needs two ranks")
    x = _blocks(world_size, rank, 5, np.float32, (3,), salt=2)
    fc.all_to_all_single(x)
    fc.all_to_all_single(x)  # learned (and swapped to the core's callable)
    seg = fc.world().shm
    if seg is None or seg.core is None:
        pytest.skip("the compiled core is not stepping (FCOLL_NATIVE=0)")
    monkeypatch.setattr(_alltoall, "even", lambda *a: pytest.fail("the full path"))
    truth = np.concatenate([np.split(_blocks(world_size, p, 5, np.float32, (3,), salt=2),
                                     world_size)[rank] for p in range(world_size)])
    for _ in range(3):  # both step parities
        steps = seg.step
        assert same_bits(fc.all_to_all_single(x), truth)
        assert seg.step == steps + 1


def test_every_form_takes_the_segment(group, forced):  # noqa: F811
    """Even, uneven and list calls all step the group's segment (where it has two ranks)."""
    n, r = group.size, group.rank
    fc.all_to_all_single(np.zeros(n), group=group.arg)  # the segment made
    before = _taken(group)
    y = fc.all_to_all_single(np.full(2 * n, r, np.int32), group=group.arg)
    assert (y == np.repeat(np.arange(n), 2)).all()
    ins = _uneven(n, r)
    fc.all_to_all_single(np.zeros(sum(ins)), None, ins, group=group.arg)
    fc.all_to_all([np.zeros(j) for j in range(n)], group=group.arg)
    assert (_taken(group) >= before + 5) == (n > 1)  # 1 + 2 + 2 steps


def test_disagreeing_splits_raise_on_every_rank(group, forced):  # noqa: F811
    n, r = group.size, group.rank
    if n == 1:
        pytest.skip("needs two ranks")
    ins = _uneven(n, r, 2)
    outs = [_uneven(n, p, 2)[r] for p in range(n)]
    wrong = list(outs)
    wrong[0] += 1 if r == n - 1 else 0
    x = np.ones((sum(ins), 2), np.float32)
    with pytest.raises(ValueError, match=f"rank {n - 1} expects output_split_sizes\\[0\\]"):
        fc.all_to_all_single(x, wrong, ins, group=group.arg)
    # rows of another shape or dtype on one rank: the pickled metadata names them
    y = x.astype(np.float64) if r == n - 1 else x
    with pytest.raises(ValueError, match="ranks disagree"):
        fc.all_to_all_single(y, outs, ins, group=group.arg)
    with pytest.raises(ValueError, match="one dtype"):
        fc.all_to_all([np.ones(2, np.int8 if r == 0 else np.int16) for _ in range(n)],
                      group=group.arg)
    with pytest.raises(fc.CollectiveMismatchError, match="differ in elements"):
        fc.all_to_all_single(np.ones(n * (1 if r == 0 else 2)), group=group.arg)
    y = fc.all_to_all_single(x, outs, ins, group=group.arg)  # the group still works
    assert y.shape == (sum(outs), 2) and (y == 1).all()


def test_the_size_window_under_the_default_setting(world_size, rank):
    """FCOLL_SHM unset, the core stepping: all-to-alls take the segment from the first byte up
    to the ceiling (n blocks of the largest; lower on an oversubscribed node), MPI from there,
    the same choice on every rank: uneven calls choose after their words' step."""
    from fcoll import runtime
    from fcoll.backends import native

    if world_size == 1 or shm.settings()[0] != "auto" or not native.running():
        pytest.skip("needs two ranks, the default setting and the compiled core")
    top = shm.ceiling("all_to_all")
    assert top == (shm.OVERSUBSCRIBED_MAX_BYTES if runtime.OVERSUBSCRIBED
                   else shm.NATIVE_MAX_BYTES)["all_to_all"]
    assert shm.limit(fc.world(), "all_to_all") == 0
    g = fc.new_group()
    try:
        fc.all_to_all_single(np.zeros(world_size), group=g)  # the segment made
        seg = g.shm
        below = (int(top) // 8 - 1) // world_size * world_size  # elements under the ceiling
        above = -(-int(top) // 8 // world_size) * world_size  # at or over it
        for count, through in ((world_size, True), (below, True), (above, False)):
            x = np.full(count, rank, np.float64)
            nbytes = x.nbytes
            before = seg.taken
            y = fc.all_to_all_single(x, group=g)
            assert (seg.taken > before) == through, nbytes
            assert (y == np.repeat(np.arange(world_size), x.size // world_size)).all()
            ins = [x.size // world_size] * world_size
            before = seg.taken
            y = fc.all_to_all_single(x, ins, ins, group=g)
            steps = seg.taken - before  # the words' step, then the data's (MPI: none)
            assert (steps >= 2) if through else steps == 1, nbytes
            assert (y == np.repeat(np.arange(world_size), x.size // world_size)).all()
    finally:
        g.destroy()


def test_uneven_fast_path_takes_two_steps_and_grows(world_size, rank, forced, monkeypatch):  # noqa: F811
    """With the core stepping, a repeated uneven call of the default group is one C call from
    the fast path: its words' step and one data step, no full path; a later call too large
    for the segment grows it (every rank alike) and still needs no full path; sizes that are
    wrong on every rank fall through to the full path's errors."""
    if world_size == 1:
        pytest.skip("needs two ranks")
    ins = _uneven(world_size, rank)
    outs = [_uneven(world_size, p)[rank] for p in range(world_size)]
    x = bits(rank, (sum(ins), 2), np.float64, salt=11)
    first = fc.all_to_all_single(x, outs, ins)
    fc.all_to_all_single(x, outs, ins)  # learned
    seg = fc.world().shm
    if seg is None or seg.core is None:
        pytest.skip("the compiled core is not stepping (FCOLL_NATIVE=0)")
    monkeypatch.setattr(_alltoall, "uneven", lambda *a: pytest.fail("the full path"))
    for _ in range(3):  # both step parities
        steps = seg.step
        assert same_bits(fc.all_to_all_single(x, outs, ins), first)
        assert fc.all_to_all_single(x, None, ins).shape == first.shape
        assert seg.step == steps + 4
    scale = seg.capacity // 16 + 1  # rows of 16 bytes: blocks larger than the segment
    big_ins = _uneven(world_size, rank, scale)
    big = bits(rank, (sum(big_ins), 2), np.float64, salt=12)
    y = fc.all_to_all_single(big, None, big_ins)
    parts = [np.split(bits(p, (sum(_uneven(world_size, p, scale)), 2), np.float64, salt=12),
                      np.cumsum(_uneven(world_size, p, scale))[:-1])[rank] for p in range(world_size)]
    assert same_bits(y, np.concatenate(parts))
    monkeypatch.undo()
    with pytest.raises(ValueError, match="sum\\(input_split_sizes\\)"):
        fc.all_to_all_single(x, outs, [s + 1 for s in ins])
    with pytest.raises(TypeError, match="list of ints"):
        fc.all_to_all_single(x, outs, [float(s) for s in ins])


def test_lists_fast_path_takes_two_steps(world_size, rank, forced, monkeypatch):  # noqa: F811
    """With the core stepping, a repeated all_to_all of the default group is one C call from
    the fast path (two steps), without the full path; a list it does not take (another
    dtype, a wrong length) goes the full path, which checks it."""
    if world_size == 1:
        pytest.skip("needs two ranks")
    chunks = [bits(rank, (j + 1, 2), np.float32, salt=j) for j in range(world_size)]
    first = fc.all_to_all(chunks)
    fc.all_to_all(chunks)  # learned
    seg = fc.world().shm
    if seg is None or seg.core is None:
        pytest.skip("the compiled core is not stepping (FCOLL_NATIVE=0)")
    monkeypatch.setattr(_alltoall, "lists", lambda *a: pytest.fail("the full path"))
    for _ in range(3):
        steps = seg.step
        got = fc.all_to_all(chunks)
        assert all(same_bits(a, b) for a, b in zip(got, first, strict=True))
        assert seg.step == steps + 2
    monkeypatch.undo()
    with pytest.raises(ValueError, match="to hold"):
        fc.all_to_all(chunks[:-1])
    got = fc.all_to_all([c.view(np.int32) for c in chunks])  # another dtype: its own path
    assert all(same_bits(a, b.view(np.int32)) for a, b in zip(got, first, strict=True))


def test_fast_paths_count_and_record_their_own_calls(world_size, rank, forced):  # noqa: F811
    """The uneven and list fast paths count each call once and record it in the flight
    recorder themselves: an earlier call's record (the full path's) keeps its end time."""
    from fcoll.diagnostics import flight

    if world_size == 1 or not flight.RING:
        pytest.skip("needs two ranks and the flight recorder")
    ins = _uneven(world_size, rank)
    outs = [_uneven(world_size, p)[rank] for p in range(world_size)]
    x = bits(rank, (sum(ins), 2), np.float64, salt=13)
    chunks = [bits(rank, (j + 1, 2), np.float32, salt=j) for j in range(world_size)]
    fc.all_to_all_single(x, outs, ins)
    fc.all_to_all(chunks)  # both learned
    g = fc.world()
    if g.shm is None or g.shm.core is None:
        pytest.skip("the compiled core is not stepping (FCOLL_NATIVE=0)")
    ring, slot, seq = flight.RING, g.call.slot, g.seq
    assert slot >= 0
    end = ring.ends[slot]
    for _ in range(3):
        fc.all_to_all_single(x, outs, ins)
        fc.all_to_all(chunks)
    assert ring.ends[slot] == end and g.seq == seq + 6
    last = ring.calls[(ring.pos[0] - 1) & ring.mask]
    assert last[1] == g.seq and last[2] == "all_to_all" and ring.ends[(ring.pos[0] - 1) & ring.mask] > 0


def _direct_core(world_size):
    """The world's core where it reads blocks directly, else skip."""
    if world_size == 1:
        pytest.skip("needs two ranks")
    seg = fc.world().shm
    if seg is None or seg.core is None:
        pytest.skip("the compiled core is not stepping (FCOLL_NATIVE=0)")
    if not seg.core.direct:
        pytest.skip("no direct reads here (FCOLL_SHM_DIRECT=0, or not Linux)")
    return seg


def test_large_blocks_are_read_directly(world_size, rank, forced):  # noqa: F811
    """From 64 KiB in the largest block an all-to-all reads each peer's block straight from
    its input: two steps whatever the size (the segment's steps: one per piece), the same
    bits as the segment's steps (direct = 0, every rank) and as MPI's, even and uneven."""
    n = world_size
    rows = 3 * (1 << 20) // 8 // max(n, 1) + 5  # blocks of ~3 MiB / n (several pieces)
    x = _blocks(n, rank, rows, np.float64, (), salt=21)
    mpi, _ = _both(fc.all_to_all_single, x)
    seg = _direct_core(world_size)
    ins = _uneven(n, rank, rows)
    u = bits(rank, (sum(ins),), np.float64, salt=22)
    _set("0")
    mpi_u = fc.all_to_all_single(u, None, ins)
    _set("1")
    fc.all_to_all_single(u, None, ins)  # grown for it
    for direct, steps in ((1, 2), (0, math.ceil(rows * 8 / shm_alltoall.piece(n, rows * 8)))):
        seg.core.direct = direct
        try:
            before = seg.step
            assert same_bits(fc.all_to_all_single(x), mpi)
            assert seg.step == before + steps
            assert same_bits(fc.all_to_all_single(u, None, ins), mpi_u)
        finally:
            seg.core.direct = 1


def test_failed_direct_reads_fall_back_on_every_rank(world_size, rank, forced):  # noqa: F811
    """Where one rank's direct reads fail (direct = 2 there), every rank takes the segment's
    steps after the two direct steps, with the same bits; where ranks are configured apart
    (one reads directly, one does not) both raise CollectiveMismatchError, none reads
    garbage, and the group works after."""
    n = world_size
    rows = (1 << 17) // 8 + 3
    x = _blocks(n, rank, rows, np.float64, (), salt=23)
    mpi, _ = _both(fc.all_to_all_single, x)
    seg = _direct_core(world_size)
    pieces = math.ceil(rows * 8 / shm_alltoall.piece(n, rows * 8))
    try:
        seg.core.direct = 2 if rank == n - 1 else 1
        before = seg.step
        assert same_bits(fc.all_to_all_single(x), mpi)
        assert seg.step == before + 2 + pieces
        assert seg.core.direct == 0  # tried once: off on every rank alike
        seg.core.direct = 0 if rank == 0 else 1
        with pytest.raises(fc.CollectiveMismatchError):
            fc.all_to_all_single(x)
    finally:
        seg.core.direct = 1
    assert same_bits(fc.all_to_all_single(x), mpi)


def test_steps_and_memory_per_rank(group, forced):  # noqa: F811
    """Messages are the segment's steps: ceil(block / piece) for even splits, or 2 where the
    compiled core reads blocks of at least DIRECT_MIN bytes directly; one more (the words)
    for uneven ones, whatever p; the segment a rank keeps stays two slots of at most a chunk
    (`segment.CHUNK`) per rank, so its memory is O(p) per node, O(1) per rank."""
    from fcoll.backends.segment import CHUNK

    n = group.size
    if n == 1:
        pytest.skip("needs two ranks")
    g = resolve_group(group.arg, "test")
    for block in (64, 3 * shm_alltoall.piece(n, 1 << 40) + 8):
        x = np.zeros(n * block, np.uint8)
        fc.all_to_all_single(x, group=group.arg)  # the segment grown for it
        steps = math.ceil(block / shm_alltoall.piece(n, block))
        core = g.shm.core if g.shm else None
        if core is not None and core.direct == 1 and block >= native.module().DIRECT_MIN:
            steps = 2
        with fc.debug.traffic() as t:
            fc.all_to_all_single(x, group=group.arg)
        assert t.messages == steps, (block, t.messages)
        with fc.debug.traffic() as t:
            fc.all_to_all_single(x, [block] * n, [block] * n, group=group.arg)
        assert t.messages == steps + 1, (block, t.messages)
        assert g.shm.capacity <= CHUNK


def test_packed_chunks_in_c_and_numpy_agree(monkeypatch):
    """The compiled core's pack_chunks/unpack_chunks and the numpy path give the same bytes
    and the same chunks (0-d, empty, odd and even dims, 7-d); a non-contiguous chunk is left
    to numpy; a malformed buffer raises; another dtype's block comes back as bytes."""
    from fcoll.backends import native

    core = native.module()
    if core is None:
        pytest.skip("the compiled core is not built (or FCOLL_NATIVE=0)")
    chunks = [bits(0, s, np.float32, salt=i) for i, s in
              enumerate([(), (0,), (3,), (2, 5), (1, 2, 3), (0, 4), (1,) * 7])]
    monkeypatch.setattr(native, "running", lambda: False)
    buf, sizes = _alltoall._packed(chunks)
    want, codes = _alltoall._unpacked(buf, np.dtype(np.float32))
    c_buf, c_sizes = core.pack_chunks(chunks, _alltoall._code(np.dtype(np.float32)))
    assert sizes == c_sizes and same_bits(buf, c_buf) and len(set(codes)) == 1
    got, c_codes = core.unpack_chunks(c_buf, np.dtype(np.float32))
    assert c_codes == codes
    for a, b, c in zip(chunks, want, got, strict=True):
        assert same_bits(a, b) and same_bits(a, c) and c.flags.aligned and c.base is c_buf
    assert core.pack_chunks([np.zeros((4, 4))[:, ::2]], 1) is None
    with pytest.raises(ValueError, match="malformed"):
        core.unpack_chunks(c_buf[:20].copy(), np.dtype(np.float32))
    other, _ = core.unpack_chunks(c_buf, np.dtype(np.complex128))  # 12 bytes are no complex
    assert other[2].dtype == np.uint8 and other[2].nbytes == 12
