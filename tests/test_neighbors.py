"""sendrecv, Mesh.shift, halo_exchange and Group.from_comm, at every world size: expected
values computed from each rank's coordinate (every rank can build every rank's block)."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

import fcoll as fc
from fcoll.runtime import mpi
from tests.helpers import ALL_DTYPES, bits, same_bits

# --- sendrecv ---------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(), (0,), (3, 2), (5000,)], ids=str)  # 5000: separate data
def test_sendrecv_ring(group, dtype, shape):
    n, r = group.size, group.rank
    x = bits(r, shape, dtype, salt=1)
    before = x.copy()
    y = fc.sendrecv(x, (r + 1) % n, (r - 1) % n, group.arg)
    assert same_bits(y, bits((r - 1) % n, shape, dtype, salt=1))
    assert same_bits(x, before) and not np.shares_memory(x, y)


def test_sendrecv_shapes_differ_and_travel(group):
    """Each rank sends a block of its own shape and dtype: shape and dtype come with it."""
    n, r = group.size, group.rank

    def block(k: int) -> np.ndarray:
        return np.arange(k * 3000 * (k % 2) + k + 1, dtype=[np.int8, np.float32][k % 2])

    y = fc.sendrecv(block(r), (r - 1) % n, (r + 1) % n, group.arg, tag=7)
    assert same_bits(y, block((r + 1) % n))


@pytest.mark.parametrize("layout", ["strided", "fortran", "readonly"])
def test_sendrecv_layouts(group, layout):
    n, r = group.size, group.rank
    base = np.arange(48.0).reshape(6, 8) + 100 * r
    x = {"strided": base[::2, 1::3], "fortran": np.asfortranarray(base), "readonly": base}[layout]
    if layout == "readonly":
        x.flags.writeable = False
    y = fc.sendrecv(x, (r + 1) % n, (r - 1) % n, group.arg)
    expected = x - 100 * r + 100 * ((r - 1) % n)
    assert same_bits(y, np.ascontiguousarray(expected)) and y.flags.writeable


def test_sendrecv_proc_null_and_self(group):
    """A non-periodic shift: the ends send or receive nothing (``None``), as MPI.PROC_NULL."""
    n, r = group.size, group.rank
    x = np.array([r, r])
    y = fc.sendrecv(x, r + 1 if r + 1 < n else None, r - 1 if r > 0 else None, group.arg)
    assert (y is None) if r == 0 else y.tolist() == [r - 1] * 2
    assert same_bits(fc.sendrecv(x, r, r, group.arg), x)
    assert fc.sendrecv(x, None, None, group.arg) is None
    big = np.arange(20000) + r
    assert same_bits(fc.sendrecv(big, r, r, group.arg), big)


def test_sendrecv_pairs_with_send_and_recv(group):
    """sendrecv's messages are send's: a send/recv pair on one side, sendrecv on the other."""
    n, r = group.size, group.rank
    if n < 2:
        pytest.skip("needs two ranks")
    for size in (3, 4000):
        if r == 0:
            fc.send(np.arange(size), 1, group.arg, tag=3)
            assert same_bits(fc.recv(1, group.arg, tag=3), np.arange(size) * 2)
            work = fc.isend(np.arange(size) + 1, 1, group.arg, tag=4)  # isend: inline, any size
            assert same_bits(fc.recv(1, group.arg, tag=4), np.arange(size) - 1)
            work.wait()
        elif r == 1:
            assert same_bits(fc.sendrecv(np.arange(size) * 2, 0, 0, group.arg, tag=3),
                             np.arange(size))
            assert same_bits(fc.sendrecv(np.arange(size) - 1, 0, 0, group.arg, tag=4),
                             np.arange(size) + 1)


def test_sendrecv_errors(group):
    n = group.size
    with pytest.raises(ValueError, match=r"^sendrecv: invalid root rank: expected 0 <= dst"):
        fc.sendrecv(np.ones(1), n, 0, group.arg)
    with pytest.raises(TypeError, match=r"^sendrecv: expected src to be an int"):
        fc.sendrecv(np.ones(1), 0, 0.5, group.arg)
    with pytest.raises(TypeError, match=r"^sendrecv: expected x to be a numpy.ndarray"):
        fc.sendrecv([1.0], 0, 0, group.arg)
    with pytest.raises(ValueError, match=r"^sendrecv: expected tag"):
        fc.sendrecv(np.ones(1), 0, 0, group.arg, tag=-1)


def test_sendrecv_deadline():
    r, n = fc.get_rank(), fc.get_world_size()
    fc.init(timeout=30)
    try:
        assert fc.sendrecv(np.array([r]), (r + 1) % n, (r - 1) % n).tolist() == [(r - 1) % n]
        assert fc.sendrecv(np.arange(9000) + r, (r + 1) % n, (r - 1) % n)[0] == (r - 1) % n
    finally:
        fc.init(timeout=math.inf)


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(), (0,), (3, 2), (5000,)], ids=str)
def test_sendrecv_like_ring(group, dtype, shape):
    """like=: the data alone, into an array of like's shape and dtype (an array or a pair)."""
    n, r = group.size, group.rank
    x = bits(r, shape, dtype, salt=4)
    expected = bits((r - 1) % n, shape, dtype, salt=4)
    for like in (x, (shape, dtype), (shape, np.dtype(dtype))):
        y = fc.sendrecv(x, (r + 1) % n, (r - 1) % n, group.arg, like=like)
        assert same_bits(y, expected) and y.flags.c_contiguous and not np.shares_memory(x, y)


