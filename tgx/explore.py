"""EXPLORE and `tgx.paths`: measure what the planners would otherwise guess.

- `explore_kernels`: profile every candidate kernel of a graph (and of its decompositions) the
  store has not measured on this machine, one backend after another.
- `candidate_assignments` + `measure_assignments`: a shortlist of whole plans (the heuristic
  plan, every single-backend plan, the best predicted plan on every set of two or more
  backends), each lowered through `lower_assignment` with the caller's options — so what is
  timed is what runs — checked against the reference evaluator, timed round-robin and
  recorded as GRAPH_RECIPEs (`tgx.planning.recipes`), which FASTEST then takes.
- `tgx.paths(fn)(...)`: every valid plan, lazily (`tgx.planning.paths`), whose plans can also
  be run, profiled and saved here.

>>> import tgx, tgx.numpy as tnp, tempfile, os
>>> from tgx.store import BenchmarkStore
>>> from tgx.planning.options import PlanOptions
>>> from tgx.planning.heuristic import heuristic_assignment
>>> store = BenchmarkStore(os.path.join(tempfile.mkdtemp(), "s.json"))
>>> g = tgx.make_graph(lambda x: tnp.exp(x) * 2.0)(tgx.Spec(("N",)))
>>> plans = {"numpy": heuristic_assignment(g, ["numpy"])}
>>> measure_assignments(g, plans, store, {"N": 32}, PlanOptions(), budget_s=0.01)
1
"""

from __future__ import annotations

import hashlib
import itertools
import math
import random
import statistics
import time
import warnings
from collections.abc import Mapping, Sequence

import msgpack
import numpy as np

from .backends import get_backend, to_callers_arrays
from .core import Graph
from .devices import aligned_copy, offset_of
from .errors import TgxError
from .graph import structural_hash
from .graph.repeats import find_repeats, shorten
from .lowering.lower import lower_assignment
from .planning import paths as _paths
from .planning.assignment import Assignment
from .planning.candidates import accepted_kernels
from .planning.cost_model import CostModel, priced_by_arithmetic
from .planning.fastest import assignment_cost
from .planning.heuristic import heuristic_assignment
from .planning.options import PlanOptions, replace
from .planning.recipes import assignment_digest, graph_keys, measured_plans, record_recipe
from .planning.selection import offered_decomposition, realize, select
from .precision import path_error
from .profiling import input_descriptors, measure, profile
from .profiling.accuracy import to_numpy
from .profiling.pending import profile_kernel, random_inputs, write_deferred
from .profiling.progress import Progress
from .serialize import SerializationError, graph_to_bytes
from .shapes import concrete_shape
from .store import as_store
from .tracing import make_graph, tree_flatten
from .transforms.evaluate import bind_dims, eval_graph, eval_graph_flat

#: plans slower than this factor of the best after a round get no further passes (per-pass
#: figures vary by ±30% on the 2-core CPU; the 18-layer prefill's torch and NumPy plans run
#: 1.3-1.5x the jax plan)
FAR = 1.5
#: plans measured within this fraction of the fastest get extra passes (see
#: `measure_assignments`)
CLOSE = 0.15
#: a graph of identical blocks has its whole plans raced with this many blocks
#: (`tgx.graph.repeats`); two, so that a mixed plan's boundary between blocks is timed
SHORT_BLOCKS = 2
#: the plans timed on the shortened graph that are timed again on the whole graph, which
#: chooses among them: those within this fraction of the fastest of all, the fastest on
#: each set of backends first, at most `CONFIRM_PLANS`. The short graph ranks plans on
#: other libraries loosely (the 18-layer decode's NumPy and jax plans were 1.00x / 1.03x
#: with two layers, 1.00x / 1.34x with all: the head, a third of the short graph's time,
#: runs faster on jax), and variants on one set of backends too: the 18-layer prefill's
#: NumPy plan with `linear[held-t]` and numba's loops measured 63.4 against 56.2 ms for the
#: heuristic NumPy plan with two layers, and 226 against 256 ms with all (2026-11-24)
CONFIRM = 0.15
#: passes per plan in the shortened race, and the factor of the fastest beyond which a plan
#: gets no second pass: only plans within `CONFIRM` of the fastest go on, so one 1.3x
#: slower at its first pass would need to gain 15% at its second (three passes of every
#: plan were 6.5 of an 18-layer prefill's 36 s explore)
SHORT_ROUNDS = 2
SHORT_FAR = 1.3
CONFIRM_PLANS = 3
#: ... and at least this many, the runner-up even beyond `CONFIRM`: an optimizer step over a
#: 4-layer LM's parameters (`bench_train.py`'s d=256) ranked NumPy's generated loops 5.5 ms
#: against 6.8 for NumPy op by op with two layers, and ran them 22 ms whole (each call
#: copies the loops' new state into the caller's arrays) where op by op, never timed whole,
#: ran 12 ms (2026-11-24, session 14)
MIN_CONFIRM = 2
#: passes per plan when the shortened graph has already raced them (`CONFIRM`)
CONFIRM_ROUNDS = 2
#: ... and the further passes of those within `CLOSE` of the fastest: with two passes (one
#: timed call each) an 18-layer prefill's explore chose a torch + NumPy plan that ran 1.07x
#: the jax plan; run again, explore measured them 1.03x apart the other way (2026-11-27).
#: Two more, not three: three made the prefill's explore 30.4 s (the issue's bound is 30)
CONFIRM_CLOSE_ROUNDS = 2


