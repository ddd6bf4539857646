"""Elementwise ops of `tgx.numpy` built from several atomic primitives (the one-primitive
binders are in `tgx.primitives.ops`; composites in `composite.py`)."""

from __future__ import annotations

import numpy as np

from .. import primitives as P
from ..primitives.math import absolute
from ..primitives.ops import (
    _as_operand,
    _aval,
    _cast,
    _float_args,
    _is_array,
    _promoted,
    _unary_float,
    astype,
    divide,
    equal,
    full,
    log,
    logical_or,
    multiply,
    less,
    not_equal,
    ones_like,
    upcast_half,
)
from ..shapes import bool_, is_float, is_int


def floor_divide(x, y):
    (x, y), dtype, _ = _promoted(x, y)
    if is_float(dtype):
        return P.floor_p.bind(P.div_p.bind(x, y))
    q = P.div_p.bind(x, y)  # truncates toward zero
    r = P.sub_p.bind(x, P.mul_p.bind(q, y))
    adjust = _round_toward_neg_inf_mask(r, y, dtype)
    return P.sub_p.bind(q, P.convert_element_type_p.bind(adjust, new_dtype=dtype))


def _round_toward_neg_inf_mask(r, y, dtype):
    zero = _cast(0, dtype)
    nonzero = P.ne_p.bind(r, zero)
    signs_differ = P.ne_p.bind(P.lt_p.bind(r, zero), P.lt_p.bind(y, zero))
    return P.and_p.bind(nonzero, signs_differ)


def power(x, y):
    """x ** y; a small non-negative integer exponent becomes multiplications (exact, fast)."""
    if isinstance(y, int) and not isinstance(y, bool) and 0 <= y <= 4 and _is_array(x):
        if y == 0:
            return ones_like(x)
        out = x
        for _ in range(y - 1):
            out = multiply(out, x)
        return out
    x, y = _float_args(x, y)
    return P.pow_p.bind(x, y)


def positive(x):
    return x


def round(x, decimals: int = 0):  # noqa: A001 - NumPy's name
    if is_int(_aval(x).dtype):
        return x
    if decimals:
        scale = 10.0 ** decimals
        return divide(_unary_float(P.round_p, multiply(x, scale)), scale)
    return _unary_float(P.round_p, x)


around = round


# ---------------------------------------------------------------------------------------------
# Floating-point classes: integers and bools are never NaN or infinite


def isnan(x):
    """True where `x` is NaN (`x != x`).

    >>> isnan(np.array([1.0, np.nan], np.float32))
    array([False,  True])
    """
    x = _as_operand(x)
    if not is_float(_aval(x).dtype):
        return full(_aval(x).shape, False, bool_)
    return not_equal(x, x)


def isinf(x):
    """True where `x` is +inf or -inf."""
    x = _as_operand(x)
    if not is_float(_aval(x).dtype):
        return full(_aval(x).shape, False, bool_)
    return logical_or(equal(x, np.inf), equal(x, -np.inf))


def isfinite(x):
    """True where `x` is neither NaN nor infinite: `|x| < inf` (false for NaN)."""
    x = _as_operand(x)
    if not is_float(_aval(x).dtype):
        return full(_aval(x).shape, True, bool_)
    return less(absolute(x), np.inf)


# ---------------------------------------------------------------------------------------------
# Logarithms and powers of other bases (as jax.numpy: one natural log or power, then a scale)


def _in_float(fn, x):
    """`fn(x)` with `x` floating; half precision is computed in float32 and rounded once, as
    NumPy's half kernels do."""
    (x,) = _float_args(_as_operand(x))
    dtype = _aval(x).dtype
    return astype(fn(upcast_half(x)), dtype)


def log2(x):
    """Base-2 logarithm: log(x) / log(2)."""
    return _in_float(lambda v: divide(log(v), np.log(2.0)), x)


def log10(x):
    """Base-10 logarithm: log(x) / log(10)."""
    return _in_float(lambda v: divide(log(v), np.log(10.0)), x)


def exp2(x):
    """2 ** x (the atomic `pow`, exact at integer x)."""
    return _in_float(lambda v: P.pow_p.bind(_cast(2, _aval(v).dtype), v), x)
