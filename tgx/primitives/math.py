"""Elementwise composite math: each op stays whole in the traced graph and decomposes into the
atomic set (exp, log, sqrt, atan, floor, select, …) with numerically stable formulas.

Decompositions are written with the lax-level binders of `tgx.primitives.ops` and call the
composites of this file through their primitives, so a decomposition cannot recurse into
itself. `absolute` and `square` bind their composites for other families' decompositions
(and are `tnp.absolute` / `tnp.square`).
"""

from __future__ import annotations

import numpy as np

from ..core import Primitive
from ..errors import DTypeError
from ..shapes import ShapedArray, bool_, broadcast_shapes, finfo
from . import ops
from .derivatives import unbroadcast, zero_scalar
from .elementwise import _check_kind, _lowp, div_p, special


def composite_unop(name: str, numpy_fn, kind: str = "float", family: str = "math") -> Primitive:
    """An elementwise unary composite: shape rule, NumPy reference; the caller adds the
    decomposition with `@p.def_decomposition`."""
    p = Primitive(name, elementwise=True, family=family)

    @p.def_shape
    def _shape(x: ShapedArray, **params) -> ShapedArray:
        _check_kind(name, x.dtype, kind)
        return x

    p.def_impl(_lowp(numpy_fn))
    return p


def composite_naryop(name: str, numpy_fn, n: int, kind: str = "num",
                     family: str = "math") -> Primitive:
    """An elementwise n-ary composite with NumPy broadcasting (operands of one dtype)."""
    p = Primitive(name, elementwise=True, family=family)

    @p.def_shape
    def _shape(*xs: ShapedArray, **params) -> ShapedArray:
        if len(xs) != n or len({x.dtype for x in xs}) != 1:
            raise DTypeError(f"{name} requires {n} operands of the same dtype, got "
                             f"{', '.join(x.str_short() for x in xs)}")
        _check_kind(name, xs[0].dtype, kind)
        shape = broadcast_shapes(*[x.shape for x in xs], op=name)
        return ShapedArray(shape, xs[0].dtype, all(x.weak_type for x in xs))

    p.def_impl(_lowp(numpy_fn))
    return p


def _big(x) -> float:
    """1/sqrt(eps) of x's dtype: above it x*x + 1 == x*x and log(2x) is exact enough."""
    return float(1.0 / np.sqrt(finfo(ops._aval(x).dtype).eps))


# ---------------------------------------------------------------------------------------------
# abs, sign, square, reciprocal, rsqrt, ceil


abs_p = composite_unop("abs", np.abs, "num")


def absolute(x):
    """|x| (composite `abs`); bool passes through.

    >>> absolute(np.array([-2, 3]))
    array([2, 3])
    """
    if ops._aval(x).dtype == bool_:
        return x
    return abs_p.bind(ops._as_operand(x))


@abs_p.def_decomposition
def _abs_decomp(x):
    return ops.where(ops.less(x, 0), ops.negative(x), x)


sign_p = composite_unop("sign", np.sign, "num")


@sign_p.def_decomposition
def _sign_decomp(x):
    # zero and NaN pass through unchanged, as np.sign / torch.sign.
    one = ops.ones_like(x)
    return ops.where(ops.greater(x, 0), one, ops.where(ops.less(x, 0), ops.negative(one), x))


square_p = composite_unop("square", np.square, "num")


def square(x):
    """x * x (composite `square`).

    >>> square(np.array([3, -2]))
    array([9, 4])
    """
    return square_p.bind(ops._as_operand(x))


@square_p.def_decomposition
def _square_decomp(x):
    return ops.multiply(x, x)


reciprocal_p = composite_unop("reciprocal", np.reciprocal)


@reciprocal_p.def_decomposition
def _reciprocal_decomp(x):
    return ops.divide(1, x)


rsqrt_p = composite_unop("rsqrt", lambda x: 1 / np.sqrt(x))


@rsqrt_p.def_decomposition
def _rsqrt_decomp(x):
    return ops.divide(1, ops.sqrt(x))


ceil_p = composite_unop("ceil", np.ceil)


@ceil_p.def_decomposition
def _ceil_decomp(x):
    return ops.negative(ops.floor(ops.negative(x)))


# ---------------------------------------------------------------------------------------------
# exponentials and logarithms


log1p_p = composite_unop("log1p", np.log1p)