# -- kernels -----------------------------------------------------------------------------------

def _all_equations(graph: Graph, backends: Sequence[str], patterns: bool = True,
                   fuse: bool = True):
    """Every equation of `graph` and of its decompositions, recursively (EXPLORE's scope),
    the decompositions as the selection solves them: with the pattern kernels and regions
    they offer on `backends` (`selection.offered_decomposition`). Without those, a pattern
    found only inside a decomposition was never swept: an 18-layer decode's q/k norm took
    NumPy's RMSNorm pattern, priced by the cost model at 1.4 µs, which ran 30-45 µs."""
    seen: set = set()
    stack = list(graph.eqns)
    while stack:
        e = stack.pop()
        key = (e.primitive.name, repr(sorted(e.params.items())),
               tuple(str(a.aval) for a in e.invars))
        if key in seen:
            continue
        seen.add(key)
        yield e
        if e.primitive.decomposition is not None:
            stack.extend(offered_decomposition(e, backends, patterns, fuse).eqns)


def unmeasured(graph: Graph, backends, store, cost_model, dims, *, patterns: bool = True,
               fuse: bool = True) -> list[tuple]:
    """(equation, kernel) for every candidate kernel of `graph` and its decompositions that
    the store has no trace of at `dims` on this machine, except those the cost model prices
    without a figure (`priced_by_arithmetic`). Lossy kernels too: a later `tolerance=`
    compile chooses from these figures. `patterns`, `fuse`: what the decompositions offer,
    as in the plan (`PlanOptions`)."""
    todo = []
    for e in _all_equations(graph, backends, patterns, fuse):
        ghash, wkey = cost_model.keys(e, dims)
        for b in backends:
            for k in accepted_kernels(e, b):
                if priced_by_arithmetic(e, k):
                    continue
                if not store.measured(ghash, cost_model.impl_key(k), wkey, cost_model.env_id):
                    todo.append((e, k))
    return todo


def explore_kernels(graph: Graph, backends, store, cost_model, dims, budget_s: float = 0.05, *,
                    time_limit_s: float | None = None, progress: bool | None = False,
                    patterns: bool = True, fuse: bool = True) -> int:
    """Profile every unmeasured candidate kernel at `dims` (random inputs, the NumPy reference
    as golden), for at most `time_limit_s` in all, with a progress bar on stderr when
    `progress`; returns how many were profiled. What the limit leaves out stays unmeasured
    (the cost model prices it) and a later call continues where this one stopped."""
    # One backend after another, with a pause at each change: a library's worker threads
    # spin for up to ~0.1 s after its last call (OpenBLAS, torch's OpenMP pool), and a kernel
    # of another library timed meanwhile competes with them for the cores (a 256x256 torch
    # matmul right after NumPy ones was measured at 8 ms instead of 0.3 ms). Golden results
    # run with BLAS on one thread for the same reason (`tgx.backends.threads.one_blas_thread`).
    todo = sorted(unmeasured(graph, backends, store, cost_model, dims, patterns=patterns,
                             fuse=fuse),
                  key=lambda ek: ek[1].backend)
    bar = Progress(len(todo), enabled=progress)
    start, n, last = time.monotonic(), 0, None
    # random inputs and golden results per workload, whatever the kernel (held for the
    # sweep: the kernels of one equation are spread over the backends' turns)
    cache: dict = {}
    deferred: list = []  # traces, written in batches
    done: list = []      # (equation, kernel, trace)

    def profile_in_turn(e, k) -> dict | None:
        # the trace of `k` on `e`, after a pause when the backend changes; None out of time
        nonlocal last
        if time_limit_s is not None and time.monotonic() - start >= time_limit_s:
            return None
        if last is not None and k.backend != last:
            time.sleep(0.2)
        last = k.backend
        return profile_kernel(e, k, dims, store, cost_model, budget_s, cache, deferred)

    try:
        for e, k in todo:
            rec = profile_in_turn(e, k)
            if rec is None:
                break
            done.append((e, k, rec))
            n += 1
            if len(deferred) >= 50:
                write_deferred(store, cache, deferred)
            bar.update(f"{e.primitive.name} on {k.backend}")
        # a figure far out of line with the same kernel's others is timed once more (the
        # store keeps the faster): an 18-layer prefill's bf16 GEMM measured 20.5 ms, twice,
        # for a product it runs in 1.1 ms, and the selection kept that layer's projections in
        # float32 (the plan 1.7x slower)
        for e, k in sorted(standouts(done, cost_model, dims), key=lambda ek: ek[1].backend):
            if profile_in_turn(e, k) is None:
                break
    finally:
        write_deferred(store, cache, deferred)
    bar.close()
    cost_model._measured.clear()
    return n


