"""`tgx.numpy` (imported as `tnp`): array ops with NumPy / jax.numpy names and signatures.

Thin wrappers: each promotes dtypes jax.numpy-style (Python scalars are weakly typed), inserts
the casts and reshapes the primitives need, and binds. Outside a trace they run eagerly on NumPy.

>>> import numpy as np, tgx.numpy as tnp
>>> tnp.add(np.float32(1), 2).dtype
dtype('float32')
"""

from __future__ import annotations

import builtins
import string
from typing import Any
from collections.abc import Sequence

import numpy as np
import sympy

from . import primitives as P
from .core import Literal
from .errors import DTypeError, ShapeError, TracerControlFlowError
from .shapes import (
    DEFAULT_FLOAT, DEFAULT_INT, ShapedArray, as_dim, as_dtype, aval_of, bfloat16, bool_,
    broadcast_shapes, canonicalize_axes, canonicalize_axis, dim_div, dim_eq, dim_ge, dim_str,
    float16, float32, float64, int32, int64, is_float, is_int, promote, shape_str, uint32,
)
from .tracing import Tracer

bool_ = bool_
float16, bfloat16, float32, float64, int32, int64, uint32 = (
    float16, bfloat16, float32, float64, int32, int64, uint32)
pi, e, inf, nan = np.pi, np.e, np.inf, np.nan
ndarray = np.ndarray

# ---------------------------------------------------------------------------------------------
# Helpers


def _aval(x: Any) -> ShapedArray:
    if isinstance(x, (Tracer, Literal)):
        return x.aval
    if isinstance(x, sympy.Basic):  # a symbolic size used as a number (`x / x.shape[0]`)
        return ShapedArray((), DEFAULT_INT if x.is_integer else DEFAULT_FLOAT, True)
    return aval_of(x)


def _is_array(x: Any) -> bool:
    # Literals reach op wrappers when a transform re-runs a graph (tgx.transforms.rewrite).
    return isinstance(x, (Tracer, Literal, np.ndarray, np.generic))


def asarray(x: Any, dtype=None):
    """An array from a tracer, NumPy array, Python scalar or (nested) list."""
    if isinstance(x, Tracer):
        return x if dtype is None else astype(x, dtype)
    if isinstance(x, (bool, int, float)) and dtype is None:
        return x
    a = np.asarray(x) if dtype is None else np.asarray(x, dtype=as_dtype(dtype))
    if a.dtype == np.float64 and dtype is None and not isinstance(x, np.ndarray):
        a = a.astype(DEFAULT_FLOAT)  # lists of floats: torch-like default
    elif a.dtype == np.int64 and dtype is None and not isinstance(x, np.ndarray):
        a = a.astype(DEFAULT_INT)
    return a


array = asarray


def _cast(x: Any, dtype: np.dtype, weak: bool = False):
    if isinstance(x, sympy.Basic):
        return P.dim_as_value_p.bind(expr=x, dtype=dtype)
    if isinstance(x, (bool, int, float)):
        return np.asarray(x, dtype=dtype)[()]
    if isinstance(x, np.generic) or (isinstance(x, np.ndarray) and x.ndim == 0):
        return np.asarray(x).astype(dtype)[()]
    if _aval(x).dtype == dtype:
        return x
    return P.convert_element_type_p.bind(x, new_dtype=dtype, weak_type=weak)


def _promoted(*xs):
    dtype, weak = promote(*[_aval(x) for x in xs])
    return [_cast(x, dtype) for x in xs], dtype, weak


def _binary(prim, x, y):
    (x, y), _, _ = _promoted(x, y)
    return prim.bind(x, y)


def _float_args(*xs):
    """Promote, then lift integers to the default float (jnp.exp(int) is a float)."""
    dtype, _ = promote(*[_aval(x) for x in xs])
    if not is_float(dtype):
        dtype = DEFAULT_FLOAT
    return [_cast(x, dtype) for x in xs]


def _unary_float(prim, x):
    (x,) = _float_args(x)
    return prim.bind(x)


def _shape_value(d, dtype=DEFAULT_FLOAT):
    """A dim as a scalar operand: a Python number, or `dim_as_value` when symbolic."""
    if type(d) is int:
        return d
    return P.dim_as_value_p.bind(expr=d, dtype=dtype)


# ---------------------------------------------------------------------------------------------
# Elementwise


def add(x, y):
    """Elementwise x + y with broadcasting. >>> add(1, 2)  # doctest: +SKIP"""
    return _binary(P.add_p, x, y)


def subtract(x, y):
    return _binary(P.sub_p, x, y)


def multiply(x, y):
    return _binary(P.mul_p, x, y)


def divide(x, y):
    """True division; integers divide as the default float (like NumPy's `/`)."""
    x, y = _float_args(x, y)
    return P.div_p.bind(x, y)


true_divide = divide


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


def remainder(x, y):
    """x mod y with the sign of y (Python/NumPy semantics); composite `mod`."""
    (x, y), dtype, _ = _promoted(x, y)
    return P.mod_p.bind(_as_operand(x), _as_operand(y))


mod = remainder


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


def negative(x):
    return P.neg_p.bind(x) if _is_array(x) else -x


def positive(x):
    return x


def _unary_op(prim, doc: str, name: str | None = None):
    """A float unary wrapper over `prim` (integers become the default float first)."""
    def fn(x):
        return _unary_float(prim, _as_operand(x))

    fn.__name__ = fn.__qualname__ = name or prim.name
    fn.__doc__ = doc
    return fn


exp = _unary_op(P.exp_p, "e ** x, elementwise.")
log = _unary_op(P.log_p, "Natural logarithm (NaN below 0, -inf at 0).")
sin = _unary_op(P.sin_p, "Sine.")
cos = _unary_op(P.cos_p, "Cosine.")
sqrt = _unary_op(P.sqrt_p, "Square root (NaN below 0).")
arctan = _unary_op(P.atan_p, "Inverse tangent.", "arctan")
erf = _unary_op(P.erf_p, "The error function (atomic: no accurate decomposition exists).")


