"""Measured whole plans: a plan is a candidate of its own (a GRAPH_RECIPE in the store).

The cost model prices a plan as the sum of its equations measured one at a time, plus
transfers and switch penalties. What only shows when the plan runs as a whole escapes it: XLA
fusing a JAX region, torch's OpenMP workers slowing the NumPy BLAS call after them, caches.
So EXPLORE also runs a shortlist of whole plans (`tgx.explore.measure_assignments`) and
records each as a GRAPH_RECIPE whose payload is its `Assignment` (`Assignment.to_bytes`, the
one format). FASTEST takes the fastest *measured* plan of the graph at this binding
(`best_measured`) and lowers its assignment through the same function as any other, with the
same options it was measured with (bound weights, state), so what was measured is what runs.

Recipes are keyed by the graph's structural hash, the workload (binding and input shapes),
the environment, the lowering options that change the run time and the code that runs a
lowered plan (`recipe_name`, `runtime_fingerprint`). EXPLORE
also records each under the key of the graph *as traced* (`traced_key`), so that FASTEST in a
later process finds the measured plan before it runs the stages that lead to the planned
graph: matching pattern kernels imports every backend (torch and jax: ~2 s), which a plan
that does not run on them never needs.

>>> import tgx, tgx.numpy as tnp
>>> from tgx.planning.options import PlanOptions
>>> name = recipe_name(PlanOptions(weights=(0,)))
>>> name.startswith("measured-plan@") and name.endswith("+bound-weights")
True
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import math
import pathlib
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from ..backends import available_backends
from ..backends.registry import all_kernels
from ..graph import structural_hash
from ..serialize import graph_to_bytes
from ..shapes import concrete_shape
from ..store.schema import implementation_key, workload_key
from .assignment import Assignment, payload_label
from .options import PlanOptions

PLAN_NAME = "measured-plan"
#: in a recipe name: measured on inputs placed off an alignment boundary, as the caller's
_UNALIGNED = "+unaligned"


@dataclass(frozen=True)
class MeasuredPlan:
    """A whole plan measured in the store: its median, label and payload (an `Assignment`)."""

    median_s: float
    label: str
    payload: bytes
    impl: str
    #: the binding it was measured at (the one asked for, or the nearest measured one)
    dims: dict = field(default_factory=dict)
    #: the backends it runs on, "+"-joined and sorted ("jax+numpy")
    backend: str = ""
    #: how it was measured otherwise than the plan asked for would run ("" when as it
    #: runs): "under other tgx code" (`runtime_fingerprint`), "on arrays placed otherwise"
    #: (`PlanOptions.in_offsets`); see `measured_plans(stale=True)`
    stale: str = ""

    def assignment(self) -> Assignment:
        """The measured `Assignment` (`SerializationError` when a kernel changed since)."""
        a = Assignment.from_bytes(self.payload)
        near = f"{self.median_s * 1e6:.0f} us" + (
            f" at {', '.join(f'{k}={v}' for k, v in self.dims.items())}" if self.dims else "") + (
            f" {self.stale}" if self.stale else "")
        return a.replace(predicted_s=self.median_s, dims=dict(self.dims),
                         by=f"measured plan {self.label}: {near}")


#: what runs a lowered plan besides its kernels (whose own source is in each plan's digest):
#: the lowering, the runtime, the call path, the thread budget, the XLA executables
_RUNTIME_SOURCES = ("lowering", "runtime", "jit.py", "backends/threads.py",
                    "backends/xla_cache.py")


@functools.cache
def runtime_fingerprint() -> str:
    """A digest of the code that runs a lowered plan (`_RUNTIME_SOURCES`). A whole plan's time
    is as much this code's as its kernels': a generated run function, values computed once
    per binding, the call's checks. Plans measured under other code are therefore not
    figures for this code (`make demo` on a store from before a faster run loop kept taking
    the jax plan it had measured, 0.82 ms, over the NumPy plan that then ran 0.72 ms), and
    the fingerprint is part of the recipe name: such plans stay in the store, unused, and
    EXPLORE measures again. FASTEST takes them only where no plan was measured under this
    code (`measured_plans(stale=True)`): after an upgrade of tgx, the plan that was fastest
    is a better guess than the cost model's (the 18-layer decode's per-equation plan put 24
    equations on jax and its first call took 3.2 s, the measured NumPy plan's 0.75 s).
    Where the sources cannot be read, tgx's version stands in."""
    root = pathlib.Path(__file__).resolve().parent.parent
    h = hashlib.sha256()
    try:
        for rel in _RUNTIME_SOURCES:
            path = root / rel
            for f in sorted(path.glob("*.py")) if path.is_dir() else [path]:
                h.update(f.name.encode())
                h.update(f.read_bytes())
    except OSError:  # (tgx is loaded: its version is read as the environment reads it)
        return f"v{getattr(sys.modules.get('tgx'), '__version__', '?')}"
    return h.hexdigest()[:12]


