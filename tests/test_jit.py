"""fcoll.lax inside jax.jit, grad, vmap, lax.scan and jax.checkpoint (issue 28, `fcoll.xla`),
with ``jax_enable_checks`` on: results equal the eager calls; gradients equal finite
differences of the whole job's function (the sum of every rank's loss); vmap sends one
message; collectives run in program order; errors inside a jitted function reach the caller
as exceptions. Meshes n x 1, 1 x n and 2 x 2 (n = 4), so calls run on the world and on
groups that split it."""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import fcoll as fc
from fcoll import lax
from tests import test_lax

jax = pytest.importorskip("jax")
jnp = jax.numpy
mesh = test_lax.mesh  # the fixture: meshes n x 1, 1 x n and 2 x 2


@pytest.fixture(autouse=True)
def _checks() -> Any:
    jax.config.update("jax_enable_checks", True)
    yield
    jax.config.update("jax_enable_checks", False)


def value(rank: int, shape: tuple[int, ...], salt: int = 0) -> np.ndarray:
    return np.random.default_rng([salt, rank]).standard_normal(shape).astype(np.float32)


def tree(rank: int) -> dict[str, Any]:
    return {"f": jnp.asarray(value(rank, (2, 3))),
            "i": [jnp.asarray(np.arange(3, dtype=np.int32) * (rank + 1)),
                  jnp.asarray(np.float32(rank))]}


def close(got: Any, want: Any) -> None:
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        assert g.dtype == w.dtype and g.shape == w.shape
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-6, atol=1e-6)


def n_of(mesh: Any, axis: str) -> int:
    return lax.axis_size(axis)


OPS: dict[str, Callable[[Any, str, int], Any]] = {
    "psum": lambda x, a, n: lax.psum(x, a),
    "pmean": lambda x, a, n: lax.pmean({"f": x["f"]}, a),
    "pmax": lambda x, a, n: lax.pmax(x, a),
    "pmin": lambda x, a, n: lax.pmin(x["i"], a),
    "all_gather": lambda x, a, n: lax.all_gather(x, a),
    "all_gather tiled -1": lambda x, a, n: lax.all_gather(x["f"], a, axis=-1, tiled=True),
    "psum_scatter": lambda x, a, n: lax.psum_scatter(jnp.tile(x["f"], (n, 1, 1)), a),
    "psum_scatter tiled": lambda x, a, n: lax.psum_scatter(jnp.tile(x["f"], (1, n)), a,
                                                           scatter_dimension=1, tiled=True),
    "all_to_all": lambda x, a, n: lax.all_to_all(jnp.tile(x["f"], (n, 1, 1)), a, 0, 2),
    "all_to_all tiled": lambda x, a, n: lax.all_to_all(jnp.tile(x["f"], (n, n)), a, 1, 0,
                                                       tiled=True),
    "ppermute": lambda x, a, n: lax.ppermute(x, a, [(i, (i + 1) % n) for i in range(n)]),
}


@pytest.mark.parametrize("axis", ["dp", "tp"])
@pytest.mark.parametrize("name", OPS)
def test_jit_equals_eager(mesh: Any, axis: str, name: str) -> None:
    n, x = n_of(mesh, axis), tree(fc.get_rank())
    eager = OPS[name](x, axis, n)
    close(jax.jit(lambda t: OPS[name](t, axis, n))(x), eager)


LINEAR = [name for name in OPS if name not in ("pmax", "pmin")]


def whole_job(op: Callable[[Any], Any], axis: str) -> Callable[[Any], Any]:
    """Every rank's input stacked (the same on every rank) -> the job's loss: rank r runs
    ``op`` on row r (of its index along ``axis`` and the others), and its loss weights the
    output with weights every rank knows; the job's loss is the sum over ranks."""
    me, rank = lax.axis_index(axis), fc.get_rank()
    def loss(stacked: Any) -> Any:
        y = op(stacked[me])
        weights = jnp.asarray(value(rank, y.shape, salt=1))
        return jnp.sum(weights * y)
    return loss


def job_loss(op: Callable[[Any], Any], axis: str, stacked: np.ndarray) -> float:
    """The sum over the ranks along ``axis`` of each rank's loss (jitted, then summed eagerly)."""
    mine = jax.jit(whole_job(op, axis))(jnp.asarray(stacked))
    return float(lax.psum(np.asarray(mine, np.float64), axis))


