"""Training a classifier with `tgx.grad` and `tgx.optim`, the whole step compiled.

A 2-layer MLP (2 -> 64 -> 2, ReLU) learns two concentric noisy rings, a set no linear model
separates. One training step (forward pass, cross-entropy, its gradient by `tgx.value_and_grad`,
and an Adam update) is one `tgx.compile`d function with the params and the optimizer state as
`state=` buffers: each call updates the caller's arrays in place, and one plan serves every
step. The script prints the loss as it falls and the accuracy on held-out points (the model
run eagerly on NumPy arrays), and checks both (loss down by more than 10x, accuracy > 95%).

Run: python examples/train_mlp.py
"""

from __future__ import annotations

import numpy as np

import tgx
import tgx.nn as tnn
from tgx import optim

HIDDEN, STEPS, BATCH = 64, 150, 256


def rings(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    """`n` points in 2-D, class 0 near the circle of radius 1, class 1 near radius 2."""
    y = rng.integers(0, 2, n)
    angle = rng.uniform(0, 2 * np.pi, n)
    radius = 1.0 + y + rng.normal(0, 0.15, n)
    x = np.stack([radius * np.cos(angle), radius * np.sin(angle)], axis=1)
    return x.astype(np.float32), y


def init_params(rng: np.random.Generator, sizes: tuple = (2, HIDDEN, 2)) -> dict:
    """He-initialised float32 weights of the MLP sizes[0] -> sizes[1] -> sizes[2]."""
    def dense(n_in, n_out):
        return (rng.standard_normal((n_in, n_out)) * np.sqrt(2 / n_in)).astype(np.float32)

    n_in, hidden, n_out = sizes
    return {"w1": dense(n_in, hidden), "b1": np.zeros(hidden, np.float32),
            "w2": dense(hidden, n_out), "b2": np.zeros(n_out, np.float32)}


def logits(params: dict, x):
    """The MLP's class scores (N, classes) for inputs x (N, features)."""
    h = tnn.relu(x @ params["w1"] + params["b1"])
    return h @ params["w2"] + params["b2"]


def loss_fn(params: dict, x, y):
    """Mean cross-entropy of the MLP on a batch."""
    return tnn.cross_entropy(logits(params, x), y)


def make_train_step(opt: optim.GradientTransformation):
    """One step: (loss, (new params, new optimizer state)), for `tgx.compile(state=...)`."""
    def train_step(params, opt_state, x, y):
        loss, grads = tgx.value_and_grad(loss_fn)(params, x, y)
        updates, opt_state = opt.update(grads, opt_state, params)
        return loss, (optim.apply_updates(params, updates), opt_state)

    return train_step


def main() -> None:
    rng = np.random.default_rng(0)
    x_train, y_train = rings(rng, 2048)
    x_test, y_test = rings(rng, 1024)
    params = tgx.aligned(init_params(rng))  # aligned: a JAX plan reads them in place
    opt = optim.adam(2e-2)
    opt_state = opt.init(params)
    train = tgx.compile(make_train_step(opt), state=("params", "opt_state"))
    w1 = params["w1"]
    losses = []
    for step in range(STEPS):
        idx = rng.integers(0, len(x_train), BATCH)
        loss, (params, opt_state) = train(params, opt_state, x_train[idx], y_train[idx])
        losses.append(float(loss))
        if step % 25 == 0 or step == STEPS - 1:
            print(f"step {step:4d}  loss {losses[-1]:.4f}")
    assert params["w1"] is w1 and int(opt_state.count) == STEPS   # updated in place
    # tgx functions also run eagerly on NumPy arrays: no compile for a one-off evaluation
    accuracy = float(np.mean(np.argmax(logits(params, x_test), axis=-1) == y_test))
    first, last = np.mean(losses[:10]), np.mean(losses[-10:])
    print(f"mean loss of the first 10 steps {first:.4f}, of the last 10 {last:.4f}; "
          f"held-out accuracy {accuracy:.1%} on {len(y_test)} points; "
          f"the step was traced {train.trace_count}x and planned once for {STEPS} calls")
    assert train.trace_count == 1, train
    assert last < first / 10, (first, last)
    assert accuracy > 0.95, accuracy


if __name__ == "__main__":
    main()
