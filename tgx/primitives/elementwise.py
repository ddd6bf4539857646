"""Atomic elementwise primitives: unary math, binary arithmetic, comparisons, select, cast,
and the integer bit operations the counter-based PRNG is built from.

Binary primitives broadcast NumPy-style (both operands must have the same dtype; `tgx.numpy`
inserts the casts). Allowing broadcasting here instead of a separate broadcast_in_dim keeps
graphs short and maps one-to-one onto NumPy, torch and XLA kernels, which all broadcast.
"""

from __future__ import annotations

import numpy as np

from ..core import Primitive
from ..errors import DTypeError
from ..shapes import (
    SHORT_NAMES,
    ShapedArray,
    bfloat16,
    bool_,
    broadcast_shapes,
    float16,
    float32,
    is_float,
    is_int,
)


def special():
    """`scipy.special`, imported when a reference first needs it (0.15 s of `import tgx`)."""
    import scipy.special

    return scipy.special


def _lowp(fn):
    """Run a NumPy function in float32 for float16/bfloat16 inputs and round the result back,
    the reference semantics of every backend's half-precision kernels."""

    def impl(*xs, **params):
        dt = xs[0].dtype
        if dt == float16 or dt == bfloat16:
            out = fn(*[np.asarray(x, np.float32) for x in xs], **params)
            return np.asarray(out).astype(dt)
        return np.asarray(fn(*xs, **params))

    return impl


def _check_kind(name: str, dtype, kind: str) -> None:
    ok = {"float": is_float(dtype), "int": is_int(dtype),
          "intbool": is_int(dtype) or dtype == bool_,
          "num": dtype != bool_, "any": True}[kind]
    if not ok:
        raise DTypeError(f"{name} does not accept {SHORT_NAMES[dtype]} operands (needs {kind})")


def unop(name: str, numpy_fn, kind: str = "float") -> Primitive:
    """Declare an elementwise unary primitive in three lines."""
    p = Primitive(name, elementwise=True, family="elementwise")

    @p.def_shape
    def _shape(x: ShapedArray) -> ShapedArray:
        _check_kind(name, x.dtype, kind)
        return x

    p.def_impl(_lowp(numpy_fn))
    return p


def binop(name: str, numpy_fn, kind: str = "num", commutative: bool = False,
          out_bool: bool = False) -> Primitive:
    """Declare an elementwise binary primitive with NumPy broadcasting."""
    p = Primitive(name, elementwise=True, commutative=commutative, family="elementwise")

    @p.def_shape
    def _shape(x: ShapedArray, y: ShapedArray) -> ShapedArray:
        if x.dtype != y.dtype:
            raise DTypeError(f"{name} requires operands of the same dtype, got "
                             f"{x.str_short()} and {y.str_short()}")
        _check_kind(name, x.dtype, kind)
        shape = broadcast_shapes(x.shape, y.shape, op=name)
        return ShapedArray(shape, bool_ if out_bool else x.dtype,
                           x.weak_type and y.weak_type and not out_bool)

    if out_bool:
        p.def_impl(lambda x, y: np.asarray(numpy_fn(x, y)))
    else:
        p.def_impl(_lowp(numpy_fn))
    return p


neg_p = unop("neg", np.negative, "num")
exp_p = unop("exp", np.exp)
log_p = unop("log", np.log)
sin_p = unop("sin", np.sin)
cos_p = unop("cos", np.cos)
sqrt_p = unop("sqrt", np.sqrt)
atan_p = unop("atan", np.arctan)
erf_p = unop("erf", lambda x: special().erf(x))
floor_p = unop("floor", np.floor)
round_p = unop("round", np.round)  # half to even, as NumPy, torch and XLA's round_nearest_even
not_p = unop("not", np.invert, "intbool")