#: a kernel's figure is timed again when, relative to the cost model's roofline, it is this
#: many times the same kernel's median over the sweep's other workloads
STANDOUT = 5.0
#: ... counted over at least this many workloads of that kernel
STANDOUT_PEERS = 3


def standouts(done: Sequence, cost_model, dims: Mapping) -> list:
    """The (equation, kernel) pairs of a sweep's `done` [(equation, kernel, trace)] whose
    figure stands out from the same kernel's on the sweep's other workloads: its time over
    the cost model's roofline (overhead + bytes / bandwidth + flops / peak) `STANDOUT` times
    their median or more, for a kernel measured on `STANDOUT_PEERS` workloads or more.
    Interference (another library's threads spinning, the machine busy) slows every sample
    of a short measurement alike, so the median alone cannot tell.

    >>> standouts([], None, {})
    []
    """
    by_kernel: dict = {}
    for e, k, rec in done:
        t = rec.get("median_s") if rec.get("status") == "PASSED" else None
        if t:
            model = cost_model.roofline(e, k.backend, dims).seconds
            by_kernel.setdefault((k.label, k.backend), []).append((t / max(model, 1e-12), e, k))
    out = []
    for figures in by_kernel.values():
        if len(figures) >= STANDOUT_PEERS:
            mid = statistics.median(r for r, _, _ in figures)
            out += [(e, k) for r, e, k in figures if r >= STANDOUT * mid]
    return out


# -- whole plans -------------------------------------------------------------------------------

def candidate_assignments(graph: Graph, backends: Sequence[str], cost_model, dims: Mapping,
                          options: PlanOptions | None = None,
                          labels: set[str] | None = None) -> dict[str, Assignment]:
    """{label: Assignment} worth measuring as a whole: the heuristic plan, each
    single-backend plan, and the best predicted plan on every set of `backends` (one
    backend included: there the selection takes the measured pattern kernels and generated
    loops the heuristic leaves out), also without kernels on thread pools of their own
    (" serial"); duplicates dropped; `labels`: only those. Ordered by
    the cost model's time, fastest first."""
    options = options or PlanOptions()
    out: dict[str, Assignment] = {}
    seen: set = set()

    def add(label, make):
        if labels is not None and label not in labels:
            return
        try:
            a = make()
        except TgxError:  # e.g. no kernel for some equation on these backends
            return
        key = assignment_digest(a, options)
        if key not in seen:
            seen.add(key)
            out[label] = a

    add("heuristic", lambda: heuristic_assignment(graph, backends))
    for b in backends:
        add(b, lambda b=b: heuristic_assignment(graph, [b]))
    serial = cost_model.without_own_pools()
    chosen: dict = {}

    def selected(subset, cm) -> Assignment:
        a = realize(select(graph, list(subset), cm, dims, weights=options.weights,
                           state=options.state, patterns=options.patterns,
                           fuse=options.fuse), "explore")
        if cm is cost_model:
            chosen[subset] = a
        return a

    def selected_serially(subset) -> Assignment:
        # without kernels that cap BLAS for the whole plan (own pools), which no per-kernel
        # figure prices (`CostModel.without_own_pools`); where the selection holds none,
        # it is the same plan (dropped as a duplicate, no second selection)
        a = chosen.get(subset)
        if a is not None and not any(k is not None and k.own_pool for k in a.kernels):
            return a
        return selected(subset, serial)

    for n in range(1, len(backends) + 1):
        for subset in itertools.combinations(backends, n):
            label = "+".join(subset) if n > 1 else f"{subset[0]} selected"
            add(label, lambda subset=subset: selected(subset, cost_model))
            add(f"{label} serial", lambda subset=subset: selected_serially(subset))

    def predicted(a: Assignment) -> float:
        if a.predicted_s is not None:
            return a.predicted_s
        return assignment_cost(a, backends, cost_model, dims, options.weights,
                               state=options.state)

    # the most promising first: a time limit stops before the last (a 4-layer LM training
    # step with a 60 s budget measured the heuristic plans only, 1.2x the torch plan)
    return dict(sorted(out.items(), key=lambda kv: predicted(kv[1])))


