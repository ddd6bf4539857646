"""Runtime benchmarks: run-loop overhead, an MLP and a transformer block on every plan, and the
buffer plan's memory, side by side with NumPy, PyTorch eager and jax.jit.

    .venv/bin/python bench/bench_runtime.py [--quick]

Prints ratios (tgx time / reference time; workspace / sum of intermediates …). Numbers are
medians of repeated runs after warm-up, on whatever CPU this runs on.
"""

from __future__ import annotations

import argparse
import itertools
import math
import sys
import time

import numpy as np

import tgx
import tgx.numpy as tnp
from tgx.backends import backend_available
from tgx.runtime.memory import format_bytes


def _calls_per_sample(fn, min_time):
    n = 1
    while True:
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        if time.perf_counter() - t0 >= min_time or n > 1 << 16:
            return n
        n *= 2


def compare(fns: dict, rounds=15, min_time=0.01) -> dict:
    """Seconds per call of each thunk, measured in interleaved rounds (so a burst of load from
    other processes hits every contender alike); the minimum over rounds of each."""
    for f in fns.values():
        f()  # warm-up: jit compiles, workspaces
    reps = {k: _calls_per_sample(f, min_time) for k, f in fns.items()}
    best = dict.fromkeys(fns, float("inf"))
    for _ in range(rounds):
        for k, f in fns.items():
            n = reps[k]
            t0 = time.perf_counter()
            for _ in range(n):
                f()
            best[k] = min(best[k], (time.perf_counter() - t0) / n)
    return best


def timeit(fn, *args, **kw):
    return compare({"f": lambda: fn(*args)}, **kw)["f"]


# --------------------------------------------------------------------------------- overhead
def bench_overhead(n_ops=200):
    ops = [tnp.sin, tnp.cos, tnp.negative, tnp.exp]

    def chain(x):
        for i in range(n_ops):
            x = ops[i % 4](x) if i % 4 != 3 else tnp.exp(tnp.minimum(x, 1.0))
        return x

    f = tgx.compile(chain, backends=["numpy"])
    x = np.linspace(0, 1, 8, dtype=np.float32)
    plan = f.lower(x)
    cg = plan.compiled
    steps = cg.hand_loop(())
    spec = cg.specialize(())
    template = spec.template

    def hand(x):  # the same kernel callables, written out as a plain loop over slots
        slots = template[:]
        slots[0] = x
        for fn, ins, out in steps:
            slots[out] = fn(*[slots[i] for i in ins])
        return slots[cg.out_slots[0]]

    def bare(x):  # the kernels alone, no slots at all (the floor)
        for fn, ins, _ in steps:
            x = fn(x) if len(ins) == 1 else fn(x, template[ins[1]])
        return x

    np.testing.assert_allclose(cg.run_flat([x])[0], hand(x), rtol=1e-6)
    t = compare({"run": lambda: cg.run_flat([x]), "call": lambda: f(x), "hand": lambda: hand(x),
                 "bare": lambda: bare(x)}, rounds=25)
    t_run, t_call, t_hand, t_bare = t["run"], t["call"], t["hand"], t["bare"]
    n = len(steps)
    print(f"run-loop overhead, chain of {n} tiny NumPy kernels:")
    print(f"  CompiledGraph.run_flat {t_run * 1e6:8.1f} us  ({t_run / n * 1e9:.0f} ns/instr)")
    print(f"  tgx.compile call       {t_call * 1e6:8.1f} us")
    print(f"  hand-written slot loop {t_hand * 1e6:8.1f} us")
    print(f"  bare kernel calls      {t_bare * 1e6:8.1f} us")
    print(f"  ratio run/hand = {t_run / t_hand:.2f}x   run/bare = {t_run / t_bare:.2f}x   "
          f"(target <= 1.3x)")
    return t_run / t_hand


# --------------------------------------------------------------------------------- models
def mlp(p, x):
    h = tnp.maximum(x @ p["w1"] + p["b1"], 0.0)
    h = tnp.maximum(h @ p["w2"] + p["b2"], 0.0)
    return h @ p["w3"]


def mlp_np(p, x, relu=lambda v: np.maximum(v, 0.0)):
    h = relu(x @ p["w1"] + p["b1"])
    h = relu(h @ p["w2"] + p["b2"])
    return h @ p["w3"]


