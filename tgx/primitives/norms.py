"""Normalisation layers as composite primitives: layer_norm, rms_norm, batch_norm, group_norm.

Shapes and semantics follow `torch.nn.functional` (NCHW, biased variance for normalising,
unbiased variance for batch_norm's running-variance update). Optional affine operands come
last and are announced by `has_weight` / `has_bias`. Half-precision inputs are normalised in
float32 and cast back (torch's CPU kernels do the same).
"""

from __future__ import annotations

import numpy as np

from ..core import Primitive
from ..errors import DTypeError, ShapeError
from ..shapes import (
    ShapedArray,
    dim_div,
    dim_eq,
    dim_str,
    is_float,
    prod,
    shape_str,
)
from . import ops
from .math import square
from .reduce_composite import mean


def _check_float(op, x: ShapedArray):
    if not is_float(x.dtype):
        raise DTypeError(f"{op}: expects a floating-point input, got {x.str_short()}")


def _check_param(op, what, a: ShapedArray, shape, dtype):
    if len(a.shape) != len(shape) or not all(dim_eq(p, q) for p, q in zip(a.shape, shape)):
        raise ShapeError(f"{op}: {what} must have shape {shape_str(shape)}, got {a}")
    if a.dtype != dtype:
        raise DTypeError(f"{op}: {what} has dtype {a.str_short()}, input is {dtype}")


def _affine_operands(args, has_weight, has_bias):
    it = iter(args)
    w = next(it) if has_weight else None
    b = next(it) if has_bias else None
    return w, b


def _np_affine(y, w, b, shape):
    if w is not None:
        y = y * w.astype(np.float64).reshape(shape)
    if b is not None:
        y = y + b.astype(np.float64).reshape(shape)
    return y


def _affine(y, w, b, shape):
    if w is not None:
        y = ops.multiply(y, ops.reshape(ops.upcast_half(w), shape))
    if b is not None:
        y = ops.add(y, ops.reshape(ops.upcast_half(b), shape))
    return y


def _normalize(x, axes, eps):
    """(x - mean) / sqrt(biased var + eps) over `axes` (two passes: stable for large means)."""
    xc = ops.subtract(x, mean(x, axis=axes, keepdims=True))
    var = mean(square(xc), axis=axes, keepdims=True)
    return ops.multiply(xc, ops.divide(1, ops.sqrt(ops.add(var, eps))))


# ---------------------------------------------------------------------------------------------
layer_norm_p = Primitive("layer_norm", family="norms")


@layer_norm_p.def_shape
def _layer_norm_shape(x, *wb, normalized_shape, eps, has_weight, has_bias):
    _check_float("layer_norm", x)
    k = len(normalized_shape)
    if k > x.ndim or not all(dim_eq(p, q) for p, q in zip(x.shape[x.ndim - k:],
                                                           normalized_shape)):
        raise ShapeError(f"layer_norm: normalized_shape {shape_str(normalized_shape)} must be "
                         f"the trailing dims of the input {x}")
    for what, a in zip(("weight", "bias"), _affine_operands(wb, has_weight, has_bias)):
        if a is not None:
            _check_param("layer_norm", what, a, normalized_shape, x.dtype)
    return x


@layer_norm_p.def_impl
def _layer_norm_impl(x, *wb, normalized_shape, eps, has_weight, has_bias):
    axes = tuple(range(x.ndim - len(normalized_shape), x.ndim))
    x64 = x.astype(np.float64)
    mu = x64.mean(axis=axes, keepdims=True)
    var = ((x64 - mu) ** 2).mean(axis=axes, keepdims=True)
    y = (x64 - mu) / np.sqrt(var + eps)
    w, b = _affine_operands(wb, has_weight, has_bias)
    return _np_affine(y, w, b, normalized_shape).astype(x.dtype)


@layer_norm_p.def_decomposition
def _layer_norm_decomp(x, *wb, normalized_shape, eps, has_weight, has_bias):
    a = ops._aval(x)
    axes = tuple(range(a.ndim - len(normalized_shape), a.ndim))
    y = _normalize(ops.upcast_half(x), axes, eps)
    w, b = _affine_operands(wb, has_weight, has_bias)
    return ops.astype(_affine(y, w, b, normalized_shape), a.dtype)


# ---------------------------------------------------------------------------------------------
rms_norm_p = Primitive("rms_norm", family="norms")


@rms_norm_p.def_shape
def _rms_norm_shape(x, *w, normalized_shape, eps, has_weight):
    return _layer_norm_shape(x, *w, normalized_shape=normalized_shape, eps=eps,
                             has_weight=has_weight, has_bias=False)


@rms_norm_p.def_impl
def _rms_norm_impl(x, *w, normalized_shape, eps, has_weight):
    axes = tuple(range(x.ndim - len(normalized_shape), x.ndim))
    x64 = x.astype(np.float64)
    y = x64 / np.sqrt((x64 ** 2).mean(axis=axes, keepdims=True) + eps)
    return _np_affine(y, w[0] if has_weight else None, None, normalized_shape).astype(x.dtype)


