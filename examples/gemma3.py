"""The Gemma-3 text decoder in tgx: prefill, and decode with a KV cache kept as state.

The architecture of Hugging Face's `Gemma3ForCausalLM`: RMSNorm with (1 + w) scaling (pre and
post norms around attention and MLP, and q/k norms), grouped-query attention with RoPE, local
(sliding-window, RoPE base 10k) layers and every 6th layer global (full causal, RoPE base 1M),
a GeGLU MLP, tied embeddings scaled by sqrt(d_model). `Config.gemma3_270m()` is the 270m
shape (18 layers, d=640, 4 query / 1 key-value heads of 256, vocabulary 262144, or 32768 with
`--vocab 32768`). Parameter names follow the Hugging Face checkpoints
(`model.layers.0.self_attn.q_proj.weight`, torch (out, in) layouts), so `--weights` can load
a real checkpoint's safetensors file; by default weights are generated randomly, saved to a
.safetensors file and loaded back from it.

Decode keeps one fixed-size cache per layer, `{"k", "v"}` of shape (kv heads, T_MAX, head
dim), as `tgx.compile(state="cache")`: a step writes its tokens' keys and values at `pos`
in place and attends over the cache with a causal (and, on local layers, sliding-window)
mask, so prefill (P tokens at pos 0) and decode (1 token at pos) are the same function.

Run: python examples/gemma3.py [--preset 270m --vocab 32768 --layers 4] [--decode 4]
     python examples/gemma3.py --weights model.safetensors --config config.json
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
import tgx.lax as lax
import tgx.nn as tnn
import tgx.numpy as tnp
from tgx.io import flatten_names, load_weights, save_weights, unflatten_names


@dataclasses.dataclass(frozen=True)
class Config:
    """A Gemma-3 text config (the fields of HF's `Gemma3TextConfig` that shape the model).
    The defaults are a small model for tests and the demo; `gemma3_270m()` is the real one."""

    vocab_size: int = 512
    hidden_size: int = 128
    intermediate_size: int = 256
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int = 32
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1_000_000.0          # global (full attention) layers
    rope_local_base_freq: float = 10_000.0   # local (sliding-window) layers
    sliding_window: int = 512
    sliding_window_pattern: int = 6          # every 6th layer is global
    query_pre_attn_scalar: int = 32

    @classmethod
    def gemma3_270m(cls, vocab_size: int = 262144, num_hidden_layers: int = 18) -> Config:
        return cls(vocab_size=vocab_size, hidden_size=640, intermediate_size=2048,
                   num_hidden_layers=num_hidden_layers, num_attention_heads=4,
                   num_key_value_heads=1, head_dim=256, query_pre_attn_scalar=256)

    def is_sliding(self, layer: int) -> bool:
        return (layer + 1) % self.sliding_window_pattern != 0

    @classmethod
    def from_json(cls, path: str) -> Config:
        with open(path) as f:
            raw = json.load(f)
        raw = dict(raw.get("text_config", raw))
        rope = raw.get("rope_parameters") or {}
        if "full_attention" in rope:
            raw.setdefault("rope_theta", rope["full_attention"].get("rope_theta"))
        if "sliding_attention" in rope:
            raw.setdefault("rope_local_base_freq", rope["sliding_attention"].get("rope_theta"))
        if raw.get("layer_types"):
            raw["sliding_window_pattern"] = raw["layer_types"].index("full_attention") + 1
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in raw.items() if k in names and v is not None})


def random_params(cfg: Config, seed: int = 0) -> dict:
    """Random weights with the checkpoint's names and layouts (float32)."""
    rng = np.random.default_rng(seed)

    def w(*shape, scale=None):
        scale = scale if scale is not None else 1.0 / math.sqrt(shape[-1])
        return (rng.standard_normal(shape, np.float32) * np.float32(scale))

    def norm(n):
        return rng.standard_normal(n, np.float32) * np.float32(0.1)

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


def hf_config(cfg: Config, max_position_embeddings: int = 4096):
    """The Hugging Face `Gemma3TextConfig` of `cfg` (eager attention, tied embeddings), to
    build `transformers.Gemma3ForCausalLM(hf_config(cfg))` offline for parity checks."""
    import transformers

    return transformers.Gemma3TextConfig(
        vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size, num_hidden_layers=cfg.num_hidden_layers,
        num_attention_heads=cfg.num_attention_heads, num_key_value_heads=cfg.num_key_value_heads,
        head_dim=cfg.head_dim, rms_norm_eps=cfg.rms_norm_eps, rope_theta=cfg.rope_theta,
        rope_local_base_freq=cfg.rope_local_base_freq, sliding_window=cfg.sliding_window,
        sliding_window_pattern=cfg.sliding_window_pattern,
        query_pre_attn_scalar=int(cfg.query_pre_attn_scalar),
        max_position_embeddings=max_position_embeddings,
        hidden_activation="gelu_pytorch_tanh", attn_implementation="eager",
        tie_word_embeddings=True)


def empty_cache(cfg: Config, t_max: int, dtype=np.float32) -> list[dict]:
    """One `{"k", "v"}` cache of (kv heads, t_max, head dim) per layer, zeroed."""
    shape = (cfg.num_key_value_heads, t_max, cfg.head_dim)
    return [{"k": np.zeros(shape, dtype), "v": np.zeros(shape, dtype)}
            for _ in range(cfg.num_hidden_layers)]


# ---------------------------------------------------------------------------------------------
# The model in tgx


def rms_norm(x, w, eps):
    # Gemma scales by (1 + w)
    return tnn.rms_norm(x, (x.shape[-1],), 1.0 + w, eps)


def attention_masks(q_pos, t: int, cfg: Config):
    """(causal, sliding) boolean masks (P, T) of queries at positions `q_pos` over keys at
    0 .. T-1 (True = attend); HF's sliding window keeps keys with q - k < window."""
    k_pos = tnp.arange(t)[None, :]
    q = q_pos[:, None]
    causal = k_pos <= q
    return causal, causal & (k_pos > q - cfg.sliding_window)


def attention(p, x, rope, mask, cfg: Config, cache=None, pos=None):
    """Self-attention of tokens x (P, d); with a cache, their keys and values are written at
    `pos` and the queries attend over the whole cache (masked). Returns (out, new cache)."""
    s, hd = x.shape[0], cfg.head_dim
    q = tnn.linear(x, p["q_proj"]["weight"]).reshape(s, cfg.num_attention_heads, hd)
    k = tnn.linear(x, p["k_proj"]["weight"]).reshape(s, cfg.num_key_value_heads, hd)
    v = tnn.linear(x, p["v_proj"]["weight"]).reshape(s, cfg.num_key_value_heads, hd)
    q = rms_norm(q, p["q_norm"]["weight"], cfg.rms_norm_eps).transpose(1, 0, 2)
    k = rms_norm(k, p["k_norm"]["weight"], cfg.rms_norm_eps).transpose(1, 0, 2)
    q = tnn.apply_rotary_emb(q, *rope)
    k = tnn.apply_rotary_emb(k, *rope)
    v = v.transpose(1, 0, 2)
    if cache is not None:
        k = lax.dynamic_update_slice(cache["k"], k, (0, pos, 0))
        v = lax.dynamic_update_slice(cache["v"], v, (0, pos, 0))
        cache = {"k": k, "v": v}
    o = tnn.scaled_dot_product_attention(q, k, v, attn_mask=mask,
                                         scale=cfg.query_pre_attn_scalar ** -0.5,
                                         enable_gqa=True)
    return tnn.linear(o.transpose(1, 0, 2).reshape(s, -1), p["o_proj"]["weight"]), cache


def mlp(p, x):
    gate = tnn.gelu(tnn.linear(x, p["gate_proj"]["weight"]), approximate="tanh")
    return tnn.linear(gate * tnn.linear(x, p["up_proj"]["weight"]), p["down_proj"]["weight"])


def decoder_layer(layer, x, rope, mask, cfg: Config, cache=None, pos=None):
    """One decoder layer on x (P, d): (x, new cache)."""
    eps = cfg.rms_norm_eps
    h = rms_norm(x, layer["input_layernorm"]["weight"], eps)
    h, cache = attention(layer["self_attn"], h, rope, mask, cfg, cache, pos)
    x = x + rms_norm(h, layer["post_attention_layernorm"]["weight"], eps)
    h = mlp(layer["mlp"], rms_norm(x, layer["pre_feedforward_layernorm"]["weight"], eps))
    return x + rms_norm(h, layer["post_feedforward_layernorm"]["weight"], eps), cache


def forward(params, tokens, cfg: Config, cache=None, pos=None):
    """Logits (P, vocab) of tokens (P,); with `cache` (see `empty_cache`) the tokens sit at
    positions pos .. pos+P-1 and the result is (logits, new cache)."""
    m = params["model"]
    emb = m["embed_tokens"]["weight"]
    x = tnn.embedding(tokens, emb) * np.float32(math.sqrt(cfg.hidden_size))
    q_pos = tnp.arange(tokens.shape[0])
    if cache is not None:
        q_pos = q_pos + pos
        t = cache[0]["k"].shape[1]
    else:
        t = tokens.shape[0]
    causal, sliding = attention_masks(q_pos, t, cfg)
    ropes = {theta: tnn.rope_cos_sin(q_pos, cfg.head_dim, theta)
             for theta in (cfg.rope_local_base_freq, cfg.rope_theta)}
    new_cache = []
    for i, layer in enumerate(m["layers"]):
        local = cfg.is_sliding(i)
        rope = ropes[cfg.rope_local_base_freq if local else cfg.rope_theta]
        x, c = decoder_layer(layer, x, rope, sliding if local else causal, cfg,
                             None if cache is None else cache[i], pos)
        new_cache.append(c)
    x = rms_norm(x, m["norm"]["weight"], cfg.rms_norm_eps)
    logits = tnn.linear(x, emb)   # tied embeddings: the head is a linear layer, as in HF
    return logits if cache is None else (logits, new_cache)


def gemma3(params, tokens, cfg: Config = Config()):
    """Logits (S, vocab) for a sequence of token ids (S,): a prefill without a cache."""
    return forward(params, tokens, cfg)


def gemma3_step(params, tokens, cache, pos, cfg: Config = Config()):
    """Tokens (P,) at positions pos .. pos+P-1 against a KV cache: (logits (P, vocab), new
    cache). Compile with `state="cache"` so the cache is updated in place."""
    return forward(params, tokens, cfg, cache, pos)


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
        if n == 1:
            return x
        if self.lib == "torch":
            return self.xp.repeat_interleave(x, n, dim=axis)
        return self.xp.repeat(x, n, axis=axis)

    def arange(self, n, like):
        if self.lib == "torch":   # on `like`'s device (a CUDA model's positions too)
            return self.xp.arange(n, dtype=like.dtype, device=like.device)
        return self.xp.arange(n, dtype=like.dtype)

    def max(self, x):
        return x.amax(-1, keepdim=True) if self.lib == "torch" else x.max(-1, keepdims=True)

    def mean(self, x):
        return x.mean(-1, keepdim=True) if self.lib == "torch" else x.mean(-1, keepdims=True)

    def sum(self, x):
        return x.sum(-1, keepdim=True) if self.lib == "torch" else x.sum(-1, keepdims=True)

    def write(self, cache, new, pos):
        """`cache` with `new` written along axis 1 at `pos` (in place on numpy and torch)."""
        if self.lib == "jax":
            import jax
            return jax.lax.dynamic_update_slice_in_dim(cache, new, pos, axis=1)
        cache[:, pos:pos + new.shape[1]] = new
        return cache


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


def gemma3_reference(params, tokens, cfg: Config = Config(), lib: str = "numpy",
                     cache=None, pos=0):
    """The model written directly with `lib` ("numpy", "torch" or "jax"), on arrays of that
    library (params, tokens and cache already converted); no tgx involved. With `cache` (a list
    of {"k", "v"} per layer, as `empty_cache`): (logits, new cache), written in place on numpy
    and torch."""
    o = _Ops(lib)
    m = params["model"]
    emb = m["embed_tokens"]["weight"]
    x = emb[tokens] * math.sqrt(cfg.hidden_size)
    s, hd = tokens.shape[0], cfg.head_dim
    q_pos = o.arange(s, x) + pos
    t = s if cache is None else cache[0]["k"].shape[1]
    k_pos = o.arange(t, x)
    causal = k_pos[None, :] <= q_pos[:, None]
    sliding = causal & (k_pos[None, :] > q_pos[:, None] - cfg.sliding_window)
    group = cfg.num_attention_heads // cfg.num_key_value_heads
    eps = cfg.rms_norm_eps
    new_cache = []
    for i, layer in enumerate(m["layers"]):
        a = layer["self_attn"]
        local = cfg.is_sliding(i)
        theta = cfg.rope_local_base_freq if local else cfg.rope_theta
        h = _rms(o, x, layer["input_layernorm"]["weight"], eps)
        q = (h @ a["q_proj"]["weight"].T).reshape(s, -1, hd)
        k = (h @ a["k_proj"]["weight"].T).reshape(s, -1, hd)
        v = o.perm((h @ a["v_proj"]["weight"].T).reshape(s, -1, hd), 1, 0, 2)
        q = _rope(o, o.perm(_rms(o, q, a["q_norm"]["weight"], eps), 1, 0, 2), q_pos, theta)
        k = _rope(o, o.perm(_rms(o, k, a["k_norm"]["weight"], eps), 1, 0, 2), q_pos, theta)
        if cache is not None:
            k = o.write(cache[i]["k"], k, pos)
            v = o.write(cache[i]["v"], v, pos)
            new_cache.append({"k": k, "v": v})
        k, v = o.repeat(k, group, 0), o.repeat(v, group, 0)
        scores = q @ o.perm(k, 0, 2, 1) * cfg.query_pre_attn_scalar ** -0.5
        scores = o.xp.where(sliding if local else causal, scores, -float("inf"))
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
    logits = x @ emb.T
    return logits if cache is None else (logits, new_cache)


def gemma3_numpy(params, tokens, cfg: Config = Config(), cache=None, pos=0):
    """The float64 NumPy reference the tgx logits are checked against (a float64 `cache`,
    from `empty_cache(cfg, t, np.float64)`, is updated in place)."""
    p64 = unflatten_names({k: np.asarray(v, np.float64) for k, v in flatten_names(params).items()})
    return gemma3_reference(p64, np.asarray(tokens), cfg, "numpy", cache, pos)


# ---------------------------------------------------------------------------------------------


def load_or_create(weights: str | None, config: str | None, workdir: str,
                   cfg: Config | None = None) -> tuple[dict, Config]:
    """Real weights when given; else random ones, saved to safetensors and loaded back."""
    cfg = Config.from_json(config) if config else (cfg or Config())
    if weights:
        params = load_weights(weights)
        return {"model": params["model"]} if "model" in params else params, cfg
    path = os.path.join(workdir, "gemma3-random.safetensors")
    save_weights(path, random_params(cfg))
    return load_weights(path), cfg


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--weights", help="a local .safetensors checkpoint (Hugging Face names)")
    ap.add_argument("--config", help="its config.json (default: --preset)")
    ap.add_argument("--preset", choices=["small", "270m"], default="small",
                    help="small (default, for a quick check) or the 270m shape")
    ap.add_argument("--vocab", type=int, help="vocabulary size (270m: 262144 or 32768)")
    ap.add_argument("--layers", type=int, help="number of decoder layers")
    ap.add_argument("--prompt", type=int, default=12, help="prompt length (default 12)")
    ap.add_argument("--decode", type=int, default=4, help="tokens to decode (default 4)")
    args = ap.parse_args(argv)
    cfg = Config.gemma3_270m() if args.preset == "270m" else Config()
    if args.vocab or args.layers:
        cfg = dataclasses.replace(cfg, vocab_size=args.vocab or cfg.vocab_size,
                                  num_hidden_layers=args.layers or cfg.num_hidden_layers)
    with tempfile.TemporaryDirectory() as tmp:
        params, cfg = load_or_create(args.weights, args.config, tmp, cfg)
    n_weights = sum(v.size for v in flatten_names(params).values())
    print(f"Gemma-3 decoder: {cfg.num_hidden_layers} layers, d={cfg.hidden_size}, "
          f"vocab={cfg.vocab_size}, {n_weights / 1e6:.2f}M weights")
    graph = tgx.make_graph(lambda p, t: gemma3(p, t, cfg))(params, tgx.Spec(("S",), "int64"))
    print(f"prefill traced with symbolic sequence length S: {len(graph)} equations, "
          f"out {graph.out_avals[0]}")

    # Greedy decoding: a prefill step, then one token per step, the cache updated in place.
    step = tgx.compile(lambda p, t, c, pos: gemma3_step(p, t, c, pos, cfg),
                       weights="p", state="c", policy="heuristic")
    t_max = args.prompt + args.decode
    cache, cache64 = empty_cache(cfg, t_max), empty_cache(cfg, t_max, np.float64)
    tokens = np.random.default_rng(1).integers(0, cfg.vocab_size, args.prompt)
    pos, worst = 0, 0.0
    for _ in range(1 + args.decode):
        logits, cache = step(params, tokens, cache, np.int32(pos))
        ref, cache64 = gemma3_numpy(params, tokens, cfg, cache64, pos)
        worst = max(worst, float(np.abs(logits - ref).max() / np.abs(ref).max()))
        pos += len(tokens)
        tokens = np.array([int(np.argmax(logits[-1]))])
    print(f"prefill of {args.prompt} tokens and {args.decode} decode steps with a KV cache as "
          f"state: max rel. error of the logits vs NumPy float64 {worst:.1e}")
    assert worst < 1e-4, worst


if __name__ == "__main__":
    main()