def block(p, x, cos, sin, *, xp=tnp, heads=4):
    """RMSNorm → attention with RoPE (causal) → residual → RMSNorm → GeGLU MLP → residual."""
    t, d = x.shape
    hd = d // heads
    erf = xp.erf if xp is tnp else _erf_for(xp)

    def rms(v, w):
        return v / xp.sqrt(xp.mean(v * v, axis=-1, keepdims=True) + 1e-6) * w

    def rope(v):  # v: (heads, t, hd)
        v1, v2 = v[..., : hd // 2], v[..., hd // 2:]
        return xp.concatenate([v1 * cos - v2 * sin, v1 * sin + v2 * cos], axis=-1)

    h = rms(x, p["n1"])
    q = xp.transpose(xp.reshape(h @ p["wq"], (t, heads, hd)), (1, 0, 2))
    k = xp.transpose(xp.reshape(h @ p["wk"], (t, heads, hd)), (1, 0, 2))
    v = xp.transpose(xp.reshape(h @ p["wv"], (t, heads, hd)), (1, 0, 2))
    q, k = rope(q), rope(k)
    s = (q @ xp.swapaxes(k, -1, -2)) * (1.0 / math.sqrt(hd)) + p["mask"]
    s = xp.exp(s - xp.max(s, axis=-1, keepdims=True))
    a = (s / xp.sum(s, axis=-1, keepdims=True)) @ v
    x = x + xp.reshape(xp.transpose(a, (1, 0, 2)), (t, d)) @ p["wo"]
    h = rms(x, p["n2"])
    g = h @ p["wg"]
    gelu = 0.5 * g * (1.0 + erf(g * (1.0 / math.sqrt(2.0))))
    return x + (gelu * (h @ p["wu"])) @ p["wd"]


def _erf_for(xp):
    if xp is np:
        import scipy.special

        return scipy.special.erf
    if xp.__name__.startswith("jax"):
        import jax.scipy.special

        return jax.scipy.special.erf
    return xp.erf


def block_params(rng, t, d, f):
    w = lambda *s: (rng.standard_normal(s) / math.sqrt(s[0])).astype(np.float32)  # noqa: E731
    hd = d // 4
    pos = np.arange(t)[:, None] * (10000.0 ** (-np.arange(hd // 2) / (hd // 2)))[None]
    p = {"n1": np.ones(d, np.float32), "n2": np.ones(d, np.float32), "wq": w(d, d),
         "wk": w(d, d), "wv": w(d, d), "wo": w(d, d), "wg": w(d, f), "wu": w(d, f),
         "wd": w(f, d), "mask": np.triu(np.full((t, t), -1e9, np.float32), 1)}
    return p, np.cos(pos).astype(np.float32), np.sin(pos).astype(np.float32)


def bench_models(quick=False):
    rng = np.random.default_rng(0)
    rows = []
    have_torch, have_jax = backend_available("torch"), backend_available("jax")
    plans = [("numpy", ["numpy"])]
    plans += [("torch", ["torch"])] if have_torch else []
    plans += [("jax", ["jax"])] if have_jax else []
    plans += [("heuristic", None)]

    # MLP
    n, d, h = (64, 256, 512) if quick else (256, 512, 1024)
    pm = {"w1": rng.standard_normal((d, h)).astype(np.float32) / 20,
          "b1": np.zeros(h, np.float32), "w2": rng.standard_normal((h, h)).astype(np.float32) / 30,
          "b2": np.zeros(h, np.float32), "w3": rng.standard_normal((h, 10)).astype(np.float32)}
    xm = rng.standard_normal((n, d)).astype(np.float32)
    refs = {"numpy": lambda: timeit(mlp_np, pm, xm)}

    # transformer block
    t, dm, ff = (64, 128, 256) if quick else (128, 256, 768)
    pb, cos, sin = block_params(rng, t, dm, ff)
    xb = rng.standard_normal((t, dm)).astype(np.float32)
    want = block(pb, xb, cos, sin, xp=np)
    brefs = {"numpy": lambda: timeit(lambda: block(pb, xb, cos, sin, xp=np))}
    if have_torch:
        import torch

        tp = {k: torch.from_numpy(v) for k, v in pb.items()}
        tx, tc, ts = map(torch.from_numpy, (xb, cos, sin))
        tm = {k: torch.from_numpy(v) for k, v in pm.items()}
        txm = torch.from_numpy(xm)

        def torch_mlp():
            with torch.no_grad():
                return mlp_np(tm, txm, torch.relu)
        refs["torch eager"] = lambda: timeit(torch_mlp)

        def torch_block():
            with torch.no_grad():
                return block(tp, tx, tc, ts, xp=_TorchNP)
        brefs["torch eager"] = lambda: timeit(torch_block)
        np.testing.assert_allclose(torch_block().numpy(), want, rtol=2e-3, atol=2e-3)
    if have_jax:
        import jax
        import jax.numpy as jnp

        jm = jax.jit(lambda p, x: mlp_np(p, x, jax.nn.relu))
        jpm = {k: jnp.asarray(v) for k, v in pm.items()}
        jxm = jnp.asarray(xm)
        refs["jax.jit"] = lambda: timeit(lambda: jm(jpm, jxm).block_until_ready())
        jb = jax.jit(lambda p, x, c, s: block(p, x, c, s, xp=jnp))
        jpb = {k: jnp.asarray(v) for k, v in pb.items()}
        jargs = tuple(map(jnp.asarray, (xb, cos, sin)))
        brefs["jax.jit"] = lambda: timeit(lambda: jb(jpb, *jargs).block_until_ready())

    for model, fn, args, ref_fns in (
            ("MLP", mlp, (pm, xm), refs),
            ("transformer block", lambda p, x, c, s: block(p, x, c, s), (pb, xb, cos, sin), brefs)):
        ref_times = {k: v() for k, v in ref_fns.items()}
        print(f"\n{model}: " + ", ".join(f"{k} {v * 1e3:.3f} ms" for k, v in ref_times.items()))
        # "+w": the parameters bound once as weights (tgx.compile(weights=...)), as the
        # peers' arrays already live in their library (jax.jit's on device)
        for (name, backends), bound in itertools.product(plans, (False, True)):
            f = tgx.compile(fn, backends=backends, weights="p" if bound else None)
            out = f(*args)
            if model == "transformer block":
                np.testing.assert_allclose(out, want, rtol=2e-3, atol=2e-3)
            tt = timeit(f, *args)
            ratios = "  ".join(f"/{k} {tt / v:5.2f}x" for k, v in ref_times.items())
            label = name + ("+w" if bound else "")
            print(f"  tgx {label:<12} {tt * 1e3:8.3f} ms   {ratios}")
            rows.append((model, label, tt, ref_times))
        plan = tgx.compile(fn, backends=["numpy"]).lower(*args)
        mem = plan.memory
        ws = mem.peak().get("cpu", 0)
        tot = mem.sum_of_intermediates().get("cpu", 0)
        lb = mem.lower_bound().get("cpu", 0)
        print(f"  memory (numpy plan): workspace {format_bytes(ws)}, sum of intermediates "
              f"{format_bytes(tot)} (workspace/sum {ws / max(tot, 1):.2f}), largest live set "
              f"{format_bytes(lb)} (workspace/live {ws / max(lb, 1):.2f}), in place: "
              f"{len(mem.aliases)}")
    return rows


class _TorchNP:
    """The handful of NumPy names `block` uses, on torch tensors."""

    @staticmethod
    def sqrt(x):
        import torch
        return torch.sqrt(x)

    @staticmethod
    def mean(x, axis, keepdims):
        return x.mean(dim=axis, keepdim=keepdims)

    @staticmethod
    def max(x, axis, keepdims):
        return x.amax(dim=axis, keepdim=keepdims)

    @staticmethod
    def sum(x, axis, keepdims):
        return x.sum(dim=axis, keepdim=keepdims)

    @staticmethod
    def exp(x):
        return x.exp()

    @staticmethod
    def erf(x):
        return x.erf()

    @staticmethod
    def reshape(x, s):
        return x.reshape(s)

    @staticmethod
    def transpose(x, p):
        return x.permute(p)

    @staticmethod
    def swapaxes(x, a, b):
        return x.transpose(a, b)

    @staticmethod
    def concatenate(xs, axis):
        import torch
        return torch.cat(xs, dim=axis)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="smaller models, fewer repeats")
    a = ap.parse_args(argv)
    print(f"tgx {tgx.__version__}, numpy {np.__version__}, python {sys.version.split()[0]}")
    bench_overhead()
    bench_models(quick=a.quick)


if __name__ == "__main__":
    main()