def recipe_name(options) -> str:
    """The implementation name of plans measured with these lowering options: bound weights
    cost nothing per call and state updated in place costs less than a copy, so plans
    measured one way are not figures for another; nor are plans measured on NumPy arrays for
    a caller passing another library's (`args_on`: a NumPy plan called with jax arrays
    converts them on every call; the small MLP's training step ran 0.98 ms so, 6x the jax
    plan); nor are plans measured under other code of what runs them
    (`runtime_fingerprint`); nor are plans measured on aligned arrays for a caller whose
    arrays are not (`PlanOptions.in_offsets`: XLA copies those on every call; the LSTM step
    of bench_selection.py's jax plan, measured at 838 us on aligned inputs, ran 1190 us on
    the caller's arrays, where the torch plan ran 981 us)."""
    return f"{PLAN_NAME}@{runtime_fingerprint()}" + (
        "+bound-weights" if options.weights else "") + (
        "+state" if options.state else "") + (
        f"+args-on-{options.args_on}" if options.args_on else "") + (
        _UNALIGNED if options.unaligned else "")


def graph_keys(graph, dims: Mapping, key: str | None = None) -> tuple[str, str]:
    """(graph hash, workload key) of the whole graph at `dims`; `key` replaces the graph's
    structural hash (`traced_key`)."""
    inputs = [(list(concrete_shape(v.aval.shape, dims)), v.aval.dtype.name)
              for v in graph.invars]
    ghash = key or structural_hash(graph)
    return ghash, workload_key(ghash, {str(k): int(v) for k, v in dims.items()}, inputs)


def traced_key(graph, options, backends: Sequence[str]) -> str:
    """The key of `graph` as traced, with all that the stages between it and the planned
    graph depend on: simplify, patterns and fuse on or off, the backends, and the pattern
    kernels registered from outside tgx (a user's new kernel must get its chance: the stages
    would match it). tgx's own pattern kernels change only with its version, which is part of
    the environment every trace is recorded in.

    >>> import tgx, tgx.numpy as tnp
    >>> from tgx.planning.options import PlanOptions
    >>> g = tgx.make_graph(lambda x: tnp.exp(x))(tgx.Spec((4,)))
    >>> k = traced_key(g, PlanOptions(), ["numpy"])
    >>> k.startswith("traced:"), k == traced_key(g, PlanOptions(patterns=False), ["numpy"])
    (True, False)
    """
    users = sorted(f"{k.label}:{k.source_hash}" for k in all_kernels()
                   if k.pattern is not None and k.backend in backends
                   and not getattr(k.fn, "__module__", "").startswith("tgx."))
    key = repr((structural_hash(graph), options.simplify, options.patterns, options.fuse,
                sorted(backends), users))
    return "traced:" + hashlib.sha256(key.encode()).hexdigest()


