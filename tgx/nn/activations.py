"""Activations and the softmax family with `torch.nn.functional` names and arguments
(`dim=`, with `axis=` as an alias), plus `dropout` with an explicit `tgx.random` key.

Each binds one composite primitive (tgx/primitives/activations.py) that decomposes into atomic
primitives with overflow-free formulas; `softmax` and `log_softmax` wrap the binders declared
there.

>>> import numpy as np, tgx.nn as tnn
>>> tnn.relu(np.array([-1.0, 2.0], np.float32))
array([0., 2.], dtype=float32)
"""

from __future__ import annotations

from .. import numpy as tnp
from .. import primitives as P
from .. import random
from ..errors import DTypeError, OptionError
from ..primitives import activations as A
from ..primitives.ops import _as_operand, _aval, _float_args
from ..shapes import canonicalize_axes

__all__ = ["relu", "relu6", "leaky_relu", "elu", "selu", "celu", "gelu", "silu", "swish",
           "sigmoid", "tanh", "softplus", "hardtanh", "hardswish", "hardsigmoid", "mish",
           "softmax", "log_softmax", "logsumexp", "dropout", "one_hot", "logsigmoid"]


def _f(x):
    (x,) = _float_args(x)
    return _as_operand(x)


def _dim(dim, axis, default=-1):
    if dim is not None and axis is not None and dim != axis:
        raise DTypeError(f"pass dim= or axis=, not both (got dim={dim}, axis={axis})")
    return default if dim is None and axis is None else (dim if dim is not None else axis)


def relu(x):
    """max(x, 0)."""
    return P.relu_p.bind(_f(x))


def relu6(x):
    """min(max(x, 0), 6)."""
    return hardtanh(x, 0.0, 6.0)


def leaky_relu(x, negative_slope: float = 0.01):
    """x for x >= 0, negative_slope * x otherwise."""
    return P.leaky_relu_p.bind(_f(x), negative_slope=float(negative_slope))


def elu(x, alpha: float = 1.0):
    """x for x > 0, alpha * (exp(x) - 1) otherwise."""
    return P.elu_p.bind(_f(x), alpha=float(alpha))


def selu(x):
    """scale * elu(x, alpha) with the self-normalising constants."""
    return P.selu_p.bind(_f(x))


def celu(x, alpha: float = 1.0):
    """max(0, x) + min(0, alpha * (exp(x / alpha) - 1))."""
    return P.celu_p.bind(_f(x), alpha=float(alpha))


def gelu(x, approximate: str = "none"):
    """x * Phi(x) (exact, erf) or the tanh approximation (`approximate="tanh"`)."""
    if approximate not in ("none", "tanh"):
        raise OptionError(f"gelu: approximate must be 'none' or 'tanh', got {approximate!r}")
    return P.gelu_p.bind(_f(x), approximate=approximate)


def sigmoid(x):
    """1 / (1 + exp(-x)), overflow-free."""
    return P.sigmoid_p.bind(_f(x))


def logsigmoid(x):
    """log(sigmoid(x)) = -softplus(-x)."""
    return tnp.negative(softplus(tnp.negative(_f(x))))


def tanh(x):
    """Hyperbolic tangent (same as tnp.tanh)."""
    return tnp.tanh(x)


def silu(x):
    """x * sigmoid(x)."""
    return P.silu_p.bind(_f(x))


swish = silu


def softplus(x, beta: float = 1.0, threshold: float = 20.0):
    """log(1 + exp(beta x)) / beta, and x where beta x > threshold (torch)."""
    return P.softplus_p.bind(_f(x), beta=float(beta), threshold=float(threshold))


def mish(x):
    """x * tanh(softplus(x))."""
    x = _f(x)
    return tnp.multiply(x, tnp.tanh(softplus(x)))


def hardtanh(x, min_val: float = -1.0, max_val: float = 1.0):
    """clip(x, min_val, max_val)."""
    return P.hardtanh_p.bind(_f(x), min_val=float(min_val), max_val=float(max_val))


def hardswish(x):
    """x * relu6(x + 3) / 6."""
    return P.hardswish_p.bind(_f(x))


def hardsigmoid(x):
    """relu6(x + 3) / 6."""
    return tnp.divide(relu6(tnp.add(_f(x), 3)), 6)


def softmax(x, dim: int | None = None, *, axis: int | None = None):
    """exp(x) / sum(exp(x)) along `dim` (default -1), max-subtracted.

    >>> import numpy as np
    >>> softmax(np.array([1e4, 0.0], np.float32))
    array([1., 0.], dtype=float32)
    """
    return A.softmax(_f(x), _dim(dim, axis))


def log_softmax(x, dim: int | None = None, *, axis: int | None = None):
    """x - logsumexp(x) along `dim` (default -1)."""
    return A.log_softmax(_f(x), _dim(dim, axis))


def logsumexp(x, dim=None, keepdim: bool = False, *, axis=None, keepdims: bool | None = None):
    """log(sum(exp(x))) over `dim` (an int or tuple; all axes when None), overflow-free."""
    x = _f(x)
    axes = canonicalize_axes(_dim(dim, axis, None), tnp.ndim(x), "logsumexp")
    keep = keepdim if keepdims is None else keepdims
    return P.logsumexp_p.bind(x, axes=axes, keepdims=bool(keep))


def dropout(x, p: float = 0.5, key=None, training: bool = True):
    """Zero each element with probability `p` and scale the rest by 1 / (1 - p); the identity
    when not training. `key` is a `tgx.random` key (required when training with p > 0)."""
    if not training or p == 0:
        return x
    if p >= 1:
        return tnp.zeros_like(x)
    if key is None:
        raise OptionError("dropout needs a tgx.random key when training (key=tgx.random.key(0))")
    keep = random.bernoulli(key, 1.0 - p, tnp.shape(x))
    return tnp.where(keep, tnp.divide(x, 1.0 - p), tnp.zeros_like(x))


def one_hot(x, num_classes: int, dtype=tnp.int64):
    """torch F.one_hot: a new last axis of length `num_classes` (int64 by default)."""
    classes = tnp.arange(num_classes, dtype=_aval(x).dtype)
    return tnp.astype(tnp.equal(tnp.expand_dims(x, -1), classes), dtype)
