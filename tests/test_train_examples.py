"""examples/train_torch.py, examples/train_jax.py (eager and jitted steps) and
examples/tensor_parallel.py, briefly, at the suite's world size.

Each trains a small model data-parallel in this job (every rank of the suite runs the
test) and checks what a wrong average would break: the ranks end bit-identical, the run
equals one process training on the whole batches (up to float32 rounding), and the loss
falls. Skipped where torch, JAX or scikit-learn (the digits) is missing.
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest

import fcoll as fc
from tests.helpers import load_example

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
EPS32 = float(np.finfo(np.float32).eps)


def _example(name: str) -> ModuleType:
    """examples/<name>.py as a module (loaded once per process)."""
    pytest.importorskip("sklearn")
    return load_example(name)


def _torch_reference(ex: ModuleType, hidden: int, epochs: int, steps: int) -> Any:
    """examples/train_torch.py's run in this process alone, on the whole global batches."""
    import torch

    x, y, _, _ = ex.load()
    model = ex.make_model(x.shape[1], hidden, 10, seed=0)
    optimizer = torch.optim.SGD(model.parameters(), lr=ex.LR, momentum=ex.MOMENTUM)
    for batch in ex.global_batches(epochs, steps, len(y)):
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(x[batch]), y[batch]).backward()
        optimizer.step()
    return model


@pytest.mark.parametrize("overlap", [False, True], ids=["after_backward", "overlapped"])
def test_torch_example_agrees_across_ranks_and_with_one_process(overlap):
    torch = pytest.importorskip("torch")
    ex = _example("train_torch")
    hidden, epochs, steps = 32, 2, 4
    model, losses = ex.train(epochs, hidden, steps_per_epoch=steps, verbose=False, overlap=overlap)
    assert ex.parameters_identical(model)
    x, y, _, _ = ex.load()
    before = ex.make_model(x.shape[1], hidden, 10, seed=0)  # rank 0's start, everyone's
    with torch.no_grad():
        start, end = (float(torch.nn.functional.cross_entropy(m(x), y)) for m in (before, model))
    assert end < start - 1e-3, (start, end, losses)  # 2.3062 -> 2.3008 at any world size
    reference = _torch_reference(ex, hidden, epochs, steps)
    # The slices' mean gradients averaged equal the whole batch's up to rounding (the sums
    # run in another order): a few float32 ulps per step, on parameters of size ~1.
    for p, q in zip(model.parameters(), reference.parameters(), strict=True):
        assert torch.allclose(p, q, rtol=0, atol=epochs * steps * 64 * EPS32), (p - q).abs().max()


def test_torch_example_overlap_gives_the_same_bits():
    """Pushing gradients during backward (buckets of 1 parameter) averages exactly as
    average_gradients after it: the sums are elementwise, bucketing does not change them."""
    torch = pytest.importorskip("torch")
    ex = _example("train_torch")
    after, _ = ex.train(1, 32, steps_per_epoch=3, verbose=False)
    during, _ = ex.train(1, 32, steps_per_epoch=3, verbose=False, overlap=True)
    for p, q in zip(after.parameters(), during.parameters(), strict=True):
        assert torch.equal(p, q)


@pytest.mark.parametrize("jit", [False, True], ids=["eager_pmean", "whole_step_in_one_jit"])
def test_jax_example_equals_one_process_training(jit):
    """Eagerly (pmean between jitted calls) or with the whole step (forward, backward, pmean
    of gradients and loss, update) in one jax.jit: the ranks agree, and the run equals one
    process training on the whole batches (and, jitted, the eager run)."""
    jax = pytest.importorskip("jax")
    ex = _example("train_jax")
    x, y = ex.load()
    start = ex.init_params([x.shape[1], 32, 32, 10], seed=0)
    steps = 10
    data = ex.batches(x[:1500], y[:1500], steps)
    params, losses = ex.train(start, data, jit=jit)
    assert np.mean(losses[-3:]) < np.mean(losses[:3]), losses
    mine = np.concatenate([np.asarray(leaf).ravel() for leaf in jax.tree_util.tree_leaves(params)])
    assert np.array_equal(mine, fc.broadcast(mine, src=0)), "ranks' parameters differ"
    reference = ex.reference(start, data)
    # Each step's averaged gradient is the whole batch's up to float32 rounding (a few ulps);
    # the differences add up over the steps at most (learning rate < 1, parameters ~1).
    scale = max(float(np.max(np.abs(np.asarray(leaf)))) for leaf in jax.tree_util.tree_leaves(params))
    assert ex.max_difference(params, reference) <= steps * 16 * EPS32 * scale
    if jit:
        eager, eager_losses = ex.train(start, data)
        np.testing.assert_allclose(losses, eager_losses, rtol=1e-5)
        assert ex.max_difference(params, eager) <= steps * 16 * EPS32 * scale


def test_tensor_parallel_example_equals_the_unsplit_model():
    torch = pytest.importorskip("torch")
    ex = _example("tensor_parallel")
    mine, whole, losses = ex.train(4)
    together = ex.gathered(mine)
    for name, value in whole.items():
        torch.testing.assert_close(together[name], value.detach(), rtol=1e-12, atol=1e-12)
    assert mine["w1"].shape == (ex.IN, ex.HIDDEN // fc.get_world_size())
    assert losses[-1] < losses[0], losses
