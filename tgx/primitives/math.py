"""Elementwise composite math: each op stays whole in the traced graph and decomposes into the
atomic set (exp, log, sqrt, atan, floor, select, …) with numerically stable formulas.

Decompositions are written with `tgx.numpy` (imported lazily: `tgx.numpy` imports this
package) and call the composites of this file through their primitives, never through the
`tnp` wrappers that bind them, so a decomposition cannot recurse into itself.
"""

from __future__ import annotations

import numpy as np
import scipy.special

from ..core import Primitive
from ..errors import DTypeError
from ..shapes import ShapedArray, broadcast_shapes, finfo
from .elementwise import _check_kind, _lowp


def _tnp():
    from .. import numpy as tnp

    return tnp


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
    def _shape(*xs: ShapedArray) -> ShapedArray:
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
    return float(1.0 / np.sqrt(finfo(_tnp()._aval(x).dtype).eps))


# ---------------------------------------------------------------------------------------------
# abs, sign, square, reciprocal, rsqrt, ceil


abs_p = composite_unop("abs", np.abs, "num")


@abs_p.def_decomposition
def _abs_decomp(x):
    tnp = _tnp()
    return tnp.where(tnp.less(x, 0), tnp.negative(x), x)


sign_p = composite_unop("sign", np.sign, "num")


@sign_p.def_decomposition
def _sign_decomp(x):
    # zero and NaN pass through unchanged, as np.sign / torch.sign.
    tnp = _tnp()
    one = tnp.ones_like(x)
    return tnp.where(tnp.greater(x, 0), one, tnp.where(tnp.less(x, 0), tnp.negative(one), x))


square_p = composite_unop("square", np.square, "num")


@square_p.def_decomposition
def _square_decomp(x):
    return _tnp().multiply(x, x)


reciprocal_p = composite_unop("reciprocal", np.reciprocal)


@reciprocal_p.def_decomposition
def _reciprocal_decomp(x):
    return _tnp().divide(1, x)


rsqrt_p = composite_unop("rsqrt", lambda x: 1 / np.sqrt(x))


@rsqrt_p.def_decomposition
def _rsqrt_decomp(x):
    tnp = _tnp()
    return tnp.divide(1, tnp.sqrt(x))


ceil_p = composite_unop("ceil", np.ceil)


@ceil_p.def_decomposition
def _ceil_decomp(x):
    tnp = _tnp()
    return tnp.negative(tnp.floor(tnp.negative(x)))


# ---------------------------------------------------------------------------------------------
# exponentials and logarithms


log1p_p = composite_unop("log1p", np.log1p)


@log1p_p.def_decomposition
def _log1p_decomp(x):
    # Kahan: u = 1 + x rounds, and log(u) * x / (u - 1) cancels the rounding error.
    tnp = _tnp()
    u = tnp.add(x, 1)
    d = tnp.subtract(u, 1)
    exact = tnp.equal(d, 0)
    safe_d = tnp.where(exact, tnp.ones_like(d), d)
    return tnp.where(exact, x, tnp.multiply(tnp.log(u), tnp.divide(x, safe_d)))


expm1_p = composite_unop("expm1", np.expm1)


@expm1_p.def_decomposition
def _expm1_decomp(x):
    # |x| < 0.5: Kahan's (u - 1) * x / log(u); elsewhere exp(x) - 1 has no cancellation.
    tnp = _tnp()
    small = tnp.less(tnp.maximum(x, tnp.negative(x)), 0.5)
    xs = tnp.where(small, x, tnp.zeros_like(x))
    u = tnp.exp(xs)
    lu = tnp.log(u)
    exact = tnp.equal(lu, 0)
    kahan = tnp.where(exact, xs, tnp.multiply(tnp.subtract(u, 1),
                                              tnp.divide(xs, tnp.where(exact, tnp.ones_like(lu),
                                                                       lu))))
    return tnp.where(small, kahan, tnp.subtract(tnp.exp(x), 1))


# ---------------------------------------------------------------------------------------------
# trigonometric and hyperbolic


tan_p = composite_unop("tan", np.tan)


