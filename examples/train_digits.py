"""Data-parallel training of a numpy MLP on scikit-learn's bundled digits (8x8 images).

    mpiexec -n 4 .venv/bin/python -m fcoll.run examples/train_digits.py [--epochs 12] [--gpu]

Every rank starts from rank 0's parameters (`fc.dp.broadcast_parameters`), takes its
slice of each global batch, and pushes each layer's gradient to a `GradientAverager` as
backprop produces it, so the all-reduce of the last layer runs while the first layer's
gradient is computed. Rank 0 shows a progress bar and per-epoch loss and accuracy; at the
end every rank checks that its parameters are bit-identical to everyone's.

With ``--gpu`` the same training runs on cupy arrays on each rank's GPU
(`fcoll.gpu.use_local_device`): parameters, batches and gradients live on the device and
`fcoll.dp` averages them there (over NCCL with one GPU per rank).
"""

from __future__ import annotations

import argparse
import hashlib
from types import ModuleType
from typing import Any

import numpy as np
from rich.console import Console
from rich.progress import Progress
from sklearn.datasets import load_digits

import fcoll as fc

HIDDEN, GLOBAL_BATCH, LR = 64, 120, 0.5


def load() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    digits = load_digits()  # ships inside scikit-learn: nothing is downloaded
    order = np.random.default_rng(0).permutation(len(digits.target))
    x, y = digits.data[order] / 16.0, digits.target[order]
    return x[:1500], y[:1500], x[1500:], y[1500:]


def init_params(seed: int, xp: ModuleType) -> dict[str, dict[str, Any]]:
    """Drawn on the host (the same numbers with or without --gpu), then moved to ``xp``."""
    rng = np.random.default_rng(seed)
    host = {"hidden": {"w": rng.standard_normal((64, HIDDEN)) * 0.1, "b": np.zeros(HIDDEN)},
            "out": {"w": rng.standard_normal((HIDDEN, 10)) * 0.1, "b": np.zeros(10)}}
    return {layer: {k: xp.asarray(v) for k, v in leaves.items()} for layer, leaves in host.items()}


def forward(params: dict, x: Any, xp: ModuleType) -> tuple[Any, Any, Any]:
    pre = x @ params["hidden"]["w"] + params["hidden"]["b"]
    hidden = xp.maximum(pre, 0)
    logits = hidden @ params["out"]["w"] + params["out"]["b"]
    return pre, hidden, logits


def loss_and_backward(params: dict, x: Any, y: Any, avg: fc.dp.GradientAverager,
                      scale: float, xp: ModuleType) -> float:
    """Cross-entropy of the global batch's mean; pushes each gradient as it is ready."""
    pre, hidden, logits = forward(params, x, xp)
    p = xp.exp(logits - logits.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    rows = xp.arange(len(y))
    loss = float(-xp.log(p[rows, y] + 1e-12).sum() * scale)
    d_logits = p
    d_logits[rows, y] -= 1
    d_logits *= scale
    avg.push(("out", "w"), hidden.T @ d_logits)  # the last layer first, as backprop goes
    avg.push(("out", "b"), d_logits.sum(0))
    d_pre = (d_logits @ params["out"]["w"].T) * (pre > 0)
    avg.push(("hidden", "w"), x.T @ d_pre)
    avg.push(("hidden", "b"), d_pre.sum(0))
    return loss


def array_module(gpu: bool) -> ModuleType:
    """numpy, or cupy on this rank's GPU (chosen before any array is made)."""
    if not gpu:
        return np
    import cupy

    import fcoll.gpu

    fcoll.gpu.use_local_device()
    return cupy


def train(epochs: int, xp: ModuleType) -> None:
    r, n = fc.get_rank(), fc.get_world_size()
    x_host, y_host, x_test, y_test = load()
    x_train, y_train = xp.asarray(x_host), xp.asarray(y_host)  # on the device with --gpu
    params = fc.dp.broadcast_parameters(init_params(seed=r, xp=xp), src=0)
    avg = fc.dp.GradientAverager(bucket_cap_mb=0.01)
    steps = len(y_train) // GLOBAL_BATCH
    per_rank = GLOBAL_BATCH // n
    console = Console()
    with Progress(console=console, disable=r != 0, transient=True) as progress:
        task = progress.add_task("training", total=epochs * steps)
        for epoch in range(epochs):
            order = xp.asarray(np.random.default_rng(1 + epoch).permutation(len(y_host)))
            losses = []
            for step in range(steps):
                batch = order[step * GLOBAL_BATCH : (step + 1) * GLOBAL_BATCH]
                mine = batch[r * per_rank : (r + 1) * per_rank]
                # Each rank's gradients are scaled by n / GLOBAL_BATCH, so their average
                # over ranks is the gradient of the global batch's mean loss.
                loss = loss_and_backward(params, x_train[mine], y_train[mine], avg,
                                         1.0 / per_rank, xp)
                grads = avg.wait()
                params = {layer: {k: params[layer][k] - LR * grads[(layer, k)]
                                  for k in params[layer]} for layer in params}
                losses.append(loss)
                progress.advance(task)
            mean_loss = float(fc.all_reduce(np.array(np.mean(losses)), "avg"))
            accuracy = evaluate(params, x_train, y_train, xp)
            if r == 0:
                console.print(f"epoch {epoch + 1:2d}  loss {mean_loss:.4f}  "
                              f"train accuracy {accuracy:.3f}")
    finish(params, xp.asarray(x_test), xp.asarray(y_test), console, xp)


def evaluate(params: dict, x: Any, y: Any, xp: ModuleType) -> float:
    return float((forward(params, x, xp)[2].argmax(1) == y).mean())


def finish(params: dict, x_test: Any, y_test: Any, console: Console, xp: ModuleType) -> None:
    host = {layer: {k: v if xp is np else xp.asnumpy(v) for k, v in leaves.items()}
            for layer, leaves in params.items()}
    digest = hashlib.sha256(b"".join(host[layer][k].tobytes()
                                     for layer in sorted(host)
                                     for k in sorted(host[layer]))).hexdigest()
    digests = fc.all_gather_object(digest)
    identical = len(set(digests)) == 1
    if fc.get_rank() == 0:
        console.print(f"test accuracy {evaluate(params, x_test, y_test, xp):.3f} "
                      f"({len(y_test)} held-out digits)")
        console.print(f"parameters identical on all {fc.get_world_size()} ranks: {identical}")
    if not identical:
        raise RuntimeError(f"parameters differ across ranks: {digests}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=12)
    parser.add_argument("--gpu", action="store_true",
                        help="train on cupy arrays on each rank's GPU (default: numpy)")
    args = parser.parse_args()
    train(args.epochs, array_module(args.gpu))


if __name__ == "__main__":
    main()
