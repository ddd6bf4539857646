"""`tgx.optim`: optimizers as pure functions over pytrees (optax's shape, torch.optim's numbers).

An optimizer is a `GradientTransformation`: `init(params) -> state` and
`update(grads, state, params=None) -> (updates, new_state)`; `apply_updates(params, updates)`
adds the updates. Everything is pure and written in `tgx.numpy`, so one step runs eagerly on
NumPy arrays or traced inside `tgx.compile` (the state then fits `state=`: its leaves are
arrays, the step count a 0-d int32, the moments of the params' dtypes). `sgd`, `adam` and
`adamw` follow `torch.optim.SGD`, `Adam` and `AdamW` step for step; a learning rate may be a
schedule, a function of the 0-based step count (`constant`, `linear_warmup`,
`warmup_cosine_decay`, `exponential_decay`, `cosine_decay`). See docs/optim.md.

>>> import numpy as np, tgx.optim as optim
>>> opt = optim.sgd(0.1, momentum=0.9)
>>> params = {"w": np.ones(2, np.float32)}
>>> state = opt.init(params)
>>> updates, state = opt.update({"w": np.ones(2, np.float32)}, state)
>>> optim.apply_updates(params, updates)["w"]
array([0.9, 0.9], dtype=float32)
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

from . import numpy as tnp
from .devices import aligned_copy
from .errors import BindingError, OptionError
from .tracing import tree_flatten, tree_structure_str, tree_unflatten

Schedule = Callable[[Any], Any]


class GradientTransformation(NamedTuple):
    """An optimizer: `init(params) -> state`, `update(grads, state, params=None) ->
    (updates, new_state)`. Both are pure; the state is a pytree of arrays.

    >>> opt = sgd(0.5)
    >>> updates, _ = opt.update([np.float32(2.0)], opt.init([np.float32(1.0)]))
    >>> float(updates[0])
    -1.0
    """

    init: Callable
    update: Callable


class SgdState(NamedTuple):
    """`count`: steps taken (0-d int32); `momentum`: the momentum buffers (None without)."""

    count: Any
    momentum: Any


class AdamState(NamedTuple):
    """`count`: steps taken (0-d int32); `mu`, `nu`: the first and second moments."""

    count: Any
    mu: Any
    nu: Any


# ---------------------------------------------------------------------------------------------
# Pytree helpers


def _map(f: Callable, what: str, tree: Any, *others: Any) -> Any:
    """`f` over the leaves of `tree` and the matching leaves of `others` (same structure)."""
    leaves, td = tree_flatten(tree)
    rest = []
    for name, other in others:
        got, got_td = tree_flatten(other)
        if got_td != td:
            raise BindingError(f"{what}: {name} has structure {tree_structure_str(got_td)}, "
                               f"but the params have {tree_structure_str(td)}")
        rest.append(got)
    return tree_unflatten(td, [f(*xs) for xs in zip(leaves, *rest)])


def _zeros_like(p):
    z = tnp.zeros_like(p)
    # eager tnp.zeros_like is a read-only broadcast view; a state buffer must be writable, and
    # aligned so that a plan running on JAX reads it in place (`tgx.aligned`)
    return aligned_copy(z) if isinstance(z, np.ndarray) else z


def _as(x, ref):
    """`x` as an array of `ref`'s dtype (NumPy scalars become 0-d arrays; tracers stay)."""
    return tnp.asarray(x, ref.dtype)


def _count0():
    return np.zeros((), np.int32)


def _lr(learning_rate, count):
    return learning_rate(count) if callable(learning_rate) else learning_rate


def apply_updates(params, updates):
    """`params + updates`, leaf by leaf, each in its param's dtype.

    >>> apply_updates({"w": np.ones(2, np.float32)}, {"w": np.full(2, -0.5, np.float32)})
    {'w': array([0.5, 0.5], dtype=float32)}
    """
    return _map(lambda p, u: _as(p + u, p), "apply_updates", params, ("updates", updates))


# ---------------------------------------------------------------------------------------------
# Optimizers


def _check(cond: bool, name: str, value, rule: str) -> None:
    if not cond:
        raise OptionError(f"{name} must be {rule}, got {value!r}")


def _check_lr(learning_rate) -> None:
    if not callable(learning_rate):
        _check(learning_rate >= 0, "learning_rate", learning_rate,
               ">= 0 (a float) or a schedule (step -> lr)")


def _need_params(params, weight_decay, what: str) -> None:
    if weight_decay and params is None:
        raise BindingError(f"{what}: weight_decay={weight_decay} needs the params: "
                           f"call update(grads, state, params)")


