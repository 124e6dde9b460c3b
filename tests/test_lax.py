"""Mesh and fcoll.lax: meshes n x 1, 1 x n and 2 x 2 (n = 4), pytrees with mixed dtypes;
expected values computed from every rank's deterministic data."""

from __future__ import annotations

import numpy as np
import pytest

import fcoll as fc
from fcoll import lax


def meshes(n: int) -> list[tuple[int, int]]:
    return [(n, 1), (1, n)] + ([(2, 2)] if n == 4 else [])


@pytest.fixture(params=["n_by_1", "1_by_n", "2_by_2"])
def mesh(request):
    n = fc.get_world_size()
    shape = {"n_by_1": (n, 1), "1_by_n": (1, n), "2_by_2": (2, 2)}[request.param]
    if shape[0] * shape[1] != n:
        pytest.skip("2 x 2 needs 4 ranks")
    with fc.Mesh(shape, ("dp", "tp")) as m:
        yield m


def tree(rank: int) -> dict:
    rng = np.random.default_rng(rank)
    return {"f": rng.integers(0, 5, (2, 3)).astype(np.float64),
            "i": [rng.integers(0, 5, (3,)).astype(np.int32),
                  np.array(rank, dtype=np.float32)]}


def members(mesh: fc.Mesh, axis: str) -> list[int]:
    return list(mesh.group(axis).ranks)


