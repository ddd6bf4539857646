"""Linear algebra layers, embedding and rotary position embedding as composite primitives.

- `linear(x, w[, b])`: x @ w.T + b with torch's weight layout (out, in).
- `matmul(a, b)`: torch.matmul / NumPy matmul (1-D operands, broadcast batch dims).
- `embedding(idx, w)`: rows of `w` (a `gather` on axis 0).
- `apply_rotary_emb(x, cos, sin)`: `x * cos + rotate_half(x) * sin` (Llama / Gemma, HF's
  rotate_half: the two halves of the last axis, not interleaved pairs).
- `rope_cos_sin(positions)`: the matching tables, `cos/sin(cat(p f, p f))` with
  `f = base ** (-2i / head_dim)`.
"""

from __future__ import annotations

import numpy as np

from ..core import Primitive
from ..errors import DTypeError, ShapeError
from ..shapes import (
    ShapedArray,
    broadcast_shapes,
    dim_eq,
    dim_str,
    is_float,
    is_int,
    shape_str,
)
from . import ops
from .linalg import dot_general_p

# ---------------------------------------------------------------------------------------------
linear_p = Primitive("linear", family="layers")


@linear_p.def_shape
def _linear_shape(x, w, *b):
    if x.ndim < 1 or w.ndim != 2:
        raise ShapeError(f"linear: input must be (..., in) and weight (out, in), got {x} and {w}")
    if not dim_eq(x.shape[-1], w.shape[1]):
        raise ShapeError(f"linear: input features {dim_str(x.shape[-1])} do not match weight "
                         f"{w} (out, in)")
    if b and not (b[0].ndim == 1 and dim_eq(b[0].shape[0], w.shape[0])):
        raise ShapeError(f"linear: bias must have shape ({dim_str(w.shape[0])},), got {b[0]}")
    if not (x.dtype == w.dtype and all(a.dtype == x.dtype for a in b)):
        raise DTypeError(f"linear: operands must share a dtype, got {x.str_short()}, "
                         f"{w.str_short()}" + "".join(f", {a.str_short()}" for a in b))
    return ShapedArray(x.shape[:-1] + (w.shape[0],), x.dtype)


@linear_p.def_impl
def _linear_impl(x, w, *b):
    y = np.matmul(x.astype(np.float64, copy=False), w.astype(np.float64, copy=False).T)
    return (y + b[0] if b else y).astype(x.dtype)


@linear_p.def_decomposition
def _linear_decomp(x, w, *b):
    nd = ops._aval(x).ndim
    y = dot_general_p.bind(x, w, dimension_numbers=(((nd - 1,), (1,)), ((), ())))
    return ops.add(y, b[0]) if b else y


# ---------------------------------------------------------------------------------------------
matmul_p = Primitive("matmul", family="layers")


@matmul_p.def_shape
def _matmul_shape(a, b):
    if a.ndim == 0 or b.ndim == 0:
        raise ShapeError(f"matmul: operands must be at least 1-D, got {a} and {b}")
    sa = (1,) + a.shape if a.ndim == 1 else a.shape
    sb = b.shape + (1,) if b.ndim == 1 else b.shape
    if not dim_eq(sa[-1], sb[-2]):
        raise ShapeError(f"matmul: contracting dims differ: {shape_str(a.shape)} @ "
                         f"{shape_str(b.shape)} ({dim_str(sa[-1])} vs {dim_str(sb[-2])})")
    if a.dtype != b.dtype:
        raise DTypeError(f"matmul: operands must share a dtype, got {a.str_short()} and "
                         f"{b.str_short()}")
    batch = broadcast_shapes(sa[:-2], sb[:-2], op="matmul")
    out = batch + ((sa[-2],) if a.ndim > 1 else ()) + ((sb[-1],) if b.ndim > 1 else ())
    return ShapedArray(out, a.dtype)


@matmul_p.def_impl
def _matmul_impl(a, b):
    if is_float(a.dtype):
        a64, b64 = a.astype(np.float64, copy=False), b.astype(np.float64, copy=False)
        return np.matmul(a64, b64).astype(a.dtype)
    return np.matmul(a, b)


@matmul_p.def_decomposition
def _matmul_decomp(a, b):
    return ops.matmul(a, b)


# ---------------------------------------------------------------------------------------------
embedding_p = Primitive("embedding", family="layers")