@tan_p.def_decomposition
def _tan_decomp(x):
    tnp = _tnp()
    return tnp.divide(tnp.sin(x), tnp.cos(x))


arctan2_p = composite_naryop("arctan2", np.arctan2, 2, "float")


@arctan2_p.def_decomposition
def _arctan2_decomp(y, x):
    # atan(y / x) corrected by ±pi in the left half-plane; x == 0 gives ±pi/2 (or y when y == 0).
    tnp = _tnp()
    y, x = tnp.broadcast_arrays(y, x)
    zero_x = tnp.equal(x, 0)
    r = tnp.arctan(tnp.divide(y, tnp.where(zero_x, tnp.ones_like(x), x)))
    left = tnp.where(tnp.less(y, 0), tnp.subtract(r, np.pi), tnp.add(r, np.pi))
    r = tnp.where(tnp.less(x, 0), left, r)
    half = tnp.full_like(y, np.pi / 2)
    on_axis = tnp.where(tnp.greater(y, 0), half, tnp.where(tnp.less(y, 0), tnp.negative(half), y))
    return tnp.where(zero_x, on_axis, r)


arcsin_p = composite_unop("arcsin", np.arcsin)


@arcsin_p.def_decomposition
def _arcsin_decomp(x):
    tnp = _tnp()
    c = tnp.sqrt(tnp.multiply(tnp.subtract(1, x), tnp.add(1, x)))
    return arctan2_p.bind(x, c)


arccos_p = composite_unop("arccos", np.arccos)


@arccos_p.def_decomposition
def _arccos_decomp(x):
    tnp = _tnp()
    return tnp.multiply(2, arctan2_p.bind(tnp.sqrt(tnp.subtract(1, x)), tnp.sqrt(tnp.add(1, x))))


sinh_p = composite_unop("sinh", np.sinh)


@sinh_p.def_decomposition
def _sinh_decomp(x):
    # expm1 keeps small |x| accurate: (e^x - 1) - (e^-x - 1).
    tnp = _tnp()
    return tnp.multiply(tnp.subtract(expm1_p.bind(x), expm1_p.bind(tnp.negative(x))), 0.5)


cosh_p = composite_unop("cosh", np.cosh)


@cosh_p.def_decomposition
def _cosh_decomp(x):
    # t = e^|x| / 2 overflows only where cosh itself does.
    tnp = _tnp()
    t = tnp.exp(tnp.subtract(abs_p.bind(x), float(np.log(2.0))))
    return tnp.add(t, tnp.divide(0.25, t))


tanh_p = composite_unop("tanh", np.tanh)


@tanh_p.def_decomposition
def _tanh_decomp(x):
    # tanh|x| = -m / (2 + m) with m = expm1(-2|x|) in [-1, 0]: no overflow, exact near 0.
    tnp = _tnp()
    m = expm1_p.bind(tnp.multiply(abs_p.bind(x), -2))
    t = tnp.divide(tnp.negative(m), tnp.add(m, 2))
    return tnp.where(tnp.less(x, 0), tnp.negative(t), t)


arcsinh_p = composite_unop("arcsinh", np.arcsinh)


@arcsinh_p.def_decomposition
def _arcsinh_decomp(x):
    # asinh|x| = log1p(a + a^2 / (1 + sqrt(1 + a^2))), or log(2a) where a^2 would overflow.
    tnp = _tnp()
    a = abs_p.bind(x)
    big = tnp.greater(a, _big(x))
    s = tnp.where(big, tnp.ones_like(a), a)
    s2 = tnp.multiply(s, s)
    small_r = log1p_p.bind(tnp.add(s, tnp.divide(s2, tnp.add(1, tnp.sqrt(tnp.add(1, s2))))))
    r = tnp.where(big, tnp.add(tnp.log(tnp.where(big, a, tnp.ones_like(a))), float(np.log(2.0))),
                  small_r)
    return tnp.where(tnp.less(x, 0), tnp.negative(r), r)


arccosh_p = composite_unop("arccosh", np.arccosh)