def floor(x):
    return x if is_int(_aval(x).dtype) else _unary_float(P.floor_p, x)


def round(x, decimals: int = 0):  # noqa: A001 - NumPy's name
    if is_int(_aval(x).dtype):
        return x
    if decimals:
        scale = 10.0 ** decimals
        return divide(_unary_float(P.round_p, multiply(x, scale)), scale)
    return _unary_float(P.round_p, x)


around = round


def absolute(x):
    """|x| (composite `abs`); bool passes through."""
    if _aval(x).dtype == bool_:
        return x
    return P.abs_p.bind(_as_operand(x))


abs = absolute  # noqa: A001


def maximum(x, y):
    return _binary(P.max_p, x, y)


def minimum(x, y):
    return _binary(P.min_p, x, y)


def square(x):
    """x * x (composite `square`)."""
    return P.square_p.bind(_as_operand(x))


def reciprocal(x):
    """1 / x (composite `reciprocal`); integers become the default float."""
    return _unary_float(P.reciprocal_p, _as_operand(x))


# comparisons and logic


def equal(x, y):
    return _binary(P.eq_p, x, y)


def not_equal(x, y):
    return _binary(P.ne_p, x, y)


def less(x, y):
    return _binary(P.lt_p, x, y)


def less_equal(x, y):
    return _binary(P.le_p, x, y)


def greater(x, y):
    return _binary(P.gt_p, x, y)


def greater_equal(x, y):
    return _binary(P.ge_p, x, y)


def _bitwise(prim, x, y):
    (x, y), dtype, _ = _promoted(x, y)
    if not (is_int(dtype) or dtype == bool_):
        raise DTypeError(f"{prim.name} needs integer or bool operands, got {dtype}")
    return prim.bind(x, y)


def bitwise_and(x, y):
    return _bitwise(P.and_p, x, y)


def bitwise_or(x, y):
    return _bitwise(P.or_p, x, y)


def bitwise_xor(x, y):
    return _bitwise(P.xor_p, x, y)


def invert(x):
    return P.not_p.bind(x)


bitwise_not = invert


def logical_and(x, y):
    return P.and_p.bind(astype(x, bool_), astype(y, bool_))


def logical_or(x, y):
    return P.or_p.bind(astype(x, bool_), astype(y, bool_))


def logical_xor(x, y):
    return P.ne_p.bind(astype(x, bool_), astype(y, bool_))


def logical_not(x):
    return P.not_p.bind(astype(x, bool_))


def left_shift(x, y):
    (x, y), _, _ = _promoted(x, y)
    return P.shift_left_p.bind(x, y)


def right_shift_logical(x, y):
    (x, y), _, _ = _promoted(x, y)
    return P.shift_right_logical_p.bind(x, y)


def where(condition, x=None, y=None):
    """Elementwise select with broadcasting; `condition` becomes bool. (The one-argument form
    has a data-dependent shape and cannot be traced.)"""
    if x is None or y is None:
        raise TracerControlFlowError("where(condition) with one argument has a data-dependent "
                                     "shape; pass x and y")
    (x, y), _, _ = _promoted(x, y)
    return P.select_p.bind(astype(condition, bool_), x, y)


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


def astype(x, dtype):
    """Cast to `dtype` (float → int truncates toward zero)."""
    dtype = as_dtype(dtype)
    if isinstance(x, (bool, int, float)):
        return np.asarray(x, dtype=dtype)[()]
    if _aval(x).dtype == dtype:
        return x
    return P.convert_element_type_p.bind(x, new_dtype=dtype, weak_type=False)


# ---------------------------------------------------------------------------------------------
# Reductions


def _reduce(prim, x, axis, keepdims):
    a = _aval(x)
    axes = canonicalize_axes(axis, a.ndim, prim.name)
    out = prim.bind(x, axes=axes)
    if keepdims:
        out = reshape(out, tuple(1 if i in axes else d for i, d in enumerate(a.shape)))
    return out


def sum(x, axis=None, dtype=None, keepdims=False):  # noqa: A001
    """Sum over `axis` (all by default); bool and small ints accumulate as the default int."""
    a = _aval(x)
    if dtype is not None:
        x = astype(x, dtype)
    elif a.dtype == bool_ or a.dtype == int32:
        x = astype(x, DEFAULT_INT)
    return _reduce(P.reduce_sum_p, x, axis, keepdims)


def prod(x, axis=None, dtype=None, keepdims=False):
    a = _aval(x)
    if dtype is not None:
        x = astype(x, dtype)
    elif a.dtype == bool_:
        x = astype(x, DEFAULT_INT)
    return _reduce(P.reduce_prod_p, x, axis, keepdims)


def max(x, axis=None, keepdims=False):  # noqa: A001
    return _reduce(P.reduce_max_p, x, axis, keepdims)


def min(x, axis=None, keepdims=False):  # noqa: A001
    return _reduce(P.reduce_min_p, x, axis, keepdims)


amax, amin = max, min


def any(x, axis=None, keepdims=False):  # noqa: A001
    return _reduce(P.reduce_max_p, astype(x, bool_), axis, keepdims)


def all(x, axis=None, keepdims=False):  # noqa: A001
    return _reduce(P.reduce_min_p, astype(x, bool_), axis, keepdims)


def mean(x, axis=None, dtype=None, keepdims=False):
    """Arithmetic mean (composite `mean`); the count may be symbolic (`dim_as_value`)."""
    a = _aval(x)
    if dtype is not None:
        x = astype(x, dtype)
    elif not is_float(a.dtype):
        x = astype(x, DEFAULT_FLOAT)
    return _reduce(P.mean_p, _as_operand(x), axis, keepdims)


