"""A small Gemma-3-shaped decoder, traced with a symbolic sequence length.

RMSNorm with (1 + w) scaling (pre and post norms around attention and MLP, and q/k norms),
grouped-query attention with RoPE and a causal mask, a GeGLU MLP, tied embeddings scaled by
sqrt(d_model). Parameter names follow the Hugging Face checkpoints
(`model.layers.0.self_attn.q_proj.weight`, torch (out, in) layouts), so `--weights` can load a
real checkpoint's safetensors file if you have one locally; by default weights are generated
randomly, saved to a .safetensors file and loaded back from it.

Run: python examples/gemma3.py [--weights model.safetensors --config config.json]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import tempfile

import numpy as np

import tgx
import tgx.nn as tnn
from tgx.io import flatten_names, load_weights, save_weights, unflatten_names


@dataclasses.dataclass(frozen=True)
class Config:
    vocab_size: int = 512
    hidden_size: int = 128
    intermediate_size: int = 256
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int = 32
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    query_pre_attn_scalar: float = 32.0

    @classmethod
    def from_json(cls, path: str) -> Config:
        with open(path) as f:
            raw = json.load(f)
        raw = raw.get("text_config", raw)
        return cls(**{k: raw[k] for k in (f.name for f in dataclasses.fields(cls)) if k in raw})


def random_params(cfg: Config, seed: int = 0) -> dict:
    """Random weights with the checkpoint's names and layouts (float32)."""
    rng = np.random.default_rng(seed)

    def w(*shape, scale=None):
        scale = scale if scale is not None else 1.0 / math.sqrt(shape[-1])
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    def norm(n):
        return (rng.standard_normal(n) * 0.1).astype(np.float32)

    d, hd = cfg.hidden_size, cfg.head_dim
    layers = []
    for _ in range(cfg.num_hidden_layers):
        layers.append({
            "input_layernorm": {"weight": norm(d)},
            "post_attention_layernorm": {"weight": norm(d)},
            "pre_feedforward_layernorm": {"weight": norm(d)},
            "post_feedforward_layernorm": {"weight": norm(d)},
            "self_attn": {
                "q_proj": {"weight": w(cfg.num_attention_heads * hd, d)},
                "k_proj": {"weight": w(cfg.num_key_value_heads * hd, d)},
                "v_proj": {"weight": w(cfg.num_key_value_heads * hd, d)},
                "o_proj": {"weight": w(d, cfg.num_attention_heads * hd)},
                "q_norm": {"weight": norm(hd)},
                "k_norm": {"weight": norm(hd)},
            },
            "mlp": {
                "gate_proj": {"weight": w(cfg.intermediate_size, d)},
                "up_proj": {"weight": w(cfg.intermediate_size, d)},
                "down_proj": {"weight": w(d, cfg.intermediate_size)},
            },
        })
    return {"model": {"embed_tokens": {"weight": w(cfg.vocab_size, d, scale=1.0)},
                      "layers": layers, "norm": {"weight": norm(d)}}}


# ---------------------------------------------------------------------------------------------
# The model in tgx


def rms_norm(x, w, eps):
    # Gemma scales by (1 + w); the (1 + w) is computed once on the constant weight.
    return tnn.rms_norm(x, (x.shape[-1],), 1.0 + w, eps)


def attention(p, x, cos, sin, cfg: Config):
    s, hd = x.shape[0], cfg.head_dim
    q = tnn.linear(x, p["q_proj"]["weight"]).reshape(s, cfg.num_attention_heads, hd)
    k = tnn.linear(x, p["k_proj"]["weight"]).reshape(s, cfg.num_key_value_heads, hd)
    v = tnn.linear(x, p["v_proj"]["weight"]).reshape(s, cfg.num_key_value_heads, hd)
    q = rms_norm(q, p["q_norm"]["weight"], cfg.rms_norm_eps).transpose(1, 0, 2)
    k = rms_norm(k, p["k_norm"]["weight"], cfg.rms_norm_eps).transpose(1, 0, 2)
    q = tnn.apply_rotary_emb(q, cos, sin)
    k = tnn.apply_rotary_emb(k, cos, sin)
    o = tnn.scaled_dot_product_attention(q, k, v.transpose(1, 0, 2), is_causal=True,
                                         scale=cfg.query_pre_attn_scalar ** -0.5,
                                         enable_gqa=True)
    return tnn.linear(o.transpose(1, 0, 2).reshape(s, -1), p["o_proj"]["weight"])


