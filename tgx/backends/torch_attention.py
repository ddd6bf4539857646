"""Attention for NumPy plans run by torch's fused CPU kernel, on the arrays' memory.

A prefill's attention multiplies every query row by every key twice. NumPy's kernels (the
library one and `numba-softmax`) do the products with BLAS, which a plan holding kernels
with a pool of their own (numba's parallel loops, oneDNN's bfloat16 GEMMs) caps to one
thread (`tgx.backends.threads`). torch's `scaled_dot_product_attention` (its flash kernel on
the CPU) runs on torch's OpenMP pool, the pool the bfloat16 GEMMs already use. Measured on
the 2-core development CPU (2026-11-25), a Gemma-3-270m prefill layer (4 query heads over 1
key/value head of 256, 128 query rows, 256 cache rows of which 128 causal): `numba-softmax`
1.45 ms (1.50 with BLAS capped), this kernel 1.00 ms (1.19 capped).

The operands are viewed as torch tensors without a copy (`torch_views.tensor_of`). A row whose
mask admits no key comes out as zeros, as the NumPy reference has it.

>>> import numpy as np
>>> q = k = v = np.ones((2, 3, 4), np.float32)
>>> bool(np.allclose(attention(q, k, v, has_mask=False, is_causal=False, scale=0.5,
...                            enable_gqa=False), 1.0)) if available() else True
True
"""

from __future__ import annotations

import functools
import importlib.util

import numpy as np

from .registry import register_kernel
from .torch_views import tensor_of

NAME = "numpy"


@functools.cache
def available() -> bool:
    """Whether torch is installed (found without importing it: planning a NumPy plan does not
    import torch)."""
    return importlib.util.find_spec("torch") is not None


def _checker(avals, params):
    q, k, v = avals[:3]
    if any(a.dtype != np.float32 for a in (q, k, v)):
        return f"float32 only, got {q.str_short()}, {k.str_short()}, {v.str_short()}"
    if q.ndim not in (3, 4) or k.ndim != q.ndim or v.ndim != q.ndim:
        return f"(heads, rows, dim) or (batch, heads, rows, dim) operands of one rank, got " \
               f"{q.str_short()}, {k.str_short()}"
    if params["has_mask"] and params["is_causal"]:
        return "torch takes a mask or is_causal, not both"
    if params["has_mask"]:
        m = avals[3]
        if m.dtype != np.bool_ or m.ndim != 2:
            return f"a boolean (rows, keys) mask shared by all heads, got {m.str_short()}"
    if not available():
        return "needs torch"
    return None


def attention(q, k, v, *mask, has_mask, is_causal, scale, enable_gqa, out=None):
    """`scaled_dot_product_attention` by torch's fused CPU kernel on NumPy arrays (into `out`
    when given); rows whose mask admits no key are zeros."""
    import torch
    import torch.nn.functional as F

    t = [tensor_of(a) for a in (q, k, v)]
    if q.ndim == 3:  # the fused kernel takes (batch, heads, rows, dim)
        t = [a[None] for a in t]
    m = tensor_of(mask[0]) if has_mask else None
    y = F.scaled_dot_product_attention(*t, attn_mask=m, is_causal=is_causal, scale=scale,
                                       enable_gqa=enable_gqa)
    if q.ndim == 3:
        y = y[0]
    if out is None:
        out = np.empty(y.shape, np.float32)
    torch.from_numpy(out).copy_(y)
    if has_mask:
        empty = ~mask[0].any(axis=-1)
        if empty.any():
            out[..., empty, :] = 0.0
    return out


# own_pool: torch's OpenMP pool, so BLAS is capped to one thread in a plan holding it
register_kernel("scaled_dot_product_attention", NAME, checker=_checker, variant="torch-sdpa",
                writes_out=True, own_pool=True)(attention)