def _prod_dims(dims):
    out = 1
    for d in dims:
        out = out * d
    return as_dim(out) if not isinstance(out, int) else out


def _arg_reduce(prim, x, axis, keepdims):
    a = _aval(x)
    if axis is None:
        x = reshape(x, (-1,))
        axis = 0
    axis = canonicalize_axis(axis, _aval(x).ndim, prim.name)
    out = prim.bind(x, axis=axis, index_dtype=DEFAULT_INT)
    if keepdims:
        shape = list(a.shape) if a.ndim else []
        if shape:
            shape[axis] = 1
        out = reshape(out, tuple(shape))
    return out


def argmax(x, axis=None, keepdims=False):
    """Index of the first maximum (flattened when `axis` is None), as int64."""
    return _arg_reduce(P.argmax_p, x, axis, keepdims)


def argmin(x, axis=None, keepdims=False):
    """Index of the first minimum (flattened when `axis` is None), as int64 (composite)."""
    return _arg_reduce(P.argmin_p, x, axis, keepdims)


# ---------------------------------------------------------------------------------------------
# Shapes and movement


def shape(x) -> tuple:
    return _aval(x).shape


def ndim(x) -> int:
    return _aval(x).ndim


def _norm_shape(newshape, size, op="reshape") -> tuple:
    if isinstance(newshape, (int, str, sympy.Basic)) or (
            hasattr(newshape, "__index__") and not isinstance(newshape, tuple)):
        newshape = (newshape,)
    dims = [as_dim(d) if not (isinstance(d, int) and d == -1) else -1 for d in newshape]
    if dims.count(-1) > 1:
        raise ShapeError(f"{op}: can only specify one unknown dimension, got {tuple(newshape)}")
    if -1 in dims:
        known = _prod_dims([d for d in dims if not (isinstance(d, int) and d == -1)])
        missing = dim_div(size, known, f"{op}: cannot infer -1 in {tuple(newshape)} "
                                       f"for {dim_str(size)} elements")
        dims = [missing if (isinstance(d, int) and d == -1) else d for d in dims]
    return tuple(dims)


def reshape(x, newshape, order="C"):
    """Reshape (one dim may be -1; symbolic dims allowed: `(N, 8) → (-1, 4)` gives `(2*N, 4)`)."""
    if order != "C":
        raise NotImplementedError("reshape supports order='C' only")
    a = _aval(x)
    new = _norm_shape(newshape, a.size)
    if len(new) == len(a.shape) and builtins.all(
            (type(p) is int and type(q) is int and p == q) or p is q for p, q in zip(new, a.shape)):
        return x
    return P.reshape_p.bind(x, new_sizes=new)


def ravel(x):
    return reshape(x, (-1,))


def transpose(x, axes=None):
    a = _aval(x)
    axes = tuple(reversed(range(a.ndim))) if axes is None else tuple(
        canonicalize_axis(ax, a.ndim, "transpose") for ax in axes)
    if axes == tuple(range(a.ndim)):
        return x
    return P.transpose_p.bind(x, permutation=axes)


def swapaxes(x, axis1, axis2):
    n = _aval(x).ndim
    perm = list(range(n))
    a1, a2 = canonicalize_axis(axis1, n, "swapaxes"), canonicalize_axis(axis2, n, "swapaxes")
    perm[a1], perm[a2] = perm[a2], perm[a1]
    return transpose(x, perm)


def moveaxis(x, source, destination):
    n = _aval(x).ndim
    src = canonicalize_axis(source, n, "moveaxis")
    dst = canonicalize_axis(destination, n, "moveaxis")
    perm = [i for i in range(n) if i != src]
    perm.insert(dst, src)
    return transpose(x, perm)


def broadcast_to(x, shape):
    a = _aval(x)
    shape = tuple(as_dim(d) for d in ((shape,) if isinstance(shape, (int, str)) else shape))
    out = broadcast_shapes(a.shape, shape, op="broadcast_to")
    if len(out) != len(shape) or not builtins.all(dim_eq(p, q) for p, q in zip(out, shape)):
        raise ShapeError(f"broadcast_to: cannot broadcast {shape_str(a.shape)} to "
                         f"{shape_str(shape)}")
    if len(shape) == a.ndim and builtins.all(p is q or p == q for p, q in zip(a.shape, shape)):
        return x
    x = _as_operand(x)
    return P.broadcast_in_dim_p.bind(x, shape=shape, broadcast_dimensions=tuple(
        range(len(shape) - a.ndim, len(shape))))


def _as_operand(x):
    if isinstance(x, (bool, int, float)):
        return np.asarray(x, dtype=aval_of(x).dtype)
    return x


def broadcast_arrays(*xs):
    shape = broadcast_shapes(*[_aval(x).shape for x in xs])
    return [broadcast_to(x, shape) for x in xs]


def expand_dims(x, axis):
    a = _aval(x)
    axes = (axis,) if isinstance(axis, int) else tuple(axis)
    n = a.ndim + len(axes)
    axes = sorted(canonicalize_axis(ax, n, "expand_dims") for ax in axes)
    shape = list(a.shape)
    for ax in axes:
        shape.insert(ax, 1)
    return reshape(x, tuple(shape))


def squeeze(x, axis=None):
    a = _aval(x)
    if axis is None:
        axes = [i for i, d in enumerate(a.shape) if type(d) is int and d == 1]
    else:
        axes = list(canonicalize_axes(axis, a.ndim, "squeeze"))
        for ax in axes:
            if not (type(a.shape[ax]) is int and a.shape[ax] == 1):
                raise ShapeError(f"squeeze: axis {ax} of {shape_str(a.shape)} has size "
                                 f"{dim_str(a.shape[ax])}, not 1")
    return reshape(x, tuple(d for i, d in enumerate(a.shape) if i not in axes))


