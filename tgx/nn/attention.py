"""Attention with `torch.nn.functional` names and semantics.

>>> import numpy as np, tgx.nn as tnn
>>> q = np.ones((1, 2, 3, 4), np.float32)
>>> tnn.scaled_dot_product_attention(q, q, q, is_causal=True).shape
(1, 2, 3, 4)
"""

from __future__ import annotations

import math

from .. import numpy as tnp
from ..errors import Unsupported
from ..primitives import attention as A
from ..primitives.ops import _as_operand, _aval, _float_args
from ..shapes import bool_

__all__ = ["scaled_dot_product_attention"]


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0,
                                 is_causal=False, scale=None, enable_gqa=False):
    """`softmax(q @ k.T * scale + mask) @ v` over the last two axes, as torch's functional.

    - `attn_mask`: bool (True = attend) or float (added to the scores), broadcast to
      (..., L, S). `is_causal=True` masks with `tril(ones(L, S))` (top-left aligned).
    - `scale` defaults to `1 / sqrt(E)`.
    - `enable_gqa=True`: key/value have Hk heads on axis -3 and each serves Hq / Hk query
      heads (torch's repeat_interleave).
    - A query row with every key masked gives zeros (torch 2.5+ also gives zeros; it gave NaN
      before).
    - `dropout_p` must be 0: tgx ops are deterministic; apply dropout to the result with
      explicit random bits instead.
    """
    if dropout_p:
        raise Unsupported("scaled_dot_product_attention: dropout_p > 0 is not supported "
                          "(tgx ops are deterministic)")
    query, key, value = (_as_operand(x) for x in _float_args(query, key, value))
    dt = _aval(query).dtype
    if scale is None:
        e = _aval(query).shape[-1]
        if not isinstance(e, int):
            raise Unsupported("scaled_dot_product_attention: a symbolic head dim needs "
                              "an explicit scale")
        scale = 1.0 / math.sqrt(e)
    args = (query, key, value)
    if attn_mask is not None:
        mask_dt = _aval(attn_mask).dtype
        args += (_as_operand(tnp.astype(attn_mask, bool_ if mask_dt == bool_ else dt)),)
    return A.sdpa_p.bind(*args, has_mask=attn_mask is not None, is_causal=bool(is_causal),
                         scale=float(scale), enable_gqa=bool(enable_gqa))
