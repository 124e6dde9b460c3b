"""Tensor-parallel training of a torch MLP: a column-parallel layer, then a row-parallel one.

    mpiexec -n 4 .venv/bin/python -m fcoll.run examples/tensor_parallel.py [--steps 5]

The MLP is ``y = tanh(x @ w1 + b1) @ w2 + b2`` (16 -> 12 -> 8) in float64. Each of the n
ranks holds a slice of the hidden layer, as Megatron-LM splits it: the columns of ``w1`` and
``b1`` (column-parallel) and the matching rows of ``w2`` (row-parallel); ``b2`` is whole on
every rank. The batch is the same on every rank:

- ``fcoll.torch.copy_to_group(x)`` enters the split layer: identity forward, and in the
  backward pass the sum of the ranks' partial gradients of ``x``;
- each rank computes its slice of the hidden activations and its partial product with
  its rows of ``w2``;
- ``fcoll.torch.reduce_from_group(partial)`` sums the partial outputs (an all-reduce)
  forward, and passes the gradient through unchanged backward: every rank holds the same
  output and the same loss, and each computes exactly its slice's gradient.

Plain SGD on each rank's own slices then trains the same model as one process training
the whole MLP: at the end the slices are gathered (`fcoll.all_gather_into_tensor`) and
compared with that model, trained here on every rank (float64, allclose).
"""

from __future__ import annotations

import argparse

import torch

import fcoll as fc
import fcoll.torch

IN, HIDDEN, OUT, BATCH, LR = 16, 12, 8, 32, 0.1  # HIDDEN splits over 1, 2, 3, 4 and 6 ranks


def whole_model(seed: int = 0) -> dict[str, torch.Tensor]:
    """The unsplit MLP's parameters (the same on every rank)."""
    g = torch.Generator().manual_seed(seed)
    return {"w1": torch.randn(IN, HIDDEN, generator=g, dtype=torch.float64) / IN ** 0.5,
            "b1": torch.randn(HIDDEN, generator=g, dtype=torch.float64) * 0.1,
            "w2": torch.randn(HIDDEN, OUT, generator=g, dtype=torch.float64) / HIDDEN ** 0.5,
            "b2": torch.zeros(OUT, dtype=torch.float64)}


def my_slices(whole: dict[str, torch.Tensor], rank: int, n: int) -> dict[str, torch.Tensor]:
    """This rank's slices: columns of w1 and b1, rows of w2, all of b2 (leaves that require grad)."""
    cols = slice(rank * HIDDEN // n, (rank + 1) * HIDDEN // n)
    mine = {"w1": whole["w1"][:, cols], "b1": whole["b1"][cols], "w2": whole["w2"][cols],
            "b2": whole["b2"]}
    return {k: v.clone().requires_grad_(True) for k, v in mine.items()}


def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Step ``step``'s inputs and targets (the same on every rank)."""
    g = torch.Generator().manual_seed(1000 + step)
    x = torch.randn(BATCH, IN, generator=g, dtype=torch.float64)
    return x, torch.sin(x[:, :OUT]) + 0.5


def parallel_forward(p: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    """The MLP with the hidden layer split over the job."""
    x = fcoll.torch.copy_to_group(x)                   # column-parallel layer's input
    hidden = torch.tanh(x @ p["w1"] + p["b1"])         # this rank's slice of the hidden layer
    out = fcoll.torch.reduce_from_group(hidden @ p["w2"])  # row-parallel: partial sums added
    return out + p["b2"]


def whole_forward(p: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    return torch.tanh(x @ p["w1"] + p["b1"]) @ p["w2"] + p["b2"]


def sgd(params: dict[str, torch.Tensor], loss: torch.Tensor) -> float:
    """One SGD step on ``params`` (in place, as an optimizer does); returns the loss."""
    loss.backward()
    with torch.no_grad():
        for p in params.values():
            p -= LR * p.grad
            p.grad = None
    return float(loss.detach())


def train(steps: int) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor], list[float]]:
    """``steps`` steps of the split model and of the whole one; returns this rank's slices,
    the whole model and the split model's losses."""
    n, r = fc.get_world_size(), fc.get_rank()
    whole = {k: v.requires_grad_(True) for k, v in whole_model().items()}
    mine = my_slices(whole_model(), r, n)
    losses = []
    for step in range(steps):
        x, target = batch(step)
        losses.append(sgd(mine, torch.mean((parallel_forward(mine, x) - target) ** 2)))
        sgd(whole, torch.mean((whole_forward(whole, x) - target) ** 2))
    return mine, whole, losses


def gathered(mine: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The slices of every rank put back together."""
    with torch.no_grad():
        return {"w1": fc.all_gather_into_tensor(mine["w1"], gather_dim=1),
                "b1": fc.all_gather_into_tensor(mine["b1"]),
                "w2": fc.all_gather_into_tensor(mine["w2"]), "b2": mine["b2"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=5)
    args = parser.parse_args()
    n = fc.get_world_size()
    if HIDDEN % n:
        raise SystemExit(f"tensor_parallel.py: expected a world size dividing {HIDDEN}, got {n}")
    mine, whole, losses = train(args.steps)
    together = gathered(mine)
    same = all(torch.allclose(together[k], whole[k].detach(), rtol=1e-12, atol=1e-12) for k in whole)
    agree = fc.all_reduce(torch.tensor([int(same)]), "min").item() == 1
    if fc.get_rank() == 0:
        print("losses " + " ".join(f"{loss:.6f}" for loss in losses))
        print(f"split over {n} ranks matches the unsplit model trained in one process: {agree}")


if __name__ == "__main__":
    main()