def concatenate(arrays: Sequence, axis: int = 0):
    arrays = list(arrays)
    if not arrays:
        raise ShapeError("concatenate: needs at least one array")
    dtype, _ = promote(*[_aval(x) for x in arrays])
    arrays = [_as_operand(_cast(x, dtype)) for x in arrays]
    if axis is None:
        arrays = [ravel(x) for x in arrays]
        axis = 0
    axis = canonicalize_axis(axis, _aval(arrays[0]).ndim, "concatenate")
    if len(arrays) == 1:
        return arrays[0]
    return P.concatenate_p.bind(*arrays, dimension=axis)


def stack(arrays: Sequence, axis: int = 0):
    arrays = list(arrays)
    if not arrays:
        raise ShapeError("stack: needs at least one array")
    n = _aval(arrays[0]).ndim + 1
    axis = canonicalize_axis(axis, n, "stack")
    return concatenate([expand_dims(x, axis) for x in arrays], axis=axis)


def pad(x, pad_width, mode="constant", constant_values=0):
    """Pad with a constant (other modes are in `tgx.nn.pad`)."""
    if mode != "constant":
        raise NotImplementedError(f"tnp.pad mode={mode!r}: use mode='constant' or tgx.nn.pad")
    a = _aval(x)
    if isinstance(pad_width, int):
        pad_width = ((pad_width, pad_width),) * a.ndim
    pad_width = [tuple(p) if isinstance(p, (tuple, list)) else (p, p) for p in pad_width]
    if len(pad_width) == 1 and a.ndim > 1:
        pad_width = pad_width * a.ndim
    if len(pad_width) != a.ndim:
        raise ShapeError(f"pad: pad_width {pad_width} needs one (before, after) pair per axis of "
                         f"{shape_str(a.shape)}")
    value = np.asarray(constant_values, dtype=a.dtype)
    return P.pad_p.bind(x, value, padding_config=tuple((int(lo), int(hi), 0)
                                                       for lo, hi in pad_width))


def take(x, indices, axis=None):
    """Elements of `x` at integer `indices` along `axis` (negative indices count from the end)."""
    if axis is None:
        x = ravel(x)
        axis = 0
    a = _aval(x)
    axis = canonicalize_axis(axis, a.ndim, "take")
    idx = asarray(indices)
    if isinstance(idx, (int, np.integer)) or (isinstance(idx, np.ndarray) and idx.ndim == 0 and
                                              is_int(idx.dtype)):
        i = int(idx)
        return index_axis(x, axis, i)
    ia = _aval(idx)
    if not is_int(ia.dtype):
        raise DTypeError(f"take: indices must be integers, got {ia.str_short()}")
    idx = _normalize_index(idx, a.shape[axis])
    return P.gather_p.bind(x, idx, axis=axis)


def _normalize_index(idx, size):
    if isinstance(idx, np.ndarray):
        if type(size) is int:
            return np.where(idx < 0, idx + size, idx).astype(idx.dtype)
    dtype = _aval(idx).dtype
    return where(less(idx, _cast(0, dtype)), add(idx, _cast(_shape_value(size, dtype), dtype)), idx)


def index_axis(x, axis: int, i: int):
    """x[..., i, ...] along `axis` for a static Python int."""
    a = _aval(x)
    d = a.shape[axis]
    if i < 0:
        i = as_dim(d + i)
        if type(i) is int and i < 0 or not dim_ge(i, 0):
            raise IndexError(f"index {i} is out of bounds for axis {axis} with size {dim_str(d)}")
    elif not dim_ge(d, i + 1):
        raise IndexError(f"index {i} is out of bounds for axis {axis} with size {dim_str(d)}")
    start = [0] * a.ndim
    limit = list(a.shape)
    start[axis], limit[axis] = i, as_dim(i + 1)
    s = P.slice_p.bind(x, start_indices=tuple(start), limit_indices=tuple(limit), strides=None)
    return reshape(s, a.shape[:axis] + a.shape[axis + 1:])


def flip(x, axis=None):
    a = _aval(x)
    axes = canonicalize_axes(axis, a.ndim, "flip")
    return P.rev_p.bind(x, dimensions=axes) if axes else x


def matmul(a, b):
    """Matrix product with NumPy semantics: 1-D operands, and batch dims that broadcast."""
    (a, b), _, _ = _promoted(a, b)
    a, b = _as_operand(a), _as_operand(b)
    sa, sb = _aval(a).shape, _aval(b).shape
    if not sa or not sb:
        raise ShapeError("matmul: operands must be at least 1-D (use multiply for scalars)")
    squeeze_a, squeeze_b = len(sa) == 1, len(sb) == 1
    if squeeze_a:
        a = reshape(a, (1,) + sa)
    if squeeze_b:
        b = reshape(b, sb + (1,))
    sa, sb = _aval(a).shape, _aval(b).shape
    if not dim_eq(sa[-1], sb[-2]):
        raise ShapeError(f"matmul: contracting dimensions differ: {shape_str(sa)} @ "
                         f"{shape_str(sb)} ({dim_str(sa[-1])} vs {dim_str(sb[-2])})")
    if len(sb) == 2:
        # (..., M, K) @ (K, N): contract directly, no batch dims needed.
        out = P.dot_general_p.bind(a, b, dimension_numbers=(((len(sa) - 1,), (0,)), ((), ())))
    elif len(sa) == 2:
        # (M, K) @ (..., K, N): contract, then move N's batch dims to the front.
        out = P.dot_general_p.bind(a, b, dimension_numbers=(((1,), (len(sb) - 2,)), ((), ())))
        nb = len(sb) - 2
        out = transpose(out, tuple(range(1, nb + 1)) + (0, nb + 1))
    else:
        batch = broadcast_shapes(sa[:-2], sb[:-2], op="matmul")
        a = broadcast_to(a, batch + sa[-2:])
        b = broadcast_to(b, batch + sb[-2:])
        nb = len(batch)
        out = P.dot_general_p.bind(a, b, dimension_numbers=(((nb + 1,), (nb,)),
                                                            (tuple(range(nb)), tuple(range(nb)))))
    if squeeze_a:
        out = squeeze(out, -2)
    if squeeze_b:
        out = squeeze(out, -1)
    return out


