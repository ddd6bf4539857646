"""Reductions of `tgx.numpy` beyond the ones in `tgx.primitives.ops` (sum, max, min, argmax);
the composite ones (mean, var, std, argmin) are in `composite.py`."""

from __future__ import annotations

import numpy as np

from .. import primitives as P
from ..primitives.ops import (
    _as_operand,
    _aval,
    _reduce,
    astype,
    expand_dims,
    iota,
    less_equal,
    max,
    min,
    moveaxis,
    multiply,
    reshape,
    where,
)
from ..shapes import DEFAULT_INT, bool_, canonicalize_axis, int32, int64


def prod(x, axis=None, dtype=None, keepdims=False):
    a = _aval(x)
    if dtype is not None:
        x = astype(x, dtype)
    elif a.dtype == bool_:
        x = astype(x, DEFAULT_INT)
    return _reduce(P.reduce_prod_p, x, axis, keepdims)


def any(x, axis=None, keepdims=False):  # noqa: A001
    return _reduce(P.reduce_max_p, astype(x, bool_), axis, keepdims)


def all(x, axis=None, keepdims=False):  # noqa: A001
    return _reduce(P.reduce_min_p, astype(x, bool_), axis, keepdims)


amax, amin = max, min


def cumprod(x, axis=None, dtype=None):
    """Inclusive cumulative product (flattened when `axis` is None); bool and int32
    accumulate as the default int, like `cumsum`. No primitive of its own: along a concrete
    axis of length n, log2(n) steps that each multiply by the array shifted by 1, 2, 4, …
    (Hillis–Steele, O(n log n)); along a symbolic axis, a product under a triangular mask
    (O(n²), as `cumsum`).

    >>> cumprod(np.array([1, 2, 3, 4]))
    array([ 1,  2,  6, 24])
    """
    a = _aval(x)
    if axis is None:
        x = reshape(x, (-1,))
        axis = 0
    if dtype is not None:
        x = astype(x, dtype)
    elif a.dtype == bool_ or a.dtype == int32:
        x = astype(x, DEFAULT_INT)
    x = _as_operand(x)
    xa = _aval(x)
    axis = canonicalize_axis(axis, xa.ndim, "cumprod")
    n = xa.shape[axis]
    one = np.ones((), xa.dtype)
    if type(n) is int:
        shift = 1
        while shift < n:
            config = tuple((shift, -shift, 0) if i == axis else (0, 0, 0)
                           for i in range(xa.ndim))
            x = multiply(x, P.pad_p.bind(x, one, padding_config=config))
            shift *= 2
        return x
    x = moveaxis(x, axis, -1)
    upto = less_equal(iota(int64, (n, n), 1), iota(int64, (n, n), 0))      # [i, j]: j <= i
    masked = where(upto, expand_dims(x, -2), one)
    return moveaxis(_reduce(P.reduce_prod_p, masked, -1, False), -1, axis)
