"""The compiled XLA handler (issue 40, `fcoll.xla.channel`, fcoll/backends/_shmxla.c): a
jitted psum on a group on one node (or of one rank) steps the group's jit channel in C,
with the eager call's bits, for every dtype and op the core folds, 0-d, empty, several
chunks, donated (aliased) buffers and pytrees of one dtype; eager calls keep their fast
paths after it; eager and jitted calls interleave in any order the program says; ranks
that make different jitted calls get fcoll's mismatch error on every rank. Meshes n x 1,
1 x n and 2 x 2 (n = 4): the world and groups that split it."""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np
import pytest

import fcoll as fc
from fcoll import lax, runtime
from tests import test_lax

jax = pytest.importorskip("jax")
jnp = jax.numpy
mesh = test_lax.mesh  # the fixture: meshes n x 1, 1 x n and 2 x 2
channel = pytest.importorskip("fcoll.xla.channel")
order = pytest.importorskip("fcoll.xla.order")

DTYPES = [np.float32, np.float64, np.float16, ml_dtypes.bfloat16, np.int32]
OPS = {"psum": lax.psum, "pmean": lax.pmean, "pmax": lax.pmax, "pmin": lax.pmin}
SHAPES = [(), (0,), (5,), (3, 4), (300_001,)]  # the last: two steps of the segment (1 MiB)


@pytest.fixture(autouse=True)
def _compiled() -> Any:
    if channel.compiled() is None:
        pytest.skip("the compiled core does not run here (FCOLL_NATIVE=0 or not built)")
    yield


def served() -> int:
    """The calls the compiled handler served so far."""
    return int(channel.compiled().xla_served())


def data(rank: int, shape: tuple[int, ...], dtype: Any, salt: int = 0) -> np.ndarray:
    x = np.random.default_rng([salt, rank]).standard_normal(shape) * 100
    return x.astype(dtype)


def same(got: Any, want: Any) -> None:
    got, want = np.asarray(got), np.asarray(want)
    assert got.dtype == want.dtype and got.shape == want.shape
    assert got.tobytes() == want.tobytes()


@pytest.mark.parametrize("op", OPS)
def test_compiled_psum_has_the_eager_bits(mesh: Any, op: str) -> None:
    """Every dtype and shape (one loop: a mesh per test costs communicators), each one call
    in C with the bits of the eager call."""
    f = jax.jit(lambda v: OPS[op](v, "dp"))
    for dtype in DTYPES:
        if op == "pmean" and np.dtype(dtype).kind == "i":
            continue  # pmean takes floats
        for shape in SHAPES if (op, dtype) == ("psum", np.float32) else SHAPES[:-1]:
            x = jnp.asarray(data(fc.get_rank(), shape, dtype))
            before = served()
            got = f(x)
            same(got, OPS[op](x, "dp"))  # the eager call
            assert served() - before == 1, (dtype, shape)  # one call, in C


def test_donated_input_is_reduced_in_place(mesh: Any) -> None:
    """The custom call aliases its output to its input: XLA may hand the handler one buffer
    (a donated argument), which it reads before it writes."""
    rank, n = fc.get_rank(), lax.axis_size("dp")
    f = jax.jit(lambda v: lax.psum(v, "dp") + 0, donate_argnums=0)
    for shape in [(3,), (70_000,), (300_001,)]:
        x = data(rank, shape, np.float32, salt=1)
        want = lax.psum(jnp.asarray(x), "dp")
        same(f(jnp.asarray(x)), want)
    loop = jax.jit(lambda c: jax.lax.fori_loop(0, 5, lambda i, v: lax.psum(v, "dp") / n, c),
                   donate_argnums=0)
    start = data(rank, (1000,), np.float64, salt=2)
    want = jnp.asarray(start)
    for _ in range(5):
        want = lax.psum(want, "dp") / n
    same(loop(jnp.asarray(start)), want)


def test_a_pytree_of_one_dtype_is_one_compiled_call(mesh: Any) -> None:
    rank = fc.get_rank()
    tree = {"a": jnp.asarray(data(rank, (2, 3), np.float32)), "b": [jnp.asarray(data(rank, (), np.float32)),
            jnp.asarray(data(rank, (7,), np.float32))]}
    before = served()
    got = jax.jit(lambda t: lax.psum(t, ("dp", "tp")))(tree)
    assert served() - before == 1
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(lax.psum(tree, ("dp", "tp"))), strict=True):
        same(g, w)
    mixed = {"f": tree["a"], "i": jnp.arange(3, dtype=jnp.int32)}
    before = served()
    got = jax.jit(lambda t: lax.psum(t, "dp"))(mixed)  # two dtypes: the Python handler
    assert served() == before
    same(got["i"], lax.psum(mixed["i"], "dp"))


def test_eager_calls_keep_their_fast_paths_after_jit(mesh: Any) -> None:
    """After a compiled jitted call eager calls do not wait for jitted ones (they have a
    channel of their own); after a call the Python handler serves they do, until disarm."""
    from fcoll.collectives import _fast

    order.disarm()
    x = jnp.ones(3)
    jax.block_until_ready(jax.jit(lambda v: lax.psum(v, "dp"))(x))
    assert runtime._state.before_call is None
    fc.all_reduce(np.ones(2, np.float32))
    assert ("sum", np.dtype(np.float32)) in _fast.ALL_REDUCE  # the fast path was learned
    jax.block_until_ready(jax.jit(lambda v: lax.all_gather(v, "dp"))(x))
    assert runtime._state.before_call is not None
    order.disarm()
    assert runtime._state.before_call is None


