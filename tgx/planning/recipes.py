"""Measured whole plans: a plan is a candidate of its own (a GRAPH_RECIPE in the store).

The cost model prices a plan as the sum of its equations measured one at a time, plus
transfers and switch penalties. What only shows when the plan runs as a whole escapes it:
XLA fusing a JAX region, torch's OpenMP workers slowing the NumPy BLAS call after them,
caches. So EXPLORE also runs a *shortlist* of whole plans (`candidate_plans`: the heuristic
plan, every single-backend plan, and the best predicted plan on each set of two or more
backends), checks each against the reference evaluator, and records it as a GRAPH_RECIPE
trace whose payload rebuilds the plan (`plan_payload`). FASTEST then takes the fastest
*measured* plan of the graph at this binding (`best_measured`); where none was measured it
plans from per-equation figures.

Payload: the lowered plan's backend graph (msgpack, `tgx.serialize`) with each equation's
backend and kernel (name, variant, source hash). A kernel that is gone or whose source
changed makes the plan unloadable (`SerializationError`), and FASTEST skips it.

>>> import tgx, tgx.numpy as tnp
>>> from tgx.store import BenchmarkStore
>>> import tempfile, os
>>> store = BenchmarkStore(os.path.join(tempfile.mkdtemp(), "s.json"))
>>> g = tgx.make_graph(lambda x: tnp.exp(x) * 2.0)(tgx.Spec(("N",)))
>>> from tgx.compiler import plan_graph
>>> plans = {"numpy": plan_graph(g, policy="heuristic", backends=["numpy"])}
>>> measure_plans(g, plans, store, {"N": 32}, budget_s=0.01)
1
>>> best_measured(g, ["numpy"], store, {"N": 32}).label
'numpy'
"""

from __future__ import annotations

import hashlib
import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

PLAN_NAME = "measured-plan"
#: plans measured within this fraction of the fastest get extra passes (see `measure_plans`)
CLOSE = 0.15
PAYLOAD_FORMAT = 1


@dataclass(frozen=True)
class MeasuredPlan:
    """A whole plan measured in the store: its median, label and payload (see module doc)."""

    median_s: float
    label: str
    payload: bytes
    impl: str
    #: the binding it was measured at (the one asked for, or the nearest measured one)
    dims: dict = field(default_factory=dict)


def _graph_keys(graph, dims: Mapping) -> tuple[str, str]:
    """(graph hash, workload key) of the whole graph at `dims`."""
    from ..graph import structural_hash
    from ..shapes import eval_dim, sym
    from ..store.schema import workload_key

    env = {sym(str(k)): int(v) for k, v in dims.items()}
    inputs = [([eval_dim(d, env) for d in v.aval.shape], v.aval.dtype.name)
              for v in graph.invars]
    ghash = structural_hash(graph)
    return ghash, workload_key(ghash, {str(k): int(v) for k, v in dims.items()}, inputs)


def _name(weights: Sequence[int]) -> str:
    # Bound weights cost nothing per call; without them every call converts them.
    return PLAN_NAME + ("+bound-weights" if tuple(weights) else "")


# -- payload ---------------------------------------------------------------------------------
def plan_payload(plan, label: str = "") -> bytes:
    """A lowered `tgx.compiler.Plan` as bytes: its backend graph, backends and kernels."""
    import msgpack

    from ..serialize import graph_to_bytes

    bg = plan.graph
    kernels = [None if e.primitive.name == "copy_to" else [k.name, k.variant, k.source_hash]
               for e, k in zip(bg.eqns, plan.kernels)]
    return msgpack.packb({"kind": "measured-plan", "format": PAYLOAD_FORMAT, "label": label,
                          "graph": graph_to_bytes(bg), "backends": list(bg.backends),
                          "kernels": kernels}, use_bin_type=True)


