"""Op-table entries for `tgx.nn.scaled_dot_product_attention`, against torch."""

from __future__ import annotations

import numpy as np
import torch.nn.functional as F

import tgx.nn as tnn
import tgx.primitives.attention  # noqa: F401 - registers the primitive
from tgx.shapes import bfloat16, float16, float32, float64

from .op_table import OpInfo, Sample, randn, register, to_torch

ALL = (float32, float64, float16, bfloat16)
TOL = {float32: (1e-4, 1e-5), float16: (1e-2, 1e-2), bfloat16: (4e-2, 4e-2)}
SYM_LS = {0: {2: "L"}, 1: {2: "S"}, 2: {2: "S"}}




def sdpa_ref(*args, **kwargs):
    out = F.scaled_dot_product_attention(*[to_torch(a) for a in args], **kwargs)
    return out.double().numpy()


def qkv(rng, dt, b, hq, hk, L, S, e, ev=None):
    return (randn(rng, (b, hq, L, e), dt), randn(rng, (b, hk, S, e), dt),
            randn(rng, (b, hk, S, ev or e), dt))


def sdpa_samples(rng, dt):
    out = []
    for L, S in ((3, 5), (4, 2)):
        out.append(Sample(qkv(rng, dt, 2, 2, 2, L, S, 8), symbolic=SYM_LS, name=f"[{L}x{S}]"))
        out.append(Sample(qkv(rng, dt, 1, 2, 2, L, S, 4, 6), dict(is_causal=True),
                          symbolic=SYM_LS, name=f"[causal,{L}x{S}]"))
        mask = rng.random((L, S)) > 0.3
        mask[0] = False  # a row that attends to nothing
        out.append(Sample(qkv(rng, dt, 2, 1, 1, L, S, 4) + (mask,),
                          symbolic={**SYM_LS, 3: {0: "L", 1: "S"}},
                          name=f"[bool-mask,{L}x{S}]"))
    for hq, hk in ((4, 2), (6, 1)):
        out.append(Sample(qkv(rng, dt, 2, hq, hk, 3, 5, 4), dict(enable_gqa=True, scale=0.3),
                          name=f"[gqa {hq}/{hk}]"))
    fmask = randn(rng, (2, 1, 3, 4), dt)
    fmask[0, 0, 1] = -np.inf
    # (an explicit scale keeps the symbolic test from binding this to the bool-mask graphs)
    out.append(Sample(qkv(rng, dt, 2, 3, 3, 3, 4, 4) + (fmask,), dict(scale=0.4),
                      name="[float-mask,-inf row]"))
    out.append(Sample(qkv(rng, dt, 1, 4, 2, 5, 5, 4) + (None, 0.0, True), dict(enable_gqa=True),
                      name="[gqa,causal]"))
    return out


register(OpInfo("tnn.scaled_dot_product_attention", tnn.scaled_dot_product_attention, sdpa_ref,
                sdpa_samples, dtypes=ALL, tol=TOL, decomposes=True))