def measure_assignments(graph: Graph, assignments: Mapping[str, Assignment], store,
                        dims: Mapping, options: PlanOptions | None = None, *,
                        budget_s: float = 0.2, rounds: int = 3, spin_up_s: float = 0.1,
                        env_id: str | None = None, time_limit_s: float | None = None,
                        progress: bool | None = False, traced: str | None = None,
                        close: int | None = None, min_plans: int = 0, far: float = FAR,
                        inputs: Sequence | None = None, lowered: dict | None = None) -> int:
    """Time each assignment of {label: Assignment}, lowered with `options` exactly as
    `tgx.compile` lowers it (bound weights, state buffers), on random inputs at `dims`
    (checked against the reference evaluator) and record a GRAPH_RECIPE trace with the
    assignment as its payload; returns how many were measured (plans already measured at
    `dims` are skipped). `inputs`: the arrays to run them on (default: random ones).

    Plans are timed round-robin: `rounds` passes in a shuffled order, `budget_s` per plan in
    all; each pass first runs the plan for `spin_up_s` untimed, then times it, and a plan's
    figure is the median of its pass medians; after each pass a plan `far` times slower
    than the fastest (both at their best pass) gets no further passes, and plans within `CLOSE`
    of the fastest then get `close` passes more (default: twice `rounds`; 0: none), to tell
    them apart (fewer passes
    for long calls were tried and reverted: on a loaded machine 3 passes chose the 18-layer
    prefill's NumPy plan, 1.13x the jax plan, where 6 had chosen right). The spin-up is
    what makes passes comparable: thread pools outlive the call that started them (OpenBLAS
    workers spin ~0.1 s, torch's OpenMP pool, XLA's), so a plan timed right after another
    would pay for it, while a plan run in a loop pays only for its own pools.

    `time_limit_s`: no further plan is lowered and checked once this much time has passed
    (those measured so far are still timed and recorded), after the first `min_plans`;
    `progress`: a bar on stderr (None: on a terminal); `traced`: the key of the graph as
    traced (`recipes.traced_key`), under which each trace is recorded too; `lowered`: a dict
    that gets {assignment_digest: Plan} of the plans that passed their check, for the
    caller to run the one it chooses without lowering (and compiling) it again."""
    if not assignments:
        return 0
    options = options or PlanOptions()
    env_id = env_id or store.environment_id()
    args = list(random_plan_inputs(graph, dims, options.in_offsets) if inputs is None
                else inputs)
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        golden = eval_graph_flat(graph, args)
    # A whole graph accumulates rounding over many equations (each kernel was already checked
    # tightly on its own): accept what a float32 pipeline of this depth normally differs by.
    scale = max((float(np.max(np.abs(o))) for o in golden if np.size(o)), default=1.0)
    # ... and a plan holding weights in a lower precision, what its tolerance admits
    tol = max(1e-3, options.tolerance or 0.0)
    atol, rtol = tol * scale, max(1e-2, tol)
    ghash, wkey = graph_keys(graph, dims)
    axes = {str(k): int(v) for k, v in dims.items()}
    inputs = [(list(np.shape(a)), np.asarray(a).dtype.name) for a in args]
    store.add_workload(ghash, axes, inputs)
    if traced is not None:
        store.add_workload(traced, axes, inputs)
    recs: dict[str, dict] = {}
    runs: dict[str, object] = {}
    start = time.monotonic()
    bar = Progress(len(assignments), enabled=progress)
    for n, (label, a) in enumerate(assignments.items()):
        if (time_limit_s is not None and n >= min_plans
                and time.monotonic() - start >= time_limit_s):
            break
        bar.update(f"whole plan {label}")
        checked_lossy = options.tolerance is not None and a.lossy
        if checked_lossy:
            label += tolerance_tag(options.tolerance)   # `pipeline.measured_as_traced`
        impl = record_recipe(store, graph, a, dims, options, label)
        if store.measured(ghash, impl, wkey, env_id) or impl in recs:
            continue
        plan = lower_assignment(a, options, source_graph=graph)
        state_args = frozenset(i for i, _ in options.state)

        def fn(*xs, run=plan.compiled.run_flat, state_args=state_args):
            # state arguments are updated in place: each call gets fresh copies
            xs = [x.copy() if i in state_args else x for i, x in enumerate(xs)]
            return _single(run(xs))

        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            # the accuracy check, one call (the passes below time the plan)
            recs[impl] = profile(fn, args, golden=_single(golden), atol=atol, rtol=rtol,
                                 graph_hash=ghash, impl=impl, workload=wkey, env_id=env_id,
                                 timed=False)
        if recs[impl]["status"] == "PASSED" and checked_lossy:
            # a plan holding weights in a lower precision passes as `tgx.compile` keeps it:
            # each output's error within the tolerance of its own scale (the check above,
            # relative too, passed an exp(int8 GEMV) whose first call was then rejected)
            err = path_error(plan, args, golden)
            if err > options.tolerance:
                recs[impl].update(status="INCORRECT_NUMERICAL", log=(
                    f"the path's error {err:.3g} of an output's scale exceeds the tolerance "
                    f"{options.tolerance:g}"))
        if recs[impl]["status"] == "PASSED":
            runs[impl] = _as_called(plan, args, options)
            if lowered is not None:
                lowered[assignment_digest(a, options)] = plan
    passes: dict[str, list] = {impl: [] for impl in runs}
    rnd = random.Random(0)

    def race(order: list, n: int) -> None:
        for r in range(n):
            if r and order:  # a plan `far` slower than the best at its best pass is out
                best = min(min(t.median_s for t in passes[i]) for i in order)
                order = [i for i in order if min(t.median_s for t in passes[i]) <= best * far]
            rnd.shuffle(order)
            for impl in order:
                with np.errstate(all="ignore"), warnings.catch_warnings():
                    warnings.simplefilter("ignore", RuntimeWarning)
                    # the spin-up is time, not a count of calls: three warm-up calls of a
                    # 0.25 s prefill were 0.75 s per pass, most of an 18-layer explore
                    passes[impl].append(measure(runs[impl], args, budget_s=budget_s / rounds,
                                                warmup=1, warmup_s=spin_up_s,
                                                sync=options.args_on))

    bar.close()
    race(list(runs), rounds)
    # plans within `CLOSE` of the fastest are told apart with more passes (racing): the
    # choice between them is what the measurement is for
    if passes:
        med = {impl: statistics.median(t.median_s for t in ts) for impl, ts in passes.items()}
        best = min(med.values())
        near = [impl for impl, m in med.items() if m <= best * (1 + CLOSE)]
        extra = 2 * rounds if close is None else close
        if len(near) > 1 and extra:
            race(near, extra)
    for impl, ts in passes.items():
        med = [t.median_s for t in ts]
        mid = statistics.median(med)
        recs[impl].update(median_s=mid, min_s=min(t.min_s for t in ts),
                          spread=(max(med) - min(med)) / mid if mid else 0.0,
                          samples=sum(t.samples for t in ts))
    if recs:
        also = []
        if traced is not None:
            twkey = graph_keys(graph, dims, traced)[1]
            also = [dict(r, graph_hash=traced, workload=twkey) for r in recs.values()]
        store.add_traces(list(recs.values()) + also)
    return len(recs)


