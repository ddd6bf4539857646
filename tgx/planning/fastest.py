"""FASTEST: the assignment with the least time, from measurements where they exist.

In order:
1. A whole plan measured on this machine for this graph, binding and lowering options
   (`tgx.planning.recipes`): the fastest one, as measured (whole-plan effects — XLA fusion,
   thread pools, caches — are in the figure). With `tolerance=`, only plans whose kernels it
   admits, and only when the selection below holds no weight in a lower precision or
   predicts more time than the measured plan took.
2. Otherwise the selection (`tgx.planning.selection`) over every kernel, decomposition and
   backend, priced by the store's figures and the cost model; the HEURISTIC plan instead when
   the cost model prices it lower (FASTEST never predicts worse than HEURISTIC). A selection
   holding a kernel on a thread pool of its own is priced with its BLAS products on the one
   thread its plan leaves them (`blas_capped_s`), against the selection without such
   kernels.
3. Equations priced without a measurement are flagged for ``tgx profile --pending``.

>>> import tgx, tgx.numpy as tnp
>>> from tgx.planning.options import PlanOptions
>>> g = tgx.make_graph(lambda x: tnp.exp(x) * 2.0)(tgx.Spec((64,)))
>>> fastest_assignment(g, PlanOptions(backends=("numpy",)), store=None).backends
('numpy', 'numpy')
"""

from __future__ import annotations

import os

from ..backends import check_backends, get_backend, host_name
from ..core import Graph
from ..errors import TgxError
from ..profiling.pending import Unencodable, describe_equation
from ..serialize import SerializationError
from ..shapes import hint_binding
from ..store.schema import make_pending
from .assignment import Assignment
from .candidates import Candidate, accepted_kernels
from .cost_model import CostModel, Estimate, ensure_calibrated
from .heuristic import heuristic_assignment
from .options import PlanOptions
from .recipes import assignment_digest, graph_keys, measured_plans, recipe_key
from .selection import Choice, _Selector, realize, select, state_values

NO_WORK = Estimate(0.0, "cost model", "no work")


def fastest_assignment(graph: Graph, options: PlanOptions, store, *,
                       cost_model: CostModel | None = None, flag: bool = True) -> Assignment:
    """FASTEST's `Assignment` of `graph` (see the module doc). `store`: the benchmark store
    (None: the cost model alone); `flag`: write pending flags for what was not measured."""
    backends = check_backends(options.backends, options.device)
    dims = options.binding or hint_binding(graph.in_avals)
    cm = cost_model or cost_model_for(store, options)
    measured = _fastest_measured(graph, backends, store, cm, dims, options)
    if measured is not None and options.tolerance is None:
        return measured
    # the caller's arrays come from (and results go back to) `args_on`'s library
    home = options.args_on if options.args_on in backends else None
    sel = select(graph, backends, cm, dims, weights=options.weights, state=options.state,
                 patterns=options.patterns,
                 fuse=options.fuse, home=home)
    price = sel.total
    if measured is None and options.tolerance is None:
        sel, price = _pool_aware(sel, graph, backends, cm, dims, options, home)
    if measured is not None:
        # Under a tolerance the selection may hold weights in a lower precision, which no
        # measured plan does: it is taken only when its prediction beats the measured plan;
        # a selection without lossy kernels is what the measured plans already cover (a
        # prefill's measured jax plan ran 237 ms, the per-kernel selection 366 ms).
        # Once timed whole (`unraced_rival`), it is the measured plan where it was faster.
        chosen = realize(sel)
        if not chosen.lossy or measured.predicted_s <= sel.total or _measured_whole(
                chosen, graph, backends, store, cm, dims, options):
            return measured
    if options.tolerance is None:
        h = heuristic_assignment(graph, backends)
        h_cost = assignment_cost(h, backends, cm, dims, options.weights, home, options.state)
        if h_cost < price * (1 - 1e-9):
            return h.replace(by=f"{options.policy} (heuristic plan: cheaper by the cost model)",
                             predicted_s=h_cost, dims=dims)
    a = realize(sel, options.policy)
    if flag and store is not None:
        flag_pending(store, cm, a, backends)
    return a


def blas_capped_s(a: Assignment, threads: int | None = None) -> float:
    """What capping BLAS at one thread adds to `a`'s predicted time when `a` holds a kernel
    on a thread pool of its own (0.0 otherwise): each BLAS product on the host backend, priced
    with BLAS on all `threads` (default: this process's CPUs), taken as `threads` times as
    long (a 256x256 product: 0.24 ms on two threads, 0.48 on one, docs/gemma.md).

    >>> import tgx
    >>> g = tgx.make_graph(lambda x: x @ x)(tgx.Spec((4, 4)))
    >>> blas_capped_s(fastest_assignment(g, PlanOptions(backends=("numpy",)), store=None))
    0.0
    """
    if a.estimates is None:
        return 0.0
    return _capped_s(list(zip(a.graph.eqns, a.backends, a.kernels, a.estimates)), threads)


