"""Reductions of `tgx.numpy` beyond the ones in `tgx.primitives.ops` (sum, max, min, argmax);
the composite ones (mean, var, std, argmin) are in `composite.py`."""

from __future__ import annotations

from .. import primitives as P
from ..primitives.ops import _aval, _reduce, astype, max, min
from ..shapes import DEFAULT_INT, bool_


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