def test_sendrecv_like_layouts_self_and_proc_null(group):
    n, r = group.size, group.rank
    base = np.arange(48.0).reshape(6, 8) + 100 * r
    x = base[::2, 1::3]
    y = fc.sendrecv(x, (r + 1) % n, (r - 1) % n, group.arg, like=(x.shape, x.dtype))
    assert same_bits(y, np.ascontiguousarray(x - 100 * r + 100 * ((r - 1) % n)))
    assert same_bits(fc.sendrecv(x, r, r, group.arg, like=x), np.ascontiguousarray(x))
    end = fc.sendrecv(x, r + 1 if r + 1 < n else None, r - 1 if r > 0 else None, group.arg,
                      like=x)
    assert (end is None) if r == 0 else end[0, 0] == 100 * (r - 1) + 1
    assert fc.sendrecv(None, None, None, group.arg, like=x) is None


def test_sendrecv_like_and_headers_keep_apart(group):
    """On one tag, a header-free message and one with a header never match each other."""
    n, r = group.size, group.rank
    x = np.full(4, r, np.int32)
    work = fc.isend(np.full(7, r, np.int64), (r + 1) % n, group.arg, tag=5)
    y = fc.sendrecv(x, (r + 1) % n, (r - 1) % n, group.arg, tag=5, like=x)
    assert (y == (r - 1) % n).all() and y.dtype == np.int32
    z = fc.irecv((r - 1) % n, group.arg, tag=5).wait()  # irecv: the peer may be this rank
    work.wait()
    assert (z == (r - 1) % n).all() and z.shape == (7,)


@pytest.mark.parametrize("other", [3, 5, 4000], ids=["shorter", "longer", "much-longer"])
def test_sendrecv_like_of_another_size_raises_on_the_receiver(group, other):
    """The receiver of a message of another size raises ValueError (the sender does not);
    the group still works."""
    n, r = group.size, group.rank
    if n < 2:
        pytest.skip("needs two ranks")
    x = np.arange(other if r == 0 else 4, dtype=np.float64)  # rank 0 sends `other` elements
    like = (4,), np.float64
    if r == 1:
        with pytest.raises(ValueError, match="expected 32 bytes from group rank 0"):
            fc.sendrecv(None, None, 0, group.arg, like=like)
    elif r == 0:
        assert fc.sendrecv(x, 1, None, group.arg, like=like) is None
    y = fc.sendrecv(np.full(4, float(r)), (r + 1) % n, (r - 1) % n, group.arg, like=like)
    assert (y == (r - 1) % n).all()