@pytest.mark.parametrize("axis", ["dp", "tp"])
@pytest.mark.parametrize("name", LINEAR)
def test_grad_is_that_of_the_sum_of_every_ranks_loss(mesh: Any, axis: str, name: str) -> None:
    n = n_of(mesh, axis)
    op = lambda x: OPS[name]({"f": x, "i": [x, x[0, 0]]}, axis, n)  # noqa: E731
    flat = lambda x: jax.tree.leaves(op(x))[0]  # noqa: E731
    stacked = value(7, (n, 2, 3)).astype(np.float64)
    grad = jax.jit(jax.grad(whole_job(flat, axis)))(jnp.asarray(stacked, jnp.float32))
    total = np.asarray(lax.psum(np.asarray(grad, np.float64), axis))  # row r from rank r
    eps = 1e-2
    for k in [(0, 0, 0), (n - 1, 1, 2)]:
        bumped = [stacked.copy(), stacked.copy()]
        bumped[0][k] += eps
        bumped[1][k] -= eps
        numeric = (job_loss(flat, axis, bumped[0]) - job_loss(flat, axis, bumped[1])) / (2 * eps)
        np.testing.assert_allclose(total[k], numeric, rtol=2e-3, atol=2e-3)
    eager = jax.grad(whole_job(flat, axis))(jnp.asarray(stacked, jnp.float32))  # no jit
    np.testing.assert_allclose(np.asarray(eager), np.asarray(grad), rtol=1e-6)


@pytest.mark.parametrize("axis", ["dp", "tp"])
def test_grad_of_psum_pmean_and_all_gather_analytically(mesh: Any, axis: str) -> None:
    n, me, rank = n_of(mesh, axis), lax.axis_index(axis), fc.get_rank()
    ranks = mesh.group(axis).ranks
    x = jnp.asarray(value(rank, (3,)))
    c = {r: value(r, (3,), salt=2) for r in ranks}
    cg = {r: value(r, (n, 3), salt=3) for r in ranks}
    def loss(x: Any) -> Any:
        return (jnp.sum(jnp.asarray(c[rank]) * lax.psum(x, axis))
                + jnp.sum(jnp.asarray(c[rank]) * lax.pmean(x, axis))
                + jnp.sum(jnp.asarray(cg[rank]) * lax.all_gather(x, axis)))
    got = jax.jit(jax.grad(loss))(x)
    want = sum(c.values()) * (1 + 1 / n) + sum(cg[r][me] for r in ranks)
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5)


def test_jvp_and_linear_transpose(mesh: Any) -> None:
    n, rank = n_of(mesh, "tp"), fc.get_rank()
    x, t = jnp.asarray(value(rank, (n, 2))), jnp.asarray(value(rank, (n, 2), salt=4))
    f = lambda v: lax.psum_scatter(v, "tp")  # noqa: E731
    y, ty = jax.jit(lambda a, b: jax.jvp(f, (a,), (b,)))(x, t)
    close(y, f(x))
    close(ty, f(t))  # linear: the JVP is the collective on the tangent
    (back,) = jax.jit(jax.linear_transpose(f, x))(ty)
    close(back, lax.all_gather(ty, "tp"))


def test_pmax_has_no_gradient(mesh: Any) -> None:
    with pytest.raises(NotImplementedError, match="pmax: expected a collective with a gradient"):
        jax.grad(lambda x: lax.pmax(x, "dp").sum())(jnp.ones(2))
    stopped = jax.grad(lambda x: lax.pmax(jax.lax.stop_gradient(x), "dp").sum() + x.sum())
    assert np.asarray(jax.jit(stopped)(jnp.ones(2))).tolist() == [1.0, 1.0]


def test_vmap_sends_one_message(mesh: Any) -> None:
    n, rank = n_of(mesh, "dp"), fc.get_rank()
    xs = jnp.asarray(value(rank, (5, 3)))
    f = jax.vmap(lambda x: lax.all_gather({"a": x, "b": x[0]}, "dp", axis=-1))
    got = jax.jit(f)(xs)
    close(got, {"a": jnp.stack([lax.all_gather(xs[i], "dp", axis=-1) for i in range(5)]),
                "b": jnp.stack([lax.all_gather(xs[i, 0], "dp") for i in range(5)])})
    eqns = [e for e in jax.make_jaxpr(f)(xs).eqns if e.primitive.name.startswith("fcoll_")]
    assert [e.primitive.name for e in eqns] == ["fcoll_all_gather"]
    assert [v.aval.shape for v in eqns[0].outvars] == [(5, 3, n), (5, n)]
    mixed = jax.vmap(lambda x, w: lax.psum({"x": x, "w": w}, "dp"), in_axes=(1, None))
    out = jax.jit(mixed)(xs, jnp.ones(2))
    close(out["x"], lax.psum(xs, "dp").T)
    close(out["w"], jnp.full((3, 2), float(n)))
    close(jax.vmap(lambda x: lax.psum(x, "dp"))(xs), lax.psum(xs, "dp"))  # no jit: eager impl