def explore(graph: Graph, options: PlanOptions, store, backends: Sequence[str],
            dims: Mapping, traced: str | None = None, given: Sequence | None = None
            ) -> dict:
    """EXPLORE: profile the unmeasured candidate kernels of `graph`, then measure the
    shortlist of whole plans lowered with `options`; FASTEST then chooses from the store.

    With `options.explore_budget` (seconds), kernels get at most half of it and whole plans
    what is left; what the budget leaves out is measured by a later explore. A progress bar
    goes to stderr on a terminal (`$TGX_PROGRESS=1/0` forces it on/off). `traced`: the key
    of the graph as traced (`recipes.traced_key`), under which plans are recorded too;
    `given`: the caller's arguments, on which whole plans are timed (`plan_inputs`).

    Returns {assignment_digest: Plan} of the whole plans it lowered and checked: the caller
    runs the chosen one as it is (lowering a jax plan again compiles it again with XLA:
    1.3-2.3 s of an 18-layer prefill's explore)."""
    start, budget = time.monotonic(), options.explore_budget

    def left():
        return None if budget is None else max(0.0, budget - (time.monotonic() - start))

    cm = CostModel(store, tolerance=options.tolerance, lossy_below=options.lossy_below)
    explore_kernels(graph, backends, store, cm, dims, progress=None,
                    patterns=options.patterns, fuse=options.fuse,
                    time_limit_s=None if budget is None else budget / 2)
    # with what was just measured
    cm = CostModel(store, tolerance=options.tolerance, lossy_below=options.lossy_below)
    # the shortened race gets half of what is left, so that the whole graph has time too
    limit = left()
    args = plan_inputs(graph, dims, options, given)
    try:
        labels = _race_shortened(graph, options, store, backends, dims, cm,
                                 None if limit is None else limit / 2, args)
    except Exception as e:  # noqa: BLE001 - a shortcut that fails: time every plan whole
        warnings.warn(f"explore: racing the plans on the graph with fewer repeated blocks "
                      f"failed ({type(e).__name__}: {e}); every plan is timed whole",
                      stacklevel=2)
        labels = None
    cands = candidate_assignments(graph, backends, cm, dims, options,
                                  None if labels is None else set(labels))
    confirm = {}
    if labels is not None:
        # the few left are close: the whole graph confirms the choice in fewer passes (its
        # calls cost the most), the shortened race's winner first and whatever the budget
        cands = {label: cands[label] for label in labels if label in cands}
        confirm = {"rounds": CONFIRM_ROUNDS, "close": CONFIRM_CLOSE_ROUNDS, "min_plans": 1}
    lowered: dict = {}
    measure_assignments(graph, cands, store, dims, options, env_id=cm.env_id,
                        time_limit_s=left(), progress=None, traced=traced, inputs=args,
                        lowered=lowered, **confirm)
    return lowered