add_p = binop("add", np.add, commutative=True)
sub_p = binop("sub", np.subtract)
mul_p = binop("mul", np.multiply, commutative=True)
max_p = binop("max", np.maximum, "any", commutative=True)
min_p = binop("min", np.minimum, "any", commutative=True)
pow_p = binop("pow", np.power, "float")
and_p = binop("and", np.bitwise_and, "intbool", commutative=True)
or_p = binop("or", np.bitwise_or, "intbool", commutative=True)
xor_p = binop("xor", np.bitwise_xor, "intbool", commutative=True)
shift_left_p = binop("shift_left", np.left_shift, "int")


def _shift_right_logical(x, y):
    unsigned = x.dtype.str.replace("i", "u")  # shift in zeros, whatever the sign bit
    return (x.astype(unsigned) >> y.astype(unsigned)).astype(x.dtype)


shift_right_logical_p = binop("shift_right_logical", _shift_right_logical, "int")


def _div(x, y):
    if x.dtype.kind in "iu":
        # C semantics (truncation toward zero), as XLA and torch's trunc division.
        with np.errstate(divide="ignore"):
            q = np.abs(x) // np.where(y == 0, 1, np.abs(y))
        return (np.sign(x) * np.sign(y) * q).astype(x.dtype)
    return np.divide(x, y)


div_p = binop("div", _div)

eq_p = binop("eq", np.equal, "any", commutative=True, out_bool=True)
ne_p = binop("ne", np.not_equal, "any", commutative=True, out_bool=True)
lt_p = binop("lt", np.less, "any", out_bool=True)
le_p = binop("le", np.less_equal, "any", out_bool=True)
gt_p = binop("gt", np.greater, "any", out_bool=True)
ge_p = binop("ge", np.greater_equal, "any", out_bool=True)


# select(pred, on_true, on_false): where with broadcasting of all three operands.
select_p = Primitive("select", elementwise=True, family="elementwise")


@select_p.def_shape
def _select_shape(pred: ShapedArray, t: ShapedArray, f: ShapedArray) -> ShapedArray:
    if pred.dtype != bool_:
        raise DTypeError(f"select requires a bool predicate, got {pred.str_short()}")
    if t.dtype != f.dtype:
        raise DTypeError(f"select requires branches of the same dtype, got "
                         f"{t.str_short()} and {f.str_short()}")
    return ShapedArray(broadcast_shapes(pred.shape, t.shape, f.shape, op="select"), t.dtype,
                       t.weak_type and f.weak_type)


@select_p.def_impl
def _select_impl(pred, t, f):
    return np.asarray(np.where(pred, t, f))


# convert_element_type: a dtype cast (float->int truncates toward zero, as C and every backend).
convert_element_type_p = Primitive("convert_element_type", elementwise=True, family="elementwise")


@convert_element_type_p.def_shape
def _cast_shape(x: ShapedArray, *, new_dtype, weak_type: bool = False) -> ShapedArray:
    return ShapedArray(x.shape, new_dtype, weak_type)


@convert_element_type_p.def_impl
def _cast_impl(x, *, new_dtype, weak_type=False):
    if x.dtype == new_dtype:
        return x
    if new_dtype.kind == "f" and x.dtype.kind in "biuf":   # NumPy's own cast (the common case,
        return x.astype(new_dtype)                          # first: 0.2 us, the checks 3 us)
    if is_float(x.dtype) and new_dtype.kind in "iu":
        with np.errstate(invalid="ignore"):
            return np.trunc(x.astype(np.float64)).astype(new_dtype)
    if str(new_dtype) == "bfloat16" and x.dtype.kind in "iub":
        return x.astype(float32).astype(new_dtype)
    return x.astype(new_dtype)


# copy: an explicit copy (identity on values); useful as a boundary and removed by simplify.
copy_p = unop("copy", np.copy, "any")

UNARY = [neg_p, exp_p, log_p, sin_p, cos_p, sqrt_p, atan_p, erf_p, floor_p, round_p, not_p]
BINARY = [add_p, sub_p, mul_p, div_p, max_p, min_p, pow_p, and_p, or_p, xor_p, shift_left_p,
          shift_right_logical_p]
COMPARE = [eq_p, ne_p, lt_p, le_p, gt_p, ge_p]