def dot(a, b):
    """NumPy dot: the last axis of `a` with the second-to-last of `b` (the only one if 1-D)."""
    (a, b), _, _ = _promoted(a, b)
    a, b = _as_operand(a), _as_operand(b)
    na, nb = _aval(a).ndim, _aval(b).ndim
    if na == 0 or nb == 0:
        return multiply(a, b)
    rc = 0 if nb == 1 else nb - 2
    return P.dot_general_p.bind(a, b, dimension_numbers=(((na - 1,), (rc,)), ((), ())))


def vdot(a, b):
    return dot(ravel(a), ravel(b))


def outer(a, b):
    return multiply(reshape(a, (-1, 1)), reshape(b, (1, -1)))


def einsum(subscripts: str, *operands):
    """Einstein summation over dot_general, transpose, reshape and reduce_sum.

    >>> import numpy as np
    >>> einsum("ij,jk->ik", np.eye(2, dtype=np.float32), np.ones((2, 3), np.float32)).shape
    (2, 3)
    """
    subscripts = subscripts.replace(" ", "")
    if "->" in subscripts:
        ins, out = subscripts.split("->")
    else:
        ins = subscripts
        letters = [c for c in ins.replace(",", "") if c in string.ascii_letters]
        out = "".join(sorted(c for c in set(letters) if letters.count(c) == 1))
    specs = ins.split(",")
    if len(specs) != len(operands):
        raise ShapeError(f"einsum: {len(specs)} operand specs in {subscripts!r} but "
                         f"{len(operands)} operands")
    if "." in subscripts:
        raise NotImplementedError("einsum: ellipsis ('...') is not supported yet")
    operands = list(operands)
    dtype, _ = promote(*[_aval(x) for x in operands])
    operands = [_as_operand(_cast(x, dtype)) for x in operands]
    for s, x in zip(specs, operands):
        if len(s) != _aval(x).ndim:
            raise ShapeError(f"einsum: spec {s!r} has {len(s)} labels but operand has shape "
                             f"{shape_str(_aval(x).shape)}")
        if len(set(s)) != len(s):
            raise NotImplementedError(f"einsum: repeated label in {s!r} (diagonals) is not "
                                      f"supported")
    # Contract left to right, summing out labels no later operand or the output needs.
    cur, cur_spec = operands[0], specs[0]
    for k in range(1, len(operands)):
        rest = "".join(specs[k + 1:]) + out
        cur, cur_spec = _einsum_pair(cur, cur_spec, operands[k], specs[k], rest)
    keep = set(out)
    drop = [i for i, c in enumerate(cur_spec) if c not in keep]
    if drop:
        cur = sum(cur, axis=tuple(drop))
        cur_spec = "".join(c for c in cur_spec if c in keep)
    if sorted(cur_spec) != sorted(out):
        raise ShapeError(f"einsum: output labels {out!r} do not match inputs {ins!r}")
    return transpose(cur, tuple(cur_spec.index(c) for c in out))


def _einsum_pair(x, xs: str, y, ys: str, needed: str):
    # Sum out labels used only by one operand and not needed later.
    def sum_private(z, zs, other):
        drop = [i for i, c in enumerate(zs) if c not in other and c not in needed]
        if drop:
            z = sum(z, axis=tuple(drop))
            zs = "".join(c for i, c in enumerate(zs) if i not in drop)
        return z, zs

    x, xs = sum_private(x, xs, ys)
    y, ys = sum_private(y, ys, xs)
    batch = [c for c in xs if c in ys and c in needed]
    contract = [c for c in xs if c in ys and c not in needed]
    dn = ((tuple(xs.index(c) for c in contract), tuple(ys.index(c) for c in contract)),
          (tuple(xs.index(c) for c in batch), tuple(ys.index(c) for c in batch)))
    out = P.dot_general_p.bind(x, y, dimension_numbers=dn)
    spec = "".join(batch) + "".join(c for c in xs if c not in ys) + "".join(
        c for c in ys if c not in xs)
    return out, spec


# ---------------------------------------------------------------------------------------------
# Creation


def full(shape, fill_value, dtype=None):
    """An array of `shape` filled with `fill_value`; symbolic dims allowed."""
    shape = tuple(as_dim(d) for d in ((shape,) if isinstance(shape, (int, str)) else shape))
    if dtype is None:
        dtype = _aval(fill_value).dtype if _is_array(fill_value) else aval_of(fill_value).dtype
    dtype = as_dtype(dtype)
    v = _as_operand(_cast(fill_value, dtype))
    if _aval(v).ndim:
        return broadcast_to(v, shape)
    return P.broadcast_in_dim_p.bind(v, shape=shape, broadcast_dimensions=())


def zeros(shape, dtype=float32):
    return full(shape, 0, dtype)


def ones(shape, dtype=float32):
    return full(shape, 1, dtype)


def zeros_like(x, dtype=None):
    a = _aval(x)
    return full(a.shape, 0, dtype or a.dtype)


def ones_like(x, dtype=None):
    a = _aval(x)
    return full(a.shape, 1, dtype or a.dtype)


def full_like(x, fill_value, dtype=None):
    a = _aval(x)
    return full(a.shape, fill_value, dtype or a.dtype)


