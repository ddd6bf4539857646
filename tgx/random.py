"""`tgx.random`: JAX-style functional random numbers with explicit keys.

A key is a `uint32[2]` array; the same key gives the same bits on every backend (the bits come
from Threefry-2x32 in atomic integer ops, the counter scheme of JAX's partitionable mode, so
`bits` equals `jax.random.bits` for the same key). Keys are never reused: `split` them.

>>> import tgx.random as trandom
>>> k = trandom.key(0)
>>> k1, k2 = trandom.split(k)
>>> trandom.uniform(k1, (2, 3)).shape
(2, 3)
"""

from __future__ import annotations

import numpy as np

from . import numpy as tnp
from .primitives.math import erfinv_p
from .primitives.ops import _aval
from .primitives.random import threefry2x32_p
from .errors import DTypeError, Unsupported
from .shapes import as_dim, as_dtype, finfo, float32, float64, is_float, uint32
from .tracing import Tracer

__all__ = ["key", "PRNGKey", "split", "fold_in", "bits", "uniform", "normal", "bernoulli",
           "categorical", "truncated_normal", "gumbel", "threefry_2x32"]


def key(seed: int):
    """A key from an integer seed (equal to `jax.random.PRNGKey(seed)` for 0 <= seed < 2**64).

    >>> key(42)
    array([ 0, 42], dtype=uint32)
    """
    seed = int(seed)
    return np.array([(seed >> 32) & 0xFFFFFFFF, seed & 0xFFFFFFFF], dtype=np.uint32)


PRNGKey = key


def threefry_2x32(k0, k1, x0, x1):
    """Threefry-2x32 of counters (x0, x1) under key (k0, k1); all uint32, broadcasting."""
    args = [tnp.asarray(a, uint32) if not isinstance(a, Tracer) else a
            for a in (k0, k1, x0, x1)]
    return threefry2x32_p.bind(*args)


def _key_words(k):
    a = _aval(k)
    if a.dtype != uint32 or tuple(a.shape) != (2,):
        raise DTypeError(f"a key must be a uint32[2] array (tgx.random.key), got {a.str_short()}")
    return tnp.index_axis(k, 0, 0), tnp.index_axis(k, 0, 1)


def _norm_shape(shape) -> tuple:
    if isinstance(shape, (int, str)) or not hasattr(shape, "__iter__"):
        shape = (shape,)
    return tuple(as_dim(d) for d in shape)


def _size(shape):
    n = 1
    for d in shape:
        n = n * d
    return n if isinstance(n, int) else as_dim(n)


def _counters(shape):
    """(hi, lo) words of each element's flat index (hi is 0: fewer than 2**32 elements)."""
    n = _size(shape)
    lo = tnp.reshape(tnp.iota(uint32, (n,), 0), shape)
    return np.zeros((), np.uint32), lo


def bits(key, shape=(), dtype=uint32):
    """Random uint32 bits of `shape` (symbolic dims allowed); equals `jax.random.bits`."""
    if as_dtype(dtype) != uint32:
        raise Unsupported("tgx.random.bits supports uint32 only")
    shape = _norm_shape(shape)
    k0, k1 = _key_words(key)
    hi, lo = _counters(shape)
    y0, y1 = threefry2x32_p.bind(k0, k1, hi, lo)
    return tnp.bitwise_xor(y0, y1)


def split(key, num: int = 2):
    """`num` new keys, as a uint32[num, 2] array (equals `jax.random.split`)."""
    k0, k1 = _key_words(key)
    hi, lo = _counters((num,))
    y0, y1 = threefry2x32_p.bind(k0, k1, hi, lo)
    return tnp.stack([y0, y1], axis=-1)


def fold_in(key, data: int):
    """A new key from `key` and an integer (equals `jax.random.fold_in`)."""
    k0, k1 = _key_words(key)
    d = np.asarray(data, np.uint32)
    y0, y1 = threefry2x32_p.bind(k0, k1, np.zeros((), np.uint32), d)
    return tnp.stack([y0, y1], axis=0)


def _unit(key, shape, dtype):
    """Uniform in [0, 1): 24 random bits for float32 and below, 53 for float64."""
    if dtype == float64:
        b = bits(key, (2,) + shape)
        a = tnp.right_shift_logical(tnp.index_axis(b, 0, 0), 5)
        c = tnp.right_shift_logical(tnp.index_axis(b, 0, 1), 6)
        hi = tnp.multiply(tnp.astype(a, float64), 67108864.0)
        return tnp.multiply(tnp.add(hi, tnp.astype(c, float64)), 2.0 ** -53)
    b = tnp.right_shift_logical(bits(key, shape), 8)
    return tnp.multiply(tnp.astype(b, float32), 2.0 ** -24)


