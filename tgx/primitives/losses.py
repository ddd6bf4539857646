"""Loss functions as composite primitives, with `torch.nn.functional` semantics.

Each primitive carries its shape rule, a NumPy reference (float64 inside, written from the
definitions, independently of the decomposition) and a decomposition in lax-level terms
(`tgx.primitives.ops` and the binders of other composite families) that stays in the log
domain (log-softmax with max subtraction, softplus via `log(1 + exp(-|x|))`).
Optional arrays (class `weight`, `pos_weight`) are trailing operands announced by `has_*` params.
Half-precision inputs are computed in float32 and the result cast back, as torch does on CPU.
"""

from __future__ import annotations

import numpy as np

from ..core import Primitive
from ..errors import DTypeError, ShapeError
from ..shapes import (
    ShapedArray,
    broadcast_shapes,
    dim_eq,
    is_float,
    is_int,
    prod,
    promote,
    shape_str,
)
from . import ops
from .derivatives import unbroadcast
from .activations import log_softmax
from .math import absolute, square
from .reduce_composite import mean

REDUCTIONS = ("none", "mean", "sum")


def _check_reduction(op: str, reduction: str, allowed=REDUCTIONS) -> None:
    if reduction not in allowed:
        raise ShapeError(f"{op}: reduction must be one of {allowed}, got {reduction!r}")


def _float_dtype(op: str, *avals: ShapedArray):
    dt, _ = promote(*[a.strip_weak() for a in avals])
    if not is_float(dt):
        raise DTypeError(f"{op}: expects floating-point inputs, got "
                         f"{', '.join(a.str_short() for a in avals)}")
    return dt


def _reduce(loss, reduction: str):
    if reduction == "sum":
        return ops.sum(loss)
    if reduction == "mean":
        return mean(loss)
    return loss


def _np_reduce(loss, reduction: str):
    if reduction == "sum":
        return np.sum(loss)
    if reduction == "mean":
        return np.mean(loss) if loss.size else np.float64(np.nan)
    return loss


def _np_log_softmax(x, axis):
    s = x - np.max(x, axis=axis, keepdims=True)
    return s - np.log(np.sum(np.exp(s), axis=axis, keepdims=True))


def _elementwise_loss(name: str, np_fn, decomp_fn, extra_operands: tuple = ()):
    """A loss of broadcast (input, target[, extras]) → elementwise loss, then `reduction`."""
    p = Primitive(name, family="losses")

    @p.def_shape
    def _shape(x, t, *extra, reduction="mean", **params):
        _check_reduction(name, reduction)
        dt = _float_dtype(name, x, t, *extra)
        shape = broadcast_shapes(x.shape, t.shape, op=name)
        for e in extra:
            if broadcast_shapes(shape, e.shape, op=name) != tuple(shape):
                raise ShapeError(f"{name}: {e} does not broadcast to the loss shape "
                                 f"{shape_str(shape)}")
        return ShapedArray(shape if reduction == "none" else (), dt)

    @p.def_impl
    def _impl(x, t, *extra, reduction="mean", **params):
        dt = np.result_type(x, t)
        loss = np_fn(*[np.asarray(a, np.float64) for a in (x, t, *extra)], **params)
        return np.asarray(_np_reduce(loss, reduction)).astype(dt)

    @p.def_decomposition
    def _decomp(x, t, *extra, reduction="mean", **params):
        dt = ops._aval(x).dtype
        loss = decomp_fn(*[ops.upcast_half(a) for a in (x, t, *extra)], **params)
        return ops.astype(_reduce(loss, reduction), dt)

    return p


# ---------------------------------------------------------------------------------------------
# Regression and divergence losses

mse_loss_p = _elementwise_loss(
    "mse_loss", lambda x, t: (x - t) ** 2, lambda x, t: square(ops.subtract(x, t)))
l1_loss_p = _elementwise_loss(
    "l1_loss", lambda x, t: np.abs(x - t), lambda x, t: absolute(ops.subtract(x, t)))


def _smooth_l1_np(x, t, *, beta):
    d = np.abs(x - t)
    return d - 0.5 * beta if beta == 0 else np.where(d < beta, 0.5 * d * d / beta, d - 0.5 * beta)


def _smooth_l1_decomp(x, t, *, beta):
    d = absolute(ops.subtract(x, t))
    if beta == 0:
        return d
    return ops.where(ops.less(d, beta), ops.multiply(square(d), 0.5 / beta),
                     ops.subtract(d, 0.5 * beta))


smooth_l1_loss_p = _elementwise_loss("smooth_l1_loss", _smooth_l1_np, _smooth_l1_decomp)


