"""Array creation of `tgx.numpy` beyond `full`, `zeros`, `ones`, `*_like`, `iota` and `tri`
(in `tgx.primitives.ops`)."""

from __future__ import annotations

import builtins

import numpy as np

from .. import primitives as P
from ..errors import Unsupported
from ..primitives.ops import (
    _aval,
    _cast,
    add,
    asarray,
    astype,
    equal,
    iota,
    multiply,
    tri,
    where,
    zeros,
)
from ..shapes import DEFAULT_FLOAT, DEFAULT_INT, as_dim, as_dtype, bool_, float32, int64

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