def uniform(key, shape=(), dtype=float32, minval=0.0, maxval=1.0):
    """Uniform floats in [minval, maxval) of `shape`."""
    dtype = as_dtype(dtype)
    if not is_float(dtype):
        raise DTypeError(f"uniform needs a floating dtype, got {dtype}")
    shape = _norm_shape(shape)
    work = float64 if dtype == float64 else float32
    u = _unit(key, shape, work)
    lo, hi = tnp.astype(tnp.asarray(minval), work), tnp.astype(tnp.asarray(maxval), work)
    out = tnp.add(tnp.multiply(u, tnp.subtract(hi, lo)), lo)
    out = tnp.astype(out, dtype)
    if isinstance(maxval, (int, float)) and isinstance(minval, (int, float)):
        # rounding to a narrower dtype may reach maxval; keep the interval half-open
        eps, step = float(finfo(dtype).eps), 0.5
        top = np.asarray(maxval, np.float64).astype(dtype)
        while float(top) >= maxval:
            top = np.asarray(maxval - (abs(maxval) or 1.0) * eps * step).astype(dtype)
            step *= 2
        out = tnp.minimum(tnp.maximum(out, np.asarray(minval).astype(dtype)), top)
    return out


def normal(key, shape=(), dtype=float32):
    """Standard normal samples (Box–Muller over two uniforms per element)."""
    dtype = as_dtype(dtype)
    shape = _norm_shape(shape)
    work = float64 if dtype == float64 else float32
    u = _unit(key, (2,) + shape, work)
    u1 = tnp.subtract(1.0, tnp.index_axis(u, 0, 0))  # (0, 1]: log is finite
    u2 = tnp.index_axis(u, 0, 1)
    r = tnp.sqrt(tnp.multiply(tnp.log(u1), -2.0))
    return tnp.astype(tnp.multiply(r, tnp.cos(tnp.multiply(u2, 2 * np.pi))), dtype)


def bernoulli(key, p=0.5, shape=None):
    """Bool samples, True with probability `p` (shape defaults to p's shape)."""
    shape = tnp.shape(p) if shape is None else _norm_shape(shape)
    return tnp.less(uniform(key, shape), p)


def gumbel(key, shape=(), dtype=float32):
    """Standard Gumbel samples: -log(-log(u)), u uniform in (0, 1)."""
    dtype = as_dtype(dtype)
    tiny = float(np.finfo(np.float32).tiny)
    u = uniform(key, shape, float64 if dtype == float64 else float32, minval=tiny, maxval=1.0)
    return tnp.astype(tnp.negative(tnp.log(tnp.negative(tnp.log(u)))), dtype)


def categorical(key, logits, axis: int = -1, shape=None):
    """Indices sampled from the categorical distribution softmax(logits) along `axis`
    (the Gumbel-max trick); `shape` (default: logits' shape without `axis`) must end with
    the batch shape of `logits`."""
    logits = tnp.moveaxis(tnp.asarray(logits), axis, -1)
    a = _aval(logits)
    batch = tuple(a.shape[:-1])
    shape = batch if shape is None else _norm_shape(shape)
    noise = gumbel(key, shape + (a.shape[-1],), a.dtype if is_float(a.dtype) else float32)
    return tnp.argmax(tnp.add(noise, logits), axis=-1)


def truncated_normal(key, lower, upper, shape=None, dtype=float32):
    """Normal samples conditioned on lower < x < upper (inverse CDF through erfinv)."""
    dtype = as_dtype(dtype)
    if shape is None:
        shape = tuple(np.broadcast_shapes(np.shape(lower), np.shape(upper)))
    shape = _norm_shape(shape)
    work = float64 if dtype == float64 else float32
    sqrt2 = float(np.sqrt(2.0))
    lo = tnp.astype(tnp.asarray(lower), work)
    hi = tnp.astype(tnp.asarray(upper), work)
    a = tnp.erf(tnp.divide(lo, sqrt2))
    b = tnp.erf(tnp.divide(hi, sqrt2))
    u = tnp.add(tnp.multiply(_unit(key, shape, work), tnp.subtract(b, a)), a)
    out = tnp.multiply(erfinv_p.bind(u), sqrt2)
    return tnp.astype(tnp.minimum(tnp.maximum(out, lo), hi), dtype)