def _capped_s(steps: list, threads: int | None = None) -> float:
    """`blas_capped_s` of (equation, backend, kernel, estimate) steps."""
    if not any(k is not None and k.own_pool for _, _, k, _ in steps):
        return 0.0
    n = threads or len(os.sched_getaffinity(0))
    host = get_backend(host_name())
    # the products on BLAS's pool, which a plan holding an own-pool kernel runs on one
    # thread (`CompiledGraph.blas_threads`): what wakes the host's pool (`wakes_pool`)
    return sum(est.seconds * (n - 1) for e, b, k, est in steps
               if b == host.name and k is not None and host.wakes_pool(e, k))


def _steps(sel) -> list:
    """The (equation, backend, kernel, estimate) steps `realize(sel)` would emit, in order,
    without building its graph."""
    out = []
    for e, c in zip(sel.graph.eqns, sel.choices):
        if c.sub is not None:
            out += _steps(c.sub)
        else:
            out.append((e, c.backend, c.kernel, c.estimate))
    return out


def _pool_aware(sel, graph, backends, cm: CostModel, dims, options, home):
    """(selection, its price) FASTEST goes on with: `sel` priced with its BLAS products
    capped where it holds a kernel on a pool of its own, or the selection without such
    kernels where that is cheaper. The per-equation prices cannot see the cap: on NumPy
    alone an 18-layer Gemma prefill's selection with torch's attention (own pool) was priced
    below the plan without it and ran 319 ms against 189, its 127 GEMMs on one thread."""
    capped = _capped_s(_steps(sel))
    if capped == 0.0:
        return sel, sel.total
    serial = select(graph, backends, cm.without_own_pools(), dims, weights=options.weights,
                    state=options.state, patterns=options.patterns, fuse=options.fuse,
                    home=home)
    if serial.total < sel.total + capped:
        return serial, serial.total
    return sel, sel.total + capped


def fastest_measured(graph: Graph, options: PlanOptions, store, dims) -> Assignment | None:
    """The fastest whole plan measured for `graph` at `dims` whose kernels `options.tolerance`
    admits (lossy ones included under a tolerance), or None: what FASTEST takes once the
    lossy selections were raced (`lossy_selections`), without building the selection again
    (~1.6 s for an 18-layer prefill).

    >>> import tgx
    >>> g = tgx.make_graph(lambda x: x * 2.0)(tgx.Spec((4,)))
    >>> fastest_measured(g, PlanOptions(), None, {}) is None
    True
    """
    backends = check_backends(options.backends, options.device)
    return _fastest_measured(graph, backends, store, cost_model_for(store, options), dims,
                             options)


def _fastest_measured(graph, backends, store, cm: CostModel, dims, options):
    """The fastest whole plan measured for `graph` (`tgx.planning.recipes`) whose kernels
    `tolerance` admits, as an `Assignment`, or None."""
    if store is None:
        return None
    hit = first_admitted(measured_plans(graph, backends, store, dims, cm.env_id, options,
                                        stale=True), cm, dims)
    if hit is None:
        return None
    m, a = hit
    near = "" if m.dims == {str(k): int(v) for k, v in dims.items()} else \
        " (the nearest measured binding)"
    return a.replace(by=f"{options.policy} ({a.by}{near})")


def first_admitted(found, cm: CostModel | None, dims, keep=None):
    """The first of `found` (measured whole plans, fastest first: `recipes.measured_plans`)
    whose assignment still loads, passes `keep(record, assignment)` and whose every kernel
    `cm` admits (`CostModel.excluded`: without a tolerance no lossy kernel, so no plan
    measured for a compile with one; None: `keep` alone decides), as (record, Assignment);
    None when none does.

    >>> first_admitted([], CostModel(), {}) is None
    True
    """
    for m in found:
        try:
            a = m.assignment()
        except SerializationError:  # a kernel changed since: the next one
            continue
        if keep is not None and not keep(m, a):
            continue
        if cm is not None and any(k is not None and cm.excluded(e, k, dims) is not None
                                  for e, k in zip(a.graph.eqns, a.kernels)):
            continue
        return m, a
    return None


def cost_model_for(store, options: PlanOptions) -> CostModel:
    """The cost model FASTEST prices with under `options`: the store's figures (the
    backends' GEMM rates and bandwidths measured into it first where it has none for this
    machine: `ensure_calibrated`), the tolerance and the bound on lossy kernels
    (`PlanOptions.lossy_below`)."""
    if store is not None and options.device == "cpu":
        ensure_calibrated(store, check_backends(options.backends, options.device))
    return CostModel(store, tolerance=options.tolerance, lossy_below=options.lossy_below)


def unraced_rival(a: Assignment, graph: Graph, options: PlanOptions, store,
                  dims) -> Assignment | None:
    """The fastest whole plan measured for `graph` when FASTEST chose `a`, a selection
    holding weights in a lower precision (under `tolerance=`) that was never measured
    whole: `a` is then priced below the rival by the cost model alone, which misprices
    plans mixing libraries (an 18-layer prefill's bf16 selection, 150 equations on jax and
    533 on NumPy, was priced 159 ms and ran 280 ms, where the measured jax plan ran 243 ms).
    None when `a` is measured, holds no such weight, or nothing is measured."""
    if options.tolerance is None or store is None or not a.lossy:
        return None
    backends = check_backends(options.backends, options.device)
    cm = cost_model_for(store, options)
    rival = _fastest_measured(graph, backends, store, cm, dims, options)
    if rival is None or _measured_whole(a, graph, backends, store, cm, dims, options):
        return None
    return rival