def tolerance_tag(tolerance: float) -> str:
    """What the label of a plan holding weights in a lower precision ends with when it was
    measured (checked) under `tolerance`.

    >>> tolerance_tag(0.02)
    ' (tolerance 0.02)'
    """
    return f" (tolerance {tolerance:g})"


def race_lossy(graph: Graph, options: PlanOptions, store, dims: Mapping,
               lossy: Mapping[str, Assignment], traced: str | None = None,
               given: Sequence | None = None, lowered: dict | None = None) -> int:
    """Time the selections of {label: Assignment} `lossy` (`fastest.lossy_selections`:
    FASTEST's under `options.tolerance`, holding weights in a lower precision) as whole
    plans on the call's arguments `given` (checked against the reference within the
    tolerance) and record them, so that FASTEST then chooses between them and the plans
    measured whole by measurement; returns how many plans were measured
    (`fastest.unraced_rival` says when this is needed)."""
    args = plan_inputs(graph, dims, options, given)
    return measure_assignments(graph, lossy, store, dims, options, traced=traced, inputs=args,
                               lowered=lowered, progress=None)


def _as_called(plan, args: list, options: PlanOptions):
    """`plan` to time as `tgx.compile` calls it: on NumPy arrays, state buffers updated in
    place call after call; on `options.args_on`'s arrays (converted once), the state donated
    and the new state passed to the next call, results left in that library's format."""
    run = plan.compiled.run_flat
    on = options.args_on
    if on is None:
        return lambda *xs: run(list(xs))
    backend = get_backend(on)
    state = {i for i, _ in options.state}
    carry = [backend.convert(np.array(a, copy=True) if i in state else a)
             for i, a in enumerate(args)]

    def call(*_):
        # results come back in the caller's library, as `tgx.compile` returns them
        outs = to_callers_arrays(run(carry, donate=True, out_backend=on), carry, backend)
        for i, o in options.state:
            carry[i] = outs[o]
        return outs
    return call


def plan_inputs(graph: Graph, dims: Mapping, options: PlanOptions,
                given: Sequence | None = None) -> tuple:
    """The arrays whole plans are timed on: the caller's own arguments `given` (a call's
    flat arguments, as NumPy arrays; the state copied where it starts, since plans update
    it in place) when they are `graph`'s inputs at `dims`, else random ones
    (`random_plan_inputs`). The caller's arrays are where the caller's are (so a plan is
    timed on them as placed), and drawing random weights was 1.8 s of an 18-layer
    prefill's explore (463 MiB).

    >>> import tgx
    >>> g = tgx.make_graph(lambda x: x * 2.0)(tgx.Spec((3,)))
    >>> x = np.ones(3, np.float32)
    >>> plan_inputs(g, {}, PlanOptions(), [x])[0] is x
    True
    """
    if given is not None:
        args = [np.asarray(to_numpy(x)) for x in given]
        want = [(tuple(concrete_shape(v.aval.shape, dims)), v.aval.dtype) for v in graph.invars]
        if len(args) == len(want) and all(a.shape == s and a.dtype == d
                                          for a, (s, d) in zip(args, want)):
            state = {i for i, _ in options.state}
            return tuple(aligned_copy(a, offset_of(a)) if i in state else a
                         for i, a in enumerate(args))
    return random_plan_inputs(graph, dims, options.in_offsets)