@rms_norm_p.def_decomposition
def _rms_norm_decomp(x, *w, normalized_shape, eps, has_weight):
    a = ops._aval(x)
    axes = tuple(range(a.ndim - len(normalized_shape), a.ndim))
    xu = ops.upcast_half(x)
    ms = mean(square(xu), axis=axes, keepdims=True)
    y = ops.multiply(xu, ops.divide(1, ops.sqrt(ops.add(ms, eps))))
    return ops.astype(_affine(y, w[0] if has_weight else None, None, normalized_shape), a.dtype)


# Derivatives in closed form (one pass of reductions, in float32 for half inputs): the
# decompositions' backward passes cost twice the equations.


def _param_ct(g, shape, k, like):
    """A cotangent summed over the leading (batch) axes down to the affine parameter."""
    lead = tuple(range(len(shape) - k))
    out = ops.sum(g, axis=lead) if lead else g
    return ops.astype(out, ops._aval(like).dtype)


@rms_norm_p.def_vjp
def _rms_norm_vjp(ct, x, *w, out, normalized_shape, eps, has_weight):
    a = ops._aval(x)
    axes = tuple(range(a.ndim - len(normalized_shape), a.ndim))
    xu, g = ops.upcast_half(x), ops.upcast_half(ct)
    r = ops.divide(1, ops.sqrt(ops.add(mean(square(xu), axis=axes, keepdims=True), eps)))
    gw = ops.multiply(g, ops.upcast_half(w[0])) if has_weight else g
    # d/dx (x r) · gw = r gw - x r³ mean(gw x)
    proj = mean(ops.multiply(gw, xu), axis=axes, keepdims=True)
    dx = ops.subtract(ops.multiply(gw, r),
                      ops.multiply(xu, ops.multiply(ops.multiply(r, ops.multiply(r, r)), proj)))
    cts = [ops.astype(dx, a.dtype)]
    if has_weight:
        cts.append(_param_ct(ops.multiply(g, ops.multiply(xu, r)), a.shape,
                             len(normalized_shape), w[0]))
    return tuple(cts)


@layer_norm_p.def_vjp
def _layer_norm_vjp(ct, x, *wb, out, normalized_shape, eps, has_weight, has_bias):
    a = ops._aval(x)
    k = len(normalized_shape)
    axes = tuple(range(a.ndim - k, a.ndim))
    w, b = _affine_operands(wb, has_weight, has_bias)
    xu, g = ops.upcast_half(x), ops.upcast_half(ct)
    xc = ops.subtract(xu, mean(xu, axis=axes, keepdims=True))
    r = ops.divide(1, ops.sqrt(ops.add(mean(square(xc), axis=axes, keepdims=True), eps)))
    xhat = ops.multiply(xc, r)
    gw = ops.multiply(g, ops.upcast_half(w)) if has_weight else g
    # r (gw - mean(gw) - xhat mean(gw xhat))
    dx = ops.multiply(r, ops.subtract(
        ops.subtract(gw, mean(gw, axis=axes, keepdims=True)),
        ops.multiply(xhat, mean(ops.multiply(gw, xhat), axis=axes, keepdims=True))))
    cts = [ops.astype(dx, a.dtype)]
    if has_weight:
        cts.append(_param_ct(ops.multiply(g, xhat), a.shape, k, w))
    if has_bias:
        cts.append(_param_ct(g, a.shape, k, b))
    return tuple(cts)


# ---------------------------------------------------------------------------------------------
# batch_norm(x, [running_mean, running_var], [weight], [bias]) -> [y] (+ [new_mean, new_var]
# when training with running stats: the functional form of torch's in-place update).
batch_norm_p = Primitive("batch_norm", family="norms", multiple_results=True)


def _bn_operands(args, has_running, has_weight, has_bias):
    it = iter(args)
    rm, rv = (next(it), next(it)) if has_running else (None, None)
    w = next(it) if has_weight else None
    b = next(it) if has_bias else None
    return rm, rv, w, b


@batch_norm_p.def_shape
def _batch_norm_shape(x, *args, training, momentum, eps, has_running, has_weight, has_bias):
    _check_float("batch_norm", x)
    if x.ndim < 2:
        raise ShapeError(f"batch_norm: input must be (N, C, ...), got {x}")
    if not training and not has_running:
        raise ShapeError("batch_norm: inference (training=False) needs running_mean and "
                         "running_var")
    rm, rv, w, b = _bn_operands(args, has_running, has_weight, has_bias)
    c = x.shape[1]
    for what, a in (("running_mean", rm), ("running_var", rv), ("weight", w), ("bias", b)):
        if a is not None:
            if a.ndim != 1 or not dim_eq(a.shape[0], c):
                raise ShapeError(f"batch_norm: {what} must have shape ({dim_str(c)},), got {a}")
            if not is_float(a.dtype):
                raise DTypeError(f"batch_norm: {what} must be floating point, got {a}")
    outs = [x.strip_weak()]
    if training and has_running:
        outs += [rm.strip_weak(), rv.strip_weak()]
    return outs