def arange(start, stop=None, step=1, dtype=None):
    """`arange(n)` or `arange(start, stop, step)`; the length may be symbolic (`arange(N)`)."""
    if stop is None:
        start, stop = 0, start
    if dtype is None:
        dtype = DEFAULT_FLOAT if builtins.any(isinstance(v, float)
                                              for v in (start, stop, step)) else DEFAULT_INT
    dtype = as_dtype(dtype)
    if isinstance(stop, (int, float)) and isinstance(start, (int, float)):
        n = builtins.max(0, int(np.ceil((stop - start) / step)))
    else:
        if step != 1:
            raise NotImplementedError("arange with a symbolic bound supports step=1 only")
        n = as_dim(stop - start)
    out = P.iota_p.bind(dtype=dtype, shape=(n,), dimension=0)
    if step != 1:
        out = multiply(out, _cast(step, dtype))
    if start != 0:
        out = add(out, _cast(start, dtype))
    return out


def iota(dtype, shape, dimension=0):
    shape = tuple(as_dim(d) for d in shape)
    return P.iota_p.bind(dtype=as_dtype(dtype), shape=shape, dimension=dimension)


def eye(n, m=None, k=0, dtype=float32):
    m = n if m is None else m
    rows = iota(int64, (n, m), 0)
    cols = iota(int64, (n, m), 1)
    return astype(equal(add(rows, k), cols), dtype)


def tri(n, m=None, k=0, dtype=float32):
    m = n if m is None else m
    rows = iota(int64, (n, m), 0)
    cols = iota(int64, (n, m), 1)
    return astype(less_equal(cols, add(rows, k)), dtype)


def tril(x, k=0):
    a = _aval(x)
    mask = tri(a.shape[-2], a.shape[-1], k, dtype=bool_)
    return where(mask, x, zeros((), a.dtype))


def triu(x, k=0):
    a = _aval(x)
    mask = tri(a.shape[-2], a.shape[-1], k - 1, dtype=bool_)
    return where(mask, zeros((), a.dtype), x)


# ---------------------------------------------------------------------------------------------
# Indexing


def _getitem(x, key):
    a = _aval(x)
    if not isinstance(key, tuple):
        key = (key,)
    if builtins.any(isinstance(k, (Tracer, np.ndarray, list)) and not (
            isinstance(k, np.ndarray) and k.ndim == 0) for k in key):
        return _advanced_getitem(x, key)
    n_real = builtins.sum(1 for k in key if k is not None and k is not Ellipsis)
    if n_real > a.ndim:
        raise IndexError(f"too many indices for an array of shape {shape_str(a.shape)}: {key}")
    if builtins.sum(1 for k in key if k is Ellipsis) > 1:
        raise IndexError("an index can only have a single ellipsis ('...')")
    if builtins.any(k is Ellipsis for k in key):
        i = next(j for j, k in enumerate(key) if k is Ellipsis)
        key = key[:i] + (slice(None),) * (a.ndim - n_real) + key[i + 1:]
    else:
        key = key + (slice(None),) * (a.ndim - n_real)
    starts, limits, strides, out_shape, rev_axes, squeeze_axes = [], [], [], [], [], []
    new_axes = []
    ax = 0
    for k in key:
        if k is None:
            new_axes.append(len(out_shape) + len(new_axes))
            continue
        d = a.shape[ax]
        if isinstance(k, slice):
            s, e, st = _slice_bounds(k, d, ax)
            if st < 0:
                rev_axes.append(ax)
                st = -st
            starts.append(s)
            limits.append(e)
            strides.append(st)
            out_shape.append(None)
        else:
            if isinstance(k, (bool, np.bool_)):
                raise IndexError("boolean indices have data-dependent shapes and cannot be traced")
            try:
                i = int(k)
            except TypeError:
                raise IndexError(f"unsupported index {k!r}") from None
            if i < 0:
                i = as_dim(d + i)
            if not (dim_ge(i, 0) and dim_ge(d, as_dim(i + 1))):
                raise IndexError(f"index {int(k)} is out of bounds for axis {ax} with size "
                                 f"{dim_str(d)}")
            starts.append(i)
            limits.append(as_dim(i + 1))
            strides.append(1)
            squeeze_axes.append(ax)
        ax += 1
    out = x
    if rev_axes:
        out = P.rev_p.bind(out, dimensions=tuple(rev_axes))
    trivial = builtins.all(type(s) is int and s == 0 for s in starts) and builtins.all(
        st == 1 for st in strides) and builtins.all(lim is d or lim == d
                                                     for lim, d in zip(limits, a.shape))
    if not trivial:
        out = P.slice_p.bind(out, start_indices=tuple(starts), limit_indices=tuple(limits),
                             strides=None if builtins.all(st == 1 for st in strides)
                             else tuple(strides))
    if squeeze_axes or new_axes:
        shape = [d for i, d in enumerate(_aval(out).shape) if i not in squeeze_axes]
        for pos in new_axes:
            shape.insert(pos, 1)
        out = reshape(out, tuple(shape))
    return out


def _slice_bounds(k: slice, d, ax):
    st = 1 if k.step is None else int(k.step)
    if st == 0:
        raise IndexError("slice step cannot be zero")
    if st < 0:
        # Reverse the axis, then slice forward: x[a:b:-s] == rev(x)[d-1-a : d-1-b : s].
        if k.start is None and k.stop is None:
            return 0, d, st
        if type(d) is not int:
            raise NotImplementedError("negative-step slices with bounds need a concrete dim")
        idx = range(d)[k]
        if len(idx) == 0:
            return 0, 0, -1
        return d - 1 - idx[0], d - 1 - idx[-1] + 1, st
    s = _clamp(k.start, d, 0)
    e = _clamp(k.stop, d, d)
    if not _ge(e, s):
        e = s
    return s, e, st


def _ge(a, b):
    return dim_ge(a, b)


