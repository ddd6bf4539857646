"""Composite reductions: mean, var, std (over a tuple of axes, which are removed; `keepdims` is
a reshape in `tgx.numpy`) and argmin. The element count may be symbolic (`dim_as_value`)."""

from __future__ import annotations

import numpy as np

from ..core import Primitive
from ..errors import DTypeError
from ..shapes import ShapedArray, as_dim, is_float
from .elementwise import _lowp
from .reductions import _check_axes


def _tnp():
    from .. import numpy as tnp

    return tnp


def _count(x, axes, minus=0):
    tnp = _tnp()
    n = 1
    for a in axes:
        n = n * tnp._aval(x).shape[a]
    n = n - minus
    n = n if isinstance(n, int) else as_dim(n)
    return tnp._shape_value(n, tnp._aval(x).dtype)


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


@mean_p.def_decomposition
def _mean_decomp(x, *, axes):
    tnp = _tnp()
    return tnp.divide(tnp.sum(x, axis=axes), _count(x, axes))


var_p = _float_reduction("var", np.var)


def _var(x, axes, ddof):
    tnp = _tnp()
    d = tnp.subtract(x, tnp.reshape(mean_p.bind(x, axes=axes), tuple(
        1 if i in axes else s for i, s in enumerate(tnp._aval(x).shape))))
    return tnp.divide(tnp.sum(tnp.multiply(d, d), axis=axes), _count(x, axes, ddof))


@var_p.def_decomposition
def _var_decomp(x, *, axes, ddof):
    return _var(x, axes, ddof)


std_p = _float_reduction("std", np.std)


@std_p.def_decomposition
def _std_decomp(x, *, axes, ddof):
    return _tnp().sqrt(var_p.bind(x, axes=axes, ddof=ddof))


# argmin(x, axis, index_dtype): first index of the minimum (NaN counts as the minimum).
argmin_p = Primitive("argmin", family="reduction")


@argmin_p.def_shape
def _argmin_shape(x: ShapedArray, *, axis: int, index_dtype) -> ShapedArray:
    from .reductions import argmax_p

    return argmax_p.shape_rule(x, axis=axis, index_dtype=index_dtype)


@argmin_p.def_impl
def _argmin_impl(x, *, axis, index_dtype):
    return np.asarray(np.argmin(x, axis=axis)).astype(index_dtype)


@argmin_p.def_decomposition
def _argmin_decomp(x, *, axis, index_dtype):
    # Reverse the order without overflow: -x for floats (NaN stays NaN, the maximum for
    # argmax), ~x for integers (~x = -x - 1, also for unsigned), not for bool.
    from .elementwise import neg_p, not_p
    from .reductions import argmax_p

    dtype = _tnp()._aval(x).dtype
    flipped = neg_p.bind(x) if is_float(dtype) else not_p.bind(x)
    return argmax_p.bind(flipped, axis=axis, index_dtype=index_dtype)


REDUCE_COMPOSITE = [mean_p, var_p, std_p, argmin_p]
