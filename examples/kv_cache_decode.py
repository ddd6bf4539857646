"""Greedy decoding with a KV cache kept as *state*: `tgx.compile(layer, state="cache")`.

A tiny decoder layer (RMSNorm, 4-head attention, SiLU MLP, residuals, a vocabulary head) with
random weights reads a 200-token prompt in one call (prefill), then decodes 16 tokens one
call each. Prefill and decode are the same function at two shapes (two traces). Every call
writes its tokens' keys and values into the caller's cache arrays in place
(`tgx.lax.dynamic_update_slice`, lowered to a window write on NumPy and torch; a copy back
on jax, whose arrays are immutable) and attends over the cache with a causal mask
`arange(T_MAX) <= position`. The baseline is a plain NumPy loop without a cache that
recomputes the layer over the whole prefix for every new token; the logits must agree.

Run: python examples/kv_cache_decode.py
"""

from __future__ import annotations

import time

import numpy as np

import tgx
import tgx.lax as lax
import tgx.nn as tnn
import tgx.numpy as tnp
from tgx.backends import available_backends

D, H, FF, VOCAB, T_MAX = 64, 4, 128, 96, 256
DH = D // H
PROMPT, NEW = 200, 16


def init_weights(rng: np.random.Generator) -> dict:
    def dense(n_in, n_out):
        return (rng.standard_normal((n_in, n_out)) / np.sqrt(n_in)).astype(np.float32)

    return {"embed": rng.standard_normal((VOCAB, D)).astype(np.float32),
            "wq": dense(D, D), "wk": dense(D, D), "wv": dense(D, D), "wo": dense(D, D),
            "w1": dense(D, FF), "w2": dense(FF, D), "head": dense(D, VOCAB),
            "g1": np.ones(D, np.float32), "g2": np.ones(D, np.float32)}


def layer(w, xs, cache, pos):
    """Tokens xs (P, D) at positions pos .. pos+P-1: (logits of the last one, new cache)."""
    p_len = xs.shape[0]
    h = tnn.rms_norm(xs, (D,), w["g1"], eps=1e-6)
    q, k, v = (tnp.reshape(h @ w[n], (p_len, H, DH)) for n in ("wq", "wk", "wv"))
    keys = lax.dynamic_update_slice(cache["k"], k, (pos, 0, 0))      # (T_MAX, H, DH)
    values = lax.dynamic_update_slice(cache["v"], v, (pos, 0, 0))
    scores = tnp.einsum("phd,thd->hpt", q, keys) / np.float32(np.sqrt(DH))
    mask = tnp.arange(T_MAX)[None, :] <= tnp.arange(p_len)[:, None] + pos     # causal
    p = tnn.softmax(tnp.where(mask[None], scores, np.float32(-1e30)), dim=-1)
    x = xs[-1] + tnp.reshape(tnp.einsum("ht,thd->hd", p[:, -1], values), (D,)) @ w["wo"]
    x = x + tnn.silu(tnn.rms_norm(x, (D,), w["g2"], eps=1e-6) @ w["w1"]) @ w["w2"]
    return x @ w["head"], {"k": keys, "v": values}


def _rms(x, g):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + 1e-6) * g


def layer_numpy(w, xs: np.ndarray) -> np.ndarray:
    """Logits of the last of the tokens `xs` (T, D), recomputing the whole prefix."""
    t = len(xs)
    h = _rms(xs, w["g1"])
    q, k, v = (np.reshape(h @ w[n], (t, H, DH)) for n in ("wq", "wk", "wv"))
    s = np.einsum("hd,thd->ht", q[-1], k) / np.sqrt(DH)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    x = xs[-1] + np.einsum("ht,thd->hd", p, v).reshape(D) @ w["wo"]
    a = _rms(x, w["g2"]) @ w["w1"]
    x = x + (a / (1 + np.exp(-a))) @ w["w2"]
    return x @ w["head"]