def _clamp(v, d, default):
    if v is None:
        return default
    if isinstance(v, Tracer):
        raise TracerControlFlowError("slice bounds must be static (Python ints or symbolic dims), "
                                     "not traced values; use tnp.take or tnp.where")
    if isinstance(v, int) and type(d) is int:
        v = v + d if v < 0 else v
        return builtins.min(builtins.max(v, 0), d)
    if isinstance(v, int) and v < 0:
        v = as_dim(d + v)   # N-2: must be provably >= 0 (NumPy would clamp; we cannot know)
        if not dim_ge(v, 0):
            return 0
        return v
    v = as_dim(v)
    return v if dim_ge(d, v) else d


def _advanced_getitem(x, key):
    """Integer-array indices (adjacent ones broadcast together), mixed with basic indices."""
    a = _aval(x)
    if builtins.any(k is Ellipsis for k in key):
        i = next(j for j, k in enumerate(key) if k is Ellipsis)
        n_real = builtins.sum(1 for k in key if k is not None and k is not Ellipsis)
        key = key[:i] + (slice(None),) * (a.ndim - n_real) + key[i + 1:]
    if builtins.any(k is None for k in key):
        raise NotImplementedError("mixing None with integer-array indices is not supported")
    key = key + (slice(None),) * (a.ndim - len(key))
    adv = [i for i, k in enumerate(key) if not isinstance(k, slice)]
    if adv != list(range(adv[0], adv[-1] + 1)):
        raise NotImplementedError("integer-array indices separated by slices are not supported")
    # Basic part first.
    basic = tuple(k if isinstance(k, slice) else slice(None) for k in key)
    x = _getitem(x, basic)
    a = _aval(x)
    idxs = [asarray(k) if not isinstance(k, Tracer) else k for k in key[adv[0]:adv[-1] + 1]]
    for k in idxs:
        if not is_int(_aval(k).dtype):
            raise IndexError(f"arrays used as indices must be integers, got {_aval(k).str_short()}")
    sizes = [a.shape[i] for i in adv]
    idxs = [_normalize_index(_as_operand(k), d) for k, d in zip(idxs, sizes)]
    if len(idxs) == 1:
        return P.gather_p.bind(x, idxs[0], axis=adv[0])
    # Several adjacent index arrays: fold them into one linear index over the merged axes.
    idx_shape = broadcast_shapes(*[_aval(k).shape for k in idxs], op="index")
    idx_dtype = int64
    lin = None
    for k, d in zip(idxs, sizes):
        k = astype(broadcast_to(k, idx_shape), idx_dtype)
        lin = k if lin is None else add(multiply(lin, _cast(_shape_value(d, idx_dtype),
                                                            idx_dtype)), k)
    merged = a.shape[:adv[0]] + (_prod_dims(sizes),) + a.shape[adv[-1] + 1:]
    x = reshape(x, merged)
    return P.gather_p.bind(x, lin, axis=adv[0])


# ---------------------------------------------------------------------------------------------
# Tracer operators and methods (NumPy's array protocol, forwarded to the functions above)


def _swap(f):
    return lambda x, y: f(y, x)


def _tracer_reshape(x, *shape, order="C"):
    if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
        shape = tuple(shape[0])
    return reshape(x, shape, order)


def _tracer_transpose(x, *axes):
    if len(axes) == 1 and isinstance(axes[0], (tuple, list)):
        axes = tuple(axes[0])
    return transpose(x, axes or None)


_METHODS = {
    "__add__": add, "__radd__": _swap(add), "__sub__": subtract, "__rsub__": _swap(subtract),
    "__mul__": multiply, "__rmul__": _swap(multiply), "__truediv__": divide,
    "__rtruediv__": _swap(divide), "__floordiv__": floor_divide,
    "__rfloordiv__": _swap(floor_divide), "__mod__": remainder, "__rmod__": _swap(remainder),
    "__pow__": power, "__rpow__": _swap(power), "__matmul__": matmul,
    "__rmatmul__": _swap(matmul), "__neg__": negative, "__pos__": positive, "__abs__": absolute,
    "__lt__": less, "__le__": less_equal, "__gt__": greater, "__ge__": greater_equal,
    "__eq__": equal, "__ne__": not_equal, "__and__": bitwise_and, "__rand__": bitwise_and,
    "__or__": bitwise_or, "__ror__": bitwise_or, "__xor__": bitwise_xor,
    "__rxor__": bitwise_xor, "__invert__": invert, "__getitem__": _getitem,
    "reshape": _tracer_reshape, "astype": astype, "sum": sum, "mean": mean, "max": max,
    "min": min, "prod": prod, "argmax": argmax, "argmin": argmin, "any": any, "all": all,
    "transpose": _tracer_transpose, "squeeze": squeeze, "ravel": ravel, "flatten": ravel,
    "clip": clip, "swapaxes": swapaxes, "take": take,
}
def _install(name: str, fn) -> None:
    # A method named like a slot would replace the slot's descriptor and break every tracer.
    assert name not in Tracer.__slots__, f"Tracer.{name} is a slot, not a method"
    setattr(Tracer, name, fn)


for _name, _fn in _METHODS.items():
    _install(_name, _fn)
Tracer.T = property(lambda x: transpose(x))
Tracer.mT = property(lambda x: swapaxes(x, -1, -2))
Tracer.__hash__ = object.__hash__  # __eq__ is elementwise; identity hashing stays usable


# ---------------------------------------------------------------------------------------------
# Composite math (tgx/primitives/math.py): each binds one composite primitive.


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
# Tensor ops (cumsum is a composite; the rest is pure data movement)


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


