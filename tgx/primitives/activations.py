"""Activation composites (elementwise) and the softmax family (over one axis / several axes).

Every decomposition is overflow-free at |x| = 1e4: sigmoid and softplus go through exp(-|x|),
tanh through expm1(-2|x|), and the softmax family subtracts the maximum first. `softmax` and
`log_softmax` bind their composites over one axis (for other families' decompositions and for
`tgx.nn`).
"""

from __future__ import annotations

import numpy as np

from ..core import Primitive
from ..errors import DTypeError, ShapeError
from ..shapes import ShapedArray, canonicalize_axis, is_float
from . import ops
from .derivatives import zero_scalar
from .elementwise import _lowp, special
from .math import abs_p, composite_naryop, composite_unop, expm1_p, log1p_p, tanh_p


def _act(name, ref):
    return composite_unop(name, ref, "float", family="activation")


# ---------------------------------------------------------------------------------------------
# ReLU family


relu_p = _act("relu", lambda x: np.maximum(x, 0))


@relu_p.def_decomposition
def _relu_decomp(x):
    return ops.maximum(x, ops.zeros_like(x))


leaky_relu_p = _act("leaky_relu", lambda x, *, negative_slope: np.where(
    x >= 0, x, x * negative_slope))


@leaky_relu_p.def_decomposition
def _leaky_relu_decomp(x, *, negative_slope):
    return ops.where(ops.greater_equal(x, 0), x, ops.multiply(x, negative_slope))


def _elu_ref(x, *, alpha):
    return np.where(x > 0, x, alpha * np.expm1(np.minimum(x, 0)))


elu_p = _act("elu", _elu_ref)


def _elu(x, alpha):
    neg = ops.multiply(expm1_p.bind(ops.minimum(x, ops.zeros_like(x))), alpha)
    return ops.where(ops.greater(x, 0), x, neg)


@elu_p.def_decomposition
def _elu_decomp(x, *, alpha):
    return _elu(x, alpha)


SELU_ALPHA = 1.6732632423543772848170429916717
SELU_SCALE = 1.0507009873554804934193349852946

selu_p = _act("selu", lambda x: SELU_SCALE * _elu_ref(x, alpha=SELU_ALPHA))


@selu_p.def_decomposition
def _selu_decomp(x):
    return ops.multiply(_elu(x, SELU_ALPHA), SELU_SCALE)


celu_p = _act("celu", lambda x, *, alpha: np.maximum(x, 0) + np.minimum(
    0, alpha * np.expm1(np.minimum(x, 0) / alpha)))


@celu_p.def_decomposition
def _celu_decomp(x, *, alpha):
    zero = ops.zeros_like(x)
    neg = ops.multiply(expm1_p.bind(ops.divide(ops.minimum(x, zero), alpha)), alpha)
    return ops.add(ops.maximum(x, zero), ops.minimum(neg, zero))


# ---------------------------------------------------------------------------------------------
# Smooth activations


_GELU_C = float(np.sqrt(2.0 / np.pi))


def _gelu_ref(x, *, approximate):
    if approximate == "tanh":  # x * x * x: NumPy's x ** 3 calls pow per element (5x slower)
        return 0.5 * x * (1 + np.tanh(_GELU_C * (x + 0.044715 * (x * x * x))))
    return 0.5 * x * (1 + special().erf(x / np.sqrt(2.0)))


gelu_p = _act("gelu", _gelu_ref)


@gelu_p.def_decomposition
def _gelu_decomp(x, *, approximate):
    if approximate == "tanh":
        inner = ops.multiply(ops.add(x, ops.multiply(ops.multiply(ops.multiply(x, x), x),
                                                     0.044715)), _GELU_C)
        t = tanh_p.bind(inner)
    else:
        t = ops.erf(ops.multiply(x, float(1 / np.sqrt(2.0))))
    return ops.multiply(ops.multiply(x, 0.5), ops.add(t, 1))


