"""Trace speed: a 1,000-equation function with a symbolic batch dim, and an 18-layer
transformer-shaped function. Target: under 0.5 s for 1,000 equations.

Run: python bench/bench_trace.py
"""

from __future__ import annotations

import time

import numpy as np

import tgx
import tgx.numpy as tnp


def chain_1000(x):
    # 7 equations per step (mul, exp, sub, reduce_sum, reshape, add, div): 143 steps ≈ 1,000.
    for _ in range(143):
        x = tnp.exp(x * 0.5) - x
        x = x / (1.0 + tnp.sum(x, axis=-1, keepdims=True))
    return x


def transformer(params, x, n_layers=18, heads=8):
    d = x.shape[-1]
    for layer in params[:n_layers]:
        h = x * (1.0 / tnp.sqrt(tnp.mean(x * x, axis=-1, keepdims=True) + 1e-6)) * layer["g"]
        q = (h @ layer["wq"]).reshape(x.shape[0], x.shape[1], heads, -1).transpose(0, 2, 1, 3)
        k = (h @ layer["wk"]).reshape(x.shape[0], x.shape[1], heads, -1).transpose(0, 2, 1, 3)
        v = (h @ layer["wv"]).reshape(x.shape[0], x.shape[1], heads, -1).transpose(0, 2, 1, 3)
        s = q @ k.swapaxes(-1, -2) * (1.0 / np.sqrt(d // heads))
        e = tnp.exp(s - tnp.max(s, axis=-1, keepdims=True))
        a = (e / tnp.sum(e, axis=-1, keepdims=True)) @ v
        x = x + a.transpose(0, 2, 1, 3).reshape(x.shape[0], x.shape[1], d) @ layer["wo"]
        h = x * (1.0 / tnp.sqrt(tnp.mean(x * x, axis=-1, keepdims=True) + 1e-6))
        x = x + tnp.maximum(h @ layer["w1"], 0.0) @ layer["w2"]
    return x


def timed(fn, repeats=5):
    """(first call, best of the rest, result): the first call pays sympy's cold caches."""
    times, out = [], None
    for _ in range(repeats):
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
    return times[0], min(times[1:] or times), out


def main() -> None:
    spec = tgx.Spec(("N", 64), "float32")
    first, t, g = timed(lambda: tgx.make_graph(chain_1000)(spec))
    print(f"trace {len(g)}-equation chain (symbolic N): first {first * 1e3:6.1f} ms, then "
          f"{t * 1e3:6.1f} ms ({t / len(g) * 1e6:.0f} us/eqn; target < 500 ms)")

    rng = np.random.default_rng(0)
    d, f = 256, 1024
    w = lambda *s: rng.standard_normal(s).astype(np.float32) * 0.02  # noqa: E731
    params = [{"g": w(d), "wq": w(d, d), "wk": w(d, d), "wv": w(d, d), "wo": w(d, d),
               "w1": w(d, f), "w2": w(f, d)} for _ in range(18)]
    spec = tgx.Spec(("B", "S", d), "float32")
    first, t, g = timed(lambda: tgx.make_graph(transformer)(params, spec), repeats=3)
    print(f"trace 18-layer transformer, {len(g)} equations (symbolic B, S): first "
          f"{first * 1e3:6.1f} ms, then {t * 1e3:6.1f} ms ({t / len(g) * 1e6:.0f} us/eqn)")
    _, t, _ = timed(lambda: tgx.check_graph(g), repeats=2)
    print(f"check_graph on it: {t * 1e3:.1f} ms")


if __name__ == "__main__":
    main()
