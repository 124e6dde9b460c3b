"""The layers above the collectives on cupy arrays: fcoll.lax, fcoll.dp and point-to-point.

Every call runs on a pytree of cupy arrays and on the same tree in numpy, and the two
results must agree: cupy leaves out (aligned on the device, same dtypes and shapes), the
numpy call's values, inputs untouched. Transports: NCCL, CUDA-aware MPI and staged MPI.
Mixing numpy and cupy leaves raises `TypeError` naming the leaf. Skipped, with the
reason, where cupy or a CUDA device is missing (run on tests/fake_cupy.py by
scripts/test.sh).
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np
import optree
import pytest

import fcoll as fc
from fcoll import dp, lax
from fcoll.dispatch import gpu_settings
from tests import jobs
from tests.helpers import data
from tests.test_gpu import REASON, _local_size

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(REASON is not None, reason=str(REASON))]


def _cupy() -> Any:
    import cupy

    return cupy


def _fake() -> bool:
    return str(_cupy().__version__).endswith("+fake")


@pytest.fixture(scope="module", autouse=True)
def device() -> int:
    import fcoll.gpu

    return fcoll.gpu.use_local_device()


@pytest.fixture(params=["nccl", "aware", "staged"])
def transport(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """NCCL; MPI handed device buffers (CUDA-aware, only where MPI is or the fake cupy
    stands in); MPI through host copies."""
    cupy = _cupy()
    if request.param == "nccl":
        from fcoll.backends import nccl

        if not nccl.available():
            pytest.skip(f"no NCCL: {nccl.why_unavailable()}")
        if _local_size() > cupy.cuda.runtime.getDeviceCount():
            pytest.skip("NCCL needs one GPU per rank; more ranks than GPUs on this node")
        monkeypatch.setenv("FCOLL_GPU_TRANSPORT", "nccl")
        return "nccl"
    if request.param == "aware" and not _fake():
        from fcoll.dispatch.gpu_probe import cuda_aware_mpi

        if not cuda_aware_mpi():
            pytest.skip("MPI is not CUDA-aware")
    monkeypatch.setenv("FCOLL_GPU_TRANSPORT", "mpi")
    monkeypatch.setattr(gpu_settings, "_AWARE", [request.param == "aware"])
    return str(request.param)


def to_cupy(tree: Any) -> Any:
    return optree.tree_map(_cupy().asarray, tree)


def to_host(tree: Any) -> Any:
    return optree.tree_map(_cupy().asnumpy, tree)


def check(got: Any, want: Any, rtol: float = 0.0) -> None:
    """``got`` has ``want``'s structure, with cupy leaves (aligned, on the current device)
    of the same dtypes, shapes and values (within ``rtol`` if not 0)."""
    cupy = _cupy()
    paths, leaves, spec = optree.tree_flatten_with_path(got)
    wanted, want_spec = optree.tree_flatten(want)
    assert spec == want_spec, (spec, want_spec)
    for path, a, b in zip(paths, leaves, wanted, strict=True):
        assert type(a) is cupy.ndarray, (path, type(a))
        assert a.dtype == b.dtype and a.shape == b.shape, (path, a.dtype, b.dtype, a.shape, b.shape)
        assert a.device.id == cupy.cuda.Device().id, path
        assert a.data.ptr % a.dtype.itemsize == 0, (path, "misaligned", a.data.ptr)
        if rtol:
            np.testing.assert_allclose(cupy.asnumpy(a), b, rtol=rtol, err_msg=str(path))
        else:
            assert np.array_equal(cupy.asnumpy(a), b), (path, cupy.asnumpy(a), b)


def unchanged(tree: Any, before: Any) -> None:
    for a, b in zip(optree.tree_leaves(tree), optree.tree_leaves(before), strict=True):
        assert np.array_equal(_cupy().asnumpy(a), b)


def tree(rank: int, salt: int = 0) -> dict[str, Any]:
    """Mixed dtypes; the int16 leaf's 6 bytes put the next one off alignment if packed tight."""
    return {"f": data(rank, (3, 2), "float32", salt), "i": [data(rank, 3, "int16", salt + 1),
            data(rank, (), "float64", salt + 2)], "l": data(rank, (2, 2), "int64", salt + 3)}