# The derivative of gelu as one composite, `gelu_grad(ct, x) = ct * gelu'(x)`: torch runs it
# as one kernel (`aten.gelu_backward`, what its autograd runs), and its decomposition is the
# closed form, where differentiating gelu's decomposition step by step (through tanh's own)
# recomputed every step of the forward. With u = c (x + a x^3), t = tanh(u):
#   gelu'(x) = (1 + t) / 2 + x (1 - t^2) (c + 3 a c x^2) / 2.
# Beyond |x| = 10, 1 - t^2 is 0 in every float dtype, so the polynomial reads min(x^2, 100):
# unclipped, x^2 overflows float16 there and 0 * inf would be NaN.
_GELU_A = 0.044715


def _gelu_grad_ref(ct, x, *, approximate):
    x2 = x * x
    if approximate == "tanh":
        t = np.tanh(x * (_GELU_C + _GELU_C * _GELU_A * x2))
        poly = np.minimum(x2, 100.0) * (1.5 * _GELU_A * _GELU_C) + 0.5 * _GELU_C
        d = (1 + t) * 0.5 + x * (1 - t * t) * poly
    else:
        d = (special().erf(x * float(1 / np.sqrt(2.0))) + 1) * 0.5 + x * np.exp(
            x2 * -0.5) * float(1 / np.sqrt(2 * np.pi))
    return ct * d


gelu_grad_p = composite_naryop("gelu_grad", _gelu_grad_ref, 2, "float", family="activation")


@gelu_grad_p.def_decomposition
def _gelu_grad_decomp(ct, x, *, approximate):
    x2 = ops.multiply(x, x)
    if approximate == "tanh":
        t = tanh_p.bind(ops.multiply(x, ops.add(ops.multiply(x2, _GELU_C * _GELU_A), _GELU_C)))
        poly = ops.add(ops.multiply(ops.minimum(x2, 100.0), 1.5 * _GELU_A * _GELU_C),
                       0.5 * _GELU_C)
        slope = ops.multiply(ops.multiply(x, ops.subtract(1.0, ops.multiply(t, t))), poly)
        d = ops.add(ops.multiply(ops.add(t, 1.0), 0.5), slope)
    else:
        cdf = ops.multiply(ops.add(ops.erf(ops.multiply(x, float(1 / np.sqrt(2.0)))), 1.0), 0.5)
        pdf = ops.multiply(ops.exp(ops.multiply(x2, -0.5)), float(1 / np.sqrt(2 * np.pi)))
        d = ops.add(cdf, ops.multiply(x, pdf))
    return ops.multiply(ct, d)


def _sigmoid_ref(x):
    return special().expit(x)


sigmoid_p = _act("sigmoid", _sigmoid_ref)


def _sigmoid(x):
    # e = exp(-|x|) <= 1: 1 / (1 + e) for x >= 0, e / (1 + e) for x < 0.
    e = ops.exp(ops.negative(abs_p.bind(x)))
    d = ops.add(e, 1)
    return ops.where(ops.greater_equal(x, 0), ops.divide(1, d), ops.divide(e, d))


@sigmoid_p.def_decomposition
def _sigmoid_decomp(x):
    return _sigmoid(x)


silu_p = _act("silu", lambda x: x * special().expit(x))


@silu_p.def_decomposition
def _silu_decomp(x):
    return ops.multiply(x, sigmoid_p.bind(x))


def _softplus_ref(x, *, beta, threshold):
    bx = x * beta
    soft = (np.log1p(np.exp(-np.abs(bx))) + np.maximum(bx, 0)) / beta
    return np.where(bx > threshold, x, soft)


softplus_p = _act("softplus", _softplus_ref)


@softplus_p.def_decomposition
def _softplus_decomp(x, *, beta, threshold):
    # log(1 + e^bx) = log1p(e^-|bx|) + max(bx, 0); linear above `threshold` (torch).
    bx = ops.multiply(x, beta) if beta != 1 else x
    soft = ops.add(log1p_p.bind(ops.exp(ops.negative(abs_p.bind(bx)))),
                   ops.maximum(bx, ops.zeros_like(bx)))
    if beta != 1:
        soft = ops.divide(soft, beta)
    return ops.where(ops.greater(bx, threshold), x, soft)


