"""Linear layers, matmul, einsum, embedding and rotary position embedding (RoPE), with
`torch.nn.functional` / torch names and layouts.

>>> import numpy as np, tgx.nn as tnn
>>> tnn.linear(np.ones((2, 3), np.float32), np.ones((4, 3), np.float32)).shape
(2, 4)
>>> cos, sin = tnn.rope_cos_sin(5, 8)
>>> tnn.apply_rotary_emb(np.ones((1, 2, 5, 8), np.float32), cos, sin).shape
(1, 2, 5, 8)
"""

from __future__ import annotations

import sympy

from .. import numpy as tnp
from ..errors import OptionError, Unsupported
from ..primitives import layers as Ly
from ..primitives.ops import _as_operand, _aval, _promoted
from ..shapes import SymDim, as_dim, as_dtype, float32, int64

__all__ = ["linear", "matmul", "bmm", "einsum", "embedding", "apply_rotary_emb",
           "rope_cos_sin", "rotate_half"]

einsum = tnp.einsum


def _same_dtype(*xs):
    (out, _, _) = _promoted(*xs)
    return [_as_operand(x) for x in out]


def linear(input, weight, bias=None):
    """`input @ weight.T + bias`, weight (out_features, in_features) as in torch."""
    args = _same_dtype(*[a for a in (input, weight, bias) if a is not None])
    return Ly.linear_p.bind(*args)


def matmul(input, other):
    """torch.matmul: 1-D operands are promoted and squeezed, batch dims broadcast."""
    return Ly.matmul_p.bind(*_same_dtype(input, other))


def bmm(input, mat2):
    """Batched matrix product of (B, n, m) and (B, m, p) (no broadcasting, as in torch)."""
    a, b = _aval(input), _aval(mat2)
    if a.ndim != 3 or b.ndim != 3:
        raise OptionError(f"bmm: expects two 3-D operands, got {a} and {b}")
    return matmul(input, mat2)


def embedding(input, weight, padding_idx=None, max_norm=None, norm_type=2.0,
              scale_grad_by_freq=False, sparse=False):
    """Rows of `weight` (num_embeddings, dim) at integer `input`: shape input.shape + (dim,).
    `padding_idx` only affects gradients in torch, so the forward value ignores it; indices
    outside [0, num_embeddings) are clamped (torch raises)."""
    if max_norm is not None:
        raise Unsupported("embedding: max_norm renormalises the weight in place; "
                          "not supported")
    return Ly.embedding_p.bind(_as_operand(tnp.asarray(input)), _as_operand(weight))


def rotate_half(x):
    """`cat(-x2, x1)` for the halves x1, x2 of the last axis (HF's Llama convention)."""
    h = _aval(x).shape[-1] // 2
    return tnp.concatenate([tnp.negative(x[..., h:]), x[..., :h]], axis=-1)


def apply_rotary_emb(x, cos, sin):
    """Rotary position embedding in the Llama / Gemma form: `x * cos + rotate_half(x) * sin`.
    `cos` / `sin` (e.g. from `rope_cos_sin`, shape (S, D)) broadcast against x (..., S, D)
    and are cast to x's dtype."""
    x = _as_operand(x)
    dt = _aval(x).dtype
    cos, sin = (_as_operand(tnp.astype(c, dt)) for c in (cos, sin))
    return Ly.apply_rotary_emb_p.bind(x, cos, sin)


def rope_cos_sin(positions, head_dim, base=10000.0, dtype=float32):
    """`(cos, sin)` tables for `apply_rotary_emb`, each positions.shape + (head_dim,):
    angles `p * base ** (-2i / head_dim)` for i < head_dim / 2, repeated for both halves.
    `positions` is an array of positions, or a length (an int, a symbolic dim or a name like
    "S") meaning `arange(length)`."""
    if isinstance(positions, (int, str, sympy.Basic, SymDim)):
        positions = tnp.iota(int64, (as_dim(positions),), 0)
    cos, sin = Ly.rope_cos_sin_p.bind(_as_operand(tnp.asarray(positions)),
                                      head_dim=int(head_dim), base=float(base),
                                      dtype=as_dtype(dtype))
    return cos, sin