def decode_tgx(f, w, prompt, state=True):
    cache = {"k": np.zeros((T_MAX, H, DH), np.float32),
             "v": np.zeros((T_MAX, H, DH), np.float32)}
    k_obj = cache["k"]
    out, cache = f(w, w["embed"][prompt], cache, np.int32(0))            # prefill
    tokens, logits, times = list(prompt) + [int(np.argmax(out))], [out], []
    for pos in range(PROMPT, PROMPT + NEW - 1):                          # decode
        t0 = time.perf_counter()
        out, cache = f(w, w["embed"][tokens[pos:pos + 1]], cache, np.int32(pos))
        times.append(time.perf_counter() - t0)
        logits.append(out)
        tokens.append(int(np.argmax(out)))
    assert (cache["k"] is k_obj) == state        # with state=: the caller's arrays, in place
    return tokens, logits, times


def decode_numpy(w, tokens):
    """Logits after each prefix, recomputed from scratch (no cache)."""
    logits, times = [], []
    for end in range(PROMPT, PROMPT + NEW):
        t0 = time.perf_counter()
        logits.append(layer_numpy(w, w["embed"][tokens[:end]]))
        times.append(time.perf_counter() - t0)
    return logits, times[1:]


def main() -> None:
    rng = np.random.default_rng(0)
    w = init_weights(rng)
    prompt = [int(t) for t in rng.integers(0, VOCAB, PROMPT)]
    print(f"decoder layer d={D}, {H} heads, KV cache ({T_MAX}, {H}, {DH}) x 2; "
          f"prompt {PROMPT} tokens (one prefill call), then {NEW} decoded one per call")
    rows = []
    for backend in available_backends():
        f = tgx.compile(layer, state="cache", weights="w", policy="heuristic",
                        backends=[backend])
        tokens, logits, times = decode_tgx(f, w, prompt)
        ref_logits, ref_times = decode_numpy(w, tokens)
        err = max(float(np.abs(a - b).max()) for a, b in zip(logits, ref_logits))
        assert err < 1e-3, f"{backend}: max |tgx - numpy| = {err}"
        assert f.trace_count == 2                # prefill and decode shapes, nothing more
        plan = f.lower(w, w["embed"][:1], {"k": np.zeros((T_MAX, H, DH), np.float32),
                                           "v": np.zeros((T_MAX, H, DH), np.float32)},
                       np.int32(0))
        inplace = [i.label for i in plan.compiled.instructions if "[inplace]" in i.label]
        how = ("in place: " + ", ".join(inplace)) if inplace else (
            "copied back: " + plan.compiled.state_reasons[0])
        state_bytes = plan.memory.bytes_by_kind()["state"]["cpu"]
        print(f"{backend:>6}: {plan.summary()}; state {state_bytes} bytes {how}")
        # the same layer without state=: a functional cache, two new arrays every call
        plain = tgx.compile(layer, weights="w", policy="heuristic", backends=[backend])
        tokens2, _, times2 = decode_tgx(plain, w, prompt, state=False)
        assert tokens2 == tokens
        rows.append((backend, np.median(times), np.median(times2), np.median(ref_times), err,
                     tokens[PROMPT:]))
    print(f"\n{'backend':>8} {'tgx state=':>11} {'tgx no state':>13} {'numpy, no cache':>16}"
          f"  max |Δlogits|")
    for backend, t, t2, t_ref, err, _ in rows:
        print(f"{backend:>8} {t * 1e6:8.1f} µs {t2 * 1e6:10.1f} µs {t_ref * 1e6:13.1f} µs"
              f"  {err:.1e}")
    print("(per decoded token, median. tgx state=: the cache updated in place; no state: the "
          "cache returned as new arrays;\n numpy: a plain loop recomputing the layer over the "
          "whole prefix)")
    print("decoded tokens:", rows[0][-1])
    assert all(r[-1] == rows[0][-1] for r in rows)


if __name__ == "__main__":
    main()
