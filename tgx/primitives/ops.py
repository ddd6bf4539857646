"""The lax level below `tgx.numpy`: jax.numpy-style dtype promotion and the NumPy-named
binders of *atomic* primitives.

Decompositions of composite primitives are written with these (and with the binders of other
composites, declared beside their primitives in their family files), so no primitive imports
the user-facing `tgx.numpy`. `tgx.numpy` re-exports every public name: `tnp.add is ops.add`.
Python scalars are weakly typed; outside a trace every binder runs eagerly on NumPy.

>>> import numpy as np
>>> from tgx.primitives import ops
>>> ops.add(np.float32(1), 2).dtype
dtype('float32')
"""

from __future__ import annotations

import builtins
from collections.abc import Sequence
from typing import Any

import numpy as np
import sympy

from ..core import Literal
from ..errors import (
    DTypeError,
    IndexingError,
    ShapeError,
    TracerControlFlowError,
    Unsupported,
    user_site,
)
from ..shapes import (
    DEFAULT_FLOAT,
    DEFAULT_INT,
    ShapedArray,
    SymDim,
    as_dim,
    as_dtype,
    bfloat16,
    float16,
    aval_of,
    bool_,
    broadcast_shapes,
    canonicalize_axes,
    canonicalize_axis,
    dim_div,
    dim_eq,
    dim_ge,
    dim_str,
    float32,
    int32,
    int64,
    is_float,
    is_int,
    promote,
    shape_str,
)
from ..tracing import Tracer
from .elementwise import (
    add_p,
    and_p,
    atan_p,
    convert_element_type_p,
    cos_p,
    div_p,
    eq_p,
    erf_p,
    exp_p,
    floor_p,
    ge_p,
    gt_p,
    le_p,
    log_p,
    lt_p,
    max_p,
    min_p,
    mul_p,
    ne_p,
    neg_p,
    not_p,
    or_p,
    select_p,
    shift_left_p,
    shift_right_logical_p,
    sin_p,
    sqrt_p,
    sub_p,
    xor_p,
)
from .linalg import dot_general_p
from .movement import (
    broadcast_in_dim_p,
    concatenate_p,
    dim_as_value_p,
    gather_p,
    iota_p,
    reshape_p,
    rev_p,
    slice_p,
    transpose_p,
)
from .reductions import argmax_p, reduce_max_p, reduce_min_p, reduce_sum_p

# ---------------------------------------------------------------------------------------------
# Helpers: avals, casts, promotion


def _aval(x: Any) -> ShapedArray:
    if isinstance(x, (Tracer, Literal)):
        return x.aval
    if isinstance(x, SymDim):
        x = x.expr
    if isinstance(x, sympy.Basic):  # a symbolic size used as a number (`x / x.shape[0]`)
        return ShapedArray((), DEFAULT_INT if x.is_integer else DEFAULT_FLOAT, True)
    return aval_of(x)


def _is_array(x: Any) -> bool:
    # Literals reach op wrappers when a transform re-runs a graph (tgx.transforms.rewrite).
    return isinstance(x, (Tracer, Literal, np.ndarray, np.generic))


def _as_operand(x):
    if isinstance(x, (bool, int, float)):
        return np.asarray(x, dtype=aval_of(x).dtype)
    return x


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


def _cast(x: Any, dtype: np.dtype, weak: bool = False):
    if isinstance(x, SymDim):
        x = x.expr
    if isinstance(x, sympy.Basic):
        return dim_as_value_p.bind(expr=x, dtype=dtype)
    if isinstance(x, (bool, int, float)):
        return np.asarray(x, dtype=dtype)[()]
    if isinstance(x, np.generic) or (isinstance(x, np.ndarray) and x.ndim == 0):
        return np.asarray(x).astype(dtype)[()]
    if _aval(x).dtype == dtype:
        return x
    return convert_element_type_p.bind(x, new_dtype=dtype, weak_type=weak)


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


def _unary_op(prim, doc: str, name: str | None = None):
    """A float unary wrapper over `prim` (integers become the default float first)."""
    def fn(x):
        return _unary_float(prim, _as_operand(x))

    fn.__name__ = fn.__qualname__ = name or prim.name
    fn.__doc__ = doc
    return fn


def upcast_half(x):
    """`x` in float32 when it is float16 / bfloat16, else `x`: decompositions compute half
    precision in float32, as torch's CPU kernels accumulate."""
    return astype(x, float32) if _aval(x).dtype in (float16, bfloat16) else x


def _shape_value(d, dtype=DEFAULT_FLOAT):
    """A dim as a scalar operand: a Python number, or `dim_as_value` when symbolic."""
    if type(d) is int:
        return d
    return dim_as_value_p.bind(expr=d, dtype=dtype)


def _prod_dims(dims):
    out = 1
    for d in dims:
        out = out * d
    return as_dim(out) if not isinstance(out, int) else out