def test_mesh_layout(mesh):
    rows, cols = mesh.shape
    r = fc.get_rank()
    assert mesh.coordinate() == (r // cols, r % cols)
    assert members(mesh, "tp") == [(r // cols) * cols + j for j in range(cols)]
    assert members(mesh, "dp") == [i * cols + r % cols for i in range(rows)]
    assert list(mesh.group(("dp", "tp")).ranks) == list(range(fc.get_world_size()))
    assert (mesh.ndim, mesh.size, mesh.names) == (2, rows * cols, ("dp", "tp"))
    sub = mesh["tp"]
    assert sub.shape == (cols,) and sub.names == ("tp",) and sub.coordinate() == (r % cols,)
    assert lax.axis_index("tp") == r % cols and lax.axis_size("dp") == rows
    assert lax.axis_index(("dp", "tp")) == r
    assert fc.all_reduce(np.array([1]), group="dp").tolist() == [rows]


def test_mesh_errors():
    n = fc.get_world_size()
    with pytest.raises(ValueError, match="multiply to the group's size"):
        fc.Mesh((n + 1,), ("x",))
    with pytest.raises(ValueError, match="one distinct name per axis"):
        fc.Mesh((n, 1), ("x", "x"))
    with fc.Mesh((n,), ("x",)) as m:
        with pytest.raises(ValueError, match="expected axis names from"):
            m.group("y")
        with pytest.raises(ValueError, match="not axes of an active mesh"):
            lax.psum(np.ones(1), "y")
        with fc.Mesh((1, n), ("a", "x")):  # nested: the innermost mesh with the name wins
            assert lax.axis_size("x") == n and lax.axis_size("a") == 1
    with pytest.raises(ValueError, match="not axes of an active mesh"):
        lax.psum(np.ones(1), "x")


@pytest.mark.smoke
@pytest.mark.parametrize("axis", ["dp", "tp"])
def test_reductions(mesh, axis):
    ranks = members(mesh, axis)
    x = tree(fc.get_rank())
    trees = [tree(r) for r in ranks]
    got = lax.psum(x, axis)
    np.testing.assert_array_equal(got["f"], sum(t["f"] for t in trees))
    assert got["i"][0].dtype == np.int32
    np.testing.assert_array_equal(got["i"][0], sum(t["i"][0] for t in trees))
    assert got["i"][1].shape == () and float(got["i"][1]) == float(sum(ranks))
    top = lax.pmax(x, axis)
    np.testing.assert_array_equal(top["i"][0], np.max([t["i"][0] for t in trees], axis=0))
    low = lax.pmin(x, axis)
    np.testing.assert_array_equal(low["f"], np.min([t["f"] for t in trees], axis=0))
    mean = lax.pmean({"f": x["f"]}, axis)
    np.testing.assert_allclose(mean["f"], sum(t["f"] for t in trees) / len(ranks))


@pytest.mark.parametrize("axis", ["dp", "tp"])
@pytest.mark.parametrize("tiled", [False, True])
def test_all_gather(mesh, axis, tiled):
    ranks = members(mesh, axis)
    trees = [tree(r) for r in ranks]
    for dim in (0, -1):
        mine = tree(fc.get_rank())
        got = lax.all_gather({"f": mine["f"], "i": mine["i"][0]}, axis, axis=dim, tiled=tiled)
        for key, parts in (("f", [t["f"] for t in trees]), ("i", [t["i"][0] for t in trees])):
            expected = np.concatenate(parts, axis=dim) if tiled else np.stack(parts, axis=dim)
            np.testing.assert_array_equal(got[key], expected)
            assert got[key].dtype == parts[0].dtype
    scalars = lax.all_gather(np.float32(fc.get_rank()), axis)
    assert scalars.tolist() == [float(r) for r in ranks]


@pytest.mark.parametrize("axis", ["dp", "tp"])
def test_psum_scatter(mesh, axis):
    ranks, me = members(mesh, axis), lax.axis_index(axis)
    n = len(ranks)
    data = {r: np.random.default_rng(r).integers(0, 9, (n, 2 * n)).astype(np.float64)
            for r in ranks}
    total = sum(data.values())
    mine = data[fc.get_rank()]
    got = lax.psum_scatter({"a": mine, "b": mine.astype(np.int64)}, axis)
    np.testing.assert_array_equal(got["a"], total[me])
    assert got["b"].dtype == np.int64
    np.testing.assert_array_equal(got["b"], total.astype(np.int64)[me])
    tiled = lax.psum_scatter(mine, axis, scatter_dimension=1, tiled=True)
    np.testing.assert_array_equal(tiled, np.split(total, n, axis=1)[me])
    if n > 1:
        with pytest.raises(ValueError, match="the axis size"):
            lax.psum_scatter(np.ones((n + 1, 2)), axis)


@pytest.mark.smoke
@pytest.mark.parametrize("axis", ["dp", "tp"])
@pytest.mark.parametrize(("split", "concat"), [(0, 0), (0, 1), (1, 0), (1, 2), (2, 0)])
def test_all_to_all(mesh, axis, split, concat):
    ranks, me = members(mesh, axis), lax.axis_index(axis)
    n = len(ranks)
    shape = [3, 4, 5]
    shape[split] = n
    data = {r: np.random.default_rng(r).integers(0, 99, shape).astype(np.int16) for r in ranks}
    got = lax.all_to_all({"x": data[fc.get_rank()], "y": data[fc.get_rank()].astype(np.float32)},
                         axis, split, concat)
    # JAX's definition: block me (along split_axis) of every rank, the blocks stacked along
    # a new axis at concat_axis of the result (split_axis removed).
    blocks = [np.take(data[r], me, axis=split) for r in ranks]
    expected = np.stack(blocks, axis=concat) if split != concat else np.concatenate(
        [np.take(data[r], [me], axis=split) for r in ranks], axis=split)
    np.testing.assert_array_equal(got["x"], expected)
    assert got["y"].dtype == np.float32
    tiled = lax.all_to_all(data[fc.get_rank()], axis, split, concat, tiled=True)
    parts = [np.split(data[r], n, axis=split)[me] for r in ranks]
    np.testing.assert_array_equal(tiled, np.concatenate(parts, axis=concat))


@pytest.mark.parametrize("axis", ["dp", "tp"])
def test_ppermute_and_pshuffle(mesh, axis):
    ranks, me = members(mesh, axis), lax.axis_index(axis)
    n = len(ranks)
    x = tree(fc.get_rank())
    shifted = lax.ppermute(x, axis, [(i, (i + 1) % n) for i in range(n)])
    source = tree(ranks[(me - 1) % n])
    np.testing.assert_array_equal(shifted["f"], source["f"])
    np.testing.assert_array_equal(shifted["i"][0], source["i"][0])
    partial = lax.ppermute(x, axis, [(0, n - 1)])
    if me == n - 1:
        np.testing.assert_array_equal(partial["f"], tree(ranks[0])["f"])
    else:
        assert not partial["f"].any() and not partial["i"][0].any()
    reverse = lax.pshuffle(x, axis, [n - 1 - i for i in range(n)])
    np.testing.assert_array_equal(reverse["f"], tree(ranks[n - 1 - me])["f"])
    np.testing.assert_array_equal(reverse["i"][0], tree(ranks[n - 1 - me])["i"][0])