def test_scan_and_checkpoint_bodies(mesh: Any) -> None:
    n, rank = n_of(mesh, "tp"), fc.get_rank()
    x = jnp.asarray(value(rank, (3,)))
    def body(carry: Any, _: Any) -> tuple[Any, Any]:
        return lax.pmean(carry, "tp") * 2 + 1, lax.psum(carry, "tp")
    carry, ys = jax.jit(lambda v: jax.lax.scan(body, v, None, length=3))(x)
    want_carry, want_ys = x, []
    for _ in range(3):
        want_ys.append(lax.psum(want_carry, "tp"))
        want_carry = lax.pmean(want_carry, "tp") * 2 + 1
    close(carry, want_carry)
    close(ys, jnp.stack(want_ys))
    remat = jax.checkpoint(lambda v: jnp.sin(lax.psum(v, "tp")) * v)
    got = jax.jit(jax.grad(lambda v: remat(v).sum()))(x)
    plain = jax.grad(lambda v: (jnp.sin(lax.psum(v, "tp")) * v).sum())(x)
    close(got, plain)
    scanned = jax.jit(jax.grad(lambda v: jax.lax.scan(body, v, None, length=2)[0].sum()))(x)
    assert scanned.shape == (3,) and n >= 1


def test_program_order_of_several_collectives(mesh: Any) -> None:
    """Independent collectives (no data dependency holds them in order: the ordered effect
    does): the HLO threads one token through every custom call, in program order, and the
    flight record shows the calls in that order."""
    rank, n, everyone = fc.get_rank(), fc.get_world_size(), ("dp", "tp")
    def f(x: Any) -> Any:
        return (lax.psum(x, "dp"), lax.all_gather(x[:2], "tp"),
                lax.psum_scatter(x[:n], everyone, tiled=True),
                lax.all_to_all(jnp.tile(x[:1], n), everyone, 0, 0, tiled=True),
                lax.all_gather(x[:1], everyone))
    x = jnp.asarray(value(rank, (max(n, 4),)))
    text = jax.jit(f).lower(x).as_text()
    calls = re.findall(r"(%\S+):2 = stablehlo.custom_call @fcoll_collective_cpu\(([^)]*)\)", text)
    assert len(calls) == 5
    for (previous, _), (_, operands) in itertools.pairwise(calls):  # each takes the last's token
        assert operands.split(", ")[-1] == f"{previous}#1"
    fc.debug.trace(64)
    jax.block_until_ready(jax.jit(f)(x))
    names = [e[2] for e in fc.debug.record()]
    if n > 1:  # a group of one sends nothing, and some calls are then not recorded
        assert names[-3:] == ["reduce_scatter_tensor", "all_to_all_single",
                              "all_gather_into_tensor"]


def test_eager_calls_wait_for_jitted_ones(mesh: Any) -> None:
    rank, n = fc.get_rank(), fc.get_world_size()
    f = jax.jit(lambda x: jax.lax.fori_loop(0, 20, lambda i, c: lax.pmean(c, ("dp", "tp")) + 1, x))
    outs = [f(jnp.full(2, float(rank))) for _ in range(3)]  # dispatched, not waited for
    eager = fc.all_reduce(np.ones(1))  # must not meet the jitted calls' messages
    assert eager.tolist() == [n]
    mean = sum(range(n)) / n
    for y in outs:
        np.testing.assert_allclose(np.asarray(y), mean + 20)


def test_mismatch_under_detail_raises_on_every_rank(mesh: Any) -> None:
    if fc.get_world_size() < 2:
        pytest.skip("a mismatch needs two ranks")
    rank = fc.get_rank()
    fc.init(debug="detail")
    try:
        shape = (3,) if rank == 0 else (2,)
        with pytest.raises(Exception, match="CollectiveMismatchError") as caught:
            jax.block_until_ready(jax.jit(lambda x: lax.psum(x, ("dp", "tp")))(jnp.ones(shape)))
        assert "JaxRuntimeError" in type(caught.value).__name__ or "Xla" in type(caught.value).__name__
    finally:
        fc.init(debug="off")
    assert float(jax.jit(lambda x: lax.psum(x, ("dp", "tp")))(jnp.ones(())) ) == fc.get_world_size()


