"""Data-parallel training of a JAX MLP: `jax.grad` on each rank's slice, `fcoll.lax.pmean`.

    mpiexec -n 2 .venv/bin/python -m fcoll.run examples/train_jax.py [--steps 150] [--reference] [--jit]

The model is a pytree of JAX arrays (three dense layers, 64 -> 256 -> 256 -> 10) trained
with plain SGD on scikit-learn's bundled digits. Every rank runs the same script: it takes
its slice of each global batch, computes the gradient of its slice's mean loss with a
jitted `jax.value_and_grad`, and averages the gradient pytree over the ranks with
``fc.lax.pmean(grads, "dp")`` inside ``with fc.Mesh((n,), ("dp",))`` (one fused message;
JAX arrays in, JAX arrays out). Every rank then takes the same step, so the parameters
stay equal without ever being sent again.

With ``--jit`` the whole step (forward, backward, ``pmean`` of the gradients and the loss,
the SGD update) is one ``jax.jit`` function: ``fc.lax.pmean`` on traced values is one of
fcoll's JAX primitives, run by fcoll inside the compiled step (docs/jax.md, "Inside jit").

Since every slice has the same size, the mean of the slices' gradients is the gradient of
the whole batch's mean loss: the run equals one process training on the whole batch, up
to float32 rounding (the sums run in another order). ``--reference`` trains that single
process too (on rank 0, after the others) and prints the largest parameter difference.
JAX has no multi-process data parallelism on the CPU to compare against; that is the check.
"""

from __future__ import annotations

import os

# Fewer XLA threads per rank (read when JAX starts its CPU backend). XLA's CPU runtime may
# still use every core it is allowed: `mpiexec -bind-to core` gives each rank one.
os.environ.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1")

import argparse
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from sklearn.datasets import load_digits

import fcoll as fc

GLOBAL_BATCH, LR = 120, 0.2  # 120 splits evenly over 1, 2, 3 and 4 ranks
Params = list[dict[str, jax.Array]]


def init_params(sizes: list[int], seed: int) -> Params:
    """One ``{"w", "b"}`` dict per dense layer (He-scaled normal weights, zero biases)."""
    keys = jax.random.split(jax.random.PRNGKey(seed), len(sizes) - 1)
    return [{"w": jax.random.normal(k, (a, b), jnp.float32) * jnp.sqrt(2.0 / a),
             "b": jnp.zeros(b, jnp.float32)}
            for k, a, b in zip(keys, sizes[:-1], sizes[1:], strict=True)]


def logits(params: Params, x: jax.Array) -> jax.Array:
    """The MLP's output: ReLU after every layer but the last."""
    for layer in params[:-1]:
        x = jax.nn.relu(x @ layer["w"] + layer["b"])
    return x @ params[-1]["w"] + params[-1]["b"]


def loss_fn(params: Params, x: jax.Array, y: jax.Array) -> jax.Array:
    """Mean cross-entropy over the rows of ``x``."""
    logp = jax.nn.log_softmax(logits(params, x))
    return -jnp.mean(jnp.take_along_axis(logp, y[:, None], axis=1))


grad_fn: Callable[..., tuple[jax.Array, Params]] = jax.jit(jax.value_and_grad(loss_fn))


@jax.jit
def sgd(params: Params, grads: Params, lr: float = LR) -> Params:
    """One plain SGD step (``lr`` is traced: changing it does not recompile)."""
    stepped: Params = jax.tree_util.tree_map(lambda p, g: p - lr * g, params, grads)
    return stepped


def load() -> tuple[np.ndarray, np.ndarray]:
    """Digits as float32 in [0, 1] and int32 labels, in a fixed order."""
    digits = load_digits()  # ships inside scikit-learn: nothing is downloaded
    order = np.random.default_rng(0).permutation(len(digits.target))
    return (digits.data[order] / 16.0).astype(np.float32), digits.target[order].astype(np.int32)