def mlp(p, x):
    gate = tnn.gelu(tnn.linear(x, p["gate_proj"]["weight"]), approximate="tanh")
    return tnn.linear(gate * tnn.linear(x, p["up_proj"]["weight"]), p["down_proj"]["weight"])


def gemma3(params, tokens, cfg: Config = Config()):
    """Logits (S, vocab) for a sequence of token ids (S,) — a prefill step."""
    m = params["model"]
    emb = m["embed_tokens"]["weight"]
    x = tnn.embedding(tokens, emb) * np.float32(math.sqrt(cfg.hidden_size))
    cos, sin = tnn.rope_cos_sin(tokens.shape[0], cfg.head_dim, cfg.rope_theta)
    for layer in m["layers"]:
        h = rms_norm(x, layer["input_layernorm"]["weight"], cfg.rms_norm_eps)
        h = attention(layer["self_attn"], h, cos, sin, cfg)
        x = x + rms_norm(h, layer["post_attention_layernorm"]["weight"], cfg.rms_norm_eps)
        h = rms_norm(x, layer["pre_feedforward_layernorm"]["weight"], cfg.rms_norm_eps)
        h = mlp(layer["mlp"], h)
        x = x + rms_norm(h, layer["post_feedforward_layernorm"]["weight"], cfg.rms_norm_eps)
    x = rms_norm(x, m["norm"]["weight"], cfg.rms_norm_eps)
    return x @ emb.T            # tied embeddings


# ---------------------------------------------------------------------------------------------
# Independent references: the same model written directly in NumPy, PyTorch and JAX


class _Ops:
    """The handful of array functions the reference needs, for one library."""

    def __init__(self, lib: str):
        self.lib = lib
        if lib == "numpy":
            self.xp = np
        elif lib == "torch":
            import torch
            self.xp = torch
        else:
            import jax.numpy as jnp
            self.xp = jnp

    def perm(self, x, *axes):
        return x.permute(*axes) if self.lib == "torch" else x.transpose(*axes)

    def cat(self, xs, axis):
        return self.xp.cat(xs, axis) if self.lib == "torch" else self.xp.concatenate(xs, axis)

    def repeat(self, x, n, axis):
        if self.lib == "torch":
            return self.xp.repeat_interleave(x, n, dim=axis)
        return self.xp.repeat(x, n, axis=axis)

    def arange(self, n, like):
        if self.lib == "torch":
            return self.xp.arange(n, dtype=like.dtype)
        return self.xp.arange(n, dtype=like.dtype)

    def max(self, x):
        return x.amax(-1, keepdim=True) if self.lib == "torch" else x.max(-1, keepdims=True)

    def mean(self, x):
        return x.mean(-1, keepdim=True) if self.lib == "torch" else x.mean(-1, keepdims=True)

    def sum(self, x):
        return x.sum(-1, keepdim=True) if self.lib == "torch" else x.sum(-1, keepdims=True)


def _rms(o, x, w, eps):
    return x / o.xp.sqrt(o.mean(x * x) + eps) * (1.0 + w)


def _gelu_tanh(o, x):
    return 0.5 * x * (1 + o.xp.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x * x * x)))


