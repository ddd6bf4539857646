"""The main job (`make demo`): a Gemma-3-shaped decoder traced with a symbolic sequence
length, its unmeasured candidates profiled into the embedded benchmark store, its path space
explored on those figures, compiled with the FASTEST policy, and run at two sequence lengths,
with a report against NumPy-only, torch-only and jax-only plans, PyTorch eager and jax.jit.

A second run finds the measurements in the store and skips profiling.

Run: python examples/demo.py [--budget SECONDS] [--store PATH]
"""

from __future__ import annotations

import argparse
import collections
import itertools
import os
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import gemma3 as G  # noqa: E402

import tgx  # noqa: E402
from tgx.profiling.timing import round_orders  # noqa: E402
from tgx.io import flatten_names, unflatten_names  # noqa: E402
from tgx.explore import (  # noqa: E402
    candidate_assignments, explore_kernels, measure_assignments, unmeasured,
)
from tgx.pipeline import transform  # noqa: E402
from tgx.planning.cost_model import CostModel  # noqa: E402
from tgx.planning.options import PlanOptions  # noqa: E402
from tgx.store import environment_id, sniff_environment  # noqa: E402

BACKENDS = ["numpy", "torch", "jax"]
LENGTHS = (64, 16)   # prefill lengths: the first binds the plan, the second reuses it
#: partial plans the path ranking may expand for the block's best (~10K per second here)
RANK_EXPANSIONS = 50_000


def section(title: str) -> None:
    print(f"\n== {title}")


def interleaved_times(rows, rounds: int = 9, calls: int = 5) -> list[tuple[str, float, float]]:
    """(name, median, spread) per row: `rounds` rounds in a shuffled order, each row one
    untimed call (its library's thread pools and caches settle) then `calls` timed ones;
    the median of all timed calls, and the spread of the round medians (max - min over
    median), so that no row is measured only while another's pools were spinning."""
    per = {name: [] for name, _ in rows}
    for order in round_orders(rows, rounds):
        for name, fn in order:
            fn()
            ts = []
            for _ in range(calls):
                t = time.perf_counter()
                fn()
                ts.append(time.perf_counter() - t)
            per[name].append(ts)
    out = []
    for name, _ in rows:
        mids = [float(np.median(ts)) for ts in per[name]]
        med = float(np.median([t for ts in per[name] for t in ts]))
        out.append((name, med, (max(mids) - min(mids)) / med))
    return out