@log1p_p.def_decomposition
def _log1p_decomp(x):
    # Kahan: u = 1 + x rounds, and log(u) * x / (u - 1) cancels the rounding error.
    u = ops.add(x, 1)
    d = ops.subtract(u, 1)
    exact = ops.equal(d, 0)
    safe_d = ops.where(exact, ops.ones_like(d), d)
    return ops.where(exact, x, ops.multiply(ops.log(u), ops.divide(x, safe_d)))


expm1_p = composite_unop("expm1", np.expm1)


@expm1_p.def_decomposition
def _expm1_decomp(x):
    # |x| < 0.5: Kahan's (u - 1) * x / log(u); elsewhere exp(x) - 1 has no cancellation.
    small = ops.less(ops.maximum(x, ops.negative(x)), 0.5)
    xs = ops.where(small, x, ops.zeros_like(x))
    u = ops.exp(xs)
    lu = ops.log(u)
    exact = ops.equal(lu, 0)
    kahan = ops.where(exact, xs, ops.multiply(ops.subtract(u, 1),
                                              ops.divide(xs, ops.where(exact, ops.ones_like(lu),
                                                                       lu))))
    return ops.where(small, kahan, ops.subtract(ops.exp(x), 1))


# ---------------------------------------------------------------------------------------------
# trigonometric and hyperbolic


tan_p = composite_unop("tan", np.tan)


@tan_p.def_decomposition
def _tan_decomp(x):
    return ops.divide(ops.sin(x), ops.cos(x))


arctan2_p = composite_naryop("arctan2", np.arctan2, 2, "float")


@arctan2_p.def_decomposition
def _arctan2_decomp(y, x):
    # atan(y / x) corrected by ±pi in the left half-plane; x == 0 gives ±pi/2 (or y when y == 0).
    y, x = ops.broadcast_arrays(y, x)
    zero_x = ops.equal(x, 0)
    r = ops.arctan(ops.divide(y, ops.where(zero_x, ops.ones_like(x), x)))
    left = ops.where(ops.less(y, 0), ops.subtract(r, np.pi), ops.add(r, np.pi))
    r = ops.where(ops.less(x, 0), left, r)
    half = ops.full_like(y, np.pi / 2)
    on_axis = ops.where(ops.greater(y, 0), half, ops.where(ops.less(y, 0), ops.negative(half), y))
    return ops.where(zero_x, on_axis, r)


arcsin_p = composite_unop("arcsin", np.arcsin)


@arcsin_p.def_decomposition
def _arcsin_decomp(x):
    c = ops.sqrt(ops.multiply(ops.subtract(1, x), ops.add(1, x)))
    return arctan2_p.bind(x, c)


arccos_p = composite_unop("arccos", np.arccos)


@arccos_p.def_decomposition
def _arccos_decomp(x):
    return ops.multiply(2, arctan2_p.bind(ops.sqrt(ops.subtract(1, x)), ops.sqrt(ops.add(1, x))))


sinh_p = composite_unop("sinh", np.sinh)


@sinh_p.def_decomposition
def _sinh_decomp(x):
    # expm1 keeps small |x| accurate: (e^x - 1) - (e^-x - 1).
    return ops.multiply(ops.subtract(expm1_p.bind(x), expm1_p.bind(ops.negative(x))), 0.5)


cosh_p = composite_unop("cosh", np.cosh)


@cosh_p.def_decomposition
def _cosh_decomp(x):
    # t = e^|x| / 2 overflows only where cosh itself does.
    t = ops.exp(ops.subtract(abs_p.bind(x), float(np.log(2.0))))
    return ops.add(t, ops.divide(0.25, t))


tanh_p = composite_unop("tanh", np.tanh)


@tanh_p.def_decomposition
def _tanh_decomp(x):
    # tanh|x| = -m / (2 + m) with m = expm1(-2|x|) in [-1, 0]: no overflow, exact near 0.
    m = expm1_p.bind(ops.multiply(abs_p.bind(x), -2))
    t = ops.divide(ops.negative(m), ops.add(m, 2))
    return ops.where(ops.less(x, 0), ops.negative(t), t)


arcsinh_p = composite_unop("arcsinh", np.arcsinh)


