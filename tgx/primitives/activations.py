"""Activation composites (elementwise) and the softmax family (over one axis / several axes).

Every decomposition is overflow-free at |x| = 1e4: sigmoid and softplus go through exp(-|x|),
tanh through expm1(-2|x|), and the softmax family subtracts the maximum first.
"""

from __future__ import annotations

import numpy as np
import scipy.special

from ..core import Primitive
from ..errors import DTypeError, ShapeError
from ..shapes import ShapedArray, is_float
from .elementwise import _lowp
from .math import abs_p, composite_unop, expm1_p, log1p_p, tanh_p


def _tnp():
    from .. import numpy as tnp

    return tnp


def _act(name, ref):
    return composite_unop(name, ref, "float", family="activation")


# ---------------------------------------------------------------------------------------------
# ReLU family


relu_p = _act("relu", lambda x: np.maximum(x, 0))


@relu_p.def_decomposition
def _relu_decomp(x):
    tnp = _tnp()
    return tnp.maximum(x, tnp.zeros_like(x))


leaky_relu_p = _act("leaky_relu", lambda x, *, negative_slope: np.where(
    x >= 0, x, x * negative_slope))


@leaky_relu_p.def_decomposition
def _leaky_relu_decomp(x, *, negative_slope):
    tnp = _tnp()
    return tnp.where(tnp.greater_equal(x, 0), x, tnp.multiply(x, negative_slope))


def _elu_ref(x, *, alpha):
    return np.where(x > 0, x, alpha * np.expm1(np.minimum(x, 0)))


elu_p = _act("elu", _elu_ref)


def _elu(x, alpha):
    tnp = _tnp()
    neg = tnp.multiply(expm1_p.bind(tnp.minimum(x, tnp.zeros_like(x))), alpha)
    return tnp.where(tnp.greater(x, 0), x, neg)


@elu_p.def_decomposition
def _elu_decomp(x, *, alpha):
    return _elu(x, alpha)


SELU_ALPHA = 1.6732632423543772848170429916717
SELU_SCALE = 1.0507009873554804934193349852946

selu_p = _act("selu", lambda x: SELU_SCALE * _elu_ref(x, alpha=SELU_ALPHA))


@selu_p.def_decomposition
def _selu_decomp(x):
    return _tnp().multiply(_elu(x, SELU_ALPHA), SELU_SCALE)


celu_p = _act("celu", lambda x, *, alpha: np.maximum(x, 0) + np.minimum(
    0, alpha * np.expm1(np.minimum(x, 0) / alpha)))


@celu_p.def_decomposition
def _celu_decomp(x, *, alpha):
    tnp = _tnp()
    zero = tnp.zeros_like(x)
    neg = tnp.multiply(expm1_p.bind(tnp.divide(tnp.minimum(x, zero), alpha)), alpha)
    return tnp.add(tnp.maximum(x, zero), tnp.minimum(neg, zero))


# ---------------------------------------------------------------------------------------------
# Smooth activations


_GELU_C = float(np.sqrt(2.0 / np.pi))


def _gelu_ref(x, *, approximate):
    if approximate == "tanh":
        return 0.5 * x * (1 + np.tanh(_GELU_C * (x + 0.044715 * x ** 3)))
    return 0.5 * x * (1 + scipy.special.erf(x / np.sqrt(2.0)))


gelu_p = _act("gelu", _gelu_ref)


@gelu_p.def_decomposition
def _gelu_decomp(x, *, approximate):
    tnp = _tnp()
    if approximate == "tanh":
        inner = tnp.multiply(tnp.add(x, tnp.multiply(tnp.multiply(tnp.multiply(x, x), x),
                                                     0.044715)), _GELU_C)
        t = tanh_p.bind(inner)
    else:
        t = tnp.erf(tnp.multiply(x, float(1 / np.sqrt(2.0))))
    return tnp.multiply(tnp.multiply(x, 0.5), tnp.add(t, 1))


def _sigmoid_ref(x):
    return scipy.special.expit(x)


sigmoid_p = _act("sigmoid", _sigmoid_ref)


def _sigmoid(x):
    # e = exp(-|x|) <= 1: 1 / (1 + e) for x >= 0, e / (1 + e) for x < 0.
    tnp = _tnp()
    e = tnp.exp(tnp.negative(abs_p.bind(x)))
    d = tnp.add(e, 1)
    return tnp.where(tnp.greater_equal(x, 0), tnp.divide(1, d), tnp.divide(e, d))


@sigmoid_p.def_decomposition
def _sigmoid_decomp(x):
    return _sigmoid(x)


silu_p = _act("silu", lambda x: x * scipy.special.expit(x))


@silu_p.def_decomposition
def _silu_decomp(x):
    return _tnp().multiply(x, sigmoid_p.bind(x))


def _softplus_ref(x, *, beta, threshold):
    bx = x * beta
    soft = (np.log1p(np.exp(-np.abs(bx))) + np.maximum(bx, 0)) / beta
    return np.where(bx > threshold, x, soft)


softplus_p = _act("softplus", _softplus_ref)