def assignment_digest(assignment: Assignment, options) -> str:
    """The identity of a plan: its graph's structure (not source lines or variable names),
    backends, kernels and the lowering options in its recipe name."""
    ks = [None if k is None else (k.name, k.variant, k.backend, k.source_hash)
          for k in assignment.kernels]
    key = repr((structural_hash(assignment.graph), assignment.backends, ks,
                options.weights, options.state))
    return hashlib.sha256(key.encode()).hexdigest()


def record_recipe(store, graph, assignment: Assignment, dims: Mapping, options,
                  label: str) -> str:
    """Store `assignment` as a GRAPH_RECIPE of `graph` (with the graph and the workload at
    `dims`); returns the implementation key its traces are recorded under (`recipe_key`)."""
    store.add_graph(structural_hash(graph), "graph", graph_to_bytes(graph))
    return store.add_implementation("GRAPH_RECIPE", recipe_name(options),
                                    _recipe_backends(assignment),
                                    assignment_digest(assignment, options), {"label": label},
                                    assignment.to_bytes(label))


def recipe_key(assignment: Assignment, options) -> str:
    """The implementation key `record_recipe` records `assignment` under, without writing."""
    return implementation_key("GRAPH_RECIPE", recipe_name(options),
                              _recipe_backends(assignment),
                              assignment_digest(assignment, options))


def _recipe_backends(assignment: Assignment) -> str:
    return "+".join(sorted({b for e, b in zip(assignment.graph.eqns, assignment.backends)
                            if e.primitive.name != "copy_to"}))


def measured_plans(graph, backends: Sequence[str], store, dims: Mapping,
                   env_id: str | None = None, options=None, *, nearest: bool = True,
                   key: str | None = None, stale: bool = False) -> list[MeasuredPlan]:
    """The plans of `graph` measured (PASSED) on this machine that use only `backends` and
    were lowered with `options`' weights and state, fastest first, at the binding `dims`;
    `key`: look them up under this key (`traced_key`) instead of the graph's hash.

    With `nearest` and nothing measured at `dims`, the plans of the *nearest measured binding*
    (the one whose total input elements are closest in log-space, the rule the cost model
    uses for kernels; see `MeasuredPlan.dims`): which plan is fastest changes slowly with
    the size, and a measured plan at another size beats a prediction at this one. With
    `stale` and nothing measured so, the plans measured as they would run but for the parts
    of the recipe name `_relaxed` leaves out, found the same way: first under other code of
    what runs plans, then also on arrays placed otherwise (`MeasuredPlan.stale`)."""
    options = options or PlanOptions()
    env_id = env_id or store.environment_id()
    ghash, wkey = graph_keys(graph, dims, key)
    name = recipe_name(options)
    for level in range(len(_RELAXED) + 1 if stale else 1):
        found = _measured_near(store, graph, ghash, wkey, env_id, backends, name, dims,
                               nearest, level)
        if found:
            return found
    return []


def measured_with_more_backends(graph, backends: Sequence[str], store, dims: Mapping,
                                options=None) -> list[MeasuredPlan]:
    """The plans of `graph` as traced measured under a larger set of backends than
    `backends` (`traced_key`: EXPLORE over every backend measures each backend alone and
    each set's selection too) that run on `backends` alone, fastest first. What FASTEST
    restricted to fewer backends than were explored takes, where nothing was measured under
    its own key: its selection is priced from one-op figures, and for an 18-layer Gemma
    prefill on NumPy alone that selection ran 319 ms where the plan EXPLORE had measured
    on NumPy ran 189 ms.

    >>> import os, tempfile, tgx, tgx.numpy as tnp
    >>> from tgx.store import BenchmarkStore
    >>> g = tgx.make_graph(lambda x: tnp.exp(x))(tgx.Spec((4,)))
    >>> with BenchmarkStore(os.path.join(tempfile.mkdtemp(), "s.json")) as st:
    ...     measured_with_more_backends(g, ["numpy"], st, {})   # nothing explored yet
    []
    """
    allowed = set(backends)
    extra = [b for b in available_backends() if b not in allowed]
    found: list[MeasuredPlan] = []
    for n in range(1, len(extra) + 1):
        for more in itertools.combinations(extra, n):
            key = traced_key(graph, options or PlanOptions(), sorted(allowed | set(more)))
            found += measured_plans(graph, backends, store, dims, options=options, key=key,
                                    stale=True)
    return sorted(found, key=lambda m: m.median_s)


