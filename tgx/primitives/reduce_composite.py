"""Composite reductions: mean, var, std (over a tuple of axes, which are removed; `keepdims` is
a reshape in the binders) and argmin. The element count may be symbolic (`dim_as_value`).

`mean` binds `mean_p` with NumPy's signature for other families' decompositions (and is
`tnp.mean`)."""

from __future__ import annotations

import numpy as np

from ..core import Primitive
from ..errors import DTypeError
from ..shapes import DEFAULT_FLOAT, ShapedArray, as_dim, is_float
from . import ops
from .elementwise import _lowp, neg_p, not_p
from .reductions import _check_axes, argmax_p


def _count(x, axes, minus=0):
    n = 1
    for a in axes:
        n = n * ops._aval(x).shape[a]
    n = n - minus
    n = n if isinstance(n, int) else as_dim(n)
    return ops._shape_value(n, ops._aval(x).dtype)


def _float_reduction(name: str, ref) -> Primitive:
    p = Primitive(name, family="reduction")

    @p.def_shape
    def _shape(x: ShapedArray, *, axes: tuple, **params) -> ShapedArray:
        _check_axes(name, x, axes)
        if not is_float(x.dtype):
            raise DTypeError(f"{name} needs a floating operand, got {x.str_short()}")
        return ShapedArray(tuple(d for i, d in enumerate(x.shape) if i not in axes), x.dtype)

    def impl(x, *, axes, **params):
        return np.asarray(ref(x, axis=axes, **params))

    p.def_impl(_lowp(impl))
    return p


mean_p = _float_reduction("mean", np.mean)


def mean(x, axis=None, dtype=None, keepdims=False):
    """Arithmetic mean (composite `mean`); the count may be symbolic (`dim_as_value`).

    >>> mean(np.array([1, 2, 3, 4]), keepdims=True)
    array([2.5], dtype=float32)
    """
    a = ops._aval(x)
    if dtype is not None:
        x = ops.astype(x, dtype)
    elif not is_float(a.dtype):
        x = ops.astype(x, DEFAULT_FLOAT)
    return ops._reduce(mean_p, ops._as_operand(x), axis, keepdims)


@mean_p.def_decomposition
def _mean_decomp(x, *, axes):
    return ops.divide(ops.sum(x, axis=axes), _count(x, axes))


var_p = _float_reduction("var", np.var)


def _var(x, axes, ddof):
    d = ops.subtract(x, ops.reshape(mean_p.bind(x, axes=axes), tuple(
        1 if i in axes else s for i, s in enumerate(ops._aval(x).shape))))
    return ops.divide(ops.sum(ops.multiply(d, d), axis=axes), _count(x, axes, ddof))


@var_p.def_decomposition
def _var_decomp(x, *, axes, ddof):
    return _var(x, axes, ddof)


@var_p.def_vjp
def _var_vjp(ct, x, *, out, axes, ddof):
    # 2 (x - mean) / (n - ddof): the path through the mean sums to zero and is left out (in
    # float32 its rounding error is not zero).
    shape = ops._aval(x).shape
    kept = tuple(1 if i in axes else s for i, s in enumerate(shape))
    d = ops.subtract(x, ops.reshape(mean_p.bind(x, axes=axes), kept))
    scale = ops.divide(ops.reshape(ct, kept), _count(x, axes, ddof))
    return (ops.multiply(ops.multiply(d, scale), 2.0),)


std_p = _float_reduction("std", np.std)


@std_p.def_decomposition
def _std_decomp(x, *, axes, ddof):
    return ops.sqrt(var_p.bind(x, axes=axes, ddof=ddof))


# argmin(x, axis, index_dtype): first index of the minimum (NaN counts as the minimum).
argmin_p = Primitive("argmin", family="reduction")


@argmin_p.def_shape
def _argmin_shape(x: ShapedArray, *, axis: int, index_dtype) -> ShapedArray:
    return argmax_p.shape_rule(x, axis=axis, index_dtype=index_dtype)


@argmin_p.def_impl
def _argmin_impl(x, *, axis, index_dtype):
    return np.asarray(np.argmin(x, axis=axis)).astype(index_dtype)


@argmin_p.def_decomposition
def _argmin_decomp(x, *, axis, index_dtype):
    # Reverse the order without overflow: -x for floats (NaN stays NaN, the maximum for
    # argmax), ~x for integers (~x = -x - 1, also for unsigned), not for bool.
    dtype = ops._aval(x).dtype
    flipped = neg_p.bind(x) if is_float(dtype) else not_p.bind(x)
    return argmax_p.bind(flipped, axis=axis, index_dtype=index_dtype)


REDUCE_COMPOSITE = [mean_p, var_p, std_p, argmin_p]