def test_sendrecv_like_fast_path(group):
    """After one call with an array like=, later ones take the learned fast path (one
    MPI_Sendrecv, `fcoll.collectives._fast_p2p`): the full path's bits for C, Fortran-ordered
    and strided x (those fall through to the full path), a ValueError on the rank that
    receives a message of another size, and fc.init drops it."""
    from fcoll.collectives import _fast

    n, r = group.size, group.rank
    to, source = (r + 1) % n, (r - 1) % n
    key = _fast.key(group.arg, "like") if group.arg is not None else "like"
    x = np.arange(12.0).reshape(3, 4) + 100 * r
    before = dict(_fast.SENDRECV_LIKE)
    fc.sendrecv(x, to, source, group.arg, like=x)
    if key is None:  # a list of ranks: nothing learned
        assert before == _fast.SENDRECV_LIKE
        return
    learned, used = _fast.SENDRECV_LIKE[key], [0]

    def spy(*args):
        used[0] += 1
        return learned(*args)

    _fast.SENDRECV_LIKE[key] = spy
    try:
        for v in (x, np.asfortranarray(x), x[:, ::2], x.ravel()[::3], x[0, 0, ...]):
            y = fc.sendrecv(v, to, source, group.arg, like=np.empty(v.shape, v.dtype))
            assert same_bits(y, np.array(v - 100 * r + 100 * source, order="C"))
        assert used[0] == 5
        sent = np.arange(5.0 if r == 0 else 4.0)  # group rank 0 sends one more
        if source == 0:
            with pytest.raises(ValueError, match="expected 32 bytes from group rank 0"):
                fc.sendrecv(sent, to, source, group.arg, like=np.empty(4))
        else:
            assert (fc.sendrecv(sent, to, source, group.arg, like=np.empty(4)) == np.arange(4.0)).all()
        assert used[0] == 6
        y = fc.sendrecv(np.full(4, float(r)), to, source, group.arg, like=np.empty(4))
        assert (y == source).all()
    finally:
        _fast.SENDRECV_LIKE.pop(key, None)
    fc.sendrecv(x, to, source, group.arg, like=x)
    assert key in _fast.SENDRECV_LIKE
    fc.init()
    assert key not in _fast.SENDRECV_LIKE


def test_sendrecv_like_errors(group):
    x = np.ones(2)
    with pytest.raises(ValueError, match="expected like to be an array or a \\(shape, dtype\\)"):
        fc.sendrecv(x, 0, 0, group.arg, like=3)
    with pytest.raises(ValueError, match="expected like's shape to be a tuple of non-negative"):
        fc.sendrecv(x, 0, 0, group.arg, like=((-1,), np.float64))
    with pytest.raises(ValueError, match="expected like's dtype to be a numpy dtype"):
        fc.sendrecv(x, 0, 0, group.arg, like=((2,), "no-such-type"))
    with pytest.raises(TypeError, match="expected like to have a dtype in"):
        fc.sendrecv(x, 0, 0, group.arg, like=((2,), np.dtype("U3")))


def test_sendrecv_like_under_a_deadline():
    r, n = fc.get_rank(), fc.get_world_size()
    fc.init(timeout=30)
    try:
        x = np.arange(9000) + r
        assert fc.sendrecv(x, (r + 1) % n, (r - 1) % n, like=x)[0] == (r - 1) % n
        if n > 1:
            if r == 1:
                with pytest.raises(ValueError, match="expected 16 bytes from group rank 0"):
                    fc.sendrecv(None, None, 0, like=((2,), np.int64))
            elif r == 0:
                fc.sendrecv(np.arange(3), 1, None, like=((2,), np.int64))
    finally:
        fc.init(timeout=math.inf)


# --- Mesh.shift ---------------------------------------------------------------------------


def _shapes(n: int) -> list[tuple[int, ...]]:
    """Every way to lay ``n`` ranks on 1, 2 and 3 axes (1x1xn, 2x1x1, ...)."""
    out = []
    for ndim in (1, 2, 3):
        out += [s for s in itertools.product(range(1, n + 1), repeat=ndim) if math.prod(s) == n]
    return out