def plan_from_payload(payload: bytes, source_graph, *, policy: str = "fastest",
                      in_names=None, weights: Sequence[int] = (), memory_budget=None,
                      return_backend_arrays: bool = False):
    """The `Plan` that `plan_payload` wrote, lowered again (weights bound per `weights`).
    `SerializationError` when a kernel it names is gone or changed."""
    import msgpack

    from ..compiler import Plan
    from ..lowering.lower import lower
    from ..lowering.rebackend import BackendGraph, rebackend
    from ..backends.registry import kernels_for
    from ..serialize import SerializationError, graph_from_bytes
    from .candidates import accepted_kernels

    d = msgpack.unpackb(payload, raw=False)
    if d.get("kind") != "measured-plan" or d.get("format") != PAYLOAD_FORMAT:
        raise SerializationError(f"not a measured-plan payload of format {PAYLOAD_FORMAT}")
    g = graph_from_bytes(d["graph"])
    bg = BackendGraph(g.constvars, g.consts, g.invars, g.outvars, g.eqns, g.in_tree,
                      g.out_tree, backends=d["backends"])
    chosen = []
    for e, b, k in zip(bg.eqns, bg.backends, d["kernels"]):
        if k is None:
            continue
        name, variant, source_hash = k
        hit = [c for c in kernels_for(e.primitive.name, b)
               if c.name == name and c.variant == variant]
        if not hit:
            raise SerializationError(f"measured plan uses kernel {name}[{variant}]@{b}, "
                                     "which is not registered here")
        if hit[0].source_hash != source_hash:
            raise SerializationError(f"kernel {hit[0]!r} changed since the plan was measured")
        chosen.append(hit[0])
    if return_backend_arrays:  # drop the copies back to NumPy at the outputs
        bg = rebackend(bg, list(bg.backends), outputs=None)
    it = iter(chosen)
    kernels = [accepted_kernels(e, b)[0] if e.primitive.name == "copy_to" else next(it)
               for e, b in zip(bg.eqns, bg.backends)]
    cg = lower(bg, kernels, in_names=in_names, weights=weights)
    return Plan(source_graph, bg, kernels, cg, policy, memory_budget, return_backend_arrays)


def _digest(plan, weights: Sequence[int]) -> str:
    """The identity of a plan: its graph's structure (not source lines or variable names),
    backends, kernels and bound weights."""
    from ..graph import structural_hash

    ks = [(k.name, k.variant, k.backend, k.source_hash) for k in plan.kernels]
    key = repr((structural_hash(plan.graph), tuple(plan.graph.backends), ks, tuple(weights)))
    return hashlib.sha256(key.encode()).hexdigest()


# -- the shortlist ------------------------------------------------------------------------------
def candidate_plans(graph, backends: Sequence[str], cost_model, dims: Mapping, *,
                    weights: Sequence[int] = ()) -> dict:
    """{label: Plan} worth measuring as a whole: the heuristic plan, each single-backend plan,
    and the best predicted plan on every set of two or more `backends` (duplicates dropped).
    """
    from ..compiler import plan_graph, selection_plan
    from ..errors import TgxError
    from .selection import select

    out: dict = {}
    seen: set = set()

    def add(label, make):
        try:
            plan = make()
        except TgxError:  # e.g. no kernel for some equation on these backends
            return
        key = _digest(plan, weights)
        if key not in seen:
            seen.add(key)
            out[label] = plan

    add("heuristic", lambda: plan_graph(graph, policy="heuristic", backends=backends,
                                        weights=weights))
    for b in backends:
        add(b, lambda b=b: plan_graph(graph, policy="heuristic", backends=[b], weights=weights))
    for n in range(2, len(backends) + 1):
        for subset in itertools.combinations(backends, n):
            def make(subset=subset):
                sel = select(graph, list(subset), cost_model, dims, weights=weights)
                return selection_plan(graph, sel, cost_model, dims, "explore",
                                      weights=weights)
            add("+".join(subset), make)
    return out