@pytest.mark.parametrize("seed", range(3))
def test_eager_and_jitted_calls_interleave_in_program_order(mesh: Any, seed: int) -> None:
    """A random program (the same on every rank) of eager calls and jitted ones dispatched
    without waiting, on the world and the mesh's groups, read only at the end."""
    rank, n = fc.get_rank(), fc.get_world_size()
    rng = np.random.default_rng(seed)
    loops = {axis: jax.jit(lambda c, a=axis: jax.lax.fori_loop(
        0, 7, lambda i, v: lax.pmean(v, a) + 1, c)) for axis in ("dp", "tp")}
    pending, eager = [], []
    for step in range(12):
        axis = ("dp", "tp")[int(rng.integers(2))]
        g, size = mesh.group(axis), lax.axis_size(axis)
        if rng.integers(2):
            x = jnp.full(4, float(rank + step))
            mean = np.mean([r + step for r in g.ranks])
            pending.append((loops[axis](x), mean + 7))
        else:
            got = fc.all_reduce(np.full(3, rank + step, np.float64), group=g)
            eager.append((got, sum(r + step for r in g.ranks)))
            assert size == g.size
        if rng.integers(4) == 0:
            world = fc.all_reduce(np.ones(1), group=None)
            eager.append((world, n))
    for got, want in eager:
        np.testing.assert_allclose(got, want)
    for y, want in pending:
        np.testing.assert_allclose(np.asarray(y), want, rtol=1e-6)


def test_different_jitted_calls_raise_a_mismatch_on_every_rank(mesh: Any) -> None:
    """Ranks that pass different sizes to one jitted psum each get fcoll's
    CollectiveMismatchError from the jitted function's result, no hang, and the group stays
    usable (no rank made a result): the next jitted call is served."""
    if lax.axis_size("dp") < 2:
        pytest.skip("a mismatch needs two ranks")
    from fcoll.xla import handler

    rank, g = fc.get_rank(), mesh.group("dp")
    shape = (3,) if rank == g.ranks[0] else (4,)
    f = jax.jit(lambda v: lax.psum(v, "dp"))
    try:
        with pytest.raises(Exception, match="CollectiveMismatchError") as caught:
            jax.block_until_ready(f(jnp.ones(shape)))
        assert "JaxRuntimeError" in type(caught.value).__name__
        assert float(jax.block_until_ready(f(jnp.ones(())))) == g.size
    finally:
        jit = handler.jit_group(g.ranks)
        channel.register(jit, g)  # the compiled handler again, for the tests that follow
        order.disarm()


def test_debug_detail_sends_compiled_calls_to_the_python_handler(mesh: Any) -> None:
    """A function compiled before ``debug="detail"`` keeps its checks: while the job checks
    calls, the channel is off and the Python handler (with the cross-rank check) serves it;
    after, the compiled handler again."""
    f = jax.jit(lambda v: lax.psum(v, "dp"))
    x, n = jnp.ones(3), lax.axis_size("dp")
    np.testing.assert_allclose(np.asarray(f(x)), n)
    fc.init(debug="detail")
    try:
        before = served()
        np.testing.assert_allclose(np.asarray(f(x)), n)
        assert served() == before
        assert runtime._state.before_call is not None  # eager calls wait for the Python handler
    finally:
        fc.init(debug="off")
    order.disarm()
    before = served()
    np.testing.assert_allclose(np.asarray(f(x)), n)
    assert served() - before == 1


def test_pytrees_of_different_lengths_raise_a_mismatch(mesh: Any) -> None:
    """A compiled psum of several leaves first announces how many: a rank that passes fewer
    leaves of the same size gets the mismatch error, as every other rank, instead of
    pairing its leaf with another rank's second one."""
    if lax.axis_size("dp") < 2:
        pytest.skip("a mismatch needs two ranks")
    g = mesh.group("dp")
    leaves = 2 if fc.get_rank() == g.ranks[0] else 1
    tree = [jnp.ones(3) for _ in range(leaves)]
    with pytest.raises(Exception, match="CollectiveMismatchError"):
        jax.block_until_ready(jax.jit(lambda t: lax.psum(t, "dp"))(tree))
    assert float(jax.jit(lambda v: lax.psum(v, "dp"))(jnp.ones(()))) == g.size  # still usable


def test_a_refused_compiled_handler_leaves_the_python_one(mesh: Any, monkeypatch: Any) -> None:
    """Where XLA refuses the compiled handler (an FFI version it no longer takes), the
    registration says False, the channels are off and calls lower for the Python handler."""
    from fcoll.xla import handler

    class Refusing:
        def register_ffi_target(self, *args: Any, **kwargs: Any) -> None:
            raise RuntimeError("FFI API 0.1 is too old")

    compiled = channel.compiled()
    monkeypatch.setattr(channel, "REFUSED", [])
    assert not handler.register_compiled(Refusing(), "fcoll_test_refused", 0)
    assert channel.REFUSED == ["RuntimeError: FFI API 0.1 is too old"]
    assert channel.compiled() is None
    user = mesh.group("dp")
    aval = jax.core.ShapedArray((3,), jnp.float32)
    assert channel.prepare("psum", user, lambda g: g, [aval], {"op": "sum"}) is channel.OFF
    compiled.xla_setup(ctypes_address(handler), channel.told)  # the real one back


def ctypes_address(handler: Any) -> int:
    import ctypes

    return int(ctypes.cast(handler._cpu_handler, ctypes.c_void_p).value)