def _rope(o, x, pos, theta):
    hd = x.shape[-1]
    inv = theta ** (-o.arange(hd // 2, pos) * 2 / hd)
    ang = pos[:, None] * inv[None, :]
    ang = o.cat([ang, ang], -1)
    rot = o.cat([-x[..., hd // 2:], x[..., :hd // 2]], -1)
    return x * o.xp.cos(ang) + rot * o.xp.sin(ang)


def gemma3_reference(params, tokens, cfg: Config = Config(), lib: str = "numpy"):
    """The model written directly with `lib` ("numpy", "torch" or "jax"), on arrays of that
    library (params and tokens already converted); no tgx involved."""
    o = _Ops(lib)
    m = params["model"]
    emb = m["embed_tokens"]["weight"]
    x = emb[tokens] * math.sqrt(cfg.hidden_size)
    s, hd = tokens.shape[0], cfg.head_dim
    pos = o.arange(s, x)
    group = cfg.num_attention_heads // cfg.num_key_value_heads
    causal = o.arange(s, x)[:, None] >= o.arange(s, x)[None, :]
    eps = cfg.rms_norm_eps
    for layer in m["layers"]:
        a = layer["self_attn"]
        h = _rms(o, x, layer["input_layernorm"]["weight"], eps)
        q = (h @ a["q_proj"]["weight"].T).reshape(s, -1, hd)
        k = (h @ a["k_proj"]["weight"].T).reshape(s, -1, hd)
        v = (h @ a["v_proj"]["weight"].T).reshape(s, -1, hd)
        q = _rope(o, o.perm(_rms(o, q, a["q_norm"]["weight"], eps), 1, 0, 2), pos, cfg.rope_theta)
        k = _rope(o, o.perm(_rms(o, k, a["k_norm"]["weight"], eps), 1, 0, 2), pos, cfg.rope_theta)
        k, v = o.repeat(k, group, 0), o.repeat(o.perm(v, 1, 0, 2), group, 0)
        scores = q @ o.perm(k, 0, 2, 1) * cfg.query_pre_attn_scalar ** -0.5
        scores = o.xp.where(causal, scores, -float("inf"))
        p = o.xp.exp(scores - o.max(scores))
        att = (p / o.sum(p)) @ v
        att = o.perm(att, 1, 0, 2).reshape(s, -1) @ a["o_proj"]["weight"].T
        x = x + _rms(o, att, layer["post_attention_layernorm"]["weight"], eps)
        h = _rms(o, x, layer["pre_feedforward_layernorm"]["weight"], eps)
        ml = layer["mlp"]
        g = _gelu_tanh(o, h @ ml["gate_proj"]["weight"].T) * (h @ ml["up_proj"]["weight"].T)
        x = x + _rms(o, g @ ml["down_proj"]["weight"].T,
                     layer["post_feedforward_layernorm"]["weight"], eps)
    x = _rms(o, x, m["norm"]["weight"], eps)
    return x @ emb.T


def gemma3_numpy(params, tokens, cfg: Config = Config()) -> np.ndarray:
    """The float64 NumPy reference the tgx logits are checked against."""
    p64 = unflatten_names({k: np.asarray(v, np.float64) for k, v in flatten_names(params).items()})
    return gemma3_reference(p64, np.asarray(tokens), cfg, "numpy")


# ---------------------------------------------------------------------------------------------


def load_or_create(weights: str | None, config: str | None, workdir: str) -> tuple[dict, Config]:
    """Real weights when given; else random ones, saved to safetensors and loaded back."""
    cfg = Config.from_json(config) if config else Config()
    if weights:
        params = load_weights(weights)
        return {"model": params["model"]} if "model" in params else params, cfg
    path = os.path.join(workdir, "gemma3-random.safetensors")
    save_weights(path, random_params(cfg))
    return load_weights(path), cfg


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--weights", help="a local .safetensors checkpoint (Hugging Face names)")
    ap.add_argument("--config", help="its config.json (default: a small random config)")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        params, cfg = load_or_create(args.weights, args.config, tmp)
    n_weights = sum(v.size for v in flatten_names(params).values())
    print(f"Gemma-3-shaped decoder: {cfg.num_hidden_layers} layers, d={cfg.hidden_size}, "
          f"vocab={cfg.vocab_size}, {n_weights / 1e6:.2f}M weights")
    graph = tgx.make_graph(lambda p, t: gemma3(p, t, cfg))(params, tgx.Spec(("S",), "int64"))
    print(f"traced with symbolic sequence length S: {len(graph)} equations, "
          f"out {graph.out_avals[0]}")
    rng = np.random.default_rng(1)
    for s in (7, 16):
        tokens = rng.integers(0, cfg.vocab_size, s)
        logits = tgx.eval_graph(graph, params, tokens)
        ref = gemma3_numpy(params, tokens, cfg)
        err = np.abs(logits - ref).max() / np.abs(ref).max()
        print(f"  S={s:3d}: logits {logits.shape}, max rel. error vs NumPy float64 {err:.1e}")
        assert err < 1e-4, err


if __name__ == "__main__":
    main()
