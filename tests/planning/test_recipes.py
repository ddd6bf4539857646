"""Whole plans as candidates: EXPLORE measures a shortlist of whole plans into the store
(GRAPH_RECIPE traces whose payload rebuilds the plan); FASTEST takes the fastest measured."""

from __future__ import annotations

import numpy as np
import pytest

import tgx
import tgx.numpy as tnp
from tgx.compiler import plan_graph
from tgx.backends import backend_available
from tgx.planning import recipes
from tgx.planning.cost_model import CostModel
from tgx.serialize import SerializationError
from tgx.store import BenchmarkStore

BACKENDS = [b for b in ("numpy", "torch", "jax") if backend_available(b)]


def f(x):
    return tnp.tanh(tnp.exp(x) * 2.0 + 1.0)


def ref(x):
    return np.tanh(np.exp(x.astype(np.float64)) * 2 + 1)


@pytest.fixture
def store(tmp_path):
    return BenchmarkStore(tmp_path / "store.json")


def plant(store, graph, dims, label, plan, median_s, status="PASSED", weights=()):
    """Record `plan` as measured at `median_s` without timing it."""
    ghash, wkey = recipes._graph_keys(graph, dims)
    inputs = [([dims["N"]], v.aval.dtype.name) for v in graph.invars]
    assert store.add_workload(ghash, dict(dims), inputs) == wkey
    payload = recipes.plan_payload(plan, label)
    bs = sorted({b for e, b in zip(plan.graph.eqns, plan.graph.backends)
                 if e.primitive.name != "copy_to"})
    impl = store.add_implementation("GRAPH_RECIPE", recipes._name(weights), "+".join(bs),
                                    recipes._digest(plan, weights), {"label": label}, payload)
    store.add_trace(graph_hash=ghash, impl=impl, workload=wkey, env_id=CostModel(store).env_id,
                    status=status, median_s=median_s)


def _backends(plan) -> set:
    return {b for e, b in zip(plan.graph.eqns, plan.graph.backends)
            if e.primitive.name != "copy_to"}


def test_payload_round_trip_rebuilds_the_same_plan():
    g = tgx.make_graph(f)(tgx.Spec(("N",)))
    assign = ["numpy", BACKENDS[-1], "numpy", BACKENDS[-1]]
    from tgx.lowering.lower import lower
    from tgx.lowering.rebackend import rebackend
    from tgx.planning.candidates import accepted_kernels

    bg = rebackend(g, assign)
    ks = [accepted_kernels(e, b)[0] for e, b in zip(bg.eqns, bg.backends)]
    plan = tgx.compiler.Plan(g, bg, ks, lower(bg, ks), "test")
    back = recipes.plan_from_payload(recipes.plan_payload(plan), g)
    assert list(back.graph.backends) == list(bg.backends)
    assert [repr(k) for k in back.kernels] == [repr(k) for k in ks]
    x = np.linspace(-2, 1, 11).astype(np.float32)
    np.testing.assert_allclose(back.run(x), ref(x), rtol=1e-6)
    # without the copies back to NumPy when the caller keeps backend arrays
    keep = recipes.plan_from_payload(recipes.plan_payload(plan), g, return_backend_arrays=True)
    assert keep.graph.eqns[-1].primitive.name != "copy_to" or BACKENDS[-1] == "numpy"


def test_fastest_takes_the_fastest_measured_plan(store):
    g = tgx.make_graph(f)(tgx.Spec(("N",)))
    slow = plan_graph(g, policy="heuristic", backends=["numpy"])
    fast = plan_graph(g, policy="heuristic", backends=[BACKENDS[-1]])
    plant(store, g, {"N": 64}, "slow", slow, 1.0)
    plant(store, g, {"N": 64}, "fast", fast, 1e-6)
    plant(store, g, {"N": 64}, "failed", slow, 1e-9, status="INCORRECT_NUMERICAL")
    c = tgx.compile(f, policy="fastest", backends=BACKENDS, store=store,
                    dynamic={"x": {0: "N"}})
    plan = c.lower(tgx.Spec(("N",)))
    assert "measured plan fast" in plan.policy
    assert _backends(plan) == _backends(fast)
    x = np.linspace(-2, 1, 9).astype(np.float32)
    np.testing.assert_allclose(c(x), ref(x), rtol=1e-6)