hardtanh_p = _act("hardtanh", lambda x, *, min_val, max_val: np.clip(x, min_val, max_val))


@hardtanh_p.def_decomposition
def _hardtanh_decomp(x, *, min_val, max_val):
    return ops.minimum(ops.maximum(x, min_val), max_val)


hardswish_p = _act("hardswish", lambda x: x * np.clip(x + 3, 0, 6) / 6)


@hardswish_p.def_decomposition
def _hardswish_decomp(x):
    r6 = ops.minimum(ops.maximum(ops.add(x, 3), 0), 6)
    return ops.divide(ops.multiply(x, r6), 6)


# Derivatives as torch defines them at the kinks (relu'(0) = 0, leaky_relu'(0) = slope, the
# exponential branch of elu/selu/celu at 0), and closed forms for the smooth ones: one fused
# expression instead of the derivative of every step of the decomposition.


relu_p.def_vjp(lambda ct, x, *, out: (ops.where(ops.greater(x, 0), ct, zero_scalar(ct)),))
leaky_relu_p.def_vjp(lambda ct, x, *, out, negative_slope: (
    ops.where(ops.greater(x, 0), ct, ops.multiply(ct, negative_slope)),))
elu_p.def_vjp(lambda ct, x, *, out, alpha: (
    ops.where(ops.greater(x, 0), ct, ops.multiply(ct, ops.add(out, alpha))),))
selu_p.def_vjp(lambda ct, x, *, out: (ops.multiply(ops.where(
    ops.greater(x, 0), ct, ops.multiply(ct, ops.multiply(ops.exp(x), SELU_ALPHA))), SELU_SCALE),))
celu_p.def_vjp(lambda ct, x, *, out, alpha: (
    ops.where(ops.greater(x, 0), ct, ops.multiply(ct, ops.exp(ops.divide(x, alpha)))),))
gelu_p.def_vjp(lambda ct, x, *, out, approximate: (
    gelu_grad_p.bind(ct, x, approximate=approximate),))
sigmoid_p.def_vjp(lambda ct, x, *, out: (
    ops.multiply(ct, ops.multiply(out, ops.subtract(1.0, out))),))


@silu_p.def_vjp
def _silu_vjp(ct, x, *, out):
    s = sigmoid_p.bind(x)
    return (ops.multiply(ct, ops.multiply(s, ops.add(ops.multiply(x, ops.subtract(1.0, s)),
                                                     1.0))),)


softplus_p.def_vjp(lambda ct, x, *, out, beta, threshold: (ops.where(
    ops.greater(ops.multiply(x, beta), threshold), ct,
    ops.multiply(ct, sigmoid_p.bind(ops.multiply(x, beta) if beta != 1 else x))),))
hardtanh_p.def_vjp(lambda ct, x, *, out, min_val, max_val: (ops.where(ops.logical_and(
    ops.greater(x, min_val), ops.less(x, max_val)), ct, zero_scalar(ct)),))


@hardswish_p.def_vjp
def _hardswish_vjp(ct, x, *, out):
    mid = ops.multiply(ct, ops.add(ops.divide(x, 3.0), 0.5))
    return (ops.where(ops.less_equal(x, -3.0), zero_scalar(ct),
                      ops.where(ops.less(x, 3.0), mid, ct)),)


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


def _axis(x, axis: int, op: str) -> int:
    nd = ops.ndim(x)
    return canonicalize_axis(axis, max(nd, 1), op) if nd else 0  # a 0-d x: axis 0


def softmax(x, axis: int = -1):
    """exp(x) / sum(exp(x)) along `axis` of a floating `x` (composite `softmax`).

    >>> softmax(np.array([0.0, 0.0], np.float32))
    array([0.5, 0.5], dtype=float32)
    """
    return softmax_p.bind(x, axis=_axis(x, axis, "softmax"))