def measure_plans(graph, plans: Mapping, store, dims: Mapping, *, budget_s: float = 0.2,
                  rounds: int = 3, spin_up_s: float = 0.1, env_id: str | None = None,
                  weights: Sequence[int] = ()) -> int:
    """Time each plan of {label: Plan} on random inputs at `dims` (checked against the
    reference evaluator; the inputs at positions `weights` bound once, as
    `tgx.compile(weights=...)` does) and record a GRAPH_RECIPE trace with the plan as its
    payload; returns how many were measured (plans already measured at `dims` are skipped).

    Plans are timed round-robin: `rounds` passes in a shuffled order, `budget_s` per plan in
    all; each pass first runs the plan for `spin_up_s` untimed, then times it, and a plan's
    figure is the median of its pass medians; plans within `CLOSE` of the fastest then get
    twice as many passes again, to tell them apart. The spin-up is what makes passes comparable:
    thread pools outlive the call that started them (OpenBLAS workers spin ~0.1 s, torch's
    OpenMP pool, XLA's), so a plan timed right after another would pay for it, while a plan
    run in a loop pays only for its own pools."""
    import random
    import statistics
    import warnings

    import numpy as np

    from ..graph import structural_hash
    from ..transforms.evaluate import eval_graph_flat
    from ..profiling import measure
    from ..profiling.pending import random_inputs
    from ..profiling.runner import profile
    from ..serialize import graph_to_bytes
    from ..shapes import eval_dim, sym
    from ..store import environment_id, sniff_environment

    if not plans:
        return 0
    env_id = env_id or environment_id(sniff_environment())
    env = {sym(str(k)): int(v) for k, v in dims.items()}
    args = list(random_inputs([([eval_dim(d, env) for d in v.aval.shape], v.aval.dtype.name)
                               for v in graph.invars]))
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        golden = eval_graph_flat(graph, args)
    # A whole graph accumulates rounding over many equations (each kernel was already checked
    # tightly on its own): accept what a float32 pipeline of this depth normally differs by.
    scale = max((float(np.max(np.abs(o))) for o in golden if np.size(o)), default=1.0)
    atol, rtol = 1e-3 * scale, 1e-2
    ghash, wkey = _graph_keys(graph, dims)
    store.add_graph(structural_hash(graph), "graph", graph_to_bytes(graph))
    store.add_workload(ghash, {str(k): int(v) for k, v in dims.items()},
                       [(list(np.shape(a)), np.asarray(a).dtype.name) for a in args])
    recs: dict[str, dict] = {}
    runs: dict[str, object] = {}
    for label, plan in plans.items():
        payload = plan_payload(plan, label)
        bs = sorted({b for e, b in zip(plan.graph.eqns, plan.graph.backends)
                     if e.primitive.name != "copy_to"}) or ["numpy"]
        impl = store.add_implementation("GRAPH_RECIPE", _name(weights), "+".join(bs),
                                        _digest(plan, weights), {"label": label}, payload)
        if store.measured(ghash, impl, wkey, env_id) or impl in recs:
            continue
        run = plan.compiled.run_flat
        fn = (lambda *xs, run=run: _single(run(list(xs))))
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            # the accuracy check (its quick timing is replaced by the passes below)
            recs[impl] = profile(fn, args, golden=_single(golden), atol=atol, rtol=rtol,
                                 graph_hash=ghash, impl=impl, workload=wkey, env_id=env_id,
                                 budget_s=0.01)
        if recs[impl]["status"] == "PASSED":
            runs[impl] = fn
    passes: dict[str, list] = {impl: [] for impl in runs}
    rnd = random.Random(0)

    def race(order: list, n: int) -> None:
        for _ in range(n):
            rnd.shuffle(order)
            for impl in order:
                with np.errstate(all="ignore"), warnings.catch_warnings():
                    warnings.simplefilter("ignore", RuntimeWarning)
                    passes[impl].append(measure(runs[impl], args, budget_s=budget_s / rounds,
                                                warmup_s=spin_up_s))

    race(list(runs), rounds)
    # plans within `CLOSE` of the fastest are told apart with more passes (racing): the
    # choice between them is what the measurement is for
    if passes:
        med = {impl: statistics.median(t.median_s for t in ts) for impl, ts in passes.items()}
        best = min(med.values())
        close = [impl for impl, m in med.items() if m <= best * (1 + CLOSE)]
        if len(close) > 1:
            race(close, 2 * rounds)
    for impl, ts in passes.items():
        med = [t.median_s for t in ts]
        mid = statistics.median(med)
        recs[impl].update(median_s=mid, min_s=min(t.min_s for t in ts),
                          spread=(max(med) - min(med)) / mid if mid else 0.0,
                          samples=sum(t.samples for t in ts))
    if recs:
        store.add_traces(list(recs.values()))
    return len(recs)