@batch_norm_p.def_impl
def _batch_norm_impl(x, *args, training, momentum, eps, has_running, has_weight, has_bias):
    rm, rv, w, b = _bn_operands(args, has_running, has_weight, has_bias)
    axes = (0,) + tuple(range(2, x.ndim))
    cshape = (-1,) + (1,) * (x.ndim - 2)
    x64 = x.astype(np.float64)
    if training:
        mean, var = x64.mean(axis=axes), x64.var(axis=axes)
    else:
        mean, var = rm.astype(np.float64), rv.astype(np.float64)
    y = (x64 - mean.reshape(cshape)) / np.sqrt(var.reshape(cshape) + eps)
    outs = [_np_affine(y, w, b, cshape).astype(x.dtype)]
    if training and has_running:
        n = x.size // x.shape[1]
        unbiased = var * n / max(n - 1, 1) if n > 1 else np.full_like(var, np.nan)
        outs.append(((1 - momentum) * rm + momentum * mean).astype(rm.dtype))
        outs.append(((1 - momentum) * rv + momentum * unbiased).astype(rv.dtype))
    return outs


@batch_norm_p.def_decomposition
def _batch_norm_decomp(x, *args, training, momentum, eps, has_running, has_weight, has_bias):
    a = ops._aval(x)
    rm, rv, w, b = _bn_operands(args, has_running, has_weight, has_bias)
    axes = (0,) + tuple(range(2, a.ndim))
    cshape = (a.shape[1],) + (1,) * (a.ndim - 2)
    xu = ops.upcast_half(x)
    if training:
        mu = mean(xu, axis=axes, keepdims=True)
        xc = ops.subtract(xu, mu)
        var = mean(square(xc), axis=axes, keepdims=True)
    else:
        mu = ops.reshape(ops.upcast_half(rm), (1,) + cshape)
        var = ops.reshape(ops.upcast_half(rv), (1,) + cshape)
        xc = ops.subtract(xu, mu)
    y = ops.multiply(xc, ops.divide(1, ops.sqrt(ops.add(var, eps))))
    outs = [ops.astype(_affine(y, w, b, cshape), a.dtype)]
    if training and has_running:
        n = prod([d for i, d in enumerate(a.shape) if i != 1])
        nv = ops._shape_value(n, ops._aval(var).dtype)
        unbiased = ops.divide(ops.multiply(ops.reshape(var, cshape[:1]), nv), ops.subtract(nv, 1))
        for stat, new in ((rm, ops.reshape(mu, cshape[:1])), (rv, unbiased)):
            upd = ops.add(ops.multiply(ops.upcast_half(stat), 1 - momentum),
                          ops.multiply(new, momentum))
            outs.append(ops.astype(upd, ops._aval(stat).dtype))
    return outs


# ---------------------------------------------------------------------------------------------
group_norm_p = Primitive("group_norm", family="norms")


@group_norm_p.def_shape
def _group_norm_shape(x, *wb, num_groups, eps, has_weight, has_bias):
    _check_float("group_norm", x)
    if x.ndim < 2:
        raise ShapeError(f"group_norm: input must be (N, C, ...), got {x}")
    dim_div(x.shape[1], num_groups, f"group_norm: {dim_str(x.shape[1])} channels into "
                                    f"{num_groups} groups")
    for what, a in zip(("weight", "bias"), _affine_operands(wb, has_weight, has_bias)):
        if a is not None:
            _check_param("group_norm", what, a, (x.shape[1],), x.dtype)
    return x


@group_norm_p.def_impl
def _group_norm_impl(x, *wb, num_groups, eps, has_weight, has_bias):
    g = x.astype(np.float64).reshape(x.shape[0], num_groups, -1)
    mu = g.mean(-1, keepdims=True)
    y = ((g - mu) / np.sqrt(g.var(-1, keepdims=True) + eps)).reshape(x.shape)
    w, b = _affine_operands(wb, has_weight, has_bias)
    return _np_affine(y, w, b, (-1,) + (1,) * (x.ndim - 2)).astype(x.dtype)


@group_norm_p.def_decomposition
def _group_norm_decomp(x, *wb, num_groups, eps, has_weight, has_bias):
    a = ops._aval(x)
    per_group = dim_div(prod(a.shape[1:]), num_groups, "group_norm")
    g = ops.reshape(ops.upcast_half(x), (a.shape[0], num_groups, per_group))
    y = ops.reshape(_normalize(g, (2,), eps), a.shape)
    w, b = _affine_operands(wb, has_weight, has_bias)
    return ops.astype(_affine(y, w, b, (a.shape[1],) + (1,) * (a.ndim - 2)), a.dtype)


NORMS = [layer_norm_p, rms_norm_p, batch_norm_p, group_norm_p]