def _kl_np(x, t, *, log_target):
    if log_target:
        return np.exp(t) * (t - x)
    safe = np.where(t > 0, t, 1.0)
    return np.where(t > 0, t * np.log(safe), 0.0) - t * x


def _kl_decomp(x, t, *, log_target):
    if log_target:
        return ops.multiply(ops.exp(t), ops.subtract(t, x))
    pos = ops.greater(t, 0)
    xlogx = ops.where(pos, ops.multiply(t, ops.log(ops.where(pos, t, 1))), 0)
    return ops.subtract(xlogx, ops.multiply(t, x))


kl_div_p = Primitive("kl_div", family="losses")


@kl_div_p.def_shape
def _kl_div_shape(x, t, *, reduction, log_target):
    _check_reduction("kl_div", reduction, REDUCTIONS + ("batchmean",))
    dt = _float_dtype("kl_div", x, t)
    shape = broadcast_shapes(x.shape, t.shape, op="kl_div")
    return ShapedArray(shape if reduction == "none" else (), dt)


@kl_div_p.def_impl
def _kl_div_impl(x, t, *, reduction, log_target):
    loss = _kl_np(x.astype(np.float64), t.astype(np.float64), log_target=log_target)
    if reduction == "batchmean":
        out = loss.sum() / (loss.shape[0] if loss.ndim else 1)
    else:
        out = _np_reduce(loss, reduction)
    return np.asarray(out).astype(np.result_type(x, t))


@kl_div_p.def_decomposition
def _kl_div_decomp(x, t, *, reduction, log_target):
    dt = ops._aval(x).dtype
    loss = _kl_decomp(ops.upcast_half(x), ops.upcast_half(t), log_target=log_target)
    if reduction == "batchmean":
        shape = ops._aval(loss).shape
        out = ops.sum(loss)
        if shape:
            out = ops.divide(out, ops._shape_value(shape[0], ops._aval(out).dtype))
    else:
        out = _reduce(loss, reduction)
    return ops.astype(out, dt)


# ---------------------------------------------------------------------------------------------
# Binary cross-entropy


def _bce_np(x, t, *w, has_weight):
    with np.errstate(divide="ignore"):  # log(0) = -inf, clamped to -100 like torch
        loss = -(t * np.maximum(np.log(x), -100.0) + (1 - t) * np.maximum(np.log1p(-x), -100.0))
    return loss * w[0] if has_weight else loss


def _bce_decomp(x, t, *w, has_weight):
    log_x = ops.maximum(ops.log(x), -100.0)
    log_1mx = ops.maximum(ops.log(ops.subtract(1, x)), -100.0)
    loss = ops.negative(ops.add(ops.multiply(t, log_x),
                                ops.multiply(ops.subtract(1, t), log_1mx)))
    return ops.multiply(loss, w[0]) if has_weight else loss


binary_cross_entropy_p = _elementwise_loss("binary_cross_entropy", _bce_np, _bce_decomp)


def _loss_ct(ct, shape, reduction):
    """The cotangent of the elementwise loss (of `shape`) from that of the reduced loss."""
    if reduction == "none":
        return ct
    if reduction == "mean":
        ct = ops.divide(ct, ops._shape_value(prod(shape), ops._aval(ct).dtype))
    return ops.broadcast_to(ct, shape)


@binary_cross_entropy_p.def_vjp
def _bce_vjp(ct, x, t, *w, out, reduction="mean", has_weight):
    # torch's derivative in x: (x - t) / max(x (1 - x), 1e-12), finite where the logs are
    # clamped (through the decomposition it would be NaN there).
    dt = ops._aval(x).dtype
    shape = broadcast_shapes(ops._aval(x).shape, ops._aval(t).shape)
    ct_e = _loss_ct(ct, shape, reduction)
    if has_weight:
        ct_e = ops.multiply(ct_e, w[0])
    denom = ops.maximum(ops.multiply(x, ops.subtract(1.0, x)), np.asarray(1e-12, dt))
    ct_x = ops.divide(ops.multiply(ct_e, ops.subtract(x, t)), denom)
    # The target's derivative uses the unclamped logs (±inf at x = 0 or 1), as torch.
    ct_t = ops.multiply(ct_e, ops.subtract(ops.log(ops.subtract(1.0, x)), ops.log(x)))
    cts = [unbroadcast(ct_x, x), unbroadcast(ct_t, t)]
    if has_weight:
        elem = _bce_decomp(x, t, has_weight=False)
        cts.append(unbroadcast(ops.multiply(_loss_ct(ct, shape, reduction), elem), w[0]))
    return tuple(cts)


