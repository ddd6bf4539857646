"""Array creation of `tgx.numpy` beyond `full`, `zeros`, `ones`, `*_like`, `iota` and `tri`
(in `tgx.primitives.ops`)."""

from __future__ import annotations

import builtins

import numpy as np

from .. import primitives as P
from ..errors import ShapeError, Unsupported
from ..primitives.ops import (
    _as_operand,
    _aval,
    _cast,
    add,
    asarray,
    astype,
    broadcast_to,
    divide,
    equal,
    floor,
    iota,
    moveaxis,
    multiply,
    reshape,
    subtract,
    tri,
    where,
    zeros,
)
from ..shapes import (
    DEFAULT_FLOAT,
    DEFAULT_INT,
    as_dim,
    as_dtype,
    bfloat16,
    bool_,
    broadcast_shapes,
    float16,
    float32,
    float64,
    int64,
    is_int,
    promote,
)

array = asarray


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
            raise Unsupported("arange with a symbolic bound supports step=1 only")
        n = as_dim(stop - start)
    out = P.iota_p.bind(dtype=dtype, shape=(n,), dimension=0)
    if step != 1:
        out = multiply(out, _cast(step, dtype))
    if start != 0:
        out = add(out, _cast(start, dtype))
    return out


def eye(n, m=None, k=0, dtype=float32):
    m = n if m is None else m
    rows = iota(int64, (n, m), 0)
    cols = iota(int64, (n, m), 1)
    return astype(equal(add(rows, k), cols), dtype)


def tril(x, k=0):
    a = _aval(x)
    mask = tri(a.shape[-2], a.shape[-1], k, dtype=bool_)
    return where(mask, x, zeros((), a.dtype))


def triu(x, k=0):
    a = _aval(x)
    mask = tri(a.shape[-2], a.shape[-1], k - 1, dtype=bool_)
    return where(mask, zeros((), a.dtype), x)


def linspace(start, stop, num: int = 50, endpoint: bool = True, retstep: bool = False,
             dtype=None, axis: int = 0):
    """`num` evenly spaced values from `start` to `stop` (NumPy's formula: `start + i * step`,
    the last value exactly `stop` when `endpoint`). `start` and `stop` may be arrays (they
    broadcast; the new axis is `axis`); `num` is a Python int. The default dtype is the
    operands' float dtype, float32 for Python numbers (NumPy: float64). Integer dtypes round
    toward -inf, as NumPy 2, from a float64 computation.

    >>> linspace(0.0, 1.0, 5)
    array([0.  , 0.25, 0.5 , 0.75, 1.  ], dtype=float32)
    """
    num = int(num)
    if num < 0:
        raise ShapeError(f"linspace: num must be non-negative, got {num}")
    ct, _ = promote(_aval(start), _aval(stop), (DEFAULT_FLOAT, True))  # a float, as NumPy
    out_dtype = as_dtype(dtype) if dtype is not None else ct
    if is_int(out_dtype) or out_dtype == bool_:
        ct = float64
    elif dtype is not None:
        ct = out_dtype
    ct_h = float32 if ct in (float16, bfloat16) else ct  # half: computed in float32
    start, stop = astype(start, ct_h), astype(stop, ct_h)
    bshape = broadcast_shapes(_aval(start).shape, _aval(stop).shape, op="linspace")
    div = num - 1 if endpoint else num
    delta = subtract(stop, start)
    step = divide(delta, div) if div > 0 else multiply(delta, np.nan)
    i = iota(ct_h, (num,) + bshape, 0)
    y = add(multiply(i, step if div > 0 else 0.0), start)
    if endpoint and num > 1:
        last = equal(iota(int64, (num,) + bshape, 0), num - 1)
        y = where(last, broadcast_to(stop, (num,) + bshape), y)
    if is_int(out_dtype):
        y = floor(y)
    y = astype(y, out_dtype)
    if axis != 0:
        y = moveaxis(y, 0, axis)
    return (y, astype(step, ct)) if retstep else y


def diag(v, k: int = 0):
    """A 1-D `v` on the `k`-th diagonal of a square matrix, or the `k`-th diagonal of a 2-D
    `v` (concrete dims), as NumPy.

    >>> diag(np.array([[1, 2], [3, 4]]))
    array([1, 4])
    """
    k = int(k)
    a = _aval(v)
    v = _as_operand(v)
    if a.ndim == 1:
        m = as_dim(a.shape[0] + builtins.abs(k))
        rows, cols = iota(int64, (m, m), 0), iota(int64, (m, m), 1)
        on_diag = equal(subtract(cols, rows), k)
        vpad = P.pad_p.bind(v, np.zeros((), a.dtype), padding_config=((0, builtins.abs(k), 0),))
        vals = P.broadcast_in_dim_p.bind(vpad, shape=(m, m),
                                         broadcast_dimensions=(0,) if k >= 0 else (1,))
        return where(on_diag, vals, zeros((), a.dtype))
    if a.ndim != 2:
        raise ShapeError(f"diag: input must be 1-D or 2-D, got {a.str_short()}")
    n, m = a.shape
    if type(n) is not int or type(m) is not int:
        raise Unsupported(f"diag of a matrix needs concrete dims, got {a.str_short()}")
    start = k if k >= 0 else -k * m
    length = builtins.max(0, builtins.min(n, m - k) if k >= 0 else builtins.min(n + k, m))
    flat = reshape(v, (n * m,))
    if length == 0:
        return P.slice_p.bind(flat, start_indices=(0,), limit_indices=(0,), strides=None)
    return P.slice_p.bind(flat, start_indices=(start,),
                          limit_indices=(start + (length - 1) * (m + 1) + 1,),
                          strides=(m + 1,))
