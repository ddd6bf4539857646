"""Activations and the softmax family with `torch.nn.functional` names and arguments
(`input` first, `dim=` with `axis=` as an alias, `inplace=` accepted and ignored), plus
`dropout` with an explicit `tgx.random` key.

Each binds one composite primitive (tgx/primitives/activations.py) that decomposes into atomic
primitives with overflow-free formulas; `softmax` and `log_softmax` wrap the binders declared
there.

>>> import numpy as np, tgx.nn as tnn
>>> tnn.relu(np.array([-1.0, 2.0], np.float32))
array([0., 2.], dtype=float32)
"""

from __future__ import annotations

import numpy as np

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


def relu(input, inplace: bool = False):
    """max(x, 0). `inplace` is accepted for torch's signature and ignored: traced arrays
    are values, so the result is always a new array."""
    return P.relu_p.bind(_f(input))


def relu6(input, inplace: bool = False):
    """min(max(x, 0), 6). `inplace` is ignored (see `relu`)."""
    return hardtanh(input, 0.0, 6.0)


def leaky_relu(input, negative_slope: float = 0.01, inplace: bool = False):
    """x for x >= 0, negative_slope * x otherwise. `inplace` is ignored (see `relu`)."""
    return P.leaky_relu_p.bind(_f(input), negative_slope=float(negative_slope))


def elu(input, alpha: float = 1.0, inplace: bool = False):
    """x for x > 0, alpha * (exp(x) - 1) otherwise. `inplace` is ignored (see `relu`)."""
    return P.elu_p.bind(_f(input), alpha=float(alpha))


def selu(input, inplace: bool = False):
    """scale * elu(x, alpha) with the self-normalising constants. `inplace` is ignored (see
    `relu`)."""
    return P.selu_p.bind(_f(input))


def celu(input, alpha: float = 1.0, inplace: bool = False):
    """max(0, x) + min(0, alpha * (exp(x / alpha) - 1)). `inplace` is ignored (see `relu`)."""
    return P.celu_p.bind(_f(input), alpha=float(alpha))


def gelu(input, approximate: str = "none"):
    """x * Phi(x) (exact, erf) or the tanh approximation (`approximate="tanh"`)."""
    if approximate not in ("none", "tanh"):
        raise OptionError(f"gelu: approximate must be 'none' or 'tanh', got {approximate!r}")
    return P.gelu_p.bind(_f(input), approximate=approximate)


def sigmoid(input):
    """1 / (1 + exp(-x)), overflow-free."""
    return P.sigmoid_p.bind(_f(input))


def logsigmoid(input):
    """log(sigmoid(x)) = -softplus(-x)."""
    return tnp.negative(softplus(tnp.negative(_f(input))))


def tanh(input):
    """Hyperbolic tangent (same as tnp.tanh)."""
    return tnp.tanh(input)


def silu(input, inplace: bool = False):
    """x * sigmoid(x). `inplace` is ignored (see `relu`)."""
    return P.silu_p.bind(_f(input))


swish = silu


def softplus(input, beta: float = 1.0, threshold: float = 20.0):
    """log(1 + exp(beta x)) / beta, and x where beta x > threshold (torch)."""
    return P.softplus_p.bind(_f(input), beta=float(beta), threshold=float(threshold))


def mish(input, inplace: bool = False):
    """x * tanh(softplus(x)). `inplace` is ignored (see `relu`)."""
    x = _f(input)
    return tnp.multiply(x, tnp.tanh(softplus(x)))


def hardtanh(input, min_val: float = -1.0, max_val: float = 1.0, inplace: bool = False):
    """clip(x, min_val, max_val). `inplace` is ignored (see `relu`)."""
    return P.hardtanh_p.bind(_f(input), min_val=float(min_val), max_val=float(max_val))


def hardswish(input, inplace: bool = False):
    """x * relu6(x + 3) / 6. `inplace` is ignored (see `relu`)."""
    return P.hardswish_p.bind(_f(input))


def hardsigmoid(input, inplace: bool = False):
    """relu6(x + 3) / 6. `inplace` is ignored (see `relu`)."""
    return tnp.divide(relu6(tnp.add(_f(input), 3)), 6)


def _softmax_input(input, dtype):
    # torch: "the input is cast to dtype before the operation" (for float16 inputs, say)
    return _f(input if dtype is None else tnp.astype(input, dtype))


def softmax(input, dim: int | None = None, _stacklevel: int = 3, dtype=None, *,
            axis: int | None = None):
    """exp(x) / sum(exp(x)) along `dim` (default -1), max-subtracted. `dtype`: cast the
    input to it first, as torch (`softmax(x_f16, -1, dtype=torch.float32)`); `_stacklevel`
    is torch's and ignored.

    >>> import numpy as np
    >>> softmax(np.array([1e4, 0.0], np.float32))
    array([1., 0.], dtype=float32)
    """
    return A.softmax(_softmax_input(input, dtype), _dim(dim, axis))


def log_softmax(input, dim: int | None = None, _stacklevel: int = 3, dtype=None, *,
                axis: int | None = None):
    """x - logsumexp(x) along `dim` (default -1); `dtype` as in `softmax`."""
    return A.log_softmax(_softmax_input(input, dtype), _dim(dim, axis))


def logsumexp(input, dim=None, keepdim: bool = False, *, axis=None,
              keepdims: bool | None = None):
    """log(sum(exp(x))) over `dim` (an int or tuple; all axes when None), overflow-free."""
    x = _f(input)
    axes = canonicalize_axes(_dim(dim, axis, None), tnp.ndim(x), "logsumexp")
    keep = keepdim if keepdims is None else keepdims
    return P.logsumexp_p.bind(x, axes=axes, keepdims=bool(keep))


def dropout(input, p: float = 0.5, training: bool = True, inplace: bool = False, *, key=None):
    """Zero each element with probability `p` and scale the rest by 1 / (1 - p); the identity
    when not training. torch's argument order; the randomness comes from `key=`, a
    `tgx.random` key (required when training with 0 < p < 1). `inplace` is ignored (see
    `relu`). (A key passed third, tgx's earlier order, is still taken as the key.)

    >>> import numpy as np, tgx
    >>> dropout(np.ones(4, np.float32), 0.5, training=False)
    array([1., 1., 1., 1.], dtype=float32)
    """
    if not isinstance(training, (bool, int, np.bool_)):  # dropout(x, p, key)
        if key is not None:
            raise OptionError("dropout: the third argument is `training` (a bool); pass the "
                              "random key as key=")
        key, training = training, True
    if not 0.0 <= p <= 1.0:
        raise OptionError(f"dropout probability has to be between 0 and 1, but got {p}")
    if not training or p == 0:
        return input
    if p == 1:
        return tnp.zeros_like(input)
    if key is None:
        raise OptionError("dropout needs a tgx.random key when training (key=tgx.random.key(0))")
    keep = random.bernoulli(key, 1.0 - p, tnp.shape(input))
    return tnp.where(keep, tnp.divide(input, 1.0 - p), tnp.zeros_like(input))


def one_hot(x, num_classes: int, dtype=tnp.int64):
    """torch F.one_hot: a new last axis of length `num_classes` (int64 by default)."""
    classes = tnp.arange(num_classes, dtype=_aval(x).dtype)
    return tnp.astype(tnp.equal(tnp.expand_dims(x, -1), classes), dtype)