def test_checks_at_trace_time(mesh: Any) -> None:
    n = n_of(mesh, "dp")
    with pytest.raises(TypeError, match="pmean: expected a floating or complex dtype"):
        jax.jit(lambda x: lax.pmean(x, "dp"))(jnp.ones(2, jnp.int32))
    with pytest.raises(ValueError, match="the axis size"):
        jax.jit(lambda x: lax.psum_scatter(x, "dp"))(jnp.ones((n + 1, 2)))
    with pytest.raises(ValueError, match="each source once"):
        jax.jit(lambda x: lax.ppermute(x, "dp", [(0, 0), (0, 0)]))(jnp.ones(2))
    with pytest.raises(ValueError, match="not axes of an active mesh"):
        jax.jit(lambda x: lax.psum(x, "nope"))(jnp.ones(2))


def test_jax_version_is_one_fcoll_was_tested_with() -> None:
    from fcoll.xla import primitives

    assert primitives.supported(jax.__version__), jax.__version__


def test_a_deadline_inside_jit_reaches_the_caller_as_an_exception(tmp_path: Any) -> None:
    """A 2-rank job: rank 1 stops making calls, rank 0's jitted psum misses its 1 s
    deadline; the CollectiveTimeoutError comes out of the jitted function's result as an
    exception that rank 0 catches (no crash, no hang), and the job then ends on its error."""
    if fc.get_world_size() != 1:
        pytest.skip("launches its own job")
    import subprocess
    import sys
    import textwrap

    from tests import jobs

    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent("""
        import time
        import jax, jax.numpy as jnp, fcoll as fc
        jax.config.update("jax_enable_checks", True)
        fc.init(timeout=1.0)
        with fc.Mesh((2,), ("x",)):
            f = jax.jit(lambda v: fc.lax.psum(v, "x"))
            print(f"first {fc.get_rank()} {float(f(jnp.ones(())))}", flush=True)
            if fc.get_rank() == 1:
                time.sleep(15)           # alive, but makes no more calls
                raise SystemExit(0)
            try:
                jax.block_until_ready(f(jnp.ones(())))
            except Exception as error:
                print(f"caught {type(error).__name__} {str(error).splitlines()[0]}", flush=True)
                raise
    """))
    done = subprocess.run(jobs.command(2, sys.executable, "-m", "fcoll.run", str(script)),
                          env=jobs.environment(), capture_output=True, text=True, timeout=120)
    out = done.stdout + done.stderr
    assert "first 0 2.0" in out and "first 1 2.0" in out, out
    assert re.search(r"caught JaxRuntimeError DEADLINE_EXCEEDED: fcoll: CollectiveTimeoutError: "
                     r"(all_reduce|psum) \(call #\d+ on the group\) did not complete within its "
                     r"1 s deadline on group ranks \[0, 1\]", out), out
    assert re.search(r"fcoll flight record \((all_reduce|psum) missed its deadline on group \[0, 1\]\)",
                     out), out
    # the call that missed it is in the record, failed (the compiled handler's ring, or Python's)
    assert re.search(r"#\d+\s+0\s+(all_reduce|psum)\s+x=float32\[1?\]\s+failed", out), out
    assert done.returncode != 0 and "Segmentation fault" not in out and "Fatal Python" not in out


@pytest.mark.gpu
def test_jit_grad_and_vmap_on_a_gpu(mesh: Any) -> None:
    """On a GPU (scripts/gpu-check.sh) the handler works on XLA's device buffers in XLA's
    stream; the results equal the CPU's and stay on the device."""
    gpus = [d for d in jax.devices() if d.platform == "gpu"]
    if not gpus:
        pytest.skip("no GPU in JAX")
    pytest.importorskip("cupy")
    n, rank = n_of(mesh, "dp"), fc.get_rank()
    x = jax.device_put(jnp.asarray(value(rank, (n, 3))), gpus[0])
    def f(v: Any) -> Any:
        return (lax.psum(v, "dp"), lax.all_gather(v, "dp", axis=1),
                jax.grad(lambda u: (lax.psum_scatter(u, "dp") ** 2).sum())(v),
                jax.vmap(lambda u: lax.pmean(u, "dp"))(v))
    got = jax.jit(f)(x)
    with jax.default_device(jax.devices("cpu")[0]):
        want = jax.jit(f)(jax.device_put(x, jax.devices("cpu")[0]))
    for g, w in zip(got, want, strict=True):
        assert next(iter(g.devices())).platform == "gpu"
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-6, atol=1e-6)
