"""Data-parallel training of a torch MLP with `fcoll.dp`, on tensors directly.

    mpiexec -n 2 .venv/bin/python -m fcoll.run examples/train_torch.py [--epochs 5] [--hidden 1024]

The model is four linear layers (64 -> 1024 -> 1024 -> 1024 -> 10: 2.2 M parameters at the
default width) trained on scikit-learn's bundled digits with torch's own SGD. Every rank
runs the same script (one thread per rank):

1. it builds the model from its own seed, then takes rank 0's parameters
   (`fc.dp.broadcast_parameters` on the ``state_dict``: a dict of tensors in, one out);
2. it takes its slice of each global batch, runs forward and backward as usual, and
   averages the gradients over the ranks (`fc.dp.average_gradients` on ``{name: p.grad}``:
   one fused message per bucket, tensors back), which become the ``.grad`` the optimizer reads;
3. rank 0 prints the loss and accuracy after each epoch, and at the end every rank checks
   that its parameters are bit-identical to rank 0's.

No ``.numpy()`` anywhere: fcoll takes CPU tensors as zero-copy numpy views and returns tensors.
Each rank's loss is the mean over its slice (all slices have the same size), so the average
of the ranks' gradients is the gradient of the global batch's mean loss.
"""

from __future__ import annotations

import argparse

import torch
from sklearn.datasets import load_digits

import fcoll as fc

GLOBAL_BATCH, LR, MOMENTUM = 120, 0.05, 0.9  # 120 splits evenly over 1, 2, 3 and 4 ranks


def make_model(features: int, hidden: int, classes: int, seed: int) -> torch.nn.Sequential:
    """Four linear layers with ReLUs between them, initialised from ``seed``."""
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(features, hidden), torch.nn.ReLU(),
        torch.nn.Linear(hidden, hidden), torch.nn.ReLU(),
        torch.nn.Linear(hidden, hidden), torch.nn.ReLU(),
        torch.nn.Linear(hidden, classes))


def load() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Digits as float32 in [0, 1] (1500 to train on, 297 held out), in a fixed order."""
    digits = load_digits()  # ships inside scikit-learn: nothing is downloaded
    order = torch.randperm(len(digits.target), generator=torch.Generator().manual_seed(0))
    x = torch.as_tensor(digits.data, dtype=torch.float32)[order] / 16.0
    y = torch.as_tensor(digits.target, dtype=torch.int64)[order]
    return x[:1500], y[:1500], x[1500:], y[1500:]


def broadcast_model(model: torch.nn.Module) -> None:
    """Give every rank rank 0's parameters (and buffers): one fused broadcast of tensors."""
    model.load_state_dict(fc.dp.broadcast_parameters(model.state_dict(), src=0))


def average_gradients(model: torch.nn.Module) -> None:
    """Replace each parameter's ``.grad`` with its mean over the ranks (tensors in and out)."""
    grads = {name: p.grad for name, p in model.named_parameters() if p.grad is not None}
    averaged = fc.dp.average_gradients(grads)
    for name, p in model.named_parameters():
        if name in averaged:
            p.grad = averaged[name]


def train_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, x: torch.Tensor,
               y: torch.Tensor) -> float:
    """One data-parallel step on this rank's slice ``x, y``; returns its mean loss."""
    optimizer.zero_grad()
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    average_gradients(model)
    optimizer.step()
    return loss.item()


def accuracy(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    with torch.no_grad():
        return float((model(x).argmax(1) == y).float().mean())


def parameters_identical(model: torch.nn.Module) -> bool:
    """Whether every rank's parameters equal rank 0's bit for bit (checked on every rank)."""
    mine = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    return bool(fc.all_reduce(torch.tensor(int(torch.equal(
        mine, fc.broadcast(mine, src=0)))), "min"))


def train(epochs: int, hidden: int = 1024, steps_per_epoch: int | None = None,
          verbose: bool = True) -> tuple[torch.nn.Module, list[float]]:
    """Train data-parallel over the job; returns the model and the mean loss of each epoch."""
    torch.set_num_threads(1)  # one core per rank
    r, n = fc.get_rank(), fc.get_world_size()
    x_train, y_train, x_test, y_test = load()
    model = make_model(x_train.shape[1], hidden, 10, seed=r)  # different on every rank ...
    broadcast_model(model)  # ... until rank 0's parameters are everyone's
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    per_rank = GLOBAL_BATCH // n
    steps = len(y_train) // GLOBAL_BATCH if steps_per_epoch is None else steps_per_epoch
    losses = []
    for epoch in range(epochs):
        order = torch.randperm(len(y_train), generator=torch.Generator().manual_seed(1 + epoch))
        total = 0.0
        for step in range(steps):
            batch = order[step * GLOBAL_BATCH : (step + 1) * GLOBAL_BATCH]
            mine = batch[r * per_rank : (r + 1) * per_rank]
            total += train_step(model, optimizer, x_train[mine], y_train[mine])
        losses.append(float(fc.all_reduce(torch.tensor(total / steps), "avg")))
        if verbose and r == 0:
            print(f"epoch {epoch + 1:2d}  loss {losses[-1]:.4f}  "
                  f"train accuracy {accuracy(model, x_train, y_train):.3f}", flush=True)
    if verbose and r == 0:
        print(f"test accuracy {accuracy(model, x_test, y_test):.3f} ({len(y_test)} held-out digits)")
    return model, losses


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--hidden", type=int, default=1024, help="width of the hidden layers")
    args = parser.parse_args()
    model, _ = train(args.epochs, args.hidden)
    identical = parameters_identical(model)
    if fc.get_rank() == 0:
        print(f"parameters identical on all {fc.get_world_size()} ranks: {identical}")
    if not identical:
        raise RuntimeError("parameters differ across ranks")


if __name__ == "__main__":
    main()
