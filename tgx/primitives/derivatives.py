"""Reverse-mode rules (VJPs) of the atomic primitives, registered with `Primitive.def_vjp`.

A rule is `rule(ct, *primals, out, **params) -> one cotangent per input` (None: no
gradient), written with the lax-level binders of `ops`, so it runs eagerly on NumPy, stages
into any trace, and is itself differentiable (`grad(grad(f))`). Composites get theirs in their
own family file where one is worth having (softmax, norms, losses); the others are
differentiated through their decomposition by `tgx.transforms.ad`.

These rules live here rather than beside each atomic primitive because they are written with
`ops`, which is built on the atomic families: keeping them one layer down keeps imports one-way.
"""

from __future__ import annotations

import math

import numpy as np

from ..shapes import as_dim
from . import ops
from .elementwise import (
    add_p,
    atan_p,
    convert_element_type_p,
    copy_p,
    cos_p,
    div_p,
    erf_p,
    exp_p,
    floor_p,
    log_p,
    max_p,
    min_p,
    mul_p,
    neg_p,
    pow_p,
    round_p,
    select_p,
    sin_p,
    sqrt_p,
    sub_p,
)
from .linalg import dot_general_p, free_axes
from .movement import (
    broadcast_in_dim_p,
    concatenate_p,
    dynamic_slice_p,
    dynamic_update_slice_p,
    gather_p,
    pad_p,
    reshape_p,
    rev_p,
    scatter_add_p,
    slice_p,
    transpose_p,
)
from .reductions import reduce_max_p, reduce_min_p, reduce_prod_p, reduce_sum_p


def _aval(x):
    return ops._aval(x)


def _is_one(d) -> bool:
    return isinstance(d, int) and d == 1


def unbroadcast(ct, like):
    """`ct` summed down to the shape of `like` (the operand NumPy-broadcast into ct's shape)."""
    shape, ct_shape = _aval(like).shape, _aval(ct).shape
    lead = len(ct_shape) - len(shape)
    ones = tuple(lead + i for i, d in enumerate(shape)
                 if _is_one(d) and not _is_one(ct_shape[lead + i]))
    if ones:
        ct = ops.sum(ct, axis=ones, keepdims=True)
    if lead:
        ct = ops.sum(ct, axis=tuple(range(lead)))
    return ct


def zero_scalar(x):
    """A 0-d zero of `x`'s dtype (the unselected side of a `where` in a rule)."""
    return np.zeros((), _aval(x).dtype)


# -- elementwise -----------------------------------------------------------------------------

neg_p.def_vjp(lambda ct, x, *, out: (ops.negative(ct),))
exp_p.def_vjp(lambda ct, x, *, out: (ops.multiply(ct, out),))
log_p.def_vjp(lambda ct, x, *, out: (ops.divide(ct, x),))
sin_p.def_vjp(lambda ct, x, *, out: (ops.multiply(ct, ops.cos(x)),))
cos_p.def_vjp(lambda ct, x, *, out: (ops.negative(ops.multiply(ct, ops.sin(x))),))
sqrt_p.def_vjp(lambda ct, x, *, out: (ops.divide(ops.multiply(ct, 0.5), out),))
atan_p.def_vjp(lambda ct, x, *, out: (
    ops.divide(ct, ops.add(ops.multiply(x, x), 1.0)),))
erf_p.def_vjp(lambda ct, x, *, out: (ops.multiply(
    ct, ops.multiply(ops.exp(ops.negative(ops.multiply(x, x))), 2.0 / math.sqrt(math.pi))),))
# Piecewise constant: zero almost everywhere (as JAX and torch).
floor_p.def_vjp(lambda ct, x, *, out: (None,))
round_p.def_vjp(lambda ct, x, *, out: (None,))
copy_p.def_vjp(lambda ct, x, *, out: (ct,))

add_p.def_vjp(lambda ct, x, y, *, out: (unbroadcast(ct, x), unbroadcast(ct, y)))
sub_p.def_vjp(lambda ct, x, y, *, out: (unbroadcast(ct, x),
                                        unbroadcast(ops.negative(ct), y)))
mul_p.def_vjp(lambda ct, x, y, *, out: (unbroadcast(ops.multiply(ct, y), x),
                                        unbroadcast(ops.multiply(ct, x), y)))
div_p.def_vjp(lambda ct, x, y, *, out: (
    unbroadcast(ops.divide(ct, y), x),
    unbroadcast(ops.negative(ops.divide(ops.multiply(ct, out), y)), y)))


