"""Op-table entries for linear layers, matmul, einsum, embedding and RoPE in `tgx.nn`, against
torch (RoPE against the Hugging Face Llama formulation written in torch)."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

import tgx.nn as tnn
import tgx.primitives.layers  # noqa: F401 - registers the primitives
from tgx.shapes import bfloat16, float16, float32, float64

from .op_table import OpInfo, Sample, randn, register, torch_ref

ALL = (float32, float64, float16, bfloat16)
TOL = {float32: (1e-4, 1e-5), float16: (1e-2, 1e-2), bfloat16: (4e-2, 5e-2)}






def linear_samples(rng, dt):
    w, b = randn(rng, (4, 6), dt), randn(rng, (4,), dt)
    out = [Sample((randn(rng, (n, 5, 6), dt), w, b), symbolic={0: {0: "N"}}, name=f"[N={n}]")
           for n in (2, 3)]
    out.append(Sample((randn(rng, (6,), dt), w), name="[1-D,no-bias]"))
    return out


def matmul_samples(rng, dt):
    out = [Sample((randn(rng, (n, 1, 3, 4), dt), randn(rng, (5, 4, 2), dt)),
                  symbolic={0: {0: "N"}}, name=f"[bcast,N={n}]") for n in (2, 3)]
    out += [Sample((randn(rng, a, dt), randn(rng, b, dt)), name=f"[{a}@{b}]") for a, b in
            (((4,), (4,)), ((4,), (2, 4, 3)), ((2, 3, 4), (4,)), ((3, 4), (4, 5)))]
    return out


def bmm_samples(rng, dt):
    return [Sample((randn(rng, (n, 3, 4), dt), randn(rng, (n, 4, 2), dt)),
                   symbolic={0: {0: "B"}, 1: {0: "B"}}, name=f"[B={n}]") for n in (2, 4)]


def einsum_samples(rng, dt):
    return [Sample(("bhqd,bhkd->bhqk", randn(rng, (n, 2, 3, 4), dt),
                    randn(rng, (n, 2, 5, 4), dt)), symbolic={1: {0: "N"}, 2: {0: "N"}},
                   name=f"[N={n}]") for n in (1, 2)]


def embedding_samples(rng, dt):
    w = randn(rng, (10, 4), dt)
    out = [Sample((rng.integers(0, 10, (n, 3)).astype(np.int64), w), symbolic={0: {0: "N"}},
                  name=f"[N={n}]") for n in (2, 5)]
    out.append(Sample((rng.integers(0, 10, (4,)).astype(np.int32), w), dict(padding_idx=0),
                      name="[padding_idx]"))
    return out


def hf_rotate_half(x):
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def hf_apply_rotary_pos_emb(x, cos, sin):
    return x * cos + hf_rotate_half(x) * sin


def hf_rope_cos_sin(positions, head_dim, base=10000.0, dtype=None):
    inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.int64).double()
                               / head_dim))
    freqs = positions.double()[..., None] * inv_freq
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def rope_samples(rng, dt):
    out = []
    for s in (3, 6):
        ang = rng.uniform(0, 2 * np.pi, (s, 8))
        out.append(Sample((randn(rng, (2, 2, s, 8), dt), np.cos(ang).astype(dt),
                           np.sin(ang).astype(dt)),
                          symbolic={0: {2: "S"}, 1: {0: "S"}, 2: {0: "S"}}, name=f"[S={s}]"))
    ang = rng.uniform(0, 2 * np.pi, (2, 1, 4, 6))
    out.append(Sample((randn(rng, (2, 3, 4, 6), dt), np.cos(ang).astype(dt),
                       np.sin(ang).astype(dt)), name="[per-batch tables]"))
    return out


def rope_table_samples(rng, dt):
    out = [Sample((np.arange(s, dtype=np.int64), 8), dict(dtype=dt), symbolic={0: {0: "S"}},
                  name=f"[S={s}]") for s in (4, 9)]
    out.append(Sample((rng.integers(0, 50, (2, 3)).astype(np.int64), 6),
                      dict(base=500000.0, dtype=dt), name="[positions,base]"))
    return out


def _rope_from_length(x, head_dim):
    """Tables for `arange(S)` where S is x's (symbolic) length: positions from iota."""
    return tnn.rope_cos_sin(x.shape[0], head_dim)


def _rope_from_length_ref(x, head_dim):
    return torch_ref(hf_rope_cos_sin)(np.arange(x.shape[0]), head_dim)


def rope_length_samples(rng, dt):
    return [Sample((np.zeros((s,), dt), 4), symbolic={0: {0: "S"}}, name=f"[S={s}]")
            for s in (5, 7)]


register(
    OpInfo("tnn.linear", tnn.linear, torch_ref(F.linear), linear_samples, dtypes=ALL, tol=TOL,
           decomposes=True),
    OpInfo("tnn.matmul", tnn.matmul, torch_ref(torch.matmul), matmul_samples, dtypes=ALL,
           tol=TOL, decomposes=True),
    OpInfo("tnn.bmm", tnn.bmm, torch_ref(torch.bmm), bmm_samples, dtypes=(float32, float64),
           tol=TOL, decomposes=True),
    OpInfo("tnn.einsum", tnn.einsum, torch_ref(torch.einsum), einsum_samples,
           dtypes=(float32, float64), tol=TOL, decomposes=True),
    OpInfo("tnn.embedding", tnn.embedding, torch_ref(F.embedding), embedding_samples,
           dtypes=ALL, decomposes=True),
    OpInfo("tnn.apply_rotary_emb", tnn.apply_rotary_emb, torch_ref(hf_apply_rotary_pos_emb),
           rope_samples, dtypes=ALL, tol=TOL, decomposes=True),
    OpInfo("tnn.rope_cos_sin", tnn.rope_cos_sin, torch_ref(hf_rope_cos_sin), rope_table_samples,
           dtypes=ALL, tol={float32: (1e-5, 1e-5), **{k: v for k, v in TOL.items()
                                                        if k != float32}}, decomposes=True),
    OpInfo("tnn.rope_cos_sin[length]", _rope_from_length, _rope_from_length_ref,
           rope_length_samples, dtypes=(float32,), tol={float32: (1e-5, 1e-5)}, decomposes=True),
)