def batches(x: np.ndarray, y: np.ndarray, steps: int) -> list[tuple[jax.Array, jax.Array]]:
    """``steps`` global batches, the same on every rank (epochs of a fixed shuffle)."""
    per_epoch = len(y) // GLOBAL_BATCH
    out = []
    for step in range(steps):
        epoch, i = divmod(step, per_epoch)
        order = np.random.default_rng(1 + epoch).permutation(len(y))
        rows = order[i * GLOBAL_BATCH : (i + 1) * GLOBAL_BATCH]
        out.append((jnp.asarray(x[rows]), jnp.asarray(y[rows])))
    return out


def eager_step(params: Params, x: jax.Array, y: jax.Array) -> tuple[Params, jax.Array]:
    """A step with jitted gradient and update and an eager ``pmean`` between them."""
    loss, grads = grad_fn(params, x, y)
    grads = fc.lax.pmean(grads, "dp")  # a pytree of JAX arrays in and out
    return sgd(params, grads), fc.lax.pmean(loss, "dp")


@jax.jit
def whole_step(params: Params, x: jax.Array, y: jax.Array) -> tuple[Params, jax.Array]:
    """The whole step in one jitted function: ``pmean`` runs inside it (traced under
    ``with fc.Mesh``: the group "dp" names is fixed when JAX traces it)."""
    loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
    grads, loss = fc.lax.pmean((grads, loss), "dp")  # one message: gradients and loss
    stepped: Params = jax.tree_util.tree_map(lambda p, g: p - LR * g, params, grads)
    return stepped, loss


def train(params: Params, data: list[tuple[jax.Array, jax.Array]],
          jit: bool = False) -> tuple[Params, list[float]]:
    """Data-parallel SGD over the job: each rank its slice, gradients averaged with pmean
    (between jitted calls, or with ``jit`` inside one jitted step)."""
    r, n = fc.get_rank(), fc.get_world_size()
    per_rank = GLOBAL_BATCH // n
    step = whole_step if jit else eager_step
    losses = []
    with fc.Mesh((n,), ("dp",)):
        for x, y in data:
            params, loss = step(params, x[r * per_rank : (r + 1) * per_rank],
                                y[r * per_rank : (r + 1) * per_rank])
            losses.append(loss)
    return params, [float(loss) for loss in losses]


def reference(params: Params, data: list[tuple[jax.Array, jax.Array]]) -> Params:
    """The same training in one process on the whole batches (no fcoll)."""
    for x, y in data:
        params = sgd(params, grad_fn(params, x, y)[1])
    return params


def max_difference(a: Params, b: Params) -> float:
    """The largest absolute difference between two parameter pytrees."""
    leaves = zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b), strict=True)
    return max(float(jnp.max(jnp.abs(p - q))) for p, q in leaves)


def accuracy(params: Params, x: np.ndarray, y: np.ndarray) -> float:
    """The fraction of rows of ``x`` the model classifies as ``y``."""
    return float(jnp.mean(jnp.argmax(logits(params, jnp.asarray(x)), axis=1) == y))


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--reference", action="store_true",
                        help="also train in one process on rank 0 and compare the parameters")
    parser.add_argument("--jit", action="store_true",
                        help="the whole step, pmean included, in one jax.jit")
    args = parser.parse_args()
    x, y = load()
    start = init_params([x.shape[1], args.hidden, args.hidden, 10], seed=0)  # same on every rank
    data = batches(x[:1500], y[:1500], args.steps)
    params, losses = train(start, data, jit=args.jit)
    every = max(1, args.steps // 5)
    if fc.get_rank() == 0:
        for step in range(0, args.steps, every):
            print(f"step {step + 1:4d}  loss {losses[step]:.4f}")
        print(f"final loss {losses[-1]:.4f}  test accuracy {accuracy(params, x[1500:], y[1500:]):.3f}")
    if args.reference and fc.get_rank() == 0:
        diff = max_difference(params, reference(start, data))
        print(f"max |data-parallel - single process| over the parameters: {diff:.2e}")


if __name__ == "__main__":
    main()