@arccosh_p.def_decomposition
def _arccosh_decomp(x):
    # acosh x = log1p(t + sqrt(t (t + 2))) with t = x - 1 (exact near 1); log(2x) when huge.
    tnp = _tnp()
    big = tnp.greater(x, _big(x))
    t = tnp.subtract(tnp.where(big, tnp.ones_like(x), x), 1)
    small_r = log1p_p.bind(tnp.add(t, tnp.sqrt(tnp.multiply(t, tnp.add(t, 2)))))
    big_r = tnp.add(tnp.log(tnp.where(big, x, tnp.ones_like(x))), float(np.log(2.0)))
    return tnp.where(big, big_r, small_r)


arctanh_p = composite_unop("arctanh", np.arctanh)


@arctanh_p.def_decomposition
def _arctanh_decomp(x):
    tnp = _tnp()
    return tnp.multiply(log1p_p.bind(tnp.divide(tnp.multiply(x, 2), tnp.subtract(1, x))), 0.5)


# ---------------------------------------------------------------------------------------------
# erfinv (used by the normal and truncated-normal samplers)


erfinv_p = composite_unop("erfinv", scipy.special.erfinv)

# Giles, "Approximating the erfinv function" (GPU Computing Gems, 2011), single precision.
_ERFINV_CENTRAL = (2.81022636e-08, 3.43273939e-07, -3.5233877e-06, -4.39150654e-06,
                   0.00021858087, -0.00125372503, -0.00417768164, 0.246640727, 1.50140941)
_ERFINV_TAIL = (-0.000200214257, 0.000100950558, 0.00134934322, -0.00367342844,
                0.00573950773, -0.0076224613, 0.00943887047, 1.00167406, 2.83297682)


@erfinv_p.def_decomposition
def _erfinv_decomp(x):
    tnp = _tnp()
    w = tnp.negative(log1p_p.bind(tnp.negative(tnp.multiply(x, x))))
    central = tnp.less(w, 5.0)
    wc = tnp.subtract(tnp.where(central, w, tnp.full_like(w, 5.0)), 2.5)
    wt = tnp.subtract(tnp.sqrt(tnp.where(central, tnp.full_like(w, 5.0), w)), 3.0)

    def horner(coeffs, t):
        p = tnp.full_like(t, coeffs[0])
        for c in coeffs[1:]:
            p = tnp.add(tnp.multiply(p, t), c)
        return p

    p = tnp.where(central, horner(_ERFINV_CENTRAL, wc), horner(_ERFINV_TAIL, wt))
    return tnp.multiply(p, x)


# ---------------------------------------------------------------------------------------------
# mod and clip


def _mod_ref(x, y):
    return np.remainder(x, y)


mod_p = composite_naryop("mod", _mod_ref, 2, "num")


@mod_p.def_decomposition
def _mod_decomp(x, y):
    # Sign of the divisor (Python / NumPy / torch.remainder).
    tnp = _tnp()
    from . import elementwise as E

    dtype = tnp._aval(x).dtype
    if dtype.kind == "f" or str(dtype) == "bfloat16":
        return tnp.subtract(x, tnp.multiply(tnp.floor(tnp.divide(x, y)), y))
    q = E.div_p.bind(x, y)  # truncates toward zero
    r = tnp.subtract(x, tnp.multiply(q, y))
    adjust = tnp.logical_and(tnp.not_equal(r, 0), tnp.not_equal(tnp.less(r, 0), tnp.less(y, 0)))
    return tnp.where(adjust, tnp.add(r, y), r)


clip_p = composite_naryop("clip", lambda x, lo, hi: np.minimum(np.maximum(x, lo), hi), 3, "num")


@clip_p.def_decomposition
def _clip_decomp(x, lo, hi):
    tnp = _tnp()
    return tnp.minimum(tnp.maximum(x, lo), hi)


MATH = [abs_p, sign_p, square_p, reciprocal_p, rsqrt_p, ceil_p, log1p_p, expm1_p, tan_p,
        arctan2_p, arcsin_p, arccos_p, sinh_p, cosh_p, tanh_p, arcsinh_p, arccosh_p, arctanh_p,
        erfinv_p, mod_p, clip_p]