def random_plan_inputs(graph: Graph, dims: Mapping, offsets: Sequence[int] | None = None
                       ) -> tuple:
    """Random arrays for `graph`'s inputs at `dims`, each starting where the caller's does
    (`offsets`, `PlanOptions.in_offsets`; None: on an alignment boundary, as `tgx.aligned`
    places arrays): XLA reads an aligned host array in place and copies an unaligned one on
    every call. Measured on aligned inputs only, the LSTM step's jax plan (838 us) beat the
    torch plan, and ran 1190 us on the caller's arrays against the torch plan's 981; and
    unaligned inputs for a caller passing aligned ones priced the 18-layer prefill's jax plan
    at 1.66 s against the 0.23 s it runs in."""
    args = random_inputs([(list(concrete_shape(v.aval.shape, dims)), v.aval.dtype.name)
                          for v in graph.invars], aligned=True)
    if not offsets:
        return args
    return tuple(aligned_copy(a, k) if k else a for a, k in zip(args, offsets))


def _race_shortened(graph: Graph, options: PlanOptions, store, backends, dims, cm,
                    time_limit_s: float | None, args: Sequence) -> list[str] | None:
    """For a graph of identical blocks in a row (decoder layers, `tgx.graph.repeats`): the
    labels of the candidate plans worth timing on the whole graph, fastest first, found by
    timing them all on the graph with `SHORT_BLOCKS` blocks (see `CONFIRM`); None when the
    graph has no such run (time every candidate on the whole graph).

    An 18-layer prefill's candidates cost ~0.5 s per pass each and ~2 s of XLA compilation
    per jax plan; with two layers, a tenth. The ranking carries over because the blocks are
    the same work: what differs between the plans is how each block and each boundary
    between blocks runs, and the shortened graph has both. `args`: the whole graph's inputs,
    of which the shortened graph runs on its own (its state copied)."""
    r = find_repeats(graph)
    if r is None or r.count <= SHORT_BLOCKS:
        return None
    short = shorten(graph, r, SHORT_BLOCKS)
    sopts = replace(options, weights=short.inputs(options.weights),
                    state=short.pairs(options.state),
                    in_names=None if options.in_names is None else tuple(
                        options.in_names[i] for i in short.invars))
    sg = short.graph
    state = {i for i, _ in options.state}
    # (drawing inputs again was ~0.7 s of an 18-layer prefill's explore: weights are shared)
    sargs = [aligned_copy(args[i], offset_of(args[i])) if i in state else args[i]
             for i in short.invars]
    # two passes each and no extra passes for the close ones: those on other backends are
    # all timed again whole, and variants on one set of backends differ by little
    measure_assignments(sg, candidate_assignments(sg, backends, cm, dims, sopts), store, dims,
                        sopts, env_id=cm.env_id, time_limit_s=time_limit_s, progress=None,
                        close=0, rounds=SHORT_ROUNDS, far=SHORT_FAR, inputs=sargs)
    ranked = measured_plans(sg, backends, store, dims, cm.env_id, sopts, nearest=False)
    if not ranked:
        return None
    return to_confirm(ranked)


def to_confirm(ranked: Sequence) -> list[str]:
    """The labels of the shortened race's plans (`MeasuredPlan`s, fastest first) to time on
    the whole graph (`CONFIRM`): within `CONFIRM` of the fastest, the fastest on each set of
    backends first, then the runners-up, at least `MIN_CONFIRM` and at most
    `CONFIRM_PLANS`."""
    close = [m for m in ranked if m.median_s <= ranked[0].median_s * (1 + CONFIRM)]
    labels, seen = [], set()
    for m in close:
        if m.backend not in seen:
            labels.append(m.label)
            seen.add(m.backend)
    labels += [m.label for m in close if m.label not in labels]
    if len(labels) < MIN_CONFIRM:  # the runner-up, however far: see `MIN_CONFIRM`
        labels += [m.label for m in ranked if m.label not in labels][:MIN_CONFIRM - len(labels)]
    return labels[:CONFIRM_PLANS]


def _single(outs: list):
    return outs[0] if len(outs) == 1 else tuple(outs)


# -- tgx.paths ----------------------------------------------------------------------------------