@arcsinh_p.def_decomposition
def _arcsinh_decomp(x):
    # asinh|x| = log1p(a + a^2 / (1 + sqrt(1 + a^2))), or log(2a) where a^2 would overflow.
    a = abs_p.bind(x)
    big = ops.greater(a, _big(x))
    s = ops.where(big, ops.ones_like(a), a)
    s2 = ops.multiply(s, s)
    small_r = log1p_p.bind(ops.add(s, ops.divide(s2, ops.add(1, ops.sqrt(ops.add(1, s2))))))
    r = ops.where(big, ops.add(ops.log(ops.where(big, a, ops.ones_like(a))), float(np.log(2.0))),
                  small_r)
    return ops.where(ops.less(x, 0), ops.negative(r), r)


arccosh_p = composite_unop("arccosh", np.arccosh)


@arccosh_p.def_decomposition
def _arccosh_decomp(x):
    # acosh x = log1p(t + sqrt(t (t + 2))) with t = x - 1 (exact near 1); log(2x) when huge.
    big = ops.greater(x, _big(x))
    t = ops.subtract(ops.where(big, ops.ones_like(x), x), 1)
    small_r = log1p_p.bind(ops.add(t, ops.sqrt(ops.multiply(t, ops.add(t, 2)))))
    big_r = ops.add(ops.log(ops.where(big, x, ops.ones_like(x))), float(np.log(2.0)))
    return ops.where(big, big_r, small_r)


arctanh_p = composite_unop("arctanh", np.arctanh)


@arctanh_p.def_decomposition
def _arctanh_decomp(x):
    return ops.multiply(log1p_p.bind(ops.divide(ops.multiply(x, 2), ops.subtract(1, x))), 0.5)


# ---------------------------------------------------------------------------------------------
# erfinv (used by the normal and truncated-normal samplers)


erfinv_p = composite_unop("erfinv", lambda x: special().erfinv(x))

# Giles, "Approximating the erfinv function" (GPU Computing Gems, 2011), single precision.
_ERFINV_CENTRAL = (2.81022636e-08, 3.43273939e-07, -3.5233877e-06, -4.39150654e-06,
                   0.00021858087, -0.00125372503, -0.00417768164, 0.246640727, 1.50140941)
_ERFINV_TAIL = (-0.000200214257, 0.000100950558, 0.00134934322, -0.00367342844,
                0.00573950773, -0.0076224613, 0.00943887047, 1.00167406, 2.83297682)


@erfinv_p.def_decomposition
def _erfinv_decomp(x):
    w = ops.negative(log1p_p.bind(ops.negative(ops.multiply(x, x))))
    central = ops.less(w, 5.0)
    wc = ops.subtract(ops.where(central, w, ops.full_like(w, 5.0)), 2.5)
    wt = ops.subtract(ops.sqrt(ops.where(central, ops.full_like(w, 5.0), w)), 3.0)

    def horner(coeffs, t):
        p = ops.full_like(t, coeffs[0])
        for c in coeffs[1:]:
            p = ops.add(ops.multiply(p, t), c)
        return p

    p = ops.where(central, horner(_ERFINV_CENTRAL, wc), horner(_ERFINV_TAIL, wt))
    return ops.multiply(p, x)


# ---------------------------------------------------------------------------------------------
# mod and clip


def _mod_ref(x, y):
    return np.remainder(x, y)


mod_p = composite_naryop("mod", _mod_ref, 2, "num")


@mod_p.def_decomposition
def _mod_decomp(x, y):
    # Sign of the divisor (Python / NumPy / torch.remainder).
    dtype = ops._aval(x).dtype
    if dtype.kind == "f" or str(dtype) == "bfloat16":
        return ops.subtract(x, ops.multiply(ops.floor(ops.divide(x, y)), y))
    q = div_p.bind(x, y)  # truncates toward zero
    r = ops.subtract(x, ops.multiply(q, y))
    adjust = ops.logical_and(ops.not_equal(r, 0), ops.not_equal(ops.less(r, 0), ops.less(y, 0)))
    return ops.where(adjust, ops.add(r, y), r)


clip_p = composite_naryop("clip", lambda x, lo, hi: np.minimum(np.maximum(x, lo), hi), 3, "num")


@clip_p.def_decomposition
def _clip_decomp(x, lo, hi):
    return ops.minimum(ops.maximum(x, lo), hi)


# ---------------------------------------------------------------------------------------------
# Derivatives: closed forms, exact where the decompositions approximate (erfinv), defined where
# they divide by zero (arcsin at ±1 gives ±inf as torch), and torch's choices at kinks
# (|x|' = sign(x), so 0 at 0; clip passes the gradient at its bounds to x).