def _minmax_vjp(ct, x, y, *, out):
    # Ties share the cotangent equally (JAX and torch.maximum do the same).
    dt = _aval(ct).dtype
    on_x = ops.astype(ops.equal(x, out), dt)
    on_y = ops.astype(ops.equal(y, out), dt)
    share = ops.divide(ct, ops.add(on_x, on_y))
    return (unbroadcast(ops.multiply(share, on_x), x), unbroadcast(ops.multiply(share, on_y), y))


max_p.def_vjp(_minmax_vjp)
min_p.def_vjp(_minmax_vjp)


@pow_p.def_vjp
def _pow_vjp(ct, x, y, *, out):
    # d/dx x**y = y * x**(y-1); d/dy = log(x) * x**y, taken as 0 where x == 0 (as JAX).
    dx = ops.multiply(y, pow_p.bind(x, ops.subtract(y, ops.ones_like(y))))
    safe_log = ops.where(ops.equal(x, 0.0), 0.0, ops.log(ops.where(ops.equal(x, 0.0), 1.0, x)))
    dy = ops.multiply(safe_log, out)
    return (unbroadcast(ops.multiply(ct, dx), x), unbroadcast(ops.multiply(ct, dy), y))


@select_p.def_vjp
def _select_vjp(ct, pred, t, f, *, out):
    zero = zero_scalar(ct)
    return (None, unbroadcast(ops.where(pred, ct, zero), t),
            unbroadcast(ops.where(pred, zero, ct), f))


@convert_element_type_p.def_vjp
def _cast_vjp(ct, x, *, out, new_dtype, weak_type=False):
    return (ops.astype(ct, _aval(x).dtype),)


# -- reductions ------------------------------------------------------------------------------


def _expand(ct, x, axes):
    """A reduced cotangent broadcast back over the reduced `axes` of `x`."""
    shape = _aval(x).shape
    kept = tuple(1 if i in axes else d for i, d in enumerate(shape))
    return ops.broadcast_to(ops.reshape(ct, kept), shape)


reduce_sum_p.def_vjp(lambda ct, x, *, out, axes: (_expand(ct, x, axes),))
reduce_prod_p.def_vjp(lambda ct, x, *, out, axes: (
    ops.divide(ops.multiply(_expand(ct, x, axes), _expand(out, x, axes)), x),))


def _extremum_vjp(ct, x, *, out, axes):
    # The cotangent goes to the extremal entries, shared equally among ties.
    hit = ops.astype(ops.equal(x, _expand(out, x, axes)), _aval(x).dtype)
    count = ops.sum(hit, axis=axes, keepdims=True)
    return (ops.divide(ops.multiply(_expand(ct, x, axes), hit), count),)


reduce_max_p.def_vjp(_extremum_vjp)
reduce_min_p.def_vjp(_extremum_vjp)


# -- linear algebra --------------------------------------------------------------------------


def _dot_transpose_lhs(ct, x, y, dimension_numbers, ans_y_last=True):
    """The cotangent of the lhs of dot_general: ct contracted with y over y's free axes, then
    its axes put back in the lhs order."""
    (xc, yc), (xb, yb) = dimension_numbers
    nx, ny = _aval(x).ndim, _aval(y).ndim
    xk, yk = free_axes(nx, xc, xb), free_axes(ny, yc, yb)
    nb = len(xb)
    # Axes of ct: batch, then the free axes of the operand on the left of the original product,
    # then those of the one on the right.
    if ans_y_last:
        ans_y = list(range(nb + len(xk), nb + len(xk) + len(yk)))
    else:
        ans_y = list(range(nb, nb + len(yk)))
    dims = ((ans_y, yk), (list(range(nb)), list(yb)))
    # ct . y has the axes: batch (x's batch order), x's free axes, then y's contracted axes
    # in y order, which are x's contracted axes ordered by y's; y . ct has the last two
    # groups swapped. The product already in x's order is taken where there is one: a weight
    # gradient x.T @ dy comes out in the weight's layout, not transposed (a transposed
    # gradient cost a strided copy in the optimizer's kernel: 0.4 ms of an MLP's 1.9 ms
    # Adam step on torch)
    xc_by_y = [a for _, a in sorted(zip(yc, xc))]
    order, in_order = list(xb) + xk + xc_by_y, list(range(nx))
    if order != in_order and list(xb) + xc_by_y + xk == in_order:
        return dot_general_p.bind(y, ct, dimension_numbers=_dn(((yk, ans_y),
                                                                (list(yb), list(range(nb))))))
    prod_ = dot_general_p.bind(ct, y, dimension_numbers=_dn(dims))
    perm = tuple(int(i) for i in np.argsort(order))
    return prod_ if order == in_order else ops.transpose(prod_, perm)