@embedding_p.def_shape
def _embedding_shape(idx, w):
    if not is_int(idx.dtype):
        raise DTypeError(f"embedding: indices must be integers, got {idx.str_short()}")
    if w.ndim != 2:
        raise ShapeError(f"embedding: weight must be (num_embeddings, dim), got {w}")
    return ShapedArray(idx.shape + (w.shape[1],), w.dtype)


@embedding_p.def_impl
def _embedding_impl(idx, w):
    return w[idx]


@embedding_p.def_decomposition
def _embedding_decomp(idx, w):
    return ops.take(w, idx, axis=0)


# ---------------------------------------------------------------------------------------------
apply_rotary_emb_p = Primitive("apply_rotary_emb", family="layers")


@apply_rotary_emb_p.def_shape
def _rope_shape(x, cos, sin):
    if not (is_float(x.dtype) and x.dtype == cos.dtype == sin.dtype):
        raise DTypeError(f"apply_rotary_emb: x, cos and sin must share a floating dtype, got "
                         f"{x.str_short()}, {cos.str_short()}, {sin.str_short()}")
    d = x.shape[-1] if x.ndim else 0
    if x.ndim == 0 or (type(d) is int and d % 2):
        raise ShapeError(f"apply_rotary_emb: the last axis of {x} must have an even size")
    out = broadcast_shapes(x.shape, cos.shape, sin.shape, op="apply_rotary_emb")
    if len(out) != x.ndim or not all(dim_eq(p, q) for p, q in zip(out, x.shape)):
        raise ShapeError(f"apply_rotary_emb: cos {cos} and sin {sin} must broadcast to x {x}")
    return x


def _np_rotate_half(x):
    h = x.shape[-1] // 2
    return np.concatenate([-x[..., h:], x[..., :h]], axis=-1)


@apply_rotary_emb_p.def_impl
def _rope_impl(x, cos, sin):
    x64 = x.astype(np.float64)
    return (x64 * cos + _np_rotate_half(x64) * sin).astype(x.dtype)


@apply_rotary_emb_p.def_decomposition
def _rope_decomp(x, cos, sin):
    d = ops._aval(x).shape[-1]
    h = d // 2
    rotated = ops.concatenate([ops.negative(ops.slice_axis(x, -1, h, d)),
                               ops.slice_axis(x, -1, 0, h)], axis=-1)
    return ops.add(ops.multiply(x, cos), ops.multiply(rotated, sin))


# ---------------------------------------------------------------------------------------------
# rope_cos_sin(positions; head_dim, base, dtype) -> (cos, sin), each positions.shape + (D,)
rope_cos_sin_p = Primitive("rope_cos_sin", family="layers", multiple_results=True)


@rope_cos_sin_p.def_shape
def _rope_tables_shape(pos, *, head_dim, base, dtype):
    if not (is_int(pos.dtype) or is_float(pos.dtype)):
        raise DTypeError(f"rope_cos_sin: positions must be numbers, got {pos.str_short()}")
    if head_dim % 2 or head_dim < 2:
        raise ShapeError(f"rope_cos_sin: head_dim must be even and >= 2, got {head_dim}")
    out = ShapedArray(pos.shape + (head_dim,), dtype)
    return [out, out]


def _inv_freq(head_dim, base):
    return 1.0 / base ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)


@rope_cos_sin_p.def_impl
def _rope_tables_impl(pos, *, head_dim, base, dtype):
    freqs = pos.astype(np.float64)[..., None] * _inv_freq(head_dim, base)
    emb = np.concatenate([freqs, freqs], axis=-1)
    return [np.cos(emb).astype(dtype), np.sin(emb).astype(dtype)]


@rope_cos_sin_p.def_decomposition
def _rope_tables_decomp(pos, *, head_dim, base, dtype):
    # Angles in float32 at least (positions up to ~1e5 need it), then the tables cast.
    work = np.float64 if np.dtype(dtype) == np.float64 else np.float32
    inv = _inv_freq(head_dim, base).astype(work)
    freqs = ops.multiply(ops.expand_dims(ops.astype(pos, work), -1), inv)
    emb = ops.concatenate([freqs, freqs], axis=-1)
    return [ops.astype(ops.cos(emb), dtype), ops.astype(ops.sin(emb), dtype)]


LAYERS = [linear_p, matmul_p, embedding_p, apply_rotary_emb_p, rope_cos_sin_p]
