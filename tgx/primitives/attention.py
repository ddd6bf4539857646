"""Scaled dot-product attention as one composite primitive, with torch's semantics.

`sdpa(q, k, v[, mask])`: q (..., Hq, L, E), k (..., Hk, S, E), v (..., Hk, S, Ev) → (..., Hq, L,
Ev). Batch dims broadcast. A bool mask keeps the positions that are True; a float mask is
added to the scores. `is_causal` keeps `tril(ones(L, S))` (top-left aligned, as torch).
`enable_gqa` repeats each k/v head Hq / Hk times (repeat_interleave). A query row whose every
key is masked out gives zeros, like torch's math kernel (`_safe_softmax`), not NaN.
"""

from __future__ import annotations

import numpy as np

from ..core import Primitive
from ..errors import DTypeError, ShapeError
from ..shapes import (
    ShapedArray,
    bfloat16,
    bool_,
    broadcast_shapes,
    dim_div,
    dim_eq,
    dim_str,
    float16,
    float32,
    is_float,
)
from . import ops

sdpa_p = Primitive("scaled_dot_product_attention", family="attention")


def _batch_shapes(q, k, v, enable_gqa):
    """(broadcast batch dims of the output, repeats of the k/v heads)."""
    for name, a in (("query", q), ("key", k), ("value", v)):
        if a.ndim < 2:
            raise ShapeError(f"scaled_dot_product_attention: {name} must be (..., L, E), got {a}")
    if not dim_eq(q.shape[-1], k.shape[-1]):
        raise ShapeError(f"scaled_dot_product_attention: query and key head dims differ: "
                         f"{q} vs {k}")
    if not dim_eq(k.shape[-2], v.shape[-2]):
        raise ShapeError(f"scaled_dot_product_attention: key and value lengths differ: "
                         f"{k} vs {v}")
    reps = 1
    kb, vb = k.shape[:-2], v.shape[:-2]
    if enable_gqa and q.ndim >= 3 and k.ndim >= 3:
        if not dim_eq(k.shape[-3], v.shape[-3]):
            raise ShapeError(f"scaled_dot_product_attention: key and value head counts differ: "
                             f"{k} vs {v}")
        reps = dim_div(q.shape[-3], k.shape[-3], "scaled_dot_product_attention (enable_gqa): "
                                                 "query heads into key/value heads")
        kb = kb[:-1] + (q.shape[-3],)
        vb = vb[:-1] + (q.shape[-3],)
    batch = broadcast_shapes(q.shape[:-2], kb, vb, op="scaled_dot_product_attention")
    return batch, reps


@sdpa_p.def_shape
def _sdpa_shape(q, k, v, *mask, has_mask, is_causal, scale, enable_gqa):
    if not (is_float(q.dtype) and q.dtype == k.dtype == v.dtype):
        raise DTypeError(f"scaled_dot_product_attention: query, key and value must share a "
                         f"floating dtype, got {q.str_short()}, {k.str_short()}, "
                         f"{v.str_short()}")
    batch, _ = _batch_shapes(q, k, v, enable_gqa)
    if has_mask:
        m = mask[0]
        if m.dtype != bool_ and m.dtype != q.dtype:
            raise DTypeError(f"scaled_dot_product_attention: attn_mask must be bool or "
                             f"{q.dtype}, got {m.str_short()}")
        full = batch + (q.shape[-2], k.shape[-2])
        if broadcast_shapes(m.shape, full, op="scaled_dot_product_attention mask") != full:
            raise ShapeError(f"scaled_dot_product_attention: attn_mask {m} does not broadcast "
                             f"to the scores' shape ({', '.join(dim_str(d) for d in full)})")
        if is_causal:
            raise ShapeError("scaled_dot_product_attention: pass either attn_mask or is_causal")
    return ShapedArray(batch + (q.shape[-2], v.shape[-1]), q.dtype)


@sdpa_p.def_impl
def _sdpa_impl(q, k, v, *mask, has_mask, is_causal, scale, enable_gqa):
    _, reps = _batch_shapes(*(ShapedArray(a.shape, np.dtype(np.float32)) for a in (q, k, v)),
                            enable_gqa)
    q64, k64, v64 = (a.astype(np.float64, copy=False) for a in (q, k, v))
    if reps != 1:
        k64, v64 = np.repeat(k64, reps, axis=-3), np.repeat(v64, reps, axis=-3)
    s = np.matmul(q64, np.swapaxes(k64, -1, -2)) * scale
    L, S = s.shape[-2:]
    if is_causal:
        s = np.where(np.tril(np.ones((L, S), bool)), s, -np.inf)
    if has_mask:
        m = mask[0]
        s = np.where(m, s, -np.inf) if m.dtype == np.bool_ else s + m.astype(np.float64)
    mx = np.max(s, axis=-1, keepdims=True)
    mx = np.where(np.isneginf(mx), 0.0, mx)
    e = np.exp(s - mx)
    den = e.sum(-1, keepdims=True)
    p = e / np.where(den == 0, 1.0, den)
    return np.matmul(p, v64).astype(q.dtype)


def _repeat_heads(x, reps):
    """repeat_interleave along axis -3 via broadcast + reshape."""
    a = ops._aval(x)
    h = a.shape[-3]
    x = ops.expand_dims(x, a.ndim - 2)
    x = ops.broadcast_to(x, a.shape[:-2] + (reps,) + a.shape[-2:])
    return ops.reshape(x, a.shape[:-3] + (h * reps,) + a.shape[-2:])


def _safe_softmax(s):
    """Softmax over the last axis with max subtraction; an all -inf row gives zeros."""
    m = ops.max(s, axis=-1, keepdims=True)
    m = ops.where(ops.equal(m, -np.inf), 0, m)
    e = ops.exp(ops.subtract(s, m))
    den = ops.sum(e, axis=-1, keepdims=True)
    return ops.divide(e, ops.where(ops.equal(den, 0), 1, den))


@sdpa_p.def_decomposition
def _sdpa_decomp(q, k, v, *mask, has_mask, is_causal, scale, enable_gqa):
    dt = ops._aval(q).dtype
    _, reps = _batch_shapes(ops._aval(q), ops._aval(k), ops._aval(v), enable_gqa)
    up = (lambda x: ops.astype(x, float32)) if dt in (float16, bfloat16) else (lambda x: x)
    q, k, v = up(q), up(k), up(v)
    if reps != 1:
        k, v = _repeat_heads(k, reps), _repeat_heads(v, reps)
    s = ops.multiply(ops.matmul(q, ops.swapaxes(k, -1, -2)), scale)
    L, S = ops._aval(s).shape[-2:]
    if is_causal:
        s = ops.where(ops.tri(L, S, dtype=bool_), s, -np.inf)
    if has_mask:
        m = mask[0]
        s = ops.where(m, s, -np.inf) if ops._aval(m).dtype == bool_ else ops.add(s, up(m))
    return ops.astype(ops.matmul(_safe_softmax(s), v), dt)


ATTENTION = [sdpa_p]