def measured_plans(graph, backends: Sequence[str], store, dims: Mapping,
                   env_id: str | None = None, weights: Sequence[int] = (), *,
                   nearest: bool = True) -> list[MeasuredPlan]:
    """The plans of `graph` measured (PASSED) on this machine that use only `backends` and
    bind weights as `weights` says, fastest first, at the binding `dims`.

    With `nearest` and nothing measured at `dims`, the plans of the *nearest measured binding*
    (the one whose total input elements are closest in log-space, the rule the cost model
    uses for kernels; see `MeasuredPlan.dims`): which plan is fastest changes slowly with
    the size, and a measured plan at another size beats a prediction at this one."""
    from ..store import environment_id, sniff_environment

    env_id = env_id or environment_id(sniff_environment())
    ghash, wkey = _graph_keys(graph, dims)
    found = _measured_at(store, ghash, wkey, env_id, backends, weights, dict(dims))
    if found or not nearest:
        return found
    here = _elements(graph, dims)
    best = None
    for wl in store.workloads_for(ghash, env_id):
        if wl["key"] == wkey or wl["axes"] is None or wl["inputs"] is None:
            continue
        dist = abs(math.log(max(1, sum(math.prod(s) for s, _ in wl["inputs"])))
                   - math.log(max(1, here)))
        if best is None or dist < best[0]:
            at = _measured_at(store, ghash, wl["key"], env_id, backends, weights, wl["axes"])
            if at:
                best = (dist, at)
    return best[1] if best else []


def _elements(graph, dims: Mapping) -> int:
    from ..shapes import eval_dim, sym

    env = {sym(str(k)): int(v) for k, v in dims.items()}
    return sum(math.prod(eval_dim(d, env) for d in v.aval.shape) for v in graph.invars)


def _measured_at(store, ghash, wkey, env_id, backends, weights, axes) -> list[MeasuredPlan]:
    best: dict[str, float] = {}
    for t in store.traces(graph_hash=ghash, workload=wkey, env_id=env_id, status="PASSED"):
        if t.get("median_s") is not None:
            best[t["impl"]] = min(best.get(t["impl"], float("inf")), float(t["median_s"]))
    allowed = set(backends)
    out = []
    for impl, median in sorted(best.items(), key=lambda kv: kv[1]):
        rec = store.get_implementation(impl)
        if (rec is None or rec["kind"] != "GRAPH_RECIPE" or rec["name"] != _name(weights)
                or not rec["payload"] or not set(rec["backend"].split("+")) <= allowed):
            continue
        label = (rec.get("requirements") or {}).get("label", rec["backend"])
        out.append(MeasuredPlan(median, label, rec["payload"], impl, dict(axes)))
    return out


def best_measured(graph, backends: Sequence[str], store, dims: Mapping,
                  env_id: str | None = None, weights: Sequence[int] = ()
                  ) -> MeasuredPlan | None:
    """The fastest of `measured_plans`, or None."""
    found = measured_plans(graph, backends, store, dims, env_id, weights)
    return found[0] if found else None


def _single(outs: list):
    return outs[0] if len(outs) == 1 else tuple(outs)
