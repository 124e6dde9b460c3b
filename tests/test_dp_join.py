"""fcoll.dp with uneven inputs (GradientAverager.join): ranks with k, k+1, ..., k+n-1
batches train to the parameters of one process that averages, at each step, the
gradients of the ranks that still have data; every rank leaves the block together."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import fcoll as fc
from fcoll.testing import parallel_assert

LR = 0.1


def _sample(rank: int, step: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(1000 * rank + step)
    return rng.normal(size=(4, 3)), rng.normal(size=4)


def _grads(params: dict[str, np.ndarray], x: np.ndarray, y: np.ndarray) -> dict[str, Any]:
    """Least-squares gradients of a linear model (float64 weights, float32 bias)."""
    err = x @ params["w"] + params["b"].astype(np.float64) - y
    return {"w": x.T @ err / len(y), "b": np.array([err.mean()], np.float32)}


def _start() -> dict[str, np.ndarray]:
    return {"w": np.zeros(3), "b": np.zeros(1, np.float32)}


def _reference(n: int, batches: list[int], steps: int, accumulate: int = 1
               ) -> dict[str, np.ndarray]:
    """One process, the first ``steps`` steps: at each, the mean over the ranks that still
    have a batch (a rank's parameters stop changing when its data ends)."""
    params = _start()
    for step in range(0, steps, accumulate):
        grads = []
        for r in range(n):
            mine = [s for s in range(step, step + accumulate) if s < batches[r]]
            if mine:
                parts = [_grads(params, *_sample(r, s)) for s in mine]
                grads.append({k: sum(p[k] for p in parts) for k in parts[0]})
        for k in params:
            mean = sum(g[k] for g in grads) / len(grads)
            params[k] = params[k] - (LR * mean).astype(params[k].dtype)
    return params


def _train_joined(group: Any, batches: list[int], bucket_cap_mb: float = 25
                  ) -> dict[str, np.ndarray]:
    """This rank's parameters after its ``batches[rank]`` steps inside ``avg.join()``."""
    avg = fc.dp.GradientAverager(group.arg, bucket_cap_mb=bucket_cap_mb)
    params = _start()
    with avg.join():
        for step in range(batches[group.rank]):
            grads = avg(_grads(params, *_sample(group.rank, step)))
            params = {key: params[key] - (LR * grads[key]).astype(params[key].dtype)
                      for key in params}
    return params


@pytest.mark.parametrize("bucket_cap_mb", [0, 25])
def test_uneven_batches_train_like_one_process(group, bucket_cap_mb):
    k = 2
    batches = [k + r for r in range(group.size)]  # rank r runs out after k + r steps
    params = _train_joined(group, batches, bucket_cap_mb)
    want = _reference(group.size, batches, batches[group.rank])
    parallel_assert(_close(params, want), "parameters of the one-process reference",
                    group=group.arg)
    # every rank left together: the group still works, in step
    parallel_assert(fc.all_reduce(np.ones(1), group=group.arg)[0] == group.size,
                    group=group.arg)


def _close(got: dict[str, np.ndarray], want: dict[str, np.ndarray]) -> bool:
    return all(got[k].dtype == want[k].dtype and np.allclose(got[k], want[k], rtol=1e-6,
                                                             atol=1e-9) for k in want)


def test_no_sync_inside_join(group):
    """Steps of two batches (the first under no_sync); rank r has 2 + 2r batches."""
    batches = [2 + 2 * r for r in range(group.size)]
    avg = fc.dp.GradientAverager(group.arg)
    params = _start()
    with avg.join():
        for step in range(batches[group.rank]):
            grads = _grads(params, *_sample(group.rank, step))
            if step % 2 == 0:
                with avg.no_sync():
                    avg(grads)
                continue
            mean = avg(grads)
            params = {key: params[key] - (LR * mean[key]).astype(params[key].dtype)
                      for key in params}
    want = _reference(group.size, batches, batches[group.rank], accumulate=2)
    parallel_assert(_close(params, want), "no_sync pairs", group=group.arg)


def test_a_rank_without_data_still_answers(group):
    """Rank 0 has no batch at all: it learns the layout from a contributing rank."""
    batches = [0 if r == 0 else 2 for r in range(group.size)]
    params = _train_joined(group, batches)
    want = _reference(group.size, batches, batches[group.rank])
    parallel_assert(_close(params, want), "a rank without data", group=group.arg)


def test_join_refuses_compression_and_push(group):
    with (pytest.raises(ValueError, match="join: expected the default averaging hook"),
          fc.dp.GradientAverager(group.arg, compression="fp16").join()):
        pass
    avg = fc.dp.GradientAverager(group.arg)
    with pytest.raises(RuntimeError, match="push: expected no join block"), avg.join():
        avg.push("w", np.ones(1))
