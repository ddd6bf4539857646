"""Elementwise ops of `tgx.numpy` built from several atomic primitives (the one-primitive
binders are in `tgx.primitives.ops`; composites in `composite.py`)."""

from __future__ import annotations

from .. import primitives as P
from ..primitives.ops import (
    _aval,
    _cast,
    _float_args,
    _is_array,
    _promoted,
    _unary_float,
    divide,
    multiply,
    ones_like,
)
from ..shapes import is_float, is_int


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