def lossy_selections(a: Assignment, graph: Graph, options: PlanOptions, store,
                     dims) -> dict[str, Assignment]:
    """What a tolerance race times whole: `a` (FASTEST's selection over every backend, which
    holds weights in a lower precision) and the selection on each single backend of
    `options.backends` that also holds such weights and was not measured whole, duplicates
    dropped. A selection over every backend is priced by per-kernel figures and modelled
    transfers: an 18-layer prefill's bf16 selection put attention on jax (its results
    waited for at every copy back, 0.7 ms each) and ran 187 ms where the NumPy-only one,
    every GEMM in bf16 and numba's attention, ran ~160 ms; one figure measured high in the
    sweep (a bf16 GEMM at 20 ms for 1 ms) moves a selection as far. Racing a few plans
    costs one lowering and a few calls each, on the first compile with the tolerance only.

    >>> import tgx
    >>> g = tgx.make_graph(lambda x: x * 2.0)(tgx.Spec((4,)))
    >>> a = fastest_assignment(g, PlanOptions(backends=("numpy",)), store=None)
    >>> list(lossy_selections(a, g, PlanOptions(backends=("numpy",)), None, {}))
    ['tolerance selection']
    """
    out = {"tolerance selection": a}
    backends = check_backends(options.backends, options.device)
    if len(backends) < 2 or store is None or options.tolerance is None:
        return out
    cm = cost_model_for(store, options)
    seen = {assignment_digest(a, options)}
    for b in backends:
        try:
            s = realize(select(graph, [b], cm, dims, weights=options.weights,
                               state=options.state, patterns=options.patterns, fuse=options.fuse,
                               home=b if options.args_on == b else None), options.policy)
        except TgxError:  # e.g. no kernel for some equation on this backend
            continue
        key = assignment_digest(s, options)
        if key in seen or not s.lossy:
            continue
        seen.add(key)
        if not _measured_whole(s, graph, backends, store, cm, dims, options):
            out[f"tolerance {b} selected"] = s
    return out


def _measured_whole(a: Assignment, graph, backends, store, cm: CostModel, dims,
                    options) -> bool:
    """Whether `a` was measured whole for `graph` at `dims`, whatever the outcome: a plan
    that failed its check (its error over the tolerance) is not timed again at every
    compile; FASTEST then keeps the plans that passed."""
    ghash, wkey = graph_keys(graph, dims)
    return store.measured(ghash, recipe_key(a, options), wkey, cm.env_id) is not None


def assignment_cost(a: Assignment, backends, cm: CostModel, dims, weights=(),
                    home: str | None = None, state=()) -> float:
    """The cost model's time of a whole assignment: its kernels, the copies it implies (bound
    weights copy for nothing; inputs come from `home`, NumPy by default; `state` written back
    as `select` prices it) and the switches between consecutive backends."""
    sel = _Selector(backends, cm, dims, [a.graph.invars[i].id for i in weights],
                    written_back=state_values(a.graph, state))
    # a `copy_to` written in the graph carries no work (its copies follow from the backends)
    opts = [{b: Choice(b, Candidate("kernel", b, k),
                       cm.kernel(e, k, dims) if k is not None else NO_WORK)}
            for e, b, k in zip(a.graph.eqns, a.backends, a.kernels)]
    sel.prepare(a.graph, home or host_name(), 0, opts)
    return sel.total(list(a.backends))[0]


def flag_pending(store, cost_model: CostModel, assignment: Assignment, backends=()) -> int:
    """Flag for the offline profiler every equation whose chosen kernel was priced without a
    measurement: each of its candidate kernels on `backends` (and the chosen one) that the
    store has not measured at the assignment's binding. All candidates, not only the chosen
    one: once the chosen kernel is measured, a sibling priced by the cost model may look
    cheaper and be chosen next, so flagging one at a time would need a profiling run per
    variant."""
    dims = assignment.dims
    recs = []
    for e, k, est in zip(assignment.graph.eqns, assignment.kernels, assignment.estimates):
        if est.source == "measured" or k is None:
            continue
        try:
            desc = describe_equation(e, dims)
        except Unencodable:
            continue
        ghash, wkey = cost_model.keys(e, dims)
        desc["axes"] = cost_model.workload(e, dims)[1]
        # (generated loops unchecked: the profiler checks what it measures)
        todo = [k] + [c for b in backends for c in accepted_kernels(e, b, unchecked_loops=True)
                      if c != k]
        for c in todo:
            ikey = cost_model.impl_key(c)
            if c is not k and store.measured(ghash, ikey, wkey, cost_model.env_id):
                continue
            recs.append(make_pending(ghash, wkey, ikey, cost_model.env_id,
                                     {"name": c.name, "backend": c.backend,
                                      "variant": c.variant, "label": c.label}, desc))
    return store.add_pending(recs) if recs else 0