def sgd(learning_rate, momentum: float = 0.0, nesterov: bool = False,
        weight_decay: float = 0.0) -> GradientTransformation:
    """Stochastic gradient descent as `torch.optim.SGD` (dampening 0).

    With `g = grad + weight_decay * param` the update is `-lr * g`; with momentum,
    `buf = momentum * buf + g` (the first step's `buf` is `g`, as torch's) and the update is
    `-lr * buf`, or `-lr * (g + momentum * buf)` with `nesterov`. `learning_rate` is a float
    or a schedule (a function of the 0-based step count).

    >>> opt = sgd(0.1, momentum=0.9)
    >>> p, s = [np.float32(1.0)], opt.init([np.float32(1.0)])
    >>> for _ in range(2):
    ...     u, s = opt.update([np.float32(1.0)], s)
    ...     p = apply_updates(p, u)
    >>> round(float(p[0]), 6), int(s.count)      # 1 - 0.1 * 1 - 0.1 * 1.9
    (0.71, 2)
    """
    _check_lr(learning_rate)
    _check(momentum >= 0, "momentum", momentum, ">= 0")
    _check(weight_decay >= 0, "weight_decay", weight_decay, ">= 0")
    _check(not nesterov or momentum > 0, "momentum", momentum, "> 0 with nesterov=True")

    def init(params):
        buf = _map(_zeros_like, "sgd.init", params) if momentum else None
        return SgdState(_count0(), buf)

    def update(grads, state, params=None):
        _need_params(params, weight_decay, "sgd.update")
        lr = _lr(learning_rate, state.count)
        if weight_decay:
            grads = _map(lambda p, g: g + weight_decay * p, "sgd.update", params,
                         ("grads", grads))
        buf = None
        if momentum:
            buf = _map(lambda b, g: _as(momentum * b + g, b), "sgd.update", state.momentum,
                       ("grads", grads))
            d = (_map(lambda g, b: g + momentum * b, "sgd.update", grads, ("the momentum", buf))
                 if nesterov else buf)
        else:
            d = grads
        updates = _map(lambda x: _as(-lr * x, x), "sgd.update", d)
        return updates, SgdState(tnp.add(state.count, 1), buf)

    return GradientTransformation(init, update)


def _one_minus_pow(b: float, t):
    """`1 - b**t` for a float32 `t`, without float32's cancellation at b = 0.999."""
    return 1.0 if b == 0 else -tnp.expm1(t * math.log(b))


def _adam(learning_rate, b1, b2, eps, weight_decay, decoupled: bool,
          name: str) -> GradientTransformation:
    _check_lr(learning_rate)
    _check(0 <= b1 < 1, "b1", b1, "in [0, 1)")
    _check(0 <= b2 < 1, "b2", b2, "in [0, 1)")
    _check(eps >= 0, "eps", eps, ">= 0")
    _check(weight_decay >= 0, "weight_decay", weight_decay, ">= 0")

    def init(params):
        return AdamState(_count0(), _map(_zeros_like, f"{name}.init", params),
                         _map(_zeros_like, f"{name}.init", params))

    def update(grads, state, params=None):
        _need_params(params, weight_decay, f"{name}.update")
        lr = _lr(learning_rate, state.count)
        count = tnp.add(state.count, 1)
        t = tnp.asarray(count, tnp.float32)
        if weight_decay and not decoupled:  # torch.optim.Adam: L2 added to the gradient
            grads = _map(lambda p, g: g + weight_decay * p, f"{name}.update", params,
                         ("grads", grads))
        # m.lerp_(g, 1 - b1) as torch computes it for a weight below 1/2
        mu = _map(lambda m, g: _as(m + (1 - b1) * (g - m), m), f"{name}.update", state.mu,
                  ("grads", grads))
        nu = _map(lambda v, g: _as(v * b2 + (1 - b2) * g * g, v), f"{name}.update", state.nu,
                  ("grads", grads))
        neg_step_size = -(lr / _one_minus_pow(b1, t))
        bc2_sqrt = tnp.sqrt(_one_minus_pow(b2, t))
        decay_rate = lr * weight_decay

        def leaf(m, v, p=None):
            u = neg_step_size * (m / (tnp.sqrt(v) / bc2_sqrt + eps))
            if p is not None:  # torch.optim.AdamW: p *= 1 - lr * weight_decay
                u = u - decay_rate * p
            return _as(u, m)

        decay = (("params", params),) if weight_decay and decoupled else ()
        updates = _map(leaf, f"{name}.update", mu, ("nu", nu), *decay)
        return updates, AdamState(count, mu, nu)

    return GradientTransformation(init, update)


def adam(learning_rate, b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8,
         weight_decay: float = 0.0) -> GradientTransformation:
    """Adam as `torch.optim.Adam` (amsgrad off): L2 weight decay added to the gradient,
    bias-corrected moments, `eps` added to `sqrt(nu_hat)`.

    >>> opt = adam(0.1)
    >>> u, s = opt.update([np.float32(3.0)], opt.init([np.float32(1.0)]))
    >>> round(float(u[0]), 6), int(s.count)    # the first step is -lr * sign(grad)
    (-0.1, 1)
    """
    return _adam(learning_rate, b1, b2, eps, weight_decay, False, "adam")