def _recip_sqrt(v):
    return ops.divide(1.0, ops.sqrt(v))


abs_p.def_vjp(lambda ct, x, *, out: (ops.multiply(ct, sign_p.bind(x)),))
sign_p.def_vjp(lambda ct, x, *, out: (None,))
ceil_p.def_vjp(lambda ct, x, *, out: (None,))
square_p.def_vjp(lambda ct, x, *, out: (ops.multiply(ct, ops.multiply(x, 2.0)),))
reciprocal_p.def_vjp(lambda ct, x, *, out: (ops.negative(ops.multiply(ct, ops.multiply(out,
                                                                                       out))),))
rsqrt_p.def_vjp(lambda ct, x, *, out: (ops.multiply(ct, ops.divide(ops.multiply(out, -0.5), x)),))
log1p_p.def_vjp(lambda ct, x, *, out: (ops.divide(ct, ops.add(x, 1.0)),))
expm1_p.def_vjp(lambda ct, x, *, out: (ops.multiply(ct, ops.add(out, 1.0)),))
tan_p.def_vjp(lambda ct, x, *, out: (ops.multiply(ct, ops.add(ops.multiply(out, out), 1.0)),))
# (1 - t)(1 + t), not 1 - t²: exact where tanh saturates (as JAX)
tanh_p.def_vjp(lambda ct, x, *, out: (ops.multiply(ct, ops.multiply(ops.subtract(1.0, out),
                                                                    ops.add(out, 1.0))),))
sinh_p.def_vjp(lambda ct, x, *, out: (ops.multiply(ct, cosh_p.bind(x)),))
cosh_p.def_vjp(lambda ct, x, *, out: (ops.multiply(ct, sinh_p.bind(x)),))
arcsin_p.def_vjp(lambda ct, x, *, out: (ops.multiply(ct, _recip_sqrt(
    ops.multiply(ops.subtract(1.0, x), ops.add(x, 1.0)))),))
arccos_p.def_vjp(lambda ct, x, *, out: (ops.negative(ops.multiply(ct, _recip_sqrt(
    ops.multiply(ops.subtract(1.0, x), ops.add(x, 1.0))))),))
arcsinh_p.def_vjp(lambda ct, x, *, out: (ops.multiply(ct, _recip_sqrt(
    ops.add(ops.multiply(x, x), 1.0))),))
arccosh_p.def_vjp(lambda ct, x, *, out: (ops.multiply(ct, _recip_sqrt(
    ops.multiply(ops.subtract(x, 1.0), ops.add(x, 1.0)))),))
arctanh_p.def_vjp(lambda ct, x, *, out: (ops.divide(ct, ops.multiply(ops.subtract(1.0, x),
                                                                     ops.add(x, 1.0))),))
erfinv_p.def_vjp(lambda ct, x, *, out: (ops.multiply(ct, ops.multiply(
    ops.exp(ops.multiply(out, out)), float(np.sqrt(np.pi) / 2))),))


@arctan2_p.def_vjp
def _arctan2_vjp(ct, y, x, *, out):
    r2 = ops.add(ops.multiply(x, x), ops.multiply(y, y))
    return (unbroadcast(ops.divide(ops.multiply(ct, x), r2), y),
            unbroadcast(ops.negative(ops.divide(ops.multiply(ct, y), r2)), x))


@clip_p.def_vjp
def _clip_vjp(ct, x, lo, hi, *, out):
    zero = zero_scalar(ct)
    below, above = ops.less(x, lo), ops.greater(x, hi)
    inside = ops.logical_not(ops.logical_or(below, above))
    return (unbroadcast(ops.where(inside, ct, zero), x),
            unbroadcast(ops.where(ops.logical_and(below, ops.less_equal(lo, hi)), ct, zero), lo),
            unbroadcast(ops.where(ops.logical_or(above, ops.greater(lo, hi)), ct, zero), hi))


MATH = [abs_p, sign_p, square_p, reciprocal_p, rsqrt_p, ceil_p, log1p_p, expm1_p, tan_p,
        arctan2_p, arcsin_p, arccos_p, sinh_p, cosh_p, tanh_p, arcsinh_p, arccosh_p, arctanh_p,
        erfinv_p, mod_p, clip_p]