def _norm_shape(newshape, size, op="reshape") -> tuple:
    if isinstance(newshape, (int, str, sympy.Basic, SymDim)) or (
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


# ---------------------------------------------------------------------------------------------
# Elementwise


def add(x, y):
    """Elementwise x + y with broadcasting. >>> add(1, 2)  # doctest: +SKIP"""
    return _binary(add_p, x, y)


def subtract(x, y):
    return _binary(sub_p, x, y)


def multiply(x, y):
    return _binary(mul_p, x, y)


def divide(x, y):
    """True division; integers divide as the default float (like NumPy's `/`)."""
    x, y = _float_args(x, y)
    return div_p.bind(x, y)


true_divide = divide


def negative(x):
    return neg_p.bind(x) if _is_array(x) else -x


exp = _unary_op(exp_p, "e ** x, elementwise.")
log = _unary_op(log_p, "Natural logarithm (NaN below 0, -inf at 0).")
sin = _unary_op(sin_p, "Sine.")
cos = _unary_op(cos_p, "Cosine.")
sqrt = _unary_op(sqrt_p, "Square root (NaN below 0).")
arctan = _unary_op(atan_p, "Inverse tangent.", "arctan")
erf = _unary_op(erf_p, "The error function (atomic: no accurate decomposition exists).")


def floor(x):
    return x if is_int(_aval(x).dtype) else _unary_float(floor_p, x)


def maximum(x, y):
    return _binary(max_p, x, y)


def minimum(x, y):
    return _binary(min_p, x, y)


# ---------------------------------------------------------------------------------------------
# Comparisons and logic


def equal(x, y):
    return _binary(eq_p, x, y)


def not_equal(x, y):
    return _binary(ne_p, x, y)


def less(x, y):
    return _binary(lt_p, x, y)


def less_equal(x, y):
    return _binary(le_p, x, y)


def greater(x, y):
    return _binary(gt_p, x, y)


def greater_equal(x, y):
    return _binary(ge_p, x, y)


def _bitwise(prim, x, y):
    (x, y), dtype, _ = _promoted(x, y)
    if not (is_int(dtype) or dtype == bool_):
        raise DTypeError(f"{prim.name} needs integer or bool operands, got {dtype}")
    return prim.bind(x, y)


def bitwise_and(x, y):
    return _bitwise(and_p, x, y)


def bitwise_or(x, y):
    return _bitwise(or_p, x, y)


def bitwise_xor(x, y):
    return _bitwise(xor_p, x, y)


def invert(x):
    return not_p.bind(x)


bitwise_not = invert


def logical_and(x, y):
    return and_p.bind(astype(x, bool_), astype(y, bool_))


def logical_or(x, y):
    return or_p.bind(astype(x, bool_), astype(y, bool_))


def logical_xor(x, y):
    return ne_p.bind(astype(x, bool_), astype(y, bool_))


def logical_not(x):
    return not_p.bind(astype(x, bool_))


def left_shift(x, y):
    (x, y), _, _ = _promoted(x, y)
    return shift_left_p.bind(x, y)


def right_shift_logical(x, y):
    (x, y), _, _ = _promoted(x, y)
    return shift_right_logical_p.bind(x, y)


def where(condition, x=None, y=None):
    """Elementwise select with broadcasting; `condition` becomes bool. (The one-argument form
    has a data-dependent shape and cannot be traced.)"""
    if x is None or y is None:
        raise TracerControlFlowError("where(condition) with one argument has a data-dependent "
                                     "shape; pass x and y")
    (x, y), _, _ = _promoted(x, y)
    return select_p.bind(astype(condition, bool_), x, y)


def astype(x, dtype):
    """Cast to `dtype` (float → int truncates toward zero)."""
    dtype = as_dtype(dtype)
    if isinstance(x, (bool, int, float)):
        return np.asarray(x, dtype=dtype)[()]
    if _aval(x).dtype == dtype:
        return x
    return convert_element_type_p.bind(x, new_dtype=dtype, weak_type=False)


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
    return _reduce(reduce_sum_p, x, axis, keepdims)


def max(x, axis=None, keepdims=False):  # noqa: A001
    return _reduce(reduce_max_p, x, axis, keepdims)


def min(x, axis=None, keepdims=False):  # noqa: A001
    return _reduce(reduce_min_p, x, axis, keepdims)


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
    return _arg_reduce(argmax_p, x, axis, keepdims)


# ---------------------------------------------------------------------------------------------
# Shapes and movement


def shape(x) -> tuple:
    return _aval(x).shape


def ndim(x) -> int:
    return _aval(x).ndim


def reshape(x, newshape, order="C"):
    """Reshape (one dim may be -1; symbolic dims allowed: `(N, 8) → (-1, 4)` gives `(2*N, 4)`)."""
    if order != "C":
        raise Unsupported("reshape supports order='C' only")
    a = _aval(x)
    new = _norm_shape(newshape, a.size)
    if len(new) == len(a.shape) and builtins.all(
            (type(p) is int and type(q) is int and p == q) or p is q for p, q in zip(new, a.shape)):
        return x
    return reshape_p.bind(x, new_sizes=new)


def ravel(x):
    return reshape(x, (-1,))


def transpose(x, axes=None):
    a = _aval(x)
    axes = tuple(reversed(range(a.ndim))) if axes is None else tuple(
        canonicalize_axis(ax, a.ndim, "transpose") for ax in axes)
    if axes == tuple(range(a.ndim)):
        return x
    return transpose_p.bind(x, permutation=axes)


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
    return broadcast_in_dim_p.bind(x, shape=shape, broadcast_dimensions=tuple(
        range(len(shape) - a.ndim, len(shape))))


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
    return concatenate_p.bind(*arrays, dimension=axis)


def stack(arrays: Sequence, axis: int = 0):
    arrays = list(arrays)
    if not arrays:
        raise ShapeError("stack: needs at least one array")
    n = _aval(arrays[0]).ndim + 1
    axis = canonicalize_axis(axis, n, "stack")
    return concatenate([expand_dims(x, axis) for x in arrays], axis=axis)


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
    return gather_p.bind(x, idx, axis=axis)


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
    out_of_bounds = f"index {i} is out of bounds for axis {axis} with size {dim_str(d)}"
    if i < 0:
        i = as_dim(d + i)
        if type(i) is int and i < 0 or not dim_ge(i, 0):
            raise IndexingError(out_of_bounds)
    elif not dim_ge(d, i + 1):
        raise IndexingError(out_of_bounds)
    start = [0] * a.ndim
    limit = list(a.shape)
    start[axis], limit[axis] = i, as_dim(i + 1)
    s = slice_p.bind(x, start_indices=tuple(start), limit_indices=tuple(limit), strides=None)
    return reshape(s, a.shape[:axis] + a.shape[axis + 1:])


def slice_axis(x, axis: int, start, stop):
    """x[..., start:stop, ...] along one axis; bounds are ints or symbolic dims."""
    a = _aval(x)
    axis = canonicalize_axis(axis, a.ndim, "slice_axis")
    starts, limits = [0] * a.ndim, list(a.shape)
    starts[axis], limits[axis] = as_dim(start), as_dim(stop)
    if builtins.all(type(s) is int and s == 0 for s in starts) and dim_eq(limits[axis],
                                                                          a.shape[axis]):
        return x
    return slice_p.bind(x, start_indices=tuple(starts), limit_indices=tuple(limits),
                          strides=None)


def flip(x, axis=None):
    a = _aval(x)
    axes = canonicalize_axes(axis, a.ndim, "flip")
    return rev_p.bind(x, dimensions=axes) if axes else x


# ---------------------------------------------------------------------------------------------
# Matrix product


def matmul(a, b):
    """Matrix product with NumPy semantics: 1-D operands, and batch dims that broadcast."""
    (a, b), _, _ = _promoted(a, b)
    a, b = _as_operand(a), _as_operand(b)
    sa, sb = _aval(a).shape, _aval(b).shape
    if not sa or not sb:
        raise ShapeError(f"matmul: operands must be at least 1-D (use multiply for scalars), "
                         f"got {_aval(a).str_short()} @ {_aval(b).str_short()}{user_site()}")
    squeeze_a, squeeze_b = len(sa) == 1, len(sb) == 1
    if squeeze_a:
        a = reshape(a, (1,) + sa)
    if squeeze_b:
        b = reshape(b, sb + (1,))
    sa, sb = _aval(a).shape, _aval(b).shape
    if not dim_eq(sa[-1], sb[-2]):
        raise ShapeError(f"matmul: contracting dimensions differ: {shape_str(sa)} @ "
                         f"{shape_str(sb)} ({dim_str(sa[-1])} vs {dim_str(sb[-2])})"
                         f"{user_site()}")
    if len(sb) == 2:
        # (..., M, K) @ (K, N): contract directly, no batch dims needed.
        out = dot_general_p.bind(a, b, dimension_numbers=(((len(sa) - 1,), (0,)), ((), ())))
    elif len(sa) == 2:
        # (M, K) @ (..., K, N): contract, then move N's batch dims to the front.
        out = dot_general_p.bind(a, b, dimension_numbers=(((1,), (len(sb) - 2,)), ((), ())))
        nb = len(sb) - 2
        out = transpose(out, tuple(range(1, nb + 1)) + (0, nb + 1))
    else:
        batch = broadcast_shapes(sa[:-2], sb[:-2], op="matmul")
        a = broadcast_to(a, batch + sa[-2:])
        b = broadcast_to(b, batch + sb[-2:])
        nb = len(batch)
        out = dot_general_p.bind(a, b, dimension_numbers=(((nb + 1,), (nb,)),
                                                            (tuple(range(nb)), tuple(range(nb)))))
    if squeeze_a:
        out = squeeze(out, -2)
    if squeeze_b:
        out = squeeze(out, -1)
    return out


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
    return broadcast_in_dim_p.bind(v, shape=shape, broadcast_dimensions=())


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


def iota(dtype, shape, dimension=0):
    shape = tuple(as_dim(d) for d in shape)
    return iota_p.bind(dtype=as_dtype(dtype), shape=shape, dimension=dimension)


def tri(n, m=None, k=0, dtype=float32):
    m = n if m is None else m
    rows = iota(int64, (n, m), 0)
    cols = iota(int64, (n, m), 1)
    return astype(less_equal(cols, add(rows, k)), dtype)