class PathPlan(_paths.PathPlan):
    """A path that can also be lowered (`lower`), run, profiled and saved to the store."""

    def lower(self):
        """The `Plan` running this path (built once)."""
        if self._plan is None:
            self._plan = lower_assignment(self.assignment(), PlanOptions(policy="heuristic"),
                                          source_graph=self.paths.graph)
        return self._plan

    def run(self, *args, **kwargs):
        """Run the plan on arguments shaped like the traced function's."""
        return self.lower().run(*args, **kwargs)

    __call__ = run

    def reference(self, *args, **kwargs):
        """The reference evaluator's result on the same arguments (for checking)."""
        return eval_graph(self.paths.graph, *args, **kwargs)

    def save(self, store=None) -> str:
        """Store the plan (its `Assignment`, with its decisions) as a GRAPH_RECIPE of the
        graph; returns the implementation key."""
        store = as_store(store if store is not None else self.paths.store)
        g = self.paths.graph
        gh = store.add_graph(structural_hash(g), self.paths.name, graph_to_bytes(g))
        digest = hashlib.sha256(msgpack.packb([gh, self.tokens()])).hexdigest()
        bs = self.backends()
        return store.add_implementation("GRAPH_RECIPE", f"{self.paths.name}-path",
                                        "+".join(bs), digest,
                                        {"kernels": len(self.steps),
                                         "transfers": self.ntransfers},
                                        self.assignment().to_bytes(f"{self.paths.name}-path"))

    def profile(self, *args, store=None, **measure_kw) -> dict:
        """Time the plan (checked against the reference evaluator) and record a trace for its
        GRAPH_RECIPE implementation in `store` (default: `$TGX_STORE`); returns the record."""
        store = as_store(store if store is not None else self.paths.store)
        plan = self.lower()
        g = self.paths.graph
        leaves, _ = tree_flatten((args, {}))
        impl = self.save(store)
        gh = structural_hash(g)
        try:
            axes = {str(k): int(v) for k, v in bind_dims(g.in_avals, leaves).items()}
        except TgxError:
            axes = {}
        workload = store.add_workload(gh, axes, input_descriptors(leaves))
        golden = _single(eval_graph_flat(g, leaves))

        def run(*xs):
            return _single(plan.compiled.run_flat(list(xs)))

        measure_kw.setdefault("budget_s", 0.05)
        rec = profile(run, leaves, golden=golden, store=store, graph_hash=gh, impl=impl,
                      workload=workload, **measure_kw)
        if rec.get("median_s") is not None and rec.get("status") == "PASSED":
            self.measured_s = rec["median_s"]
        return rec


class Paths(_paths.Paths):
    """Every valid plan of a graph (`tgx.planning.paths.Paths`), as runnable `PathPlan`s."""

    plan_type = PathPlan

    def measured(self, store=None) -> list[tuple[float, PathPlan]]:
        """(median seconds, plan) of every plan of this graph profiled into `store` (PASSED
        traces of GRAPH_RECIPEs saved from `tgx.paths`), fastest first: ranking by
        measurement."""
        store = as_store(store if store is not None else self.store)
        gh = structural_hash(self.graph)
        best: dict[str, float] = {}
        for t in store.traces(graph_hash=gh, status="PASSED"):
            if t.get("median_s") is not None:
                best[t["impl"]] = min(best.get(t["impl"], math.inf), t["median_s"])
        out = []
        for impl, s in best.items():
            rec = store.get_implementation(impl)
            if rec is None or rec["kind"] != "GRAPH_RECIPE" or not rec["payload"]:
                continue
            try:
                tokens = Assignment.from_bytes(rec["payload"]).meta.get("tokens")
                if tokens is None:  # a measured plan of EXPLORE: no decisions to replay
                    continue
                plan = self.plan_from_tokens(tokens)
            except SerializationError:
                continue
            plan.measured_s = s
            out.append((s, plan))
        out.sort(key=lambda t: t[0])
        return out


def paths(fn, **options):
    """`tgx.paths(fn)(*args_or_specs, backends=None, store=None, ...)`: the `Paths` of `fn`
    traced on those arguments (arrays, pytrees of arrays, or `tgx.Spec`s).

    Options (given to either call): `backends`, `store`, `dims` (values of symbolic dims for
    costing, default 64), `max_transfers`, `decompose`, `patterns`, `kernels_only`,
    `cost_model` (an object with `kernel(eqn, kernel, dims)` and `transfer(aval, src, dst,
    dims)`, and optionally `switch(src, dst)`: seconds ≥ 0 per backend switch).

    >>> import tgx, tgx.numpy as tnp
    >>> tgx.paths(lambda x: tnp.exp(x))(tgx.Spec((4,)), backends=["numpy"]).count()
    2
    """
    if isinstance(fn, Graph):
        return Paths(fn, **options)
    inner = getattr(fn, "fn", fn)  # a tgx.compile'd function: trace the Python function
    keys = ("backends", "store", "dims", "max_transfers", "decompose", "patterns",
            "kernels_only", "cost_model", "name")

    def trace(*args, **kwargs):
        opts = dict(options)
        opts.update({k: kwargs.pop(k) for k in keys if k in kwargs})
        opts.setdefault("name", getattr(inner, "__name__", "graph"))
        g = make_graph(inner)(*args, **kwargs)
        return Paths(g, **opts)

    return trace