def slice_axis(x, axis: int, start, stop):
    """x[..., start:stop, ...] along one axis; bounds are ints or symbolic dims."""
    a = _aval(x)
    axis = canonicalize_axis(axis, a.ndim, "slice_axis")
    starts, limits = [0] * a.ndim, list(a.shape)
    starts[axis], limits[axis] = as_dim(start), as_dim(stop)
    if builtins.all(type(s) is int and s == 0 for s in starts) and dim_eq(limits[axis],
                                                                          a.shape[axis]):
        return x
    return P.slice_p.bind(x, start_indices=tuple(starts), limit_indices=tuple(limits),
                          strides=None)


def split(x, indices_or_sections, axis: int = 0):
    """NumPy split: into equal sections (must divide the axis) or at the given indices."""
    a = _aval(x)
    axis = canonicalize_axis(axis, a.ndim, "split")
    d = a.shape[axis]
    if isinstance(indices_or_sections, int):
        n = indices_or_sections
        size = dim_div(d, n, f"split: array split does not result in an equal division "
                             f"({dim_str(d)} into {n})")
        bounds = [as_dim(i * size) for i in range(n + 1)]
    else:
        bounds = [0] + [as_dim(i) if i >= 0 else as_dim(d + i) for i in indices_or_sections]
        bounds.append(d)
    return [slice_axis(x, axis, lo, hi if dim_ge(hi, lo) else lo)
            for lo, hi in zip(bounds[:-1], bounds[1:])]


def array_split(x, sections: int, axis: int = 0):
    """NumPy array_split: `sections` parts, the first ones one longer (concrete axis only)."""
    a = _aval(x)
    axis = canonicalize_axis(axis, a.ndim, "array_split")
    d = a.shape[axis]
    if type(d) is not int:
        raise NotImplementedError("array_split needs a concrete axis length; use split")
    q, r = divmod(d, sections)
    sizes = [q + 1] * r + [q] * (sections - r)
    return split(x, list(np.cumsum(sizes)[:-1].tolist()), axis)


def chunk(x, chunks: int, dim: int = 0):
    """torch.chunk: parts of ceil(d / chunks) elements (the last may be shorter or absent)."""
    a = _aval(x)
    dim = canonicalize_axis(dim, a.ndim, "chunk")
    d = a.shape[dim]
    if type(d) is not int:
        return split(x, chunks, dim)
    size = -(-d // chunks)
    return split(x, list(range(size, d, size)), dim)


def tile(x, reps):
    """NumPy tile: repeat the whole array `reps` times along each axis."""
    reps = (reps,) if isinstance(reps, int) else tuple(reps)
    a = _aval(x)
    x = _as_operand(x)
    n = builtins.max(a.ndim, len(reps))
    shape = (1,) * (n - a.ndim) + tuple(a.shape)
    reps = (1,) * (n - len(reps)) + reps
    x = reshape(x, shape)
    big = []
    for r, d in zip(reps, shape):
        big += [r, d]
    out = P.broadcast_in_dim_p.bind(x, shape=tuple(big),
                                    broadcast_dimensions=tuple(range(1, 2 * n, 2)))
    return reshape(out, tuple(as_dim(r * d) for r, d in zip(reps, shape)))


def repeat(x, repeats, axis=None):
    """Repeat each element `repeats` times along `axis` (flattened when None): NumPy repeat,
    torch repeat_interleave. `repeats` is an int or a concrete sequence of ints."""
    if axis is None:
        x = ravel(x)
        axis = 0
    a = _aval(x)
    axis = canonicalize_axis(axis, a.ndim, "repeat")
    x = _as_operand(x)
    if isinstance(repeats, (int, np.integer)) or (np.ndim(repeats) == 0 and not isinstance(
            repeats, Tracer)):
        r = int(repeats)
        shape = a.shape[:axis + 1] + (r,) + a.shape[axis + 1:]
        dims = tuple(i if i <= axis else i + 1 for i in range(a.ndim))
        out = P.broadcast_in_dim_p.bind(x, shape=shape, broadcast_dimensions=dims)
        return reshape(out, a.shape[:axis] + (as_dim(a.shape[axis] * r),) + a.shape[axis + 1:])
    if isinstance(repeats, Tracer):
        raise TracerControlFlowError("repeat with traced repeats has a data-dependent shape")
    idx = np.repeat(np.arange(len(repeats)), np.asarray(repeats))
    return P.gather_p.bind(x, idx.astype(np.int64), axis=axis)


def roll(x, shift, axis=None):
    """Elements shifted by `shift` along `axis` (cyclically; flattened when None)."""
    if axis is None:
        a = _aval(x)
        return reshape(roll(ravel(x), shift, 0), a.shape)
    if isinstance(shift, (tuple, list)) or isinstance(axis, (tuple, list)):
        shifts = shift if isinstance(shift, (tuple, list)) else [shift] * len(axis)
        for s, ax in zip(shifts, axis):
            x = roll(x, s, ax)
        return x
    a = _aval(x)
    axis = canonicalize_axis(axis, a.ndim, "roll")
    d = a.shape[axis]
    if type(d) is int:
        if d == 0:
            return x
        shift = int(shift) % d
        if shift == 0:
            return x
    elif shift < 0:
        shift = as_dim(d + shift)  # assumes |shift| <= d
    cut = as_dim(d - shift)
    return concatenate([slice_axis(x, axis, cut, d), slice_axis(x, axis, 0, cut)], axis=axis)


def vstack(arrays):
    """Stack along the first axis (1-D arrays become rows)."""
    return concatenate([reshape(x, (1, -1)) if _aval(x).ndim < 2 else x for x in arrays], 0)


def hstack(arrays):
    """Stack along the second axis (the first for 1-D arrays)."""
    arrays = list(arrays)
    return concatenate(arrays, 0 if _aval(arrays[0]).ndim == 1 else 1)


row_stack = vstack

for _name, _fn in {"var": var, "std": std, "cumsum": cumsum, "repeat": repeat}.items():
    _METHODS[_name] = _fn
    _install(_name, _fn)
