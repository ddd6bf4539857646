"""Whole plans as candidates: EXPLORE measures a shortlist of whole plans into the store
(GRAPH_RECIPE traces whose payload rebuilds the plan); FASTEST takes the fastest measured."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tgx
import tgx.numpy as tnp
from tgx import explore
from tgx.backends import backend_available
from tgx.lowering.lower import lower_assignment
from tgx.planning import recipes
from tgx.planning.assignment import Assignment
from tgx.planning.cost_model import CostModel
from tgx.planning.heuristic import heuristic_assignment
from tgx.pipeline import transform
from tgx.planning.options import PlanOptions
from tgx.profiling.timing import Timing
from tgx.serialize import SerializationError
from tgx.store import BenchmarkStore, environment

BACKENDS = [b for b in ("numpy", "torch", "jax") if backend_available(b)]


def f(x):
    return tnp.tanh(tnp.exp(x) * 2.0 + 1.0)


def seen(fn):
    """`fn`'s graph as `tgx.compile` plans it (simplified, fused): measured plans are keyed
    by it."""
    return transform(tgx.make_graph(fn)(tgx.Spec(("N",))))


def ref(x):
    return np.tanh(np.exp(x.astype(np.float64)) * 2 + 1)


@pytest.fixture
def store(tmp_path):
    return BenchmarkStore(tmp_path / "store.json")


def plant(store, graph, dims, label, assignment, median_s, status="PASSED",
          options=PlanOptions(), key=None):
    """Record `assignment` as measured at `median_s` without timing it (under `key`, a
    `recipes.traced_key`, when given)."""
    ghash, wkey = recipes.graph_keys(graph, dims, key)
    inputs = [([dims["N"]], v.aval.dtype.name) for v in graph.invars]
    assert store.add_workload(ghash, dict(dims), inputs) == wkey
    impl = recipes.record_recipe(store, graph, assignment, dims, options, label)
    store.add_trace(graph_hash=ghash, impl=impl, workload=wkey, env_id=CostModel(store).env_id,
                    status=status, median_s=median_s)


def _backends(plan) -> set:
    return {b for e, b in zip(plan.graph.eqns, plan.graph.backends)
            if e.primitive.name != "copy_to"}


def test_payload_round_trip_rebuilds_the_same_plan():
    g = tgx.make_graph(f)(tgx.Spec(("N",)))
    backends = ("numpy", BACKENDS[-1], "numpy", BACKENDS[-1])
    from tgx.planning.candidates import accepted_kernels

    a = Assignment(g, backends, [accepted_kernels(e, b)[0] for e, b in zip(g.eqns, backends)])
    back = Assignment.from_bytes(a.to_bytes("test"))
    assert back.backends == a.backends and back.kernels == a.kernels
    plan = lower_assignment(back, PlanOptions())
    assert [repr(k) for k in plan.kernels] == \
        [repr(k) for k in lower_assignment(a, PlanOptions()).kernels]
    x = np.linspace(-2, 1, 11).astype(np.float32)
    np.testing.assert_allclose(plan.run(x), ref(x), rtol=1e-6)
    # without the copies back to NumPy when the caller keeps backend arrays
    keep = lower_assignment(back, PlanOptions(return_backend_arrays=True))
    assert keep.graph.eqns[-1].primitive.name != "copy_to" or BACKENDS[-1] == "numpy"


def test_fastest_takes_the_fastest_measured_plan(store):
    g = seen(f)
    slow = heuristic_assignment(g, ["numpy"])
    fast = heuristic_assignment(g, [BACKENDS[-1]])
    plant(store, g, {"N": 64}, "slow", slow, 1.0)
    plant(store, g, {"N": 64}, "fast", fast, 1e-6)
    plant(store, g, {"N": 64}, "failed", slow, 1e-9, status="INCORRECT_NUMERICAL")
    c = tgx.compile(f, policy="fastest", backends=BACKENDS, store=store,
                    dynamic={"x": {0: "N"}})
    plan = c.lower(tgx.Spec(("N",)))
    assert "measured plan fast" in plan.policy
    assert _backends(plan) == set(fast.backends)
    x = np.linspace(-2, 1, 9).astype(np.float32)
    np.testing.assert_allclose(c(x), ref(x), rtol=1e-6)


def test_measured_plans_on_other_backends_are_not_used(store):
    g = seen(f)
    if len(BACKENDS) > 1:
        plant(store, g, {"N": 64}, "other", heuristic_assignment(g, [BACKENDS[1]]), 1e-9)
    plant(store, g, {"N": 8}, "elsewhere", heuristic_assignment(g, ["numpy"]), 1e-9)
    plan = tgx.compile(f, policy="fastest", backends=["numpy"], store=store).lower(
        tgx.Spec(("N",)))
    # only the numpy plan measured at N=8 qualifies, as the nearest measured binding
    assert "measured plan elsewhere" in plan.policy and plan.dims == {"N": 8}
    assert recipes.measured_plans(g, ["numpy"], store, {"N": 64}, nearest=False) == []


def test_plan_with_bound_weights_is_a_different_candidate(store):
    g = seen(f)
    plant(store, g, {"N": 64}, "unbound", heuristic_assignment(g, ["numpy"]), 1e-6)
    bound = PlanOptions(weights=(0,))
    assert recipes.best_measured(g, ["numpy"], store, {"N": 64}, options=bound) is None
    assert recipes.best_measured(g, ["numpy"], store, {"N": 64}).label == "unbound"
    # state updated in place is timed apart too
    stateful = PlanOptions(state=((0, 0),))
    assert recipes.best_measured(g, ["numpy"], store, {"N": 64}, options=stateful) is None


def test_a_plan_whose_kernel_changed_is_skipped(store, monkeypatch):
    g = seen(f)
    a = heuristic_assignment(g, ["numpy"])
    import msgpack

    d = msgpack.unpackb(a.to_bytes(), raw=False)
    d["kernels"] = [None if k is None else [k[0], k[1], "0" * 64] for k in d["kernels"]]
    bad = msgpack.packb(d, use_bin_type=True)
    with pytest.raises(SerializationError, match="changed"):
        Assignment.from_bytes(bad)
    monkeypatch.setattr(Assignment, "to_bytes", lambda self, label="": bad)
    plant(store, g, {"N": 64}, "stale", a, 1e-9)
    monkeypatch.undo()
    c = tgx.compile(f, policy="fastest", backends=["numpy"], store=store)
    assert "measured plan" not in c.lower(tgx.Spec(("N",))).policy


def test_a_plan_measured_under_other_runtime_code_is_a_last_resort(store, monkeypatch):
    """A whole plan's time is as much the run loop's as its kernels': one measured before
    the code that runs plans changed is no figure for this code (EXPLORE measures again),
    but FASTEST takes it while nothing was measured under this code, over the cost model."""
    g = seen(f)
    with monkeypatch.context() as m:
        m.setattr(recipes, "runtime_fingerprint", lambda: "000000000000")
        plant(store, g, {"N": 64}, "old runtime", heuristic_assignment(g, ["numpy"]), 1e-9)
        plant(store, g, {"N": 64}, "old+state", heuristic_assignment(g, ["numpy"]), 1e-10,
              options=PlanOptions(state=((0, 0),)))
        assert recipes.best_measured(g, ["numpy"], store, {"N": 64}).label == "old runtime"
    assert recipes.best_measured(g, ["numpy"], store, {"N": 64}) is None   # EXPLORE's view
    old = recipes.measured_plans(g, ["numpy"], store, {"N": 64}, stale=True)
    assert [(p.label, p.stale) for p in old] == [("old runtime", "under other tgx code")]
    c = tgx.compile(f, policy="fastest", backends=["numpy"], store=store)
    assert "under other tgx code" in c.lower(tgx.Spec(("N",))).policy
    x = np.linspace(-1, 1, 64, dtype=np.float32)
    np.testing.assert_allclose(c(x), ref(x), rtol=1e-6)
    # one plan measured under this code, slower than the old one: it is the figure now
    jx = heuristic_assignment(g, BACKENDS)
    plant(store, g, {"N": 64}, "this runtime", jx, 1.0)
    assert recipes.measured_plans(g, BACKENDS, store, {"N": 64}, stale=True)[0].label \
        == "this runtime"
    c = tgx.compile(f, policy="fastest", backends=BACKENDS, store=store)
    assert "measured plan this runtime" in c.lower(tgx.Spec(("N",))).policy
    assert len(store.traces()) == 3   # kept


def test_the_runtime_fingerprint_follows_the_sources(tmp_path, monkeypatch):
    root = tmp_path / "tgx"
    (root / "planning").mkdir(parents=True)
    for rel in recipes._RUNTIME_SOURCES:
        path = root / rel
        if rel.endswith(".py"):
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("# " + rel)
        else:
            path.mkdir(parents=True, exist_ok=True)
            (path / "a.py").write_text("x = 1")
    monkeypatch.setattr(recipes, "__file__", str(root / "planning" / "recipes.py"))
    recipes.runtime_fingerprint.cache_clear()
    try:
        first = recipes.runtime_fingerprint()
        recipes.runtime_fingerprint.cache_clear()
        (root / "runtime" / "a.py").write_text("x = 2")
        assert recipes.runtime_fingerprint() != first
    finally:
        monkeypatch.undo()
        recipes.runtime_fingerprint.cache_clear()


def test_explore_measures_the_shortlist_once_and_fastest_uses_it(store):
    g = seen(f)
    cm = CostModel(store)
    short = explore.candidate_assignments(g, BACKENDS, cm, {"N": 32})
    assert set(BACKENDS) <= set(short) or len(short) >= len(BACKENDS)
    opts = PlanOptions()
    assert explore.measure_assignments(g, short, store, {"N": 32}, opts,
                                       budget_s=0.01) == len(short)
    assert explore.measure_assignments(g, short, store, {"N": 32}, opts, budget_s=0.01) == 0
    found = recipes.measured_plans(g, BACKENDS, store, {"N": 32})
    assert len(found) == len(short)
    assert [m.median_s for m in found] == sorted(m.median_s for m in found)
    c = tgx.compile(f, policy="fastest", backends=BACKENDS, store=store,
                    dynamic={"x": {0: "N"}})
    x = np.linspace(-2, 1, 32).astype(np.float32)
    np.testing.assert_allclose(c(x), ref(x), rtol=1e-5)
    assert f"measured plan {found[0].label}" in c.lower(tgx.Spec(("N",))).policy


@pytest.mark.parametrize("close, near_passes", [(0, 2), (3, 5)])
def test_plans_measured_close_to_the_fastest_get_more_passes(store, monkeypatch, close,
                                                             near_passes):
    """After `rounds` passes, plans within `CLOSE` of the fastest get `close` passes more
    (the whole graph's confirmation: two passes had chosen an 18-layer prefill's plan that
    ran 1.07x another), one `FAR` slower is dropped after its first, and each figure is the
    median of its passes. Planted timings: the race, not the machine, decides."""
    g = seen(f)
    plans = explore.candidate_assignments(g, BACKENDS, CostModel(store), {"N": 32})
    labels = list(plans)[:3]
    if len(labels) < 3:
        pytest.skip("three distinct plans need two backends")
    planted = dict(zip(labels, [1.00e-3, 1.05e-3, 2.0e-3]))
    runs, passes = {}, {}
    as_called = explore._as_called

    def spy_as_called(plan, args, options):
        fn = as_called(plan, args, options)
        runs[fn] = labels[len(runs)]
        return fn

    def planted_measure(fn, args, **kw):
        label = runs[fn]
        passes[label] = passes.get(label, 0) + 1
        # the second plan's passes alternate above and below the first's
        t = planted[label] * (0.97 if passes[label] % 2 and label == labels[1] else 1.0)
        return Timing(t, t, 0.0, 1, t)

    monkeypatch.setattr(explore, "_as_called", spy_as_called)
    monkeypatch.setattr(explore, "measure", planted_measure)
    chosen = {label: plans[label] for label in labels}
    assert explore.measure_assignments(g, chosen, store, {"N": 32}, PlanOptions(), rounds=2,
                                       close=close) == 3
    assert passes == {labels[0]: near_passes, labels[1]: near_passes, labels[2]: 1}
    found = {m.label: m.median_s for m in recipes.measured_plans(g, BACKENDS, store,
                                                                  {"N": 32})}
    assert found[labels[0]] == pytest.approx(1.00e-3)
    assert found[labels[2]] == pytest.approx(2.0e-3)


def test_plans_are_measured_on_the_callers_kind_of_arrays(store, tmp_path):
    """A NumPy plan called with jax arrays converts them on every call (the small MLP's
    training step: 0.98 ms so, 0.15 ms on the jax plan): whole plans are measured, and
    found, for the kind of arrays the caller passes."""
    jnp = pytest.importorskip("jax.numpy")
    c = tgx.compile(f, policy="explore", backends=BACKENDS, store=store)
    x = np.linspace(-2, 1, 32).astype(np.float32)
    np.testing.assert_allclose(c(x), ref(x), rtol=1e-5)
    assert "measured plan" in c.lower(x).policy
    xj = jnp.asarray(x)
    on_jax = tgx.compile(f, backends=BACKENDS, store=store).lower(xj)
    assert on_jax.options.args_on == "jax" and "measured plan" not in on_jax.policy
    assert recipes.recipe_name(on_jax.options).endswith("+args-on-jax")
    # explored with jax arrays: measured so, and found for jax arrays
    c = tgx.compile(f, policy="explore", backends=BACKENDS, store=store)
    out = c(xj)
    assert type(out) is type(xj)
    np.testing.assert_allclose(np.asarray(out), ref(x), rtol=1e-5)
    again = tgx.compile(f, backends=BACKENDS, store=store)
    assert "measured plan" in again.lower(xj).policy
    assert "measured plan" in again.lower(x).policy


def test_a_plan_is_timed_returning_the_callers_kind_of_arrays():
    """Explore times a NumPy plan called with jax arrays as `tgx.compile` runs it: its
    results, the new state among them, come back as jax arrays (a `device_put` each). Timed
    with NumPy results fed back as the next call's state, the small MLP's NumPy training
    step measured 125 us on jax arrays and ran 965 (its jax plan: 150)."""
    jax = pytest.importorskip("jax")

    def step(s, x):
        return tnp.sum(s * x), s + x

    s0, x = np.ones(8, np.float32), np.linspace(0, 1, 8).astype(np.float32)
    c = tgx.compile(step, state="s", backends=["numpy"])
    plan = c.lower(jax.numpy.asarray(s0), jax.numpy.asarray(x))
    assert plan.options.args_on == "jax"
    call = explore._as_called(plan, [s0, x], plan.options)
    for k in range(1, 4):
        loss, new = call()
        assert isinstance(loss, jax.Array) and isinstance(new, jax.Array)
        np.testing.assert_allclose(np.asarray(new), s0 + k * x, rtol=1e-6)


def test_the_callers_library_is_known_before_tgx_loads_its_backend():
    # a fresh process: torch's tensors come before tgx has loaded its torch backend
    import subprocess
    import sys

    pytest.importorskip("torch")
    code = ("import tgx, torch\n"
            "f = tgx.compile(lambda x: x * 2.0, store=False)\n"
            "print(f.lower(torch.ones(4)).options.args_on)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out == "torch"


def test_a_state_explored_on_jax_arrays_is_timed_donated(store):
    jnp = pytest.importorskip("jax.numpy")

    def step(w, x):
        return (w * x).sum(), w - 0.1 * x
    c = tgx.compile(step, policy="explore", backends=BACKENDS, store=store, state="w")
    w = jnp.ones(16, jnp.float32)
    x = jnp.asarray(np.linspace(0, 1, 16).astype(np.float32))
    loss, w2 = c(w, x)
    np.testing.assert_allclose(float(loss), float(np.linspace(0, 1, 16).sum()), rtol=1e-5)
    np.testing.assert_allclose(np.asarray(w2), 1 - 0.1 * np.linspace(0, 1, 16), rtol=1e-6)
    fresh = jnp.ones(16, jnp.float32)
    assert "measured plan" in tgx.compile(step, backends=BACKENDS, store=store,
                                          state="w").lower(fresh, x).policy


def test_explore_runs_the_plan_it_chose_as_it_lowered_it(store, monkeypatch):
    """The plan EXPLORE chooses was lowered, checked and timed whole: the compile runs that
    one (lowering a jax plan again compiled it again with XLA, 1.3-2.3 s of an 18-layer
    prefill's explore), and it runs right, state included, call after call."""
    import tgx.pipeline as pipeline

    def no_second_lowering(*a, **kw):
        raise AssertionError("the chosen plan was lowered again")
    monkeypatch.setattr(pipeline, "lower_assignment", no_second_lowering)

    def step(w, x):
        return (w * x).sum(), w - 0.1 * x
    w = np.ones(64, np.float32)
    x = np.linspace(0, 1, 64).astype(np.float32)
    c = tgx.compile(step, policy="explore", backends=BACKENDS, store=store, state="w")
    for k in range(1, 4):
        before = w.copy()
        loss, _ = c(w, x)
        np.testing.assert_allclose(float(loss), float((before * x).sum()), rtol=1e-5)
        np.testing.assert_allclose(w, 1 - 0.1 * k * x, rtol=1e-5)
    plan = c.lower(w, x)
    assert "measured plan" in plan.policy and plan.stages["select"] is plan.assignment
    assert [n for n, _ in plan.stages][-4:] == ["rebackend", "schedule", "lower", "buffers"]


@settings(max_examples=20, deadline=None)
@given(offsets=st.lists(st.sampled_from([0, 16, 32, 48]), min_size=1, max_size=4))
def test_explore_draws_its_inputs_where_the_callers_start(offsets):
    from tgx.devices import offset_of

    g = tgx.make_graph(lambda *xs: sum(xs))(*[tgx.Spec((8, 8))] * len(offsets))
    args = explore.random_plan_inputs(g, {}, tuple(offsets))
    assert [offset_of(a) for a in args] == offsets
    assert [offset_of(a) for a in explore.random_plan_inputs(g, {})] == [0] * len(offsets)


def test_explore_times_plans_on_the_callers_arrays_and_leaves_its_state_alone(store,
                                                                           monkeypatch):
    """Whole plans are timed on the first call's own arguments (no random weights to draw:
    1.8 s of an 18-layer prefill's explore), the state on a copy: the caller's state is
    updated once, by the call, however many times explore ran the plans."""
    seen_inputs = []
    measure = explore.measure_assignments

    def spy(*a, inputs=None, **kw):
        seen_inputs.append(inputs)
        return measure(*a, inputs=inputs, **kw)
    monkeypatch.setattr(explore, "measure_assignments", spy)

    def step(w, x):
        return (w * x).sum(), w - 0.1 * x
    w = np.ones(4096, np.float32)
    x = np.linspace(0, 1, 4096).astype(np.float32)
    c = tgx.compile(step, policy="explore", backends=["numpy"], store=store, state="w")
    loss, _ = c(w, x)
    assert seen_inputs and all(args[1] is x and args[0] is not w for args in seen_inputs)
    np.testing.assert_allclose(float(loss), float(x.sum()), rtol=1e-5)
    np.testing.assert_allclose(w, 1 - 0.1 * x, rtol=1e-6)   # one update, the call's own
    g = tgx.make_graph(step)(tgx.Spec((4096,)), tgx.Spec((4096,)))
    wrong = [np.ones(8, np.float32), x]                      # not the graph's inputs: random
    assert explore.plan_inputs(g, {}, PlanOptions(), wrong)[0].shape == (4096,)


def _placed(x, offset):
    from tgx.devices import aligned_copy, offset_of

    y = aligned_copy(x, offset)
    assert offset_of(y) == offset
    return y


def test_plans_are_measured_on_arrays_placed_as_the_callers(store):
    """XLA copies an unaligned host argument on every call: plans explored for a caller whose
    large arguments are unaligned are measured on inputs placed so, and recorded apart
    ("+unaligned"); a caller whose arrays are aligned uses them while nothing was measured
    for it, and says so."""
    big = np.linspace(-1, 1, 8192, dtype=np.float32)          # 32 KiB: counts
    small = np.linspace(-1, 1, 64, dtype=np.float32)          # does not
    c = tgx.compile(f, policy="explore", backends=["numpy"], store=store)
    plan = c.lower(_placed(big, 16))
    assert plan.options.in_offsets == (16,) and plan.options.unaligned
    assert tgx.compile(f, backends=["numpy"]).lower(_placed(small, 16)).options.in_offsets \
        is None
    names = {r["name"] for r in store.implementations() if r["kind"] == "GRAPH_RECIPE"}
    assert names and all(n.endswith("+unaligned") for n in names)
    aligned = tgx.compile(f, backends=["numpy"], store=store)
    x = _placed(big, 0)
    assert "measured plan" in aligned.lower(x).policy
    assert "on arrays placed otherwise" in aligned.lower(x).policy
    np.testing.assert_allclose(aligned(x), ref(x), rtol=1e-6)
    again = tgx.compile(f, backends=["numpy"], store=store)
    assert "placed otherwise" not in again.lower(_placed(big, 48)).policy   # as explored


def test_an_unmeasured_binding_uses_the_nearest_measured_one(store):
    g = seen(f)
    fast = heuristic_assignment(g, [BACKENDS[-1]])
    plant(store, g, {"N": 64}, "near", fast, 1e-6)
    plant(store, g, {"N": 4096}, "far", heuristic_assignment(g, ["numpy"]), 1e-9)
    found = recipes.measured_plans(g, BACKENDS, store, {"N": 50})
    assert [m.label for m in found] == ["near"] and found[0].dims == {"N": 64}
    assert recipes.measured_plans(g, BACKENDS, store, {"N": 50}, nearest=False) == []
    c = tgx.compile(f, policy="fastest", backends=BACKENDS, store=store,
                    dynamic={"x": {0: "N"}})
    x = np.linspace(-2, 1, 50).astype(np.float32)
    np.testing.assert_allclose(c(x), ref(x), rtol=1e-6)
    plan = c.lower(tgx.Spec(("N",)))
    assert "nearest measured binding" in plan.policy and plan.dims == {"N": 64}


@pytest.mark.skipif(len(BACKENDS) < 2, reason="needs a second backend")
@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(times=st.lists(st.floats(1e-6, 1.0), min_size=4, max_size=4),
       stateful=st.booleans())
def test_fastest_is_never_slower_than_any_measured_or_single_backend_plan(tmp_path_factory,
                                                                         times, stateful):
    """With planted whole-plan timings: FASTEST over every backend returns the plan with the
    least measured time (regret 0 against the measured ones), so never slower than the plan
    FASTEST returns with any single backend allowed; the same holds with state buffers."""
    store = BenchmarkStore(tmp_path_factory.mktemp("s") / "store.json")

    def step(x, s):
        return tnp.tanh(tnp.exp(x) * 2.0 + 1.0) + s.sum(), s * 0.5

    opts = PlanOptions(state=((1, 1),)) if stateful else PlanOptions()
    g = transform(tgx.make_graph(step)(tgx.Spec(("N",)), tgx.Spec((4,))))
    from tgx.planning.selection import realize, select

    plans = {b: heuristic_assignment(g, [b]) for b in BACKENDS}
    plans["mix"] = realize(select(g, BACKENDS, CostModel(store), {"N": 64}), "explore")
    measured = {}
    for (label, a), t in zip(plans.items(), times):
        ghash, wkey = recipes.graph_keys(g, {"N": 64})
        store.add_workload(ghash, {"N": 64}, [([64], "float32"), ([4], "float32")])
        impl = recipes.record_recipe(store, g, a, {"N": 64}, opts, label)
        store.add_trace(graph_hash=ghash, impl=impl, workload=wkey,
                        env_id=CostModel(store).env_id, status="PASSED", median_s=t)
        measured[impl] = min(t, measured.get(impl, t))  # "mix" may equal a single plan

    def chosen(backends):
        m = recipes.best_measured(g, backends, store, {"N": 64}, options=opts)
        return m.median_s

    best = chosen(BACKENDS)
    assert best == min(measured.values())
    for b in BACKENDS:
        assert best <= chosen([b])
    kw = dict(state="s") if stateful else {}
    c = tgx.compile(step, policy="fastest", backends=BACKENDS, store=store,
                    dynamic={"x": {0: "N"}}, **kw)
    plan = c.lower(tgx.Spec(("N",)), tgx.Spec((4,)))
    assert f"{best * 1e6:.0f} us" in plan.policy
    x, s = np.linspace(-2, 1, 64).astype(np.float32), np.ones(4, np.float32)
    y, s2 = c(x, s)
    np.testing.assert_allclose(y, ref(x) + 4.0, rtol=1e-5)
    np.testing.assert_allclose(s2, 0.5)


# -- found from the graph as traced: a later compile skips the stages ------------------------

def test_a_later_compile_finds_the_measured_plan_from_the_traced_graph(store):
    dyn = {"x": {0: "N"}}
    x = np.linspace(-2, 1, 32).astype(np.float32)
    tgx.compile(f, policy="explore", backends=BACKENDS, store=store, dynamic=dyn)(x)
    best = recipes.measured_plans(seen(f), BACKENDS, store, {"N": 32})[0]
    c = tgx.compile(f, policy="fastest", backends=BACKENDS, store=store, dynamic=dyn)
    np.testing.assert_allclose(c(x), ref(x), rtol=1e-5)
    plan = c.lower(tgx.Spec(("N",)))
    assert f"measured plan {best.label}" in plan.policy
    assert "found from the traced graph" in plan.policy
    assert [n for n, _ in plan.stages][:2] == ["traced", "select"]  # simplify..fuse skipped
    # what changes the stages' result changes the key: planned through the stages again
    for kw in (dict(patterns=False), dict(tolerance=1e-3)):
        c = tgx.compile(f, **{"policy": "fastest", "backends": BACKENDS, "store": store,
                              "dynamic": dyn, **kw})
        np.testing.assert_allclose(c(x), ref(x), rtol=1e-5)
        assert "found from the traced graph" not in c.lower(tgx.Spec(("N",))).policy
    # fewer backends than explored: the fastest plan measured on those alone, not the stages
    # and a selection priced from one-op figures (recipes.measured_with_more_backends)
    traced = tgx.make_graph(f)(tgx.Spec(("N",)))
    alone = recipes.measured_with_more_backends(traced, BACKENDS[:1], store, {"N": 32})
    assert alone and all(m.backend == BACKENDS[0] for m in alone)
    c = tgx.compile(f, policy="fastest", backends=BACKENDS[:1], store=store, dynamic=dyn)
    np.testing.assert_allclose(c(x), ref(x), rtol=1e-5)
    plan = c.lower(tgx.Spec(("N",)))
    assert f"measured plan {alone[0].label}" in plan.policy
    assert set(plan.graph.backends) == {BACKENDS[0]}


def test_a_pattern_kernel_registered_later_changes_the_traced_key():
    g = tgx.make_graph(f)(tgx.Spec(("N",)))
    before = recipes.traced_key(g, PlanOptions(), ["numpy"])
    tgx.register_kernel(lambda x: tnp.tanh(x * 2.0 + 1.0), lambda x: np.tanh(x * 2 + 1),
                        specs=(tgx.Spec(("N",)),), name="test_traced_key_tanh")
    try:
        assert recipes.traced_key(g, PlanOptions(), ["numpy"]) != before
        assert recipes.traced_key(g, PlanOptions(), ["torch"]) == \
            recipes.traced_key(g, PlanOptions(), ["torch"])
    finally:
        tgx.unregister_kernel("test_traced_key_tanh")


@pytest.mark.skipif("torch" not in BACKENDS, reason="needs torch")
@pytest.mark.skipif(environment._may_have_gpu(),
                    reason="a GPU driver is present: the environment is read through torch")
def test_a_measured_numpy_plan_is_lowered_without_importing_torch(tmp_path):
    """Matching pattern kernels imports every backend; a measured plan found from the traced
    graph needs only its own (a fresh process: torch stays unimported)."""
    import subprocess
    import sys

    store = BenchmarkStore(tmp_path / "store.json")
    backends = ["numpy", "torch"]
    opts = PlanOptions(policy="fastest", backends=tuple(backends))
    traced = tgx.make_graph(f)(tgx.Spec(("N",)))
    g = seen(f)
    key = recipes.traced_key(traced, opts, backends)
    for label, b, t in (("numpy", "numpy", 1e-6), ("torch", "torch", 1.0)):
        plant(store, g, {"N": 32}, label, heuristic_assignment(g, [b]), t, key=key)
    code = f"""
import sys, numpy as np, tgx, tgx.numpy as tnp
def f(x):
    return tnp.tanh(tnp.exp(x) * 2.0 + 1.0)
c = tgx.compile(f, policy="fastest", backends={backends!r}, store={str(store.path)!r},
                dynamic={{"x": {{0: "N"}}}})
y = c(np.linspace(-2, 1, 32).astype(np.float32))
print(c.lower(tgx.Spec(("N",))).policy)
print("torch" in sys.modules, float(y[0]))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.splitlines()
    assert "measured plan numpy" in out[0] and "found from the traced graph" in out[0]
    imported, y0 = out[1].split()
    assert imported == "False"
    assert float(y0) == pytest.approx(float(ref(np.float32([-2.0]))[0]), rel=1e-5)


# -- a stack of identical layers: raced shortened, confirmed whole ------------------------------

def test_explore_races_a_stack_of_layers_shortened_and_confirms_on_the_whole(store,
                                                                          monkeypatch):
    """The candidates are raced on the graph with two layers (`tgx.graph.repeats`), and
    only the few it ranks first are timed on the whole graph, with the weights and state
    buffers of the kept layers bound as `tgx.compile` binds them."""
    n, d = 5, 8

    def net(ws, x, ss):
        new = []
        for w, s in zip(ws, ss):
            x = x + tnp.tanh(x @ w) * 0.5
            new.append(s * 0.5 + x.sum())
        return tnp.exp(x).sum(axis=-1), new

    raced = []
    measure = explore.measure_assignments

    def spy(graph, assignments, *args, **kw):
        raced.append((len(graph.eqns), len(graph.invars), set(assignments)))
        return measure(graph, assignments, *args, **kw)

    monkeypatch.setattr(explore, "measure_assignments", spy)
    rng = np.random.default_rng(0)
    ws = [rng.standard_normal((d, d)).astype(np.float32) * 0.3 for _ in range(n)]
    x = rng.standard_normal((4, d)).astype(np.float32)

    def fresh():
        return [np.ones(2, np.float32) for _ in range(n)]

    def want(ss):
        h = x.astype(np.float64)
        out = []
        for w, s in zip(ws, ss):
            h = h + np.tanh(h @ w) * 0.5
            out.append(s * 0.5 + h.sum())
        return np.exp(h).sum(axis=-1), out

    c = tgx.compile(net, policy="explore", backends=BACKENDS, store=store, weights="ws",
                    state="ss")
    ss = fresh()
    y, _ = c(ws, x, ss)
    y_ref, s_ref = want(fresh())
    np.testing.assert_allclose(y, y_ref, rtol=1e-5)
    for s, r in zip(ss, s_ref):
        np.testing.assert_allclose(s, r, rtol=1e-5)
    (short_eqns, short_ins, short_labels), (whole_eqns, whole_ins, whole_labels) = raced
    # (fusion merges the last layer into the epilogue: two blocks and it are kept)
    assert short_eqns < whole_eqns and short_ins < whole_ins == 1 + 2 * n
    assert 1 <= len(whole_labels) <= explore.CONFIRM_PLANS
    assert whole_labels <= short_labels
    # FASTEST runs the whole graph's plan that was measured
    f2 = tgx.compile(net, policy="fastest", backends=BACKENDS, store=store, weights="ws",
                     state="ss")
    ss = fresh()
    np.testing.assert_allclose(f2(ws, x, ss)[0], y_ref, rtol=1e-5)
    assert "measured plan" in f2.lower(ws, x, fresh()).policy


def test_the_whole_graph_confirms_runners_up_on_the_same_backends():
    """The shortened race ranks variants on one set of backends loosely too (the 18-layer
    prefill's NumPy plans: 63.4 against 56.2 ms with two layers, 226 against 256 with all),
    so those within CONFIRM are timed whole after the best of each set of backends."""
    def m(label, backend, t):
        return recipes.MeasuredPlan(t, label, b"", label, {}, backend)
    ranked = [m("np-heuristic", "numpy", 56.2), m("np-selected", "numpy", 63.4),
              m("torch", "torch", 80.0)]
    assert explore.to_confirm(ranked) == ["np-heuristic", "np-selected"]
    ranked = [m("jax", "jax", 1.0), m("jax-2", "jax", 1.02), m("np", "numpy", 1.05),
              m("torch", "torch", 1.1), m("np-2", "numpy", 1.12)]
    assert explore.to_confirm(ranked) == ["jax", "np", "torch"][:explore.CONFIRM_PLANS]
    # the runner-up is timed whole however far behind: the short race ranks loosely
    ranked = [m("np-loops", "numpy", 5.5), m("np-heuristic", "numpy", 6.8)]
    assert explore.to_confirm(ranked) == ["np-loops", "np-heuristic"]
    assert explore.to_confirm(ranked[:1]) == ["np-loops"]


def test_a_failing_shortened_race_falls_back_to_timing_every_plan_whole(store, monkeypatch):
    def net(ws, x):
        for w in ws:
            x = x + tnp.tanh(x @ w)
        return x.sum(axis=-1)

    def broken(*args, **kw):
        raise RuntimeError("boom")

    monkeypatch.setattr(explore, "shorten", broken)
    rng = np.random.default_rng(0)
    ws = [rng.standard_normal((8, 8)).astype(np.float32) * 0.3 for _ in range(4)]
    x = rng.standard_normal((4, 8)).astype(np.float32)
    with pytest.warns(UserWarning, match="every plan is timed whole.*boom|boom.*every plan"):
        c = tgx.compile(net, policy="explore", backends=BACKENDS, store=store, weights="ws")
        y = c(ws, x)
    h = x.astype(np.float64)
    for w in ws:
        h = h + np.tanh(h @ w)
    np.testing.assert_allclose(y, h.sum(axis=-1), rtol=1e-5)
    assert "measured plan" in c.lower(ws, x).policy
