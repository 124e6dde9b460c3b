"""Data-parallel training of a torch MLP with `fcoll.dp`, on tensors directly.

    mpiexec -n 2 .venv/bin/python -m fcoll.run examples/train_torch.py [--epochs 5] [--overlap]

The model is four linear layers (64 -> 1024 -> 1024 -> 1024 -> 10: 2.2 M parameters at the
default width) trained on scikit-learn's bundled digits with torch's own SGD. Every rank
runs the same script (one thread per rank):

1. it builds the model from its own seed, then takes rank 0's parameters
   (`fc.dp.broadcast_parameters` on the ``state_dict``: a dict of tensors in, one out);
2. it takes its slice of each global batch, runs forward and backward as usual, and
   averages the gradients over the ranks (`fc.dp.average_gradients` on ``{name: p.grad}``:
   one fused message per bucket, tensors back), which become the ``.grad`` the optimizer
   reads. With ``--overlap``, a post-accumulate-grad hook pushes each gradient to a
   `fc.dp.GradientAverager` as backward produces it instead (DDP's overlap: `OverlappedAverager`);
3. rank 0 prints the loss and accuracy after each epoch, and at the end every rank checks
   that its parameters are bit-identical to rank 0's.

No ``.numpy()`` anywhere: fcoll takes CPU tensors as zero-copy numpy views and returns tensors.
Each rank's loss is the mean over its slice (all slices have the same size), so the average
of the ranks' gradients is the gradient of the global batch's mean loss.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

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


class OverlappedAverager:
    """DDP's overlap: each gradient is pushed to a `fc.dp.GradientAverager` the moment
    autograd has accumulated it (a post-accumulate-grad hook), so a bucket's all-reduce
    starts while the layers before it are still in backward; `finish` waits for the last
    buckets and sets the averaged ``.grad``s.

    Example:
        >>> averager = OverlappedAverager(model, bucket_cap_mb=4)
        >>> loss.backward()            # pushes every gradient, last layer first
        >>> averager.finish()          # p.grad is now the mean over the ranks
    """

    def __init__(self, model: torch.nn.Module, bucket_cap_mb: float = 25) -> None:
        self.avg = fc.dp.GradientAverager(bucket_cap_mb=bucket_cap_mb)
        self.params = dict(model.named_parameters())
        for name, p in self.params.items():
            p.register_post_accumulate_grad_hook(self._pusher(name))

    def _pusher(self, name: str) -> Callable[[torch.Tensor], None]:
        def push(p: torch.Tensor) -> None:
            self.avg.push(name, p.grad)  # the same names in the same order on every rank

        return push

    def finish(self) -> None:
        for name, grad in self.avg.wait().items():
            self.params[name].grad = grad


def train_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, x: torch.Tensor,
               y: torch.Tensor, overlapped: OverlappedAverager | None = None) -> float:
    """One data-parallel step on this rank's slice ``x, y``; returns its mean loss.

    The gradients are averaged after backward (`average_gradients`) or, with
    ``overlapped``, during it."""
    optimizer.zero_grad()
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    if overlapped is None:
        average_gradients(model)
    else:
        overlapped.finish()
    optimizer.step()
    return loss.item()


def accuracy(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    """The fraction of rows of ``x`` the model classifies as ``y``."""
    with torch.no_grad():
        return float((model(x).argmax(1) == y).float().mean())


def parameters_identical(model: torch.nn.Module) -> bool:
    """Whether every rank's parameters equal rank 0's bit for bit (checked on every rank)."""
    mine = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    return bool(fc.all_reduce(torch.tensor(int(torch.equal(
        mine, fc.broadcast(mine, src=0)))), "min"))


def global_batches(epochs: int, steps: int, rows: int) -> list[torch.Tensor]:
    """The row indices of every global batch, the same on every rank (a shuffle per epoch)."""
    out: list[torch.Tensor] = []
    for epoch in range(epochs):
        order = torch.randperm(rows, generator=torch.Generator().manual_seed(1 + epoch))
        out.extend(order[step * GLOBAL_BATCH : (step + 1) * GLOBAL_BATCH] for step in range(steps))
    return out


def train(epochs: int, hidden: int = 1024, steps_per_epoch: int | None = None,
          verbose: bool = True, overlap: bool = False) -> tuple[torch.nn.Module, list[float]]:
    """Train data-parallel over the job; returns the model and this rank's loss at each step.

    ``overlap``: average during backward (`OverlappedAverager`) instead of after it."""
    torch.set_num_threads(1)  # one core per rank
    r, n = fc.get_rank(), fc.get_world_size()
    x_train, y_train, x_test, y_test = load()
    model = make_model(x_train.shape[1], hidden, 10, seed=r)  # different on every rank ...
    broadcast_model(model)  # ... until rank 0's parameters are everyone's
    overlapped = OverlappedAverager(model) if overlap else None
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    per_rank = GLOBAL_BATCH // n
    steps = len(y_train) // GLOBAL_BATCH if steps_per_epoch is None else steps_per_epoch
    losses: list[float] = []
    for i, batch in enumerate(global_batches(epochs, steps, len(y_train))):
        mine = batch[r * per_rank : (r + 1) * per_rank]
        losses.append(train_step(model, optimizer, x_train[mine], y_train[mine], overlapped))
        if (i + 1) % steps == 0:  # an epoch's end
            mean = float(fc.all_reduce(torch.tensor(sum(losses[-steps:]) / steps), "avg"))
            if verbose and r == 0:
                print(f"epoch {(i + 1) // steps:2d}  loss {mean:.4f}  "
                      f"train accuracy {accuracy(model, x_train, y_train):.3f}", flush=True)
    if verbose and r == 0:
        print(f"test accuracy {accuracy(model, x_test, y_test):.3f} ({len(y_test)} held-out digits)")
    return model, losses


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--hidden", type=int, default=1024, help="width of the hidden layers")
    parser.add_argument("--overlap", action="store_true",
                        help="average each gradient during backward (GradientAverager.push)")
    args = parser.parse_args()
    model, _ = train(args.epochs, args.hidden, overlap=args.overlap)
    identical = parameters_identical(model)
    if fc.get_rank() == 0:
        print(f"parameters identical on all {fc.get_world_size()} ranks: {identical}")
    if not identical:
        raise RuntimeError("parameters differ across ranks")


if __name__ == "__main__":
    main()