def meshes(n: int) -> list[tuple[tuple[int, ...], tuple[str, ...]]]:
    return [((n,), ("x",))] + ([((2, n // 2), ("x", "y"))] if n % 2 == 0 else [])


@pytest.mark.parametrize("fn", [lax.psum, lax.pmax, lax.pmin, lax.pmean])
def test_lax_reductions(transport, group, fn):
    for shape, names in meshes(group.size):
        with fc.Mesh(shape, names, group=group.arg):
            for axis in [names[-1], names]:
                host = tree(fc.get_rank())
                if fn is lax.pmean:
                    host = {"f": host["f"], "d": host["i"][1]}
                x = to_cupy(host)
                check(fn(x, axis), fn(host, axis), rtol=1e-6 if fn is lax.pmean else 0.0)
                unchanged(x, host)


@pytest.mark.parametrize("tiled", [False, True])
def test_lax_all_gather_and_psum_scatter(transport, group, tiled):
    n = group.size
    for shape, names in meshes(n):
        with fc.Mesh(shape, names, group=group.arg):
            size = lax.axis_size(names[0])
            host = tree(fc.get_rank())
            if tiled:  # a 0-d leaf has no axis to concatenate along
                host["i"] = host["i"][:1]
            x = to_cupy(host)
            for dim in (0, -1):
                check(lax.all_gather(x, names[0], axis=dim, tiled=tiled),
                      lax.all_gather(host, names[0], axis=dim, tiled=tiled))
            unchanged(x, host)
            host = {"a": data(fc.get_rank(), (size, 2 * size), "float64"),
                    "b": data(fc.get_rank(), (size, 3), "int16")}
            x = to_cupy(host)
            check(lax.psum_scatter(x, names[0], tiled=tiled),
                  lax.psum_scatter(host, names[0], tiled=tiled))
            check(lax.psum_scatter(x["a"], names[0], scatter_dimension=1, tiled=True),
                  lax.psum_scatter(host["a"], names[0], scatter_dimension=1, tiled=True))
            unchanged(x, host)


@pytest.mark.parametrize(("split", "concat"), [(0, 0), (0, 1), (1, 0), (2, 1)])
def test_lax_all_to_all(transport, group, split, concat):
    n = group.size
    shape = [3, 4, 5]
    shape[split] = n
    host = {"x": data(fc.get_rank(), shape, "int16"), "y": data(fc.get_rank(), shape, "float64")}
    x = to_cupy(host)
    with fc.Mesh((n,), ("x",), group=group.arg):
        check(lax.all_to_all(x, "x", split, concat), lax.all_to_all(host, "x", split, concat))
        check(lax.all_to_all(x, "x", split, concat, tiled=True),
              lax.all_to_all(host, "x", split, concat, tiled=True))
    unchanged(x, host)


def test_lax_ppermute_and_pshuffle(transport, group):
    n = group.size
    host = tree(fc.get_rank())
    x = to_cupy(host)
    with fc.Mesh((n,), ("x",), group=group.arg):
        ring = [(i, (i + 1) % n) for i in range(n)]
        check(lax.ppermute(x, "x", ring), lax.ppermute(host, "x", ring))
        check(lax.ppermute(x, "x", [(0, n - 1)]), lax.ppermute(host, "x", [(0, n - 1)]))
        flip = list(reversed(range(n)))
        check(lax.pshuffle(x, "x", flip), lax.pshuffle(host, "x", flip))
    unchanged(x, host)


def test_lax_mixing_raises_before_sending(group):
    cupy = _cupy()
    mixed = {"a": cupy.ones(2), "b": {"c": np.ones(2)}}
    with fc.Mesh((group.size,), ("x",), group=group.arg):
        for fn in (lax.psum, lax.all_gather, lax.psum_scatter):
            with pytest.raises(TypeError, match=r"leaf \['b'\]\['c'\] to be a cupy\.ndarray "
                                                r"like leaf \['a'\], got numpy\.ndarray"):
                fn(mixed, "x")
        with pytest.raises(TypeError, match=r"leaf \[1\] .*got builtins\.float"):
            lax.ppermute([cupy.ones(1), 1.0], "x", [(0, 0)])
        # nothing was sent: the next call pairs up as usual
        got = lax.psum({"a": cupy.asarray(np.full(2, float(group.rank)))}, "x")
        check(got, {"a": np.full(2, float(sum(range(group.size))))})


@pytest.mark.parametrize("cap_mb", [0, 0.0001, 25])
def test_dp_averaging(transport, group, cap_mb):
    host = {"w": data(group.rank, (5, 3), "float64"), "b": [data(group.rank, 3, "float32"),
                                                            data(group.rank, 7, "float16")]}
    x = to_cupy(host)
    want = dp.average_gradients(host, group.arg, bucket_cap_mb=cap_mb)
    check(dp.average_gradients(x, group.arg, bucket_cap_mb=cap_mb), want, rtol=1e-3)
    avg = dp.GradientAverager(group.arg, bucket_cap_mb=cap_mb)
    check(avg(x), want, rtol=1e-3)
    check(avg.start(x).wait(), want, rtol=1e-3)
    for key, leaf in (("w", x["w"]), ("b1", x["b"][1]), ("b0", x["b"][0])):
        avg.push(key, leaf)  # as backprop produces them
    pushed = avg.wait()
    check({"w": pushed["w"], "b": [pushed["b0"], pushed["b1"]]}, want, rtol=1e-3)
    unchanged(x, host)


def test_dp_no_sync_hooks_and_compression(transport, group):
    cupy = _cupy()
    host = {"w": data(group.rank, (4, 3), "float64"), "b": data(group.rank, 3, "float32")}
    x = to_cupy(host)
    avg, ref = dp.GradientAverager(group.arg), dp.GradientAverager(group.arg)
    with avg.no_sync(), ref.no_sync():
        check(avg(x), ref(host))  # local sums only
    check(avg(x), ref(host), rtol=1e-6)  # accumulated + current, averaged
    seen = []

    def hook(bucket: Any, g: Any) -> Any:
        seen.append(type(bucket))
        return fc.all_reduce(bucket, "sum", g) / group.size

    check(dp.GradientAverager(group.arg, bucket_cap_mb=0, hook=hook)(x),
          dp.average_gradients(host, group.arg), rtol=1e-6)
    assert seen == [cupy.ndarray, cupy.ndarray]
    for compression, rtol in (("fp16", 2e-3), ("bf16", 2e-2)):
        check(dp.average_gradients(x, group.arg, compression=compression),
              dp.average_gradients(host, group.arg), rtol=rtol)
    unchanged(x, host)


def test_dp_join_uneven(transport, group):
    """Group rank r has r steps of data (rank 0 none: it learns the layout, cupy included,
    from the first contributor); every step matches the same join on numpy."""
    me = group.rank

    def grads(step: int) -> dict[str, np.ndarray]:
        return {"w": data(me, (3, 2), "float64", salt=step), "b": data(me, 2, "float32", step)}

    results = []
    for to in (to_cupy, lambda t: t):
        avg, got = dp.GradientAverager(group.arg, bucket_cap_mb=0), []
        with avg.join():
            for step in range(me):
                got.append(avg(to(grads(step))))
        results.append(got)
    for got, want in zip(*results, strict=True):
        check(got, want, rtol=1e-6)


def test_dp_parameters(transport, group):
    host = tree(group.rank)
    x = to_cupy(host)
    check(dp.broadcast_parameters(x, group.size - 1, group.arg),
          dp.broadcast_parameters(host, group.size - 1, group.arg))
    floats = {"f": host["f"], "d": host["i"][1]}
    check(dp.average_parameters(to_cupy(floats), group.arg),
          dp.average_parameters(floats, group.arg), rtol=1e-6)
    periodic = dp.PeriodicModelAverager(period=2, group=group.arg)
    check(periodic.average_parameters(to_cupy(floats)), dp.average_parameters(floats, group.arg),
          rtol=1e-6)
    dp.check_parameters(x, group.arg)
    unchanged(x, host)
    if group.size > 1:  # numpy on one rank, cupy on the others: named
        odd = {"w": np.zeros(2) if group.rank == 0 else _cupy().zeros(2)}
        with pytest.raises(ValueError, match=r"leaf \['w'\]: rank 0 has \(2,\) float64, "
                                             r"rank 1 has \(2,\) cupy float64"):
            dp.check_parameters(odd, group.arg)


def test_dp_errors_name_the_leaf(group):
    cupy = _cupy()
    avg = dp.GradientAverager(group.arg)
    mixed = {"a": cupy.ones(2), "b": [cupy.ones(1), np.ones(1)]}
    for call in (avg, avg.start, lambda t: dp.average_gradients(t, group.arg),
                 lambda t: dp.broadcast_parameters(t, 0, group.arg),
                 lambda t: dp.average_parameters(t, group.arg)):
        with pytest.raises(TypeError, match=r"expected leaf \['b'\]\[1\] to be a cupy\.ndarray "
                                            r"like leaf \['a'\], got numpy\.ndarray"):
            call(mixed)
    with pytest.raises(TypeError, match=r"leaf \['b'\] to be a numpy\.ndarray, cupy\.ndarray, "
                                        r"torch\.Tensor or jax\.Array, got builtins\.float"):
        avg({"a": np.ones(1), "b": 1.5})
    avg.push("w", cupy.ones(2))
    with pytest.raises(TypeError, match=r"push: expected grad 'v' to be a cupy\.ndarray like the "
                                        r"gradients before it, got numpy\.ndarray"):
        avg.push("v", np.ones(2))
    with pytest.raises(TypeError, match=r"push: expected grad 'v' to be a numpy\.ndarray, "
                                        r"cupy\.ndarray, torch\.Tensor or jax\.Array, got builtins\.list"):
        avg.push("v", [1.0])
    check(avg.wait(), {"w": np.ones(2)})  # the cupy step goes on unharmed
    with avg.no_sync():
        avg({"w": np.ones(2)})
    with pytest.raises(TypeError, match=r"expected leaf \['w'\] to be a numpy\.ndarray like the "
                                        r"gradients before it, got cupy\.ndarray"):
        avg({"w": cupy.ones(2)})



@pytest.mark.parametrize("size", [5, 5000])  # inline in the header message, and separate
def test_p2p_cupy_arrives_as_cupy(group, size, monkeypatch):
    cupy = _cupy()
    n, me = group.size, group.rank
    mine = data(group.members[me], (size, 2), "float32")
    theirs = data(group.members[(me - 1) % n], (size, 2), "float32")
    x = cupy.asarray(mine)
    works = fc.batch_isend_irecv([fc.P2POp(fc.isend, x, (me + 1) % n, group.arg),
                                  fc.P2POp(fc.irecv, None, (me - 1) % n, group.arg)])
    check(works[1].wait(), theirs)
    works[0].wait()
    w = fc.irecv((me - 1) % n, group.arg, tag=3)
    fc.isend(mine, (me + 1) % n, group.arg, tag=3).wait()
    got = w.wait()
    assert type(got) is np.ndarray and np.array_equal(got, theirs)  # numpy stays numpy
    with monkeypatch.context() as m:  # a receiver without cupy gets numpy
        m.delitem(sys.modules, "cupy")
        w = fc.irecv((me - 1) % n, group.arg, tag=4)
    fc.isend(x, (me + 1) % n, group.arg, tag=4).wait()
    got = w.wait()
    assert type(got) is np.ndarray and np.array_equal(got, theirs)
    if n > 1 and not (n % 2 and me == n - 1):  # blocking pairs 0-1, 2-3, ...
        peer = me + 1 if me % 2 == 0 else me - 1
        pair = data(group.members[peer], (size, 2), "float32")
        if me % 2 == 0:
            fc.send(x, peer, group.arg)
            got, source = fc.recv(peer, group.arg, return_source=True)
        else:
            got, source = fc.recv(None, group.arg, return_source=True)
            fc.send(x, peer, group.arg)
        assert source == peer
        check(got, pair)
    unchanged(x, mine)


@pytest.mark.skipif(fc.get_world_size() != 1, reason="starts its own 2-rank jobs")
def test_training_example_on_gpu_matches_numpy():
    """examples/train_digits.py --gpu (on the CPU stand-in for cupy) trains like numpy."""
    if not _fake():
        pytest.skip("runs the example on tests/fake_cupy.py; on a GPU run it by hand")
    fake = ("from tests import fake_cupy; fake_cupy.install(); import sys; "
            "from fcoll.run import main; main(sys.argv[1:])")
    runs = [jobs.run(2, sys.executable, "-c", fake, "examples/train_digits.py", "--epochs", "2",
                     *flag, timeout=300) for flag in ([], ["--gpu"])]
    for done in runs:
        assert done.returncode == 0, done.stdout + done.stderr
        assert "parameters identical on all 2 ranks: True" in done.stdout, done.stdout
    accuracy = [done.stdout.split("test accuracy ")[1].split()[0] for done in runs]
    assert accuracy[0] == accuracy[1], accuracy