#: what FASTEST may leave out of a recipe name, in turn, where no plan was measured with
#: all of it (`measured_plans(stale=True)`): the runtime fingerprint (after an upgrade of
#: tgx, the plan that was fastest is a better guess than the cost model's), then where the
#: arguments start (a caller whose arrays happen to be aligned where the explored ones were
#: not: NumPy places arrays anywhere within 64 bytes, so that changes from run to run)
_RELAXED = ("fingerprint", _UNALIGNED)


def _relaxed(name: str, level: int) -> str:
    """`name` without the first `level` parts of `_RELAXED`: `measured-plan@+state` for
    `measured-plan@<fingerprint>+state+unaligned` at level 2."""
    if level >= 1:
        name = name.replace("@" + _fingerprint(name), "@", 1)
    for part in _RELAXED[1:level]:
        name = name.replace(part, "")
    return name


def _fingerprint(name: str) -> str:
    return name.partition("@")[2].partition("+")[0]


def _why_other(rec_name: str, name: str) -> str:
    """How a plan recorded under `rec_name` was measured otherwise than `name` says ("")."""
    why = []
    if _fingerprint(rec_name) != _fingerprint(name):
        why.append("under other tgx code")
    if (_UNALIGNED in rec_name) != (_UNALIGNED in name):
        why.append("on arrays placed otherwise")
    return " and ".join(why)


def _measured_near(store, graph, ghash, wkey, env_id, backends, name, dims,
                   nearest: bool, level: int = 0) -> list[MeasuredPlan]:
    found = _measured_at(store, ghash, wkey, env_id, backends, name, dict(dims), level)
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
            at = _measured_at(store, ghash, wl["key"], env_id, backends, name, wl["axes"],
                              level)
            if at:
                best = (dist, at)
    return best[1] if best else []


def _elements(graph, dims: Mapping) -> int:
    return sum(math.prod(concrete_shape(v.aval.shape, dims)) for v in graph.invars)


def _measured_at(store, ghash, wkey, env_id, backends, name, axes,
                 level: int = 0) -> list[MeasuredPlan]:
    """The plans measured at one workload under the recipe name `name`, or from `level` 1 on
    under the names equal to it but for what `_relaxed` leaves out at that level."""
    best: dict[str, float] = {}
    for t in store.traces(graph_hash=ghash, workload=wkey, env_id=env_id, status="PASSED"):
        if t.get("median_s") is not None:
            best[t["impl"]] = min(best.get(t["impl"], float("inf")), float(t["median_s"]))
    allowed = set(backends)
    want = _relaxed(name, level)
    out = []
    for impl, median in sorted(best.items(), key=lambda kv: kv[1]):
        rec = store.get_implementation(impl)
        if (rec is None or rec["kind"] != "GRAPH_RECIPE"
                or not rec["payload"] or not set(rec["backend"].split("+")) <= allowed):
            continue
        if _relaxed(rec["name"], level) != want:
            continue
        label = (rec.get("requirements") or {}).get("label") or payload_label(rec["payload"]) \
            or rec["backend"]
        out.append(MeasuredPlan(median, label, rec["payload"], impl, dict(axes),
                                rec["backend"], _why_other(rec["name"], name)))
    return out


def best_measured(graph, backends: Sequence[str], store, dims: Mapping,
                  env_id: str | None = None, options=None) -> MeasuredPlan | None:
    """The fastest of `measured_plans`, or None."""
    found = measured_plans(graph, backends, store, dims, env_id, options)
    return found[0] if found else None