def _bce_logits_np(x, t, *extra, has_weight, has_pos_weight):
    # softplus(-x) = log(1 + exp(-x)), computed stably.
    sp_neg = np.logaddexp(0.0, -x)
    if has_pos_weight:
        pw = extra[-1]
        loss = (1 - t) * x + (1 + (pw - 1) * t) * sp_neg
    else:
        loss = (1 - t) * x + sp_neg
    return loss * extra[0] if has_weight else loss


def _bce_logits_decomp(x, t, *extra, has_weight, has_pos_weight):
    # softplus(-x) = max(-x, 0) + log(1 + exp(-|x|)): never overflows.
    sp_neg = ops.add(ops.maximum(ops.negative(x), 0),
                     ops.log(ops.add(1, ops.exp(ops.negative(absolute(x))))))
    if has_pos_weight:
        coef = ops.add(1, ops.multiply(ops.subtract(extra[-1], 1), t))
        sp_neg = ops.multiply(coef, sp_neg)
    loss = ops.add(ops.multiply(ops.subtract(1, t), x), sp_neg)
    return ops.multiply(loss, extra[0]) if has_weight else loss


binary_cross_entropy_with_logits_p = _elementwise_loss(
    "binary_cross_entropy_with_logits", _bce_logits_np, _bce_logits_decomp)


# ---------------------------------------------------------------------------------------------
# Negative log-likelihood and cross-entropy over a class axis (axis 1, or 0 for 1-D input)


def _class_axis(x: ShapedArray) -> int:
    return 0 if x.ndim == 1 else 1


def _check_class_inputs(op: str, x: ShapedArray, t: ShapedArray, w, probs: bool):
    if x.ndim == 0:
        raise ShapeError(f"{op}: input must have a class axis, got {x}")
    ax = _class_axis(x)
    rest = x.shape[:ax] + x.shape[ax + 1:]
    if probs:
        if not (t.ndim == x.ndim and all(dim_eq(a, b) for a, b in zip(t.shape, x.shape))):
            raise ShapeError(f"{op}: class-probability target {t} must have the shape of the "
                             f"input {x}")
    else:
        if not is_int(t.dtype):
            raise DTypeError(f"{op}: class-index target must be integers, got {t.str_short()}")
        if not (t.ndim == len(rest) and all(dim_eq(a, b) for a, b in zip(t.shape, rest))):
            raise ShapeError(f"{op}: target {t} must have the input's shape {shape_str(x.shape)} "
                             f"without the class axis {ax}, i.e. {shape_str(rest)}")
    if w is not None and not (w.ndim == 1 and dim_eq(w.shape[0], x.shape[ax])):
        raise ShapeError(f"{op}: weight must be 1-D with one entry per class "
                         f"({x.shape[ax]}), got {w}")
    return rest


def _class_loss_shape(op, x, t, *w, reduction, probs=False, **_):
    _check_reduction(op, reduction)
    if not is_float(x.dtype):
        raise DTypeError(f"{op}: input must be floating point, got {x.str_short()}")
    rest = _check_class_inputs(op, x, t, w[0] if w else None, probs)
    return ShapedArray(rest if reduction == "none" else (), x.dtype)


def _np_pick(logp, t, ax):
    """logp[i, t_i, ...] along the class axis; `t` already made safe (in range)."""
    return np.take_along_axis(logp, np.expand_dims(t, ax), axis=ax).squeeze(ax)


def _np_nll(logp, t, w, ignore_index, reduction):
    """Returns (per-element loss, per-element weight) with ignored targets zeroed."""
    ax = _class_axis(logp)
    keep = t != ignore_index
    safe = np.where(keep, t, 0)
    wt = (w[safe] if w is not None else np.ones(t.shape)) * keep
    return -_np_pick(logp, safe, ax) * wt, wt


def _np_weighted_mean(loss, wt, reduction):
    if reduction == "mean":
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.sum(loss) / np.sum(wt)
    return _np_reduce(loss, reduction)


nll_loss_p = Primitive("nll_loss", family="losses")
nll_loss_p.def_shape(lambda x, t, *w, **k: _class_loss_shape("nll_loss", x, t, *w, **k))


@nll_loss_p.def_impl
def _nll_impl(x, t, *w, has_weight, ignore_index, reduction):
    wv = w[0].astype(np.float64) if has_weight else None
    loss, wt = _np_nll(x.astype(np.float64), t, wv, ignore_index, reduction)
    return np.asarray(_np_weighted_mean(loss, wt, reduction)).astype(x.dtype)


def _onehot_pick(logp, t, ax):
    """logp gathered at target indices along the class axis, via a one-hot select."""
    a = ops._aval(logp)
    classes = ops.iota(ops._aval(t).dtype, a.shape, ax)
    hit = ops.equal(classes, ops.expand_dims(t, ax))
    return ops.sum(ops.where(hit, logp, 0), axis=ax)