@softplus_p.def_decomposition
def _softplus_decomp(x, *, beta, threshold):
    # log(1 + e^bx) = log1p(e^-|bx|) + max(bx, 0); linear above `threshold` (torch).
    tnp = _tnp()
    bx = tnp.multiply(x, beta) if beta != 1 else x
    soft = tnp.add(log1p_p.bind(tnp.exp(tnp.negative(abs_p.bind(bx)))),
                   tnp.maximum(bx, tnp.zeros_like(bx)))
    if beta != 1:
        soft = tnp.divide(soft, beta)
    return tnp.where(tnp.greater(bx, threshold), x, soft)


hardtanh_p = _act("hardtanh", lambda x, *, min_val, max_val: np.clip(x, min_val, max_val))


@hardtanh_p.def_decomposition
def _hardtanh_decomp(x, *, min_val, max_val):
    tnp = _tnp()
    return tnp.minimum(tnp.maximum(x, min_val), max_val)


hardswish_p = _act("hardswish", lambda x: x * np.clip(x + 3, 0, 6) / 6)


@hardswish_p.def_decomposition
def _hardswish_decomp(x):
    tnp = _tnp()
    r6 = tnp.minimum(tnp.maximum(tnp.add(x, 3), 0), 6)
    return tnp.divide(tnp.multiply(x, r6), 6)


ACTIVATIONS = [relu_p, leaky_relu_p, elu_p, selu_p, celu_p, gelu_p, sigmoid_p, silu_p,
               softplus_p, hardtanh_p, hardswish_p]


# ---------------------------------------------------------------------------------------------
# Softmax family: softmax / log_softmax over one axis, logsumexp over a tuple of axes.


def _softmax_shape(name):
    def rule(x: ShapedArray, *, axis: int) -> ShapedArray:
        if not is_float(x.dtype):
            raise DTypeError(f"{name} needs a floating operand, got {x.str_short()}")
        if not 0 <= axis < max(x.ndim, 1):
            raise ShapeError(f"{name}: axis {axis} out of range for {x}")
        return x
    return rule


def _softmax_ref(x, *, axis):
    if x.ndim == 0:
        return np.ones_like(x)
    m = np.max(x, axis=axis, keepdims=True)
    e = np.exp(x - m)
    return e / np.sum(e, axis=axis, keepdims=True)


def _log_softmax_ref(x, *, axis):
    if x.ndim == 0:
        return np.zeros_like(x)
    m = np.max(x, axis=axis, keepdims=True)
    s = x - m
    return s - np.log(np.sum(np.exp(s), axis=axis, keepdims=True))


softmax_p = Primitive("softmax", family="softmax")
softmax_p.def_shape(_softmax_shape("softmax"))
softmax_p.def_impl(_lowp(_softmax_ref))

log_softmax_p = Primitive("log_softmax", family="softmax")
log_softmax_p.def_shape(_softmax_shape("log_softmax"))
log_softmax_p.def_impl(_lowp(_log_softmax_ref))


def _shifted(x, axis):
    tnp = _tnp()
    return tnp.subtract(x, tnp.max(x, axis=axis, keepdims=True))


@softmax_p.def_decomposition
def _softmax_decomp(x, *, axis):
    tnp = _tnp()
    if tnp.ndim(x) == 0:
        return tnp.ones_like(x)
    e = tnp.exp(_shifted(x, axis))
    return tnp.divide(e, tnp.sum(e, axis=axis, keepdims=True))


@log_softmax_p.def_decomposition
def _log_softmax_decomp(x, *, axis):
    tnp = _tnp()
    if tnp.ndim(x) == 0:
        return tnp.zeros_like(x)
    s = _shifted(x, axis)
    return tnp.subtract(s, tnp.log(tnp.sum(tnp.exp(s), axis=axis, keepdims=True)))


logsumexp_p = Primitive("logsumexp", family="softmax")


@logsumexp_p.def_shape
def _logsumexp_shape(x: ShapedArray, *, axes: tuple, keepdims: bool) -> ShapedArray:
    if not is_float(x.dtype):
        raise DTypeError(f"logsumexp needs a floating operand, got {x.str_short()}")
    shape = tuple((1 if keepdims else None) if i in axes else d for i, d in enumerate(x.shape))
    return ShapedArray(tuple(d for d in shape if d is not None), x.dtype)


def _logsumexp_ref(x, *, axes, keepdims):
    return np.asarray(scipy.special.logsumexp(x, axis=axes, keepdims=keepdims))


logsumexp_p.def_impl(_lowp(_logsumexp_ref))


@logsumexp_p.def_decomposition
def _logsumexp_decomp(x, *, axes, keepdims):
    # m + log(sum(exp(x - m))); an infinite m (all -inf, or some +inf) is replaced by 0 in the
    # shift so that no inf - inf appears, and added back afterwards.
    tnp = _tnp()
    if not axes:
        return x
    m = tnp.max(x, axis=axes, keepdims=True)
    finite = tnp.less(abs_p.bind(m), np.inf)
    shift = tnp.where(finite, m, tnp.zeros_like(m))
    s = tnp.log(tnp.sum(tnp.exp(tnp.subtract(x, shift)), axis=axes, keepdims=True))
    out = tnp.add(s, shift)
    if not keepdims:
        out = tnp.squeeze(out, axes)
    return out


SOFTMAX = [softmax_p, log_softmax_p, logsumexp_p]
