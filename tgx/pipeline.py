"""The compile pipeline: a traced graph → a `Plan`, as a list of named stages.

    traced ─simplify─▶ graph ─patterns─▶ graph ─fuse─▶ graph ─select─▶ Assignment
           ─rebackend─▶ copies ─schedule─▶ run order ─lower─▶ instructions ─buffers─▶ memory
           plan ─▶ Plan

- simplify: `tgx.simplify` (rules as data; nothing unsafe).
- patterns: each occurrence of a pattern kernel's pattern becomes one `fused` equation whose
  candidates are the kernels and the op-by-op body (`tgx.planning.kernel_patterns`); the
  selection chooses between them, as for any equation.
- fuse: regions of elementwise ops numba can generate one loop for become one `fused`
  equation (`tgx.planning.regions`); the loop is a candidate beside the ops.
- select: the policy's planner — HEURISTIC (`planning.heuristic`), FASTEST
  (`planning.fastest`: a measured whole plan, else the selection), or EXPLORE
  (`tgx.explore`: measure first, then FASTEST). Each returns an `Assignment`.
- rebackend, schedule, lower, buffers: `tgx.lowering.lower_assignment`, the one lowering of
  every assignment.

FASTEST first looks for a measured plan of the graph as traced (`measured_as_traced`; with
a tolerance, once one was raced under it): EXPLORE records its plans under that key too, so
a later compile lowers the measured plan without running simplify, patterns and fuse
(matching pattern kernels imports every backend: torch and jax take ~2 s, which a NumPy
plan never needs);
its `stages` are then "traced", "select" and the lowering's.

`plan.stages` holds the program after each stage; `print(plan.stages)` shows them in order.
Options travel as one frozen `PlanOptions`.

>>> import tgx, tgx.numpy as tnp
>>> g = tgx.make_graph(lambda x: tnp.exp(x) * 1.0)(tgx.Spec(("N",)))
>>> plan = plan_graph(g, policy="heuristic", backends=["numpy"])
>>> print(plan.stages["simplify"])
{ lambda ; a:f32[N]. let
    b:f32[N] = exp a
  in (b) }
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from .backends import check_backends
from .core import Graph
from .explore import explore, race_lossy, tolerance_tag
from .lowering.lower import lower_assignment
from .plan import Plan
from .planning.assignment import Assignment
from .planning.fastest import (cost_model_for, fastest_assignment, fastest_measured,
                               first_admitted, lossy_selections, unraced_rival)
from .planning.heuristic import heuristic_assignment
from .planning.kernel_patterns import match_patterns
from .planning.options import PlanOptions
from .planning.recipes import (assignment_digest, measured_plans, measured_with_more_backends,
                               traced_key)
from .planning.regions import fuse_regions
from .serialize import SerializationError
from .shapes import hint_binding
from .store import open_for_planning
from .transforms.simplify import simplify

#: the stages `plan_graph` runs, in order (the lowering's four are `lower_assignment`'s)
STAGES = ("traced", "simplify", "patterns", "fuse", "select", "rebackend", "schedule", "lower",
          "buffers")


def plan_graph(graph: Graph, options: PlanOptions | None = None, *,
               given: Sequence | None = None, **kw) -> Plan:
    """Choose a kernel per equation of `graph`, insert transfers, lower: a `Plan`.

    `options` (or the same fields as keywords; see `PlanOptions` and `tgx.compile`): the
    policy, backends, device, store, tolerance, binding `dims`, memory budget, weights,
    state, argument names, and whether results stay in their backends' formats. `given`:
    a call's flat arguments, on which "explore" times whole plans (default: random ones).

    "fastest" and "explore" choose at the binding `dims` (default: every symbol at 64) with
    `store` (default: `BenchmarkStore()`). On a GPU `device` they fall back to the heuristic
    plan (the profiler and the store's figures are CPU timings), and `plan.policy` says so.
    """
    if options is None:
        options = PlanOptions.make(**kw)
    elif kw:
        options = replace(options, **kw)
    backends = check_backends(options.backends, options.device)
    traced = None
    if options.policy in ("fastest", "explore") and options.device == "cpu":
        traced = traced_key(graph, options, backends)
        found = measured_as_traced(graph, options, backends, traced)
        if found is not None:  # the stages' result is the measured plan's graph
            return lower_assignment(found, options, source_graph=graph,
                                    stages=[("traced", graph), ("select", found)])
    stages = [("traced", graph), *graph_stages(graph, options)]
    g = stages[-1][1]
    lowered: dict = {}
    assignment = select(g, options, backends, traced, given, lowered)
    stages.append(("select", assignment))
    plan = lowered.get(assignment_digest(assignment, options))
    if plan is not None:  # EXPLORE lowered, ran and timed this very plan: run it as it is
        lowering = [(n, p) for n, p in plan.stages if n in STAGES[-4:]]
        return Plan(assignment, plan.graph, plan.compiled, options, graph, stages + lowering)
    return lower_assignment(assignment, options, source_graph=graph, stages=stages)


def measured_as_traced(graph: Graph, options: PlanOptions, backends,
                       traced: str) -> Assignment | None:
    """FASTEST's measured plan found from the graph as traced (`recipes.traced_key`), before
    the stages run, or None. With a tolerance, only once a plan holding weights in a lower
    precision was measured under that very tolerance (its label ends with
    `explore.tolerance_tag`): its selection was raced, so the fastest plan measured is what
    FASTEST would take after building the selection again (~2 s of stages and selection for
    an 18-layer prefill, every process); lossy plans measured under another tolerance are
    left out."""
    if options.policy != "fastest":
        return None
    store, unusable = open_for_planning(options.store)
    if store is None or unusable:
        return None
    dims = options.binding or hint_binding(graph.in_avals)
    found = measured_plans(graph, backends, store, dims, options=options, key=traced,
                           stale=True)
    if not found:  # fewer backends than were explored: the plans measured on these alone
        found = measured_with_more_backends(graph, backends, store, dims, options)
    tag = None if options.tolerance is None else tolerance_tag(options.tolerance)
    if tag is not None and not any(m.label.endswith(tag) and _loads(m) for m in found):
        # not raced under this tolerance, or what was raced holds a kernel changed since (an
        # upgrade of tgx): the stages build the selection, which races it again
        return None
    if tag is None:  # no lossy plan (the cost model, ~9 ms to load, is not needed)
        hit = first_admitted(found, None, dims, keep=lambda m, a: not a.lossy)
    else:  # a lossy plan measured under another tolerance passed another check: left out
        hit = first_admitted(found, cost_model_for(store, options), dims,
                             keep=lambda m, a: not a.lossy or m.label.endswith(tag))
    if hit is None:
        return None
    a = hit[1]
    return a.replace(by=f"fastest ({a.by}; found from the traced graph)")


def _loads(m) -> bool:
    """Whether a measured plan's assignment still loads (its kernels are this process's)."""
    try:
        m.assignment()
    except SerializationError:
        return False
    return True


def graph_stages(graph: Graph, options: PlanOptions) -> list[tuple[str, Graph]]:
    """The graph-to-graph stages in turn, each (name, its output): simplify, patterns and
    fuse, as `options` say (a stage turned off passes its input on)."""
    backends = check_backends(options.backends, options.device)
    g = simplify(graph) if options.simplify else graph
    out = [("simplify", g)]
    g = match_patterns(g, backends) if options.patterns else g
    out.append(("patterns", g))
    g = fuse_regions(g, backends) if options.fuse else g
    out.append(("fuse", g))
    return out


def transform(graph: Graph, options: PlanOptions | None = None) -> Graph:
    """The graph the planners see: `graph` through `graph_stages`. Measured whole plans are
    keyed by this graph, so code that measures plans for `tgx.compile` measures
    `transform(graph)`."""
    return graph_stages(graph, options or PlanOptions())[-1][1]


def select(graph: Graph, options: PlanOptions, backends, traced: str | None = None,
           given: Sequence | None = None, lowered: dict | None = None) -> Assignment:
    """The select stage: the policy's `Assignment` of `graph`; `traced`: the key of the graph
    as traced, under which EXPLORE records the plans it measures too; `given`: the
    arguments EXPLORE times whole plans on (`tgx.explore.plan_inputs`); `lowered`: a dict
    that gets EXPLORE's lowered plans ({assignment_digest: Plan})."""
    if options.policy == "heuristic":
        return heuristic_assignment(graph, backends, options.device)
    if options.device != "cpu":  # the store's figures are CPU timings
        a = heuristic_assignment(graph, backends, options.device)
        return a.replace(by=f"heuristic (device {options.device}: the benchmark store's "
                            f"selection is CPU-only, so {options.policy!r} falls back)")
    store, unusable = open_for_planning(options.store)  # a broken store warns once, is unused
    if unusable:
        return heuristic_assignment(graph, backends, options.device).replace(
            by=f"heuristic ({unusable})")
    dims = options.binding or hint_binding(graph.in_avals)
    options = replace(options, store=store, dims=dims)
    lowered = {} if lowered is None else lowered
    if options.policy == "explore" and store is not None:
        # (plans are timed on arrays of the library the caller's are: `options.args_on`)
        lowered.update(explore(graph, options, store, backends, dims, traced, given))
    a = fastest_assignment(graph, options, store, flag=options.policy == "fastest")
    rival = unraced_rival(a, graph, options, store, dims)
    if rival is not None and given is not None:
        # a selection holding weights in a lower precision, priced below the fastest plan
        # measured whole: timed against it on the call's arguments, once (recorded), with
        # the lossy selection on each single backend
        race_lossy(graph, options, store, dims,
                   lossy_selections(a, graph, options, store, dims), traced, given, lowered)
        a = fastest_measured(graph, options, store, dims) or \
            fastest_assignment(graph, options, store, flag=False)
    return a