def log_softmax(x, axis: int = -1):
    """x - logsumexp(x) along `axis` of a floating `x` (composite `log_softmax`).

    >>> log_softmax(np.array([[0.0], [1.0]], np.float32), axis=0).round(4)
    array([[-1.3133],
           [-0.3133]], dtype=float32)
    """
    return log_softmax_p.bind(x, axis=_axis(x, axis, "log_softmax"))


def _shifted(x, axis):
    return ops.subtract(x, ops.max(x, axis=axis, keepdims=True))


@softmax_p.def_decomposition
def _softmax_decomp(x, *, axis):
    if ops.ndim(x) == 0:
        return ops.ones_like(x)
    e = ops.exp(_shifted(x, axis))
    return ops.divide(e, ops.sum(e, axis=axis, keepdims=True))


@log_softmax_p.def_decomposition
def _log_softmax_decomp(x, *, axis):
    if ops.ndim(x) == 0:
        return ops.zeros_like(x)
    s = _shifted(x, axis)
    return ops.subtract(s, ops.log(ops.sum(ops.exp(s), axis=axis, keepdims=True)))


logsumexp_p = Primitive("logsumexp", family="softmax")


@logsumexp_p.def_shape
def _logsumexp_shape(x: ShapedArray, *, axes: tuple, keepdims: bool) -> ShapedArray:
    if not is_float(x.dtype):
        raise DTypeError(f"logsumexp needs a floating operand, got {x.str_short()}")
    shape = tuple((1 if keepdims else None) if i in axes else d for i, d in enumerate(x.shape))
    return ShapedArray(tuple(d for d in shape if d is not None), x.dtype)


def _logsumexp_ref(x, *, axes, keepdims):
    return np.asarray(special().logsumexp(x, axis=axes, keepdims=keepdims))


logsumexp_p.def_impl(_lowp(_logsumexp_ref))


@logsumexp_p.def_decomposition
def _logsumexp_decomp(x, *, axes, keepdims):
    # m + log(sum(exp(x - m))); an infinite m (all -inf, or some +inf) is replaced by 0 in the
    # shift so that no inf - inf appears, and added back afterwards.
    if not axes:
        return x
    m = ops.max(x, axis=axes, keepdims=True)
    finite = ops.less(abs_p.bind(m), np.inf)
    shift = ops.where(finite, m, ops.zeros_like(m))
    s = ops.log(ops.sum(ops.exp(ops.subtract(x, shift)), axis=axes, keepdims=True))
    out = ops.add(s, shift)
    if not keepdims:
        out = ops.squeeze(out, axes)
    return out


@softmax_p.def_vjp
def _softmax_vjp(ct, x, *, out, axis):
    if ops.ndim(x) == 0:
        return (ops.zeros_like(ct),)
    dot = ops.sum(ops.multiply(ct, out), axis=axis, keepdims=True)
    return (ops.multiply(out, ops.subtract(ct, dot)),)


@log_softmax_p.def_vjp
def _log_softmax_vjp(ct, x, *, out, axis):
    if ops.ndim(x) == 0:
        return (ops.zeros_like(ct),)
    total = ops.sum(ct, axis=axis, keepdims=True)
    return (ops.subtract(ct, ops.multiply(ops.exp(out), total)),)


@logsumexp_p.def_vjp
def _logsumexp_vjp(ct, x, *, out, axes, keepdims):
    if not axes:
        return (ct,)
    shape = ops._aval(x).shape
    kept = tuple(1 if i in axes else d for i, d in enumerate(shape))
    # softmax(x) over the axes (NaN for a row of -inf, as torch and JAX).
    w = ops.exp(ops.subtract(x, ops.reshape(out, kept)))
    return (ops.multiply(ops.reshape(ct, kept), w),)


SOFTMAX = [softmax_p, log_softmax_p, logsumexp_p]