def _dn(dims):
    (a, b), (c, d) = dims
    return ((tuple(a), tuple(b)), (tuple(c), tuple(d)))


@dot_general_p.def_vjp
def _dot_general_vjp(ct, x, y, *, out, dimension_numbers):
    (xc, yc), (xb, yb) = dimension_numbers
    ct_x = _dot_transpose_lhs(ct, x, y, dimension_numbers)
    ct_y = _dot_transpose_lhs(ct, y, x, ((yc, xc), (yb, xb)), ans_y_last=False)
    return ct_x, ct_y


# -- movement --------------------------------------------------------------------------------

reshape_p.def_vjp(lambda ct, x, *, out, new_sizes: (ops.reshape(ct, _aval(x).shape),))
transpose_p.def_vjp(lambda ct, x, *, out, permutation: (
    ops.transpose(ct, tuple(int(i) for i in np.argsort(permutation))),))
rev_p.def_vjp(lambda ct, x, *, out, dimensions: (
    rev_p.bind(ct, dimensions=dimensions),))


@broadcast_in_dim_p.def_vjp
def _bid_vjp(ct, x, *, out, shape, broadcast_dimensions):
    xs = _aval(x).shape
    ones = tuple(d for i, d in enumerate(broadcast_dimensions)
                 if _is_one(xs[i]) and not _is_one(shape[d]))
    if ones:
        ct = ops.sum(ct, axis=ones, keepdims=True)
    new = tuple(i for i in range(len(shape)) if i not in broadcast_dimensions)
    if new:
        ct = ops.sum(ct, axis=new)
    return (ct,)


@slice_p.def_vjp
def _slice_vjp(ct, x, *, out, start_indices, limit_indices, strides=None):
    xs, os_ = _aval(x).shape, _aval(out).shape
    strides = strides or (1,) * len(xs)
    config = tuple((s, as_dim(d - s - (n - 1) * st - 1), st - 1)
                   for d, s, n, st in zip(xs, start_indices, os_, strides))
    return (pad_p.bind(ct, zero_scalar(ct), padding_config=config),)


@pad_p.def_vjp
def _pad_vjp(ct, x, v, *, out, padding_config):
    unpadded = pad_p.bind(ct, zero_scalar(ct), padding_config=tuple(
        (-lo, -hi, 0) for lo, hi, _ in padding_config))
    shape = _aval(unpadded).shape
    ct_x = slice_p.bind(unpadded, start_indices=(0,) * len(shape), limit_indices=tuple(shape),
                        strides=tuple(i + 1 for _, _, i in padding_config))
    ct_v = ops.subtract(ops.sum(ct), ops.sum(ct_x))
    return ct_x, ct_v


@concatenate_p.def_vjp
def _concat_vjp(ct, *xs, out, dimension):
    cts, start = [], 0
    for x in xs:
        n = _aval(x).shape[dimension]
        cts.append(ops.slice_axis(ct, dimension, start, as_dim(start + n)))
        start = as_dim(start + n)
    return tuple(cts)


@gather_p.def_vjp
def _gather_vjp(ct, x, idx, *, out, axis):
    zeros = ops.zeros_like(x)
    return scatter_add_p.bind(zeros, idx, ct, axis=axis), None


@scatter_add_p.def_vjp
def _scatter_add_vjp(ct, x, idx, updates, *, out, axis):
    return ct, None, gather_p.bind(ct, idx, axis=axis)


@dynamic_slice_p.def_vjp
def _dynamic_slice_vjp(ct, x, *idx, out, slice_sizes):
    return (dynamic_update_slice_p.bind(ops.zeros_like(x), ct, *idx),) + (None,) * len(idx)


@dynamic_update_slice_p.def_vjp
def _dynamic_update_slice_vjp(ct, x, update, *idx, out):
    sizes = _aval(update).shape
    ct_x = dynamic_update_slice_p.bind(ct, ops.zeros_like(update), *idx)
    ct_u = dynamic_slice_p.bind(ct, *idx, slice_sizes=tuple(sizes))
    return (ct_x, ct_u) + (None,) * len(idx)