def _nll_parts(logp, t, w, ignore_index):
    """(loss per element, weight per element), ignored targets contributing 0 to both."""
    ax = _class_axis(ops._aval(logp))
    keep = ops.not_equal(t, ignore_index)
    safe = ops.where(keep, t, 0)
    picked = _onehot_pick(logp, safe, ax)
    if w is not None:
        wt = ops.where(keep, ops.take(w, safe), 0)
    else:
        wt = ops.astype(keep, ops._aval(logp).dtype)
    return ops.negative(ops.multiply(picked, wt)), wt


def _weighted_mean(loss, wt, reduction):
    if reduction == "mean":
        return ops.divide(ops.sum(loss), ops.sum(wt))
    return _reduce(loss, reduction)


@nll_loss_p.def_decomposition
def _nll_decomp(x, t, *w, has_weight, ignore_index, reduction):
    dt = ops._aval(x).dtype
    weight = ops.upcast_half(w[0]) if has_weight else None
    loss, wt = _nll_parts(ops.upcast_half(x), t, weight, ignore_index)
    return ops.astype(_weighted_mean(loss, wt, reduction), dt)


cross_entropy_p = Primitive("cross_entropy", family="losses")
cross_entropy_p.def_shape(lambda x, t, *w, **k: _class_loss_shape("cross_entropy", x, t, *w, **k))


@cross_entropy_p.def_impl
def _ce_impl(x, t, *w, has_weight, ignore_index, reduction, label_smoothing, probs):
    ax = _class_axis(x)
    logp = _np_log_softmax(x.astype(np.float64), ax)
    wv = w[0].astype(np.float64) if has_weight else None
    wb = 1.0 if wv is None else wv.reshape((-1,) + (1,) * (x.ndim - ax - 1))
    n_cls = x.shape[ax]
    eps = label_smoothing
    if probs:
        tp = t.astype(np.float64) * (1 - eps) + eps / n_cls
        loss = -np.sum(logp * tp * wb, axis=ax)
        if reduction == "mean":
            out = np.sum(loss) / (loss.size if loss.ndim else 1)
        else:
            out = _np_reduce(loss, reduction)
        return np.asarray(out).astype(x.dtype)
    loss, wt = _np_nll(logp, t, wv, ignore_index, reduction)
    if eps:
        smooth = -np.sum(logp * wb, axis=ax) * (t != ignore_index)
        loss = (1 - eps) * loss + eps / n_cls * smooth
    return np.asarray(_np_weighted_mean(loss, wt, reduction)).astype(x.dtype)


@cross_entropy_p.def_decomposition
def _ce_decomp(x, t, *w, has_weight, ignore_index, reduction, label_smoothing, probs):
    dt = ops._aval(x).dtype
    xa = ops._aval(x)
    ax = _class_axis(xa)
    n_cls = xa.shape[ax]
    logp = log_softmax(ops.upcast_half(x), ax)
    wv = ops.upcast_half(w[0]) if has_weight else None
    eps = label_smoothing
    smooth_scale = eps / n_cls if type(n_cls) is int else ops.divide(
        eps, ops._shape_value(n_cls, ops._aval(logp).dtype))

    def class_weighted(v):  # v * weight broadcast along the class axis
        if wv is None:
            return v
        return ops.multiply(v, ops.reshape(wv, (n_cls,) + (1,) * (xa.ndim - ax - 1)))

    if probs:
        tp = ops.upcast_half(t)
        if eps:
            tp = ops.add(ops.multiply(tp, 1 - eps), smooth_scale)
        loss = ops.negative(ops.sum(class_weighted(ops.multiply(logp, tp)), axis=ax))
        out = mean(loss) if reduction == "mean" else _reduce(loss, reduction)
        return ops.astype(out, dt)
    if not eps:
        args = (logp, t) + ((wv,) if has_weight else ())
        out = nll_loss_p.bind(*args, has_weight=has_weight, ignore_index=ignore_index,
                              reduction=reduction)
        return ops.astype(out, dt)
    loss, wt = _nll_parts(logp, t, wv, ignore_index)
    smooth = ops.negative(ops.sum(class_weighted(logp), axis=ax))
    smooth = ops.where(ops.not_equal(t, ignore_index), smooth, 0)
    loss = ops.add(ops.multiply(loss, 1 - eps), ops.multiply(smooth, smooth_scale))
    return ops.astype(_weighted_mean(loss, wt, reduction), dt)


LOSSES = [mse_loss_p, l1_loss_p, smooth_l1_loss_p, kl_div_p, binary_cross_entropy_p,
          binary_cross_entropy_with_logits_p, nll_loss_p, cross_entropy_p]
