"""Whole-graph single-backend plans as candidates: measured as a whole, chosen by FASTEST when
faster than the sum of per-equation figures."""

from __future__ import annotations

import numpy as np
import pytest

import tgx
import tgx.numpy as tnp
from tgx.planning import recipes
from tgx.planning.cost_model import CostModel
from tgx.store import BenchmarkStore


def f(x):
    return tnp.exp(x) * 2.0 + 1.0


@pytest.fixture
def store(tmp_path):
    return BenchmarkStore(tmp_path / "store.json")


def plant(store, graph, dims, backend, median_s, status="PASSED"):
    ghash, wkey, impl = recipes._keys(graph, dims, backend)
    store.add_trace(graph_hash=ghash, impl=impl, workload=wkey, env_id=CostModel(store).env_id,
                    status=status, median_s=median_s)


def test_fastest_takes_a_whole_graph_plan_measured_faster(store):
    pytest.importorskip("jax")
    g = tgx.make_graph(f)(tgx.Spec(("N",)))
    plant(store, g, {"N": 64}, "jax", 1e-9)          # planted: far below any prediction
    c = tgx.compile(f, policy="fastest", backends=["numpy", "jax"], store=store,
                    dynamic={"x": {0: "N"}})
    plan = c.lower(tgx.Spec(("N",)))
    assert "whole graph on jax" in plan.policy
    assert {b for e, b in zip(plan.graph.eqns, plan.graph.backends)
            if e.primitive.name != "copy_to"} == {"jax"}
    x = np.linspace(-2, 2, 9).astype(np.float32)
    np.testing.assert_allclose(c(x), np.exp(x) * 2 + 1, rtol=1e-6)


def test_slow_or_failed_whole_graph_plans_are_ignored(store):
    g = tgx.make_graph(f)(tgx.Spec(("N",)))
    plant(store, g, {"N": 64}, "numpy", 10.0)               # slower than any prediction
    plant(store, g, {"N": 64}, "torch", 1e-9, "INCORRECT_NUMERICAL")
    c = tgx.compile(f, policy="fastest", backends=["numpy", "torch"], store=store)
    assert "whole graph" not in c.lower(tgx.Spec(("N",))).policy


def test_measure_recipes_records_passed_traces_once(store):
    g = tgx.make_graph(f)(tgx.Spec(("N",)))
    assert recipes.measure_recipes(g, ["numpy", "torch"], store, {"N": 16}, budget_s=0.01) == 2
    assert recipes.measure_recipes(g, ["numpy", "torch"], store, {"N": 16}, budget_s=0.01) == 0
    backend, median = recipes.best_recipe(g, ["numpy", "torch"], store, {"N": 16})
    assert backend in ("numpy", "torch") and median > 0
