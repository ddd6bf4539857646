"""Compile + first call of the Gemma-3-270m-shaped step in a fresh process, with a warm
benchmark store: without the XLA executable cache, with it cold (the process compiles and
writes), and warm (the process loads what the cold one wrote).

    .venv/bin/python bench/bench_cold_start.py [--layers 18] [--vocab 32768]
                                               [--phase prefill] [--store PATH] [--rounds 3]

The store: --store PATH if it exists, else EXPLORE fills it first (a process of its own,
~70 s for the 18-layer prefill). Each measurement is a new Python process that builds the
weights and the cache (not timed), then times `tgx.compile(step, weights="p", state="c",
store=..., policy="fastest", backends=["numpy", "torch", "jax"])` and the first call (timed:
what a user waits for, including the imports of the backends' libraries, tgx's trace, the
plan and XLA's compile or load, and only those a plan uses: a NumPy plan never imports
jax), then one more call. Rounds interleave the three modes. The numba kernel cache is the
user's own (warm after explore); only the XLA cache is switched (`TGX_XLA_CACHE`). The
processes read and write Python bytecode as an installed package does, whatever
PYTHONDONTWRITEBYTECODE says; an untimed process first writes what is missing.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "examples"))


def _step(cfg):
    import gemma3 as G

    def step(p, t, c, position):
        return G.gemma3_step(p, t, c, position, cfg)
    return step


def _setup(args):
    import bench_gemma as B
    import gemma3 as G

    cfg = G.Config.gemma3_270m(vocab_size=args.vocab, num_hidden_layers=args.layers)
    params = G.random_params(cfg)
    tokens, pos = B.phase_inputs(args.phase, cfg, np.random.default_rng(0))
    return cfg, params, tokens, pos, B


def explore(args) -> None:
    import tgx

    cfg, params, tokens, pos, B = _setup(args)
    t0 = time.perf_counter()
    f = tgx.compile(_step(cfg), weights="p", state="c", store=args.store, policy="explore",
                    backends=list(B.BACKENDS))
    f(params, tokens, B.filled_cache(cfg, params), np.int32(pos))
    print(json.dumps({"explore_s": time.perf_counter() - t0}))


def child(args) -> None:
    import tgx

    cfg, params, tokens, pos, B = _setup(args)
    caches = [B.filled_cache(cfg, params) for _ in range(2)]
    os.environ["TGX_XLA_CACHE"] = args.xla_dir   # a directory, or "off"
    t0 = time.perf_counter()   # the libraries a plan needs are imported inside: jax, numba …
    f = tgx.compile(_step(cfg), weights="p", state="c", store=args.store, policy="fastest",
                    backends=list(B.BACKENDS))
    f(params, tokens, caches[0], np.int32(pos))
    t1 = time.perf_counter()
    f(params, tokens, caches[1], np.int32(pos))
    t2 = time.perf_counter()
    plan = f.lower(params, tokens, caches[0], np.int32(pos))
    xla = sys.modules.get("tgx.backends.xla_cache")   # imported where a plan runs XLA
    print(json.dumps({"first_s": t1 - t0, "second_s": t2 - t1, "plan": plan.summary(),
                      "stats": dict(xla.STATS) if xla else "jax not imported"}))


def _spawn(args, *extra) -> dict:
    cmd = [sys.executable, os.path.abspath(__file__), "--layers", str(args.layers), "--vocab",
           str(args.vocab), "--phase", args.phase, "--store", args.store, *extra]
    # bytecode is written and read, as in an installed package (PYTHONDONTWRITEBYTECODE
    # would make every process compile tgx's modules from source: ~0.13 s)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, env=env)
    if r.returncode:
        sys.exit(r.stderr)
    return json.loads(r.stdout.strip().splitlines()[-1])


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=18)
    ap.add_argument("--vocab", type=int, default=32768)
    ap.add_argument("--phase", choices=["prefill", "decode"], default="prefill")
    ap.add_argument("--store", help="a warm benchmark store (explored first if missing)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--explore", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--xla-dir", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.explore:
        return explore(args)
    if args.xla_dir:
        return child(args)
    with tempfile.TemporaryDirectory() as tmp:
        args.store = args.store or os.path.join(tmp, "store.json")
        if not os.path.exists(args.store):
            print(f"explore into {args.store}: {_spawn(args, '--explore')['explore_s']:.1f} s")
        _spawn(args, "--xla-dir", "off")   # untimed: writes the bytecode of what it imports
        times: dict = {"no XLA cache": [], "cold XLA cache": [], "warm XLA cache": []}
        for r in range(args.rounds):
            xla = os.path.join(tmp, f"xla{r}")
            for mode, d in (("no XLA cache", "off"), ("cold XLA cache", xla),
                            ("warm XLA cache", xla)):
                out = _spawn(args, "--xla-dir", d)
                times[mode].append(out["first_s"])
                print(f"round {r} {mode}: compile + first call {out['first_s']:.3f} s, "
                      f"second call {out['second_s']:.3f} s, {out['stats']}", flush=True)
        print(f"\n{args.layers}-layer {args.phase}, FASTEST, warm store; {out['plan']}")
        for mode, ts in times.items():
            print(f"  {mode}: median {statistics.median(ts):.3f} s "
                  f"(min {min(ts):.3f}, max {max(ts):.3f})")


if __name__ == "__main__":
    main()
