"""Selection quality: FASTEST's plan against every single-backend plan and random mixed plans.

    .venv/bin/python bench/bench_selection.py [--quick] [--mixed N]

For each graph (MLP, transformer block, LSTM step): EXPLORE profiles every candidate kernel of
every equation into a fresh store; FASTEST then plans from those traces. Every plan is timed
on the same inputs (median of `tgx.profiling.measure`, best of `--rounds` round-robin
passes). Regret = FASTEST / best timed plan - 1. Identical plans (the same backend graph and
kernels, e.g. an all-NumPy "mixed" plan that is FASTEST's own) are timed once: timing a plan
against itself only measures noise.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))

import tgx  # noqa: E402
import tgx.nn as tnn  # noqa: E402
from bench_runtime import block, block_params, mlp  # noqa: E402
from tgx.backends import available_backends  # noqa: E402
from tgx.lowering.lower import lower_assignment  # noqa: E402
from tgx.planning.assignment import Assignment  # noqa: E402
from tgx.planning.candidates import accepted_kernels  # noqa: E402
from tgx.planning.cost_model import CostModel  # noqa: E402
from tgx.planning.fastest import assignment_cost  # noqa: E402
from tgx.planning.heuristic import decompose_unsupported  # noqa: E402
from tgx.planning.options import PlanOptions  # noqa: E402
from tgx.planning.recipes import assignment_digest  # noqa: E402
from tgx.profiling import measure  # noqa: E402
from tgx.store import BenchmarkStore  # noqa: E402
from tgx.tracing import tree_flatten  # noqa: E402


def graphs(quick):
    rng = np.random.default_rng(0)
    n, d, h = (64, 128, 256) if quick else (256, 512, 1024)
    pm = {"w1": rng.standard_normal((d, h)).astype(np.float32) / 20,
          "b1": np.zeros(h, np.float32), "w2": rng.standard_normal((h, h)).astype(np.float32) / 30,
          "b2": np.zeros(h, np.float32), "w3": rng.standard_normal((h, 10)).astype(np.float32)}
    xm = rng.standard_normal((n, d)).astype(np.float32)
    yield "mlp", mlp, (pm, xm)
    t, dm, ff = (32, 64, 128) if quick else (128, 256, 768)
    pb, cos, sin = block_params(rng, t, dm, ff)
    xb = rng.standard_normal((t, dm)).astype(np.float32)
    yield "transformer block", lambda p, x, c, s: block(p, x, c, s), (pb, xb, cos, sin)
    b, i, hs = (8, 32, 64) if quick else (32, 256, 512)
    w = lambda *s: (rng.standard_normal(s) / np.sqrt(s[-1])).astype(np.float32)  # noqa: E731
    args = (w(b, i), (w(b, hs), w(b, hs)), w(4 * hs, i), w(4 * hs, hs), w(4 * hs), w(4 * hs))
    yield "lstm step", tnn.lstm_cell, args


def runner(plan, args):
    leaves, _ = tree_flatten((args, {}))
    return lambda: plan.run_flat(leaves)


def timed(run, budget, spin_up_s=0.1):
    # each plan timed in its own steady state, not paying for the thread pools of the plan
    # timed before it (see `measure(warmup_s=)`; as tgx.explore.measure_assignments does)
    return measure(run, budget_s=budget, warmup_s=spin_up_s).median_s


def time_plans(plans: dict, args, budget: float, rounds: int, seed: int = 0):
    """Fair timing: every plan warmed first, then `rounds` round-robin passes (a fresh
    shuffled order each round, so no plan always follows the same one), each giving a
    per-round median; a plan's time is the median of its per-round medians, its spread
    (max - min) / median of them."""
    runs = {k: runner(p, args) for k, p in plans.items()}
    for run in runs.values():  # warm: first-call costs (jit, allocations, thread pools)
        for _ in range(3):
            run()
    per: dict[str, list[float]] = {k: [] for k in plans}
    rnd = random.Random(seed)
    order = list(plans)
    for _ in range(rounds):
        rnd.shuffle(order)
        for k in order:
            per[k].append(timed(runs[k], budget / rounds))
    med = {k: float(np.median(v)) for k, v in per.items()}
    spread = {k: (max(v) - min(v)) / med[k] for k, v in per.items()}
    return med, spread


def predicted(plan, cm, backends, dims=None) -> float:
    """The cost model's figure for a plan, as selection prices it: kernels + the copies its
    assignment implies + switch penalties between consecutive kernels and last → first."""
    return assignment_cost(plan.assignment, backends, cm, dict(dims or {}))


def mixed_plans(graph, backends, n, seed=0):
    g = decompose_unsupported(graph, backends, None)
    options = [[b for b in backends if accepted_kernels(e, b)] for e in g.eqns]
    rnd = random.Random(seed)
    for _ in range(n):
        assign = [rnd.choice(o) for o in options]
        kernels = [accepted_kernels(e, b)[0] for e, b in zip(g.eqns, assign)]
        yield lower_assignment(Assignment(g, assign, kernels, by="mixed"), PlanOptions(),
                               source_graph=graph)


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--mixed", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--verbose", "-v", action="store_true",
                    help="predicted vs measured time of every plan")
    a = ap.parse_args(argv)
    budget = 0.2 if a.quick else 0.8   # per plan, spread over the rounds
    backends = available_backends()
    rows = []
    for name, fn, args in graphs(a.quick):
        store = BenchmarkStore(tempfile.mktemp(suffix=".json"))
        t0 = time.perf_counter()
        tgx.compile(fn, policy="explore", store=store, backends=backends).lower(*args)
        explore_s = time.perf_counter() - t0
        fast = tgx.compile(fn, policy="fastest", store=store, backends=backends).lower(*args)
        plans = {"fastest": fast}
        for b in backends:
            plans[b] = tgx.compile(fn, policy="heuristic", backends=[b]).lower(*args)
        plans["heuristic"] = tgx.compile(fn, policy="heuristic", backends=backends).lower(*args)
        for i, p in enumerate(mixed_plans(fast.source_graph, backends, a.mixed)):
            plans[f"mixed{i}"] = p
        # the same plan twice only measures noise (an all-NumPy "mixed" plan is often
        # FASTEST's own): keep the first of each, FASTEST's included
        seen, twin = {}, {}
        for k, p in list(plans.items()):
            d = assignment_digest(p.assignment, PlanOptions())
            if d in seen:
                twin[k] = seen[d]
                del plans[k]
            else:
                seen[d] = k
        if twin:
            print(f"{name}: identical plans timed once: "
                  + ", ".join(f"{k}={v}" for k, v in twin.items()))
        times, spread = time_plans(plans, args, budget, a.rounds)
        best_k = min(times, key=times.get)  # over distinct plans
        for k, v in twin.items():  # for the table: a twin has its original's figures
            times[k], spread[k] = times[v], spread[v]
        cm = CostModel(store=store)
        preds = {k: predicted(p, cm, backends, fast.dims) for k, p in plans.items()}
        mixed = [t for k, t in times.items() if k.startswith("mixed")] or [float("nan")]
        rows.append((name, len(store.traces()), explore_s, fast.predicted_s, times, spread,
                     min(mixed), best_k, preds))
        if a.verbose or best_k != "fastest":
            print(f"{name}: predicted (cost model on the explored store) vs measured")
            for k in sorted(plans, key=times.get):
                p = plans[k]
                bs = sorted(set(p.graph.backends))
                print(f"  {k:<10} pred {preds[k] * 1e6:>9.1f}µs  meas {times[k] * 1e6:>9.1f}µs "
                      f"±{100 * spread[k]:>4.1f}%  {'+'.join(bs)}, "
                      f"{len(p.transfers())} transfers")
    print(f"{'graph':<18} {'traces':>6} {'explore':>8} {'pred':>9} {'fastest':>9} "
          + " ".join(f"{b + '/F':>9}" for b in [*backends, "heuristic"])
          + f" {'mixed/F':>8} {'regret':>7} {'spread':>7}  best")
    for name, nt, ex, pred, times, spread, mixed, best_k, _ in rows:
        f = times["fastest"]
        sp = max(spread["fastest"], spread[best_k])
        print(f"{name:<18} {nt:>6} {ex:>7.1f}s {pred * 1e6:>7.1f}µs {f * 1e6:>7.1f}µs "
              + " ".join(f"{times[b] / f:>9.2f}" for b in [*backends, "heuristic"])
              + f" {mixed / f:>8.2f} {100 * (f / times[best_k] - 1):>6.1f}% "
              f"{100 * sp:>6.1f}%  {best_k}")
    print("ratios: time of that plan / FASTEST's (> 1: FASTEST is faster); mixed: best of "
          f"{a.mixed} random mixed plans; regret: FASTEST vs the best plan timed (times: median "
          f"of {a.rounds} round-robin per-round medians); spread: (max - min) / median of the "
          "per-round medians of FASTEST and the best plan, the larger")


if __name__ == "__main__":
    main()