def test_shift_is_cart_shift():
    """Against MPI's own Cartesian topology, for every mesh shape, axis, disp and period."""
    comm = fc.world().comm("test")
    for shape in _shapes(comm.Get_size()):
        mesh = fc.Mesh(shape, tuple("zyx"[-len(shape):]))
        for periodic in (False, True):
            cart = comm.Create_cart(shape, periods=[periodic] * len(shape), reorder=False)
            for k, name in enumerate(mesh.names):
                for disp in (1, -1, 2):
                    src, dst = cart.Shift(k, disp)
                    got = mesh.shift(name, disp, periodic=periodic)
                    null = mpi().PROC_NULL
                    assert got == (None if src == null else src // _stride(shape, k) % shape[k],
                                   None if dst == null else dst // _stride(shape, k) % shape[k])
            cart.Free()


def _stride(shape: tuple[int, ...], k: int) -> int:
    return math.prod(shape[k + 1 :])


def test_shift_errors():
    mesh = fc.Mesh((fc.get_world_size(),), ("x",))
    with pytest.raises(ValueError, match="axis names"):
        mesh.shift("y")
    with pytest.raises(TypeError, match="disp"):
        mesh.shift("x", 1.5)
    with pytest.raises(TypeError, match="one axis name"):
        mesh.shift(("x",))


# --- halo_exchange -------------------------------------------------------------------------


def _grid(shape: tuple[int, ...], mesh_shape: tuple[int, ...], dims: list[int], salt: int = 0,
          dtype: str = "float64") -> np.ndarray:
    """The global array (every rank builds the same): distinct values per cell."""
    size = math.prod(shape)
    return (np.arange(size, dtype=np.float64).reshape(shape) * 1.5 + salt).astype(dtype)


def _bounds(length: int, parts: int, i: int) -> tuple[int, int]:
    """Rows of block ``i`` of ``length`` split into ``parts`` uneven blocks (earlier larger)."""
    base, extra = divmod(length, parts)
    start = i * base + min(i, extra)
    return start, start + base + (i < extra)


def _blocks(full, mesh_shape, coord, dims, widths, periodic):
    """This rank's block of ``full`` with ghost cells (x's ghosts: a sentinel), and the
    expected result: ghosts hold the neighbours' cells (wrapping if periodic), else the
    sentinel. Corners follow from taking the padded global array."""
    sentinel = -7.0
    index = [slice(None)] * full.ndim
    padded_full = full
    for k, d in enumerate(dims):
        w = widths[k]
        if periodic[k]:
            padded_full = np.concatenate([padded_full.take(range(-w, 0), d), padded_full,
                                          padded_full.take(range(w), d)], axis=d)
        else:
            shape = list(padded_full.shape)
            shape[d] = w
            edge = np.full(shape, sentinel, full.dtype)
            padded_full = np.concatenate([edge, padded_full, edge], axis=d)
    for k, d in enumerate(dims):
        a, b = _bounds(full.shape[d], mesh_shape[k], coord[k])
        index[d] = slice(a, b + 2 * widths[k])
    expected = padded_full[tuple(index)].copy()
    x = expected.copy()
    for k, d in enumerate(dims):
        w = widths[k]
        sl = [slice(None)] * x.ndim
        sl[d] = slice(0, w)
        x[tuple(sl)] = sentinel
        sl[d] = slice(x.shape[d] - w, x.shape[d])
        x[tuple(sl)] = sentinel
    # non-periodic domain edges keep x's (sentinel) values; corners there take the neighbour's
    return x, expected


CASES = [((30,), [0], [1], [False]), ((30,), [0], [2], [True]),
         ((13, 11), [0, 1], [1, 1], [False, False]), ((13, 11), [0, 1], [2, 1], [True, False]),
         ((9, 10), [1, 0], [1, 3], [False, True]),
         ((7, 8, 9), [0, 1, 2], [1, 1, 2], [False, True, False]),
         ((6, 9, 8), [2, 0, 1], [1, 2, 1], [True, True, True])]


def _mesh_shape(n: int, ndim: int) -> tuple[int, ...]:
    return {1: (n,), 2: (2, 2) if n == 4 else (n, 1), 3: (2, 2, 1) if n == 4 else (1, n, 1)}[ndim]


@pytest.mark.parametrize("shape,dims,widths,periodic", CASES,
                         ids=[f"{len(c[0])}d-{c[1]}-w{c[2]}-p{c[3]}" for c in CASES])
def test_halo_matches_the_padded_global_array(shape, dims, widths, periodic):
    n = fc.get_world_size()
    mesh = fc.Mesh(_mesh_shape(n, len(dims)), tuple("zyx"[-len(dims):]))
    full = _grid(shape, mesh.shape, dims)
    x, expected = _blocks(full, mesh.shape, mesh.coordinate(), dims, widths, periodic)
    before = x.copy()
    y = fc.halo_exchange(x, mesh, widths, dims=dims, periodic=periodic)
    assert same_bits(y, expected)
    assert same_bits(x, before) and not np.shares_memory(x, y)


@pytest.mark.parametrize("dtype", ["float32", "int16", "complex128", "bool"])
@pytest.mark.parametrize("layout", ["fortran", "strided", "readonly"])
def test_halo_dtypes_and_layouts(dtype, layout):
    n = fc.get_world_size()
    mesh = fc.Mesh(_mesh_shape(n, 2), ("y", "x"))
    full = _grid((10, 12), mesh.shape, [0, 1], dtype="float64")
    x, expected = _blocks(full, mesh.shape, mesh.coordinate(), [0, 1], [1, 2], [True, False])
    x, expected = x.astype(dtype), expected.astype(dtype)
    if layout == "fortran":
        x = np.asfortranarray(x)
    elif layout == "strided":
        wide = np.zeros((x.shape[0], 2 * x.shape[1]), dtype)
        wide[:, ::2] = x
        x = wide[:, ::2]
    else:
        x.flags.writeable = False
    y = fc.halo_exchange(x, mesh, [1, 2], periodic=[True, False])
    assert same_bits(y, expected) and y.flags.c_contiguous and y.flags.writeable


@pytest.mark.parametrize("shape,dims,widths,periodic", CASES,
                         ids=[f"{len(c[0])}d-{c[1]}-w{c[2]}-p{c[3]}" for c in CASES])
def test_donated_halo_fills_x_in_place(shape, dims, widths, periodic):
    """donate=True: the same cells as the pure call, in x itself, returned."""
    n = fc.get_world_size()
    mesh = fc.Mesh(_mesh_shape(n, len(dims)), tuple("zyx"[-len(dims):]))
    full = _grid(shape, mesh.shape, dims)
    x, expected = _blocks(full, mesh.shape, mesh.coordinate(), dims, widths, periodic)
    pure = fc.halo_exchange(x, mesh, widths, dims=dims, periodic=periodic)
    for _ in range(2):  # again on the filled array: the same cells (a stencil loop)
        y = fc.halo_exchange(x, mesh, widths, dims=dims, periodic=periodic, donate=True)
        assert y is x and same_bits(x, expected) and same_bits(pure, expected)


@pytest.mark.parametrize("dtype", ["float32", "int16", "complex128", "bool"])
@pytest.mark.parametrize("layout", ["fortran", "strided"])
def test_donated_halo_other_layouts_write_back(dtype, layout):
    """A writable x of another layout: exchanged through a C-ordered copy, written back into
    x (the strided view's base sees it), x returned."""
    n = fc.get_world_size()
    mesh = fc.Mesh(_mesh_shape(n, 2), ("y", "x"))
    full = _grid((10, 12), mesh.shape, [0, 1])
    x, expected = _blocks(full, mesh.shape, mesh.coordinate(), [0, 1], [1, 2], [True, False])
    x, expected = x.astype(dtype), expected.astype(dtype)
    wide = None
    if layout == "fortran":
        x = np.asfortranarray(x)
    else:
        wide = np.zeros((x.shape[0], 2 * x.shape[1]), dtype)
        wide[:, ::2] = x
        x = wide[:, ::2]
    y = fc.halo_exchange(x, mesh, [1, 2], periodic=[True, False], donate=True)
    assert y is x and same_bits(x, expected)
    if wide is not None:
        assert same_bits(wide[:, ::2], expected) and not wide[:, 1::2].any()


def test_donated_halo_refuses_what_it_cannot_fill():
    """A read-only x raises on every rank before anything is sent (each passes one); a
    non-bool donate names the argument; the mesh still works after."""
    n = fc.get_world_size()
    mesh = fc.Mesh((n,), ("x",))
    x = np.arange(6.0)
    x.flags.writeable = False
    with pytest.raises(ValueError, match="expected x to be writable with donate=True"):
        fc.halo_exchange(x, mesh, 1, donate=True)
    with pytest.raises(ValueError, match="expected donate to be a bool, got 1"):
        fc.halo_exchange(np.arange(6.0), mesh, 1, donate=1)
    y = np.full(6, float(fc.get_rank()))
    assert fc.halo_exchange(y, mesh, 1, periodic=True, donate=True) is y
    assert y[0] == (fc.get_rank() - 1) % n and y[-1] == (fc.get_rank() + 1) % n


def test_donated_read_only_on_one_rank_raises_everywhere_under_detail(world_size, rank):
    """Under debug="detail" the read-only check is one of the compared checks: rank 0's
    read-only block makes it raise ValueError and every other rank CollectiveMismatchError,
    before anything is sent; the mesh still works after."""
    if world_size < 2:
        pytest.skip("needs two ranks")
    mesh = fc.Mesh((world_size,), ("x",))
    x = np.arange(6.0)
    x.flags.writeable = rank != 0
    fc.init(debug="detail")
    try:
        error = ValueError if rank == 0 else fc.CollectiveMismatchError
        with pytest.raises(error, match="halo_exchange"):
            fc.halo_exchange(x, mesh, 1, periodic=True, donate=True)
        y = np.full(6, float(rank))
        assert fc.halo_exchange(y, mesh, 1, periodic=True, donate=True) is y
        assert y[0] == (rank - 1) % world_size and y[-1] == (rank + 1) % world_size
    finally:
        fc.init(debug="off")


def test_halo_width_zero_and_sub_mesh():
    n = fc.get_world_size()
    mesh = fc.Mesh(_mesh_shape(n, 2), ("y", "x"))
    x = np.full((6, 6), float(fc.get_rank()))
    assert same_bits(fc.halo_exchange(x, mesh, 0), x)
    row = mesh["x"]  # a 1-D sub-mesh: only the x axis is exchanged
    full = _grid((3, 12 * row.size), row.shape, [1])
    x, expected = _blocks(full, row.shape, row.coordinate(), [1], [1], [True])
    assert same_bits(fc.halo_exchange(x, row, 1, dims=[1], periodic=True), expected)
    assert fc.halo_exchange(x, row, 1, dims=[1], periodic=True, donate=True) is x
    assert same_bits(x, expected)


def test_halo_errors():
    n = fc.get_world_size()
    mesh = fc.Mesh((n,), ("x",))
    x = np.zeros(12)
    with pytest.raises(ValueError, match=r"x.shape\[0\] >= 3 \* width = 15"):
        fc.halo_exchange(x, mesh, 5)
    with pytest.raises(TypeError, match=r"expected mesh to be a fcoll\.Mesh"):
        fc.halo_exchange(x, None, 1)
    with pytest.raises(TypeError, match="width to be an int"):
        fc.halo_exchange(x, mesh, 1.0)
    with pytest.raises(ValueError, match="width >= 0"):
        fc.halo_exchange(x, mesh, -1)
    with pytest.raises(ValueError, match="one value or 1"):
        fc.halo_exchange(x, mesh, [1, 1])
    with pytest.raises(TypeError, match="periodic to be a bool"):
        fc.halo_exchange(x, mesh, 1, periodic="yes")
    with pytest.raises(ValueError, match="distinct dims"):
        fc.halo_exchange(np.zeros((6, 6)), fc.Mesh(_mesh_shape(n, 2), ("a", "b")), 1, dims=[1, -1])
    with pytest.raises(ValueError, match="at least 2 dims"):
        fc.halo_exchange(x, fc.Mesh(_mesh_shape(n, 2), ("a", "b")), 1)
    with pytest.raises(TypeError, match=r"numpy\.ndarray"):
        fc.halo_exchange([0.0] * 6, mesh, 1)


def test_halo_faces_of_another_size_raise_under_detail(world_size, rank):
    """Blocks that do not form a grid (rank 0's faces along x are shorter): under
    debug="detail" every rank raises, before anything is sent."""
    if world_size < 2:
        pytest.skip("needs two ranks")
    mesh = fc.Mesh((1, world_size), ("y", "x"))
    x = np.zeros((4 if rank == 0 else 5, 6))
    fc.init(debug="detail")
    try:
        with pytest.raises(fc.CollectiveMismatchError, match=r"along axis 'x' \(dim 1\) faces"):
            fc.halo_exchange(x, mesh, 1, dims=[0, 1])
        y = fc.halo_exchange(np.full((5, 6), float(rank)), mesh, 1, dims=[0, 1])  # usable
        assert y[0, 0] == (rank - 1 if rank else 0)
    finally:
        fc.init(debug="off")


def test_halo_under_deadline_and_detail():
    n = fc.get_world_size()
    mesh = fc.Mesh(_mesh_shape(n, 2), ("y", "x"))
    full = _grid((8, 9), mesh.shape, [0, 1])
    x, expected = _blocks(full, mesh.shape, mesh.coordinate(), [0, 1], [1, 1], [False, True])
    fc.init(timeout=30, debug="detail")
    try:
        assert same_bits(fc.halo_exchange(x, mesh, 1, periodic=[False, True]), expected)
        if n > 1:
            with pytest.raises(fc.CollectiveMismatchError, match="halo_exchange"):
                fc.halo_exchange(x, mesh, 1, periodic=[fc.get_rank() == 0, True])
    finally:
        fc.init(timeout=math.inf, debug="off")


# --- Group.from_comm ------------------------------------------------------------------------


class _PetscLike:
    """What petsc4py's communicators offer fcoll: ``tompi4py()``."""

    def __init__(self, comm: object) -> None:
        self._comm = comm

    def tompi4py(self) -> object:
        return self._comm


def test_from_comm():
    MPI = mpi()
    r, n = fc.get_rank(), fc.get_world_size()
    app = MPI.COMM_WORLD.Split(r % 2, -r)  # reversed order: group rank 0 is the highest
    g = fc.Group.from_comm(app)
    members = sorted(range(r % 2, n, 2), reverse=True)
    assert g.ranks == tuple(members) and g.rank == members.index(r) == app.Get_rank()
    assert fc.all_reduce(np.array([r]), group=g).tolist() == [sum(members)]
    assert fc.scan(np.array([r]), group=g).tolist() == [sum(members[: g.rank + 1])]
    # fcoll works on a duplicate: a message the application has in flight on its communicator
    # never matches fcoll's
    request = app.isend(("app", r), dest=(g.rank + 1) % g.size, tag=0)
    fc.sendrecv(np.array([r]), (g.rank + 1) % g.size, (g.rank - 1) % g.size, g)
    assert app.recv(source=(g.rank - 1) % g.size, tag=0) == ("app", members[(g.rank - 1) % g.size])
    request.wait()
    h = fc.Group.from_comm(_PetscLike(MPI.COMM_WORLD), timeout=30)
    assert h.ranks == tuple(range(n)) and h.timeout == 30
    assert fc.all_reduce(np.ones(1), group=h).tolist() == [n]
    g.destroy(), h.destroy()
    app.Free()


def test_from_comm_refuses():
    MPI = mpi()
    with pytest.raises(TypeError, match=r"^from_comm: expected an mpi4py.MPI.Intracomm"):
        fc.Group.from_comm(object())
    with pytest.raises(TypeError, match="Intracomm"):
        fc.Group.from_comm(MPI.COMM_NULL)