def adamw(learning_rate, b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8,
          weight_decay: float = 1e-2) -> GradientTransformation:
    """AdamW as `torch.optim.AdamW`: Adam with decoupled weight decay (the params shrink by
    `lr * weight_decay` of themselves each step); `update` needs the params.

    >>> opt = adamw(0.1, weight_decay=0.5)
    >>> p = [np.float32(1.0)]
    >>> u, s = opt.update([np.float32(3.0)], opt.init(p), p)
    >>> round(float(u[0]), 6)                  # -0.1 (Adam) - 0.1 * 0.5 * 1.0
    -0.15
    """
    return _adam(learning_rate, b1, b2, eps, weight_decay, True, "adamw")


# ---------------------------------------------------------------------------------------------
# Schedules: step (0-based, a Python int or a 0-d int array, traced or not) -> float32 lr


def _f32(x):
    return tnp.asarray(x, tnp.float32)


def constant(lr: float) -> Schedule:
    """The same learning rate at every step.

    >>> float(constant(0.1)(7))
    0.1...
    """
    return lambda step: _f32(lr)


def linear_warmup(init: float, peak: float, warmup_steps: int) -> Schedule:
    """From `init` at step 0 linearly to `peak` at `warmup_steps`, then `peak`
    (`torch.optim.lr_scheduler.LinearLR` with `start_factor=init/peak`, `total_iters`).

    >>> s = linear_warmup(0.0, 1.0, 4)
    >>> [float(s(t)) for t in (0, 2, 4, 9)]
    [0.0, 0.5, 1.0, 1.0]
    """
    if warmup_steps <= 0:
        return constant(peak)
    return lambda step: _f32(init + (peak - init) * tnp.minimum(_f32(step) / warmup_steps, 1.0))


def cosine_decay(init: float, decay_steps: int, alpha: float = 0.0) -> Schedule:
    """Half a cosine from `init` at step 0 to `alpha * init` at `decay_steps`, then flat
    (`torch.optim.lr_scheduler.CosineAnnealingLR` with `T_max=decay_steps`,
    `eta_min=alpha * init`, up to `T_max`).

    >>> s = cosine_decay(1.0, 10, alpha=0.1)
    >>> [round(float(s(t)), 4) for t in (0, 5, 10, 20)]
    [1.0, 0.55, 0.1, 0.1]
    """
    _check(decay_steps > 0, "decay_steps", decay_steps, "> 0")

    def schedule(step):
        frac = tnp.minimum(_f32(step), decay_steps) / decay_steps
        return _f32(init * ((1 - alpha) * 0.5 * (1 + tnp.cos(math.pi * frac)) + alpha))

    return schedule


def exponential_decay(init: float, rate: float, steps: int,
                      staircase: bool = False) -> Schedule:
    """`init * rate ** (step / steps)`; with `staircase` the exponent is floored
    (`ExponentialLR(gamma=rate)` is `steps=1`, `StepLR(step_size=steps, gamma=rate)` is
    `staircase=True`).

    >>> s = exponential_decay(1.0, 0.5, 2)
    >>> [float(s(t)) for t in (0, 2, 4)], float(exponential_decay(1.0, 0.5, 2, True)(3))
    ([1.0, 0.5, 0.25], 0.5)
    """
    _check(steps > 0, "steps", steps, "> 0")
    _check(rate > 0, "rate", rate, "> 0")

    def schedule(step):
        e = _f32(step) / steps
        if staircase:
            e = tnp.floor(e)
        return _f32(init * tnp.exp(e * math.log(rate)))

    return schedule


def warmup_cosine_decay(init: float, peak: float, warmup_steps: int, decay_steps: int,
                        end: float = 0.0) -> Schedule:
    """Linear warmup from `init` to `peak` over `warmup_steps`, then half a cosine down to
    `end` at `decay_steps` (counted from step 0, warmup included, as optax's), then `end`.

    >>> s = warmup_cosine_decay(0.0, 1.0, warmup_steps=2, decay_steps=6)
    >>> [round(float(s(t)), 4) for t in range(8)]
    [0.0, 0.5, 1.0, 0.8536, 0.5, 0.1464, 0.0, 0.0]
    """
    _check(decay_steps > warmup_steps >= 0, "decay_steps", decay_steps,
           f"> warmup_steps ({warmup_steps}) >= 0")
    warm = linear_warmup(init, peak, warmup_steps)
    length = decay_steps - warmup_steps

    def schedule(step):
        t = _f32(step)
        frac = tnp.clip(t - warmup_steps, 0.0, length) / length
        cos = end + (peak - end) * 0.5 * (1 + tnp.cos(math.pi * frac))
        return _f32(tnp.where(t < warmup_steps, warm(t), cos))

    return schedule


__all__ = [
    "AdamState", "GradientTransformation", "SgdState", "adam", "adamw", "apply_updates",
    "constant", "cosine_decay", "exponential_decay", "linear_warmup", "sgd",
    "warmup_cosine_decay",
]