def test_measured_plans_on_other_backends_are_not_used(store):
    g = tgx.make_graph(f)(tgx.Spec(("N",)))
    if len(BACKENDS) > 1:
        plant(store, g, {"N": 64}, "other", plan_graph(g, policy="heuristic",
                                                       backends=[BACKENDS[1]]), 1e-9)
    plant(store, g, {"N": 8}, "elsewhere", plan_graph(g, policy="heuristic",
                                                      backends=["numpy"]), 1e-9)
    plan = tgx.compile(f, policy="fastest", backends=["numpy"], store=store).lower(
        tgx.Spec(("N",)))
    # only the numpy plan measured at N=8 qualifies, as the nearest measured binding
    assert "measured plan elsewhere" in plan.policy and plan.dims == {"N": 8}
    assert recipes.measured_plans(g, ["numpy"], store, {"N": 64}, nearest=False) == []


def test_plan_with_bound_weights_is_a_different_candidate(store):
    g = tgx.make_graph(f)(tgx.Spec(("N",)))
    plant(store, g, {"N": 64}, "unbound", plan_graph(g, policy="heuristic",
                                                     backends=["numpy"]), 1e-6)
    assert recipes.best_measured(g, ["numpy"], store, {"N": 64}, weights=(0,)) is None
    assert recipes.best_measured(g, ["numpy"], store, {"N": 64}).label == "unbound"


def test_a_plan_whose_kernel_changed_is_skipped(store, monkeypatch):
    g = tgx.make_graph(f)(tgx.Spec(("N",)))
    plan = plan_graph(g, policy="heuristic", backends=["numpy"])
    payload = recipes.plan_payload(plan)
    import msgpack

    d = msgpack.unpackb(payload, raw=False)
    d["kernels"] = [None if k is None else [k[0], k[1], "0" * 64] for k in d["kernels"]]
    bad = msgpack.packb(d, use_bin_type=True)
    with pytest.raises(SerializationError, match="changed"):
        recipes.plan_from_payload(bad, g)
    monkeypatch.setattr(recipes, "plan_payload", lambda p, label="": bad)
    plant(store, g, {"N": 64}, "stale", plan, 1e-9)
    monkeypatch.undo()
    c = tgx.compile(f, policy="fastest", backends=["numpy"], store=store)
    assert "measured plan" not in c.lower(tgx.Spec(("N",))).policy


def test_explore_measures_the_shortlist_once_and_fastest_uses_it(store):
    g = tgx.make_graph(f)(tgx.Spec(("N",)))
    cm = CostModel(store)
    short = recipes.candidate_plans(g, BACKENDS, cm, {"N": 32})
    assert set(BACKENDS) <= set(short) or len(short) >= len(BACKENDS)
    assert recipes.measure_plans(g, short, store, {"N": 32}, budget_s=0.01) == len(short)
    assert recipes.measure_plans(g, short, store, {"N": 32}, budget_s=0.01) == 0
    found = recipes.measured_plans(g, BACKENDS, store, {"N": 32})
    assert len(found) == len(short)
    assert [m.median_s for m in found] == sorted(m.median_s for m in found)
    c = tgx.compile(f, policy="fastest", backends=BACKENDS, store=store,
                    dynamic={"x": {0: "N"}})
    x = np.linspace(-2, 1, 32).astype(np.float32)
    np.testing.assert_allclose(c(x), ref(x), rtol=1e-5)
    assert f"measured plan {found[0].label}" in c.lower(tgx.Spec(("N",))).policy


def test_an_unmeasured_binding_uses_the_nearest_measured_one(store):
    g = tgx.make_graph(f)(tgx.Spec(("N",)))
    fast = plan_graph(g, policy="heuristic", backends=[BACKENDS[-1]])
    plant(store, g, {"N": 64}, "near", fast, 1e-6)
    plant(store, g, {"N": 4096}, "far", plan_graph(g, policy="heuristic",
                                                   backends=["numpy"]), 1e-9)
    found = recipes.measured_plans(g, BACKENDS, store, {"N": 50})
    assert [m.label for m in found] == ["near"] and found[0].dims == {"N": 64}
    assert recipes.measured_plans(g, BACKENDS, store, {"N": 50}, nearest=False) == []
    c = tgx.compile(f, policy="fastest", backends=BACKENDS, store=store,
                    dynamic={"x": {0: "N"}})
    x = np.linspace(-2, 1, 50).astype(np.float32)
    np.testing.assert_allclose(c(x), ref(x), rtol=1e-6)
    plan = c.lower(tgx.Spec(("N",)))
    assert "nearest measured binding" in plan.policy and plan.dims == {"N": 64}
