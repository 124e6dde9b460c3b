"""fcoll.dp: data-parallel training of a numpy MLP matches single-process training."""

from __future__ import annotations

from collections import namedtuple

import numpy as np
import pytest

import fcoll as fc
from fcoll import dp
from fcoll.dp import averager

BATCH, D_IN, HIDDEN, D_OUT, STEPS, LR = 24, 8, 16, 4, 4, 0.5


def init_params(seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    return {"l1": {"w": rng.standard_normal((D_IN, HIDDEN)) * 0.3, "b": np.zeros(HIDDEN)},
            "l2": {"w": rng.standard_normal((HIDDEN, D_OUT)) * 0.3, "b": np.zeros(D_OUT)}}


def data(step: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(100 + step)
    return rng.standard_normal((BATCH, D_IN)), rng.integers(0, D_OUT, BATCH)


def forward_backward(params: dict, x: np.ndarray, y: np.ndarray, push=None) -> dict:
    """Mean cross-entropy gradients; ``push(path, grad)`` is called as each appears."""
    h_pre = x @ params["l1"]["w"] + params["l1"]["b"]
    h = np.maximum(h_pre, 0)
    logits = h @ params["l2"]["w"] + params["l2"]["b"]
    p = np.exp(logits - logits.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    d_logits = p.copy()
    d_logits[np.arange(len(y)), y] -= 1
    d_logits /= len(y)
    grads = {"l2": {"w": h.T @ d_logits, "b": d_logits.sum(0)}}
    if push:
        push(("l2", "w"), grads["l2"]["w"])
        push(("l2", "b"), grads["l2"]["b"])
    d_h = (d_logits @ params["l2"]["w"].T) * (h_pre > 0)
    grads["l1"] = {"w": x.T @ d_h, "b": d_h.sum(0)}
    if push:
        push(("l1", "w"), grads["l1"]["w"])
        push(("l1", "b"), grads["l1"]["b"])
    return grads


def sgd(params: dict, grads: dict) -> dict:
    return {layer: {k: params[layer][k] - LR * grads[layer][k] for k in params[layer]}
            for layer in params}


def single_process(steps: int = STEPS, accumulate: int = 1) -> dict:
    params = init_params()
    for step in range(steps):
        total = None
        for micro in range(accumulate):
            x, y = data(step * accumulate + micro)
            g = forward_backward(params, x, y)
            total = g if total is None else {ly: {k: total[ly][k] + g[ly][k] for k in g[ly]}
                                             for ly in g}
        params = sgd(params, {ly: {k: v / accumulate for k, v in total[ly].items()}
                              for ly in total})
    return params


def shard(group, x, y):
    per = BATCH // group.size
    part = slice(group.rank * per, (group.rank + 1) * per)
    return x[part], y[part]


def assert_same(a: dict, b: dict, rtol: float = 1e-5) -> None:
    for layer in a:
        for k in a[layer]:
            np.testing.assert_allclose(a[layer][k], b[layer][k], rtol=rtol, atol=1e-8)


@pytest.mark.smoke
@pytest.mark.parametrize("cap_mb", [0, 0.001, 25])
@pytest.mark.parametrize("overlap", [False, True])
def test_data_parallel_matches_single_process(group, cap_mb, overlap):
    if BATCH % group.size:
        pytest.skip("batch does not split evenly")
    avg = dp.GradientAverager(group.arg, bucket_cap_mb=cap_mb)
    averager._LAYOUTS.clear()  # shared by every averager: count only this test's
    params = dp.broadcast_parameters(init_params(seed=group.rank), 0, group.arg)
    for step in range(STEPS):
        x, y = shard(group, *data(step))
        if overlap:
            forward_backward(params, x, y, push=avg.push)
            by_key = avg.wait()
            grads = {ly: {k: by_key[(ly, k)] for k in ("w", "b")} for ly in ("l1", "l2")}
        else:
            grads = avg(forward_backward(params, x, y))
        params = sgd(params, grads)
    assert_same(params, single_process())
    dp.check_parameters(params, group.arg)
    if not overlap:  # computed once for the tree's structure, reused every step
        mine = [v for k, v in averager._LAYOUTS.items() if k[1] == avg.cap]
        assert len(mine) == 1
        buckets = mine[0]
        assert [i for b in buckets for i in b] == [3, 2, 1, 0]  # reverse leaf order
        assert len(buckets) == (4 if cap_mb == 0 else 2 if cap_mb == 0.001 else 1)
    fc.barrier(group.arg)


def test_no_sync_accumulation(group):
    if BATCH % group.size:
        pytest.skip("batch does not split evenly")
    avg = dp.GradientAverager(group.arg, bucket_cap_mb=0.001)
    params = init_params()
    for step in range(2):
        with avg.no_sync():
            x, y = shard(group, *data(2 * step))
            local = avg(forward_backward(params, x, y))
        assert local["l1"]["w"].shape == (D_IN, HIDDEN)
        x, y = shard(group, *data(2 * step + 1))
        summed = avg(forward_backward(params, x, y))  # averages accumulated + current
        params = sgd(params, {ly: {k: v / 2 for k, v in summed[ly].items()} for ly in summed})
    assert_same(params, single_process(steps=2, accumulate=2))


@pytest.mark.parametrize(("compression", "rtol"), [("fp16", 2e-3), ("bf16", 2e-2)])
def test_compression_within_tolerance(group, compression, rtol):
    rng = np.random.default_rng(group.members[group.rank])
    grads = {"a": rng.standard_normal((30, 7)), "b": [rng.standard_normal(5).astype(np.float32)]}
    exact = dp.average_gradients(grads, group.arg)
    approx = dp.average_gradients(grads, group.arg, compression=compression)
    for e, a in zip([exact["a"], exact["b"][0]], [approx["a"], approx["b"][0]], strict=True):
        assert a.dtype == e.dtype
        np.testing.assert_allclose(a, e, rtol=rtol, atol=rtol * 4)


def test_custom_hook_and_start(group):
    calls = []

    def hook(bucket, g):
        calls.append(bucket.size)
        return fc.all_reduce(bucket, "sum", g) / group.size  # a plain array is fine too

    avg = dp.GradientAverager(group.arg, bucket_cap_mb=0, hook=hook)
    tree = {"x": np.full(3, float(group.rank)), "y": (np.ones(2, np.float32),)}
    work = avg.start(tree)
    out = work.wait()
    assert sorted(calls) == [2, 3]  # one bucket per leaf at cap 0
    np.testing.assert_allclose(out["x"], np.full(3, (group.size - 1) / 2))
    assert out["y"][0].dtype == np.float32


def test_broadcast_check_and_average_parameters(group):
    Pair = namedtuple("Pair", "w b")
    params = {"p": Pair(np.full(3, float(group.rank)), np.arange(2, dtype=np.int32) + group.rank)}
    got = dp.broadcast_parameters(params, group.size - 1, group.arg)
    assert isinstance(got["p"], Pair) and got["p"].w.tolist() == [group.size - 1.0] * 3
    assert got["p"].b.tolist() == [group.size - 1, group.size]
    avg = dp.average_parameters({"w": np.full(2, float(group.rank))}, group.arg)
    assert avg["w"].tolist() == [(group.size - 1) / 2] * 2
    if group.size > 1:
        bad = {"w": np.zeros(3 if group.rank == 0 else 4), "v": np.zeros(2, np.float32)}
        with pytest.raises(ValueError, match=r"leaf \['w'\]: rank 0 has \(3,\) float64, rank 1"):
            dp.check_parameters(bad, group.arg)


def test_periodic_model_averager_schedule(group):
    averager = dp.PeriodicModelAverager(period=3, warmup_steps=2, group=group.arg)
    averaged = []
    for _ in range(10):
        p = {"w": np.full(1, float(group.rank))}
        out = averager.average_parameters(p)
        averaged.append(out is not p)
    assert averaged == [k >= 2 and (k - 2) % 3 == 0 for k in range(10)]
    with pytest.raises(ValueError, match="period"):
        dp.PeriodicModelAverager(period=0)


def test_averager_argument_errors():
    with pytest.raises(ValueError, match="compression"):
        dp.GradientAverager(compression="int8")
    with pytest.raises(ValueError, match="bucket_cap_mb"):
        dp.GradientAverager(bucket_cap_mb=-1)
    with pytest.raises(TypeError, match=r"numpy\.ndarray"):
        dp.GradientAverager().push("k", [1.0])