def decoder_block(cfg: G.Config):
    """One decoder layer as its own function (for the path listing)."""
    def block(layer, x):
        q_pos = tgx.numpy.arange(x.shape[0])
        rope = tgx.nn.rope_cos_sin(q_pos, cfg.head_dim, cfg.rope_local_base_freq)
        _, sliding = G.attention_masks(q_pos, x.shape[0], cfg)
        return G.decoder_layer(layer, x, rope, sliding, cfg)[0]
    return block


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budget", type=float, default=90.0,
                    help="seconds of profiling at most (default 90)")
    ap.add_argument("--store", help="benchmark store (default: $TGX_STORE or the user cache)")
    args = ap.parse_args(argv)
    t_start = time.perf_counter()
    store = tgx.BenchmarkStore(args.store)
    env = sniff_environment()
    print(f"tgx demo on {env.get('cpu_model', 'this CPU')} ({env.get('cpu_cores', '?')} cores), "
          f"environment {environment_id(env)}")
    print(f"benchmark store: {store.path} ({len(store.traces())} traces)")

    section("Model")
    cfg = G.Config()
    with tempfile.TemporaryDirectory() as tmp:
        params, cfg = G.load_or_create(None, None, tmp)
        print(f"Gemma-3-shaped decoder: {cfg.num_hidden_layers} layers, d={cfg.hidden_size}, "
              f"{cfg.num_attention_heads} query / {cfg.num_key_value_heads} key-value heads, "
              f"vocab {cfg.vocab_size}; {sum(v.size for v in flatten_names(params).values()):,} "
              f"random weights saved to and loaded from a .safetensors file")

    def model(params, tokens):
        return G.gemma3(params, tokens, cfg)

    graph = tgx.make_graph(model)(params, tgx.Spec(("S",), "int64"))
    kinds = collections.Counter(e.primitive.name for e in graph.eqns)
    print(f"traced with a symbolic sequence length: {len(graph)} equations -> "
          f"{graph.out_avals[0]}")
    print("  " + ", ".join(f"{k} x{n}" for k, n in kinds.most_common()))
    flat = tgx.decompose(graph)
    print(f"  fully decomposed: {len(flat)} atomic equations over "
          f"{len({e.primitive.name for e in flat.eqns})} atomic primitives")

    section("Profiling")
    s0 = LENGTHS[0]
    dims = {"S": s0}   # the binding at which plans are costed and kernels profiled
    graph = transform(graph)  # the graph tgx.compile plans (simplified); plans are keyed by it
    cm = CostModel(store)
    todo = unmeasured(graph, BACKENDS, store, cm, dims)
    if not todo:
        print("every candidate kernel is already measured in the store: profiling skipped")
    else:
        print(f"{len(todo)} candidate kernels (incl. inside decompositions) are unmeasured at "
              f"S={s0}; profiling for at most {args.budget:.0f} s")
        t = time.perf_counter()
        n = explore_kernels(graph, BACKENDS, store, cm, dims, budget_s=0.02,
                            time_limit_s=args.budget, progress=None)
        left = len(todo) - n
        print(f"recorded {n} traces in {time.perf_counter() - t:.1f} s"
              + (f"; {left} left for the next run" if left else ""))
    t = time.perf_counter()
    # every input but the tokens is a weight, bound once (as tgx.compile(weights=) does)
    opts = PlanOptions(weights=tuple(range(len(graph.invars) - 1)))
    shortlist = candidate_assignments(graph, BACKENDS, CostModel(store), dims, opts)
    n = measure_assignments(graph, shortlist, store, dims, opts, budget_s=0.3)
    if n:
        print(f"measured {n} whole plans as a whole (each backend alone, the heuristic plan, "
              f"the best predicted mix of each set of backends: {', '.join(shortlist)}) in "
              f"{time.perf_counter() - t:.1f} s")

    section("Path space")
    paths = tgx.paths(model)(params, tgx.Spec(("S",), "int64"), backends=BACKENDS,
                             store=store, dims=dims)
    print(f"whole model: {paths.count():.3e} valid plans (kernels on {', '.join(BACKENDS)}, "
          f"decompositions, pattern kernels, transfers)")
    block = decoder_block(cfg)
    layer0 = params["model"]["layers"][0]
    spec = tgx.Spec(("S", cfg.hidden_size))
    bpaths = tgx.paths(block)(layer0, spec, backends=BACKENDS, store=store, dims=dims)
    # ranked among the plans that keep each op whole: the exact search over decompositions
    # too expands hundreds of thousands of partial plans that predict about the same time
    # (36 s on a freshly profiled store, 2026-11-24; docs/paths.md)
    whole = tgx.paths(block)(layer0, spec, backends=BACKENDS, store=store, dims=dims,
                             decompose=False)
    print(f"one decoder block: {bpaths.count():.3e} valid plans, {whole.count():.3e} with "
          f"each op kept whole; the best predicted of those at S={s0}:")
    found = list(itertools.islice(whole.ranked(max_expansions=RANK_EXPANSIONS), 1))
    if not found:
        print(f"  (not found within {RANK_EXPANSIONS:,} steps of the ranking's exact search: "
              f"many partial plans predict about the same time here; docs/paths.md)")
    for i, p in enumerate(found):
        per = collections.Counter(s.option.backend for s in p.steps if s.option.backend)
        src = collections.Counter(s.estimate.source for s in p.steps)
        print(f"  #{i + 1}: {p.cost * 1e6:7.1f} us predicted, {len(p.steps)} kernels "
              f"({', '.join(f'{n} on {b}' for b, n in per.items())}), {p.ntransfers} "
              f"transfers; figures: {', '.join(f'{n} {s}' for s, n in src.items())}")

    section("Compile (policy FASTEST) and run")
    fastest = tgx.compile(model, policy="fastest", backends=BACKENDS, store=store,
                          dynamic={"tokens": {0: "S"}}, weights="params")
    rng = np.random.default_rng(0)
    token_sets = {s: rng.integers(0, cfg.vocab_size, s) for s in LENGTHS}
    for s, tokens in token_sets.items():
        logits = fastest(params, tokens)
        ref = G.gemma3_numpy(params, tokens, cfg)
        err = float(np.abs(logits - ref).max() / np.abs(ref).max())
        print(f"prefill S={s:3d}: logits {logits.shape}, max rel. error vs NumPy float64 "
              f"{err:.1e}")
        assert err < 1e-4, err
    plan = fastest.lower(params, tgx.Spec(("S",), "int64"))
    print(f"traced {fastest.trace_count}x and planned once for both lengths: {plan.summary()}")

    section("Chosen implementation per op kind")
    chosen: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for e, k in zip(plan.graph.eqns, plan.kernels):
        chosen[e.primitive.name][repr(k)] += 1
    for prim, ks in sorted(chosen.items(), key=lambda kv: -sum(kv[1].values())):
        print(f"  {prim:30s} " + ", ".join(f"{k} x{n}" for k, n in ks.most_common()))
    if plan.estimates is None:  # a whole plan measured as a whole (planning/recipes.py)
        print(f"  chosen by {plan.policy}")
    else:
        measured = sum(1 for e in plan.estimates if e.source == "measured")
        print(f"  {measured} of {len(plan.estimates)} figures measured, the rest from the "
              f"cost model")

    section(f"Time per prefill at S={s0} (median of 45 calls in 9 interleaved rounds, "
            f"± half the spread of the round medians)")
    tokens = token_sets[s0]
    rows = [("tgx FASTEST", lambda: fastest(params, tokens))]
    for b in BACKENDS:
        c = tgx.compile(model, policy="fastest", backends=[b], store=store, weights="params")
        rows.append((f"tgx {b}-only plan", lambda c=c: c(params, tokens)))
    import jax
    import jax.numpy as jnp
    import torch

    tp = unflatten_names({k: torch.from_numpy(np.ascontiguousarray(v))
                          for k, v in flatten_names(params).items()})
    tt = torch.from_numpy(tokens)
    jp = unflatten_names({k: jnp.asarray(v) for k, v in flatten_names(params).items()})
    jt = jnp.asarray(tokens)
    jitted = jax.jit(lambda p, t: G.gemma3_reference(p, t, cfg, "jax"))

    def torch_eager():
        with torch.no_grad():
            return G.gemma3_reference(tp, tt, cfg, "torch")

    rows += [("PyTorch eager", torch_eager),
             ("jax.jit", lambda: jitted(jp, jt).block_until_ready())]
    for _, fn in rows:
        fn()  # first calls (jit compilation) before timing
    times = interleaved_times(rows)
    base = times[0][1]
    for name, t, spread in times:
        print(f"  {name:20s} {t * 1e3:8.2f} ms ±{spread * 50:3.0f}%   "
              f"{t / base:5.2f}x tgx FASTEST")
    peer, t_peer, _ = min(times[1:], key=lambda nt: nt[1])
    verdict = ("faster than" if base < t_peer * 0.98 else
               "on par with" if base <= t_peer * 1.02 else "slower than")
    print(f"  => tgx FASTEST is {verdict} the best alternative here ({peer}): "
          f"{base / t_peer:.2f}x its time")

    section(f"Memory plan at S={s0}")
    mem = plan.memory
    peak = mem.peak(S=s0)
    total = sum(mem.sum_of_intermediates(S=s0).values())
    low = sum(mem.lower_bound(S=s0).values())
    both = sum(peak.values())
    parts = ", ".join(f"{d} {v / 1024:.1f} KiB" for d, v in peak.items())
    print(f"  peak of the planned buffers {both / 1024:.1f} KiB ({parts}; "
          f"'owned' = results whose memory the library allocates)")
    print(f"  vs the sum of all intermediates {total / 1024:.1f} KiB ({total / both:.1f}x "
          f"more) and the largest live set {low / 1024:.1f} KiB (the lower bound, "
          f"{both / low:.2f}x)")
    est = plan.estimate_memory(S=4096)
    print("  at S=4096 without re-planning: " + ", ".join(
        f"{d} {v / 2**20:.1f} MiB" for d, v in est.items()))
    print(f"\ndone in {time.perf_counter() - t_start:.0f} s; run again to reuse the store "
          f"({len(store.traces())} traces)")


if __name__ == "__main__":
    main()
