"""`tgx.numpy` wrappers over composite primitives: each promotes like jax.numpy and binds one
composite that stays whole in the traced graph (`tgx.decompose` expands it). Binders that
decompositions also use (`absolute`, `square`, `mean`) sit beside their primitives and are
re-exported here."""

from __future__ import annotations

import numpy as np

from .. import primitives as P
from ..primitives.math import absolute, square  # noqa: F401 - tnp.square is math.square
from ..primitives.ops import (
    _arg_reduce,
    _as_operand,
    _aval,
    _float_args,
    _promoted,
    _unary_float,
    _unary_op,
    add,
    astype,
    equal,
    exp,
    maximum,
    negative,
    ravel,
    reshape,
    subtract,
    where,
    zeros_like,
)
from ..primitives.reduce_composite import mean  # noqa: F401 - tnp.mean is the binder
from ..shapes import (
    DEFAULT_FLOAT,
    DEFAULT_INT,
    bool_,
    canonicalize_axes,
    canonicalize_axis,
    int32,
    is_float,
    is_int,
)

# ---------------------------------------------------------------------------------------------
# Elementwise


def remainder(x, y):
    """x mod y with the sign of y (Python/NumPy semantics); composite `mod`."""
    (x, y), dtype, _ = _promoted(x, y)
    return P.mod_p.bind(_as_operand(x), _as_operand(y))


mod = remainder
abs = absolute  # noqa: A001


def reciprocal(x):
    """1 / x (composite `reciprocal`); integers become the default float."""
    return _unary_float(P.reciprocal_p, _as_operand(x))


def clip(x, a_min=None, a_max=None):
    """min(max(x, a_min), a_max) (composite `clip`); a missing bound is not applied."""
    if a_min is None and a_max is None:
        return x
    dtype = _aval(x).dtype
    lo = a_min if a_min is not None else _bound(dtype, False)
    hi = a_max if a_max is not None else _bound(dtype, True)
    (x, lo, hi), _, _ = _promoted(x, lo, hi)
    return P.clip_p.bind(*[_as_operand(v) for v in (x, lo, hi)])


def _bound(dtype, upper: bool):
    if is_float(dtype):
        return np.asarray(np.inf if upper else -np.inf, dtype)
    info = np.iinfo(dtype)
    return np.asarray(info.max if upper else info.min, dtype)


# ---------------------------------------------------------------------------------------------
# Composite math (tgx/primitives/math.py)


tanh = _unary_op(P.tanh_p, "Hyperbolic tangent, overflow-free: expm1(-2|x|) inside.")
log1p = _unary_op(P.log1p_p, "log(1 + x), accurate for tiny x (Kahan's trick).")
expm1 = _unary_op(P.expm1_p, "exp(x) - 1, accurate for tiny x.")
tan = _unary_op(P.tan_p, "Tangent: sin / cos.")
arcsin = _unary_op(P.arcsin_p, "Inverse sine (NaN outside [-1, 1]).")
arccos = _unary_op(P.arccos_p, "Inverse cosine (NaN outside [-1, 1]).")
sinh = _unary_op(P.sinh_p, "Hyperbolic sine.")
cosh = _unary_op(P.cosh_p, "Hyperbolic cosine.")
arcsinh = _unary_op(P.arcsinh_p, "Inverse hyperbolic sine.")
arccosh = _unary_op(P.arccosh_p, "Inverse hyperbolic cosine (NaN below 1).")
arctanh = _unary_op(P.arctanh_p, "Inverse hyperbolic tangent (NaN outside [-1, 1]).")
rsqrt = _unary_op(P.rsqrt_p, "1 / sqrt(x), as jax.lax.rsqrt.")
erfinv = _unary_op(P.erfinv_p, "Inverse error function (single-precision accuracy in "
                                      "the decomposition).")
asin, acos, asinh, acosh, atanh = arcsin, arccos, arcsinh, arccosh, arctanh


def sign(x):
    """-1, 0 or 1 by the sign of x (NaN stays NaN); integers stay integers."""
    if _aval(x).dtype == bool_:
        return x
    return P.sign_p.bind(_as_operand(x))


def ceil(x):
    """Smallest integer >= x; integers pass through."""
    return x if is_int(_aval(x).dtype) else _unary_float(P.ceil_p, _as_operand(x))


def arctan2(y, x):
    """Angle of the point (x, y) in (-pi, pi], elementwise with broadcasting."""
    y, x = _float_args(y, x)
    return P.arctan2_p.bind(_as_operand(y), _as_operand(x))


atan2 = arctan2


def logaddexp(x, y):
    """log(exp(x) + exp(y)) without overflow: max + log1p(exp(-|x - y|))."""
    x, y = _float_args(x, y)
    m = maximum(x, y)
    d = subtract(x, y)
    # x == y == ±inf gives d = NaN; the max is then the answer.
    safe = where(equal(x, y), zeros_like(d), d)
    return add(m, log1p(exp(negative(absolute(safe)))))


# ---------------------------------------------------------------------------------------------
# Composite reductions (tgx/primitives/reduce_composite.py)


def argmin(x, axis=None, keepdims=False):
    """Index of the first minimum (flattened when `axis` is None), as int64 (composite)."""
    return _arg_reduce(P.argmin_p, x, axis, keepdims)


def _moment(prim, x, axis, dtype, ddof, keepdims, correction):
    if correction is not None:
        ddof = correction
    a = _aval(x)
    if dtype is not None:
        x = astype(x, dtype)
    elif not is_float(a.dtype):
        x = astype(x, DEFAULT_FLOAT)
    axes = canonicalize_axes(axis, a.ndim, prim.name)
    out = prim.bind(_as_operand(x), axes=axes, ddof=int(ddof))
    if keepdims:
        out = reshape(out, tuple(1 if i in axes else d for i, d in enumerate(a.shape)))
    return out


def var(x, axis=None, dtype=None, ddof=0, keepdims=False, *, correction=None):
    """Variance over `axis` with `ddof` (or torch/array-API `correction`) degrees of freedom.

    >>> float(var(np.array([1.0, 2.0, 3.0, 4.0]), ddof=1))
    1.6666666666666667
    """
    return _moment(P.var_p, x, axis, dtype, ddof, keepdims, correction)


def std(x, axis=None, dtype=None, ddof=0, keepdims=False, *, correction=None):
    """Standard deviation: sqrt(var(...))."""
    return _moment(P.std_p, x, axis, dtype, ddof, keepdims, correction)


# ---------------------------------------------------------------------------------------------
# Cumulative sum (tgx/primitives/tensor.py)


def cumsum(x, axis=None, dtype=None):
    """Inclusive cumulative sum (flattened when `axis` is None); bool and int32 accumulate as
    the default int, like `sum`.

    >>> cumsum(np.array([1, 2, 3]))
    array([1, 3, 6])
    """
    a = _aval(x)
    if axis is None:
        x = ravel(x)
        axis = 0
    if dtype is not None:
        x = astype(x, dtype)
    elif a.dtype == bool_ or a.dtype == int32:
        x = astype(x, DEFAULT_INT)
    axis = canonicalize_axis(axis, _aval(x).ndim, "cumsum")
    return P.cumsum_p.bind(_as_operand(x), axis=axis, reverse=False)
