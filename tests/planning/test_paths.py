"""tgx.paths: counting, enumeration, filters, ranking, pruning, pattern kernels, running plans."""

from __future__ import annotations

import hashlib
import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tgx
import tgx.nn as tnn
import tgx.numpy as tnp
from tgx.planning.cost_model import Estimate
from tgx.explore import Paths
from tgx.planning.assignment import Assignment
from tgx.primitives.transfer import copy_to
from tgx.serialize import SerializationError

S = tgx.Spec
NT = ["numpy", "torch"]


class PlantedCosts:
    """A fake cost model: a fixed pseudo-random time per (primitive, kernel) and transfer."""

    def __init__(self, seed=0):
        self.seed = seed

    def _t(self, *key) -> float:
        h = hashlib.sha256(repr((self.seed, key)).encode()).digest()
        return (1 + int.from_bytes(h[:4], "little") % 1000) * 1e-6

    def kernel(self, eqn, kernel, dims):
        return Estimate(self._t(eqn.primitive.name, repr(kernel),
                                tuple(str(v.aval) for v in eqn.outvars)), "cost model")

    def transfer(self, aval, src, dst, dims):
        return Estimate(self._t(str(aval), src, dst), "measured")


# -- random small graphs of elementwise / softmax / matmul ops -----------------------------
OPS = ["exp", "neg", "add", "mul", "softmax", "matmul"]


def build(ops):
    def f(x, y):
        vals = [x]
        for op, i in ops:
            a = vals[-1]
            b = vals[i % len(vals)]
            if op == "exp":
                vals.append(tnp.exp(a))
            elif op == "neg":
                vals.append(-a)
            elif op == "add":
                vals.append(a + b)
            elif op == "mul":
                vals.append(a * y)
            elif op == "softmax":
                vals.append(tnn.softmax(a, axis=-1))
            else:
                vals.append(a @ y)
        return vals[-1]
    return tgx.make_graph(f)(S((4, 4)), S((4, 4)))


programs = st.lists(st.tuples(st.sampled_from(OPS), st.integers(0, 5)), min_size=1, max_size=3)


@settings(max_examples=20, deadline=None)
@given(programs, st.booleans())
def test_count_equals_enumeration(ops, two_backends):
    g = build(ops)
    ps = Paths(g, backends=NT if two_backends else ["numpy"], decompose=not two_backends,
               cost_model=PlantedCosts())
    assert ps.count() == sum(1 for _ in ps)


@settings(max_examples=10, deadline=None)
@given(programs, st.integers(0, 3))
def test_ranked_is_ordered_and_optimal(ops, seed):
    g = build(ops)
    ps = Paths(g, backends=NT, decompose=False, cost_model=PlantedCosts(seed))
    costs = [p.cost for p in itertools.islice(ps.ranked(distinct=False), 20)]
    assert costs == sorted(costs)
    brute = sorted(p.cost for p in ps)
    assert costs[0] == pytest.approx(brute[0])
    assert costs == pytest.approx(brute[:20])  # the k best, exactly


def test_ranked_stops_after_max_expansions():
    g = tgx.make_graph(lambda x: tnp.exp(tnn.softmax(x, axis=-1)))(S((4, 8)))
    ps = Paths(g, backends=["numpy"], cost_model=PlantedCosts(7))
    assert list(ps.ranked(max_expansions=1)) == []
    full = [p.cost for p in ps.ranked(distinct=False)]
    # a limit that is not reached changes nothing
    assert [p.cost for p in ps.ranked(distinct=False, max_expansions=10**6)] == full


def test_ranked_with_decompositions_matches_brute_force():
    g = tgx.make_graph(lambda x: tnp.exp(tnn.softmax(x, axis=-1)))(S((4, 8)))
    ps = Paths(g, backends=["numpy"], cost_model=PlantedCosts(7))
    all_costs = sorted(p.cost for p in ps)
    got = [p.cost for p in ps.ranked(distinct=False)]
    assert got == pytest.approx(all_costs)
    assert len(got) == ps.count()


def test_every_plan_runs_and_matches_reference():
    g = tgx.make_graph(lambda x, y: tnn.softmax(tnp.exp(x) @ y, axis=-1))(S((3, 4)), S((4, 5)))
    ps = Paths(g, backends=NT, decompose=False, cost_model=PlantedCosts())
    x = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
    y = np.random.default_rng(1).standard_normal((4, 5)).astype(np.float32)
    ref = tgx.transforms.evaluate.eval_graph(g, x, y)
    n = 0
    for p in ps:
        np.testing.assert_allclose(p.run(x, y), ref, rtol=1e-5, atol=1e-6)
        assert p.ntransfers == len(p.lower().transfers())
        n += 1
    assert n == ps.count() > 1


def test_decomposed_plans_run():
    g = tgx.make_graph(lambda x: tnn.softmax(x, axis=-1))(S((2, 3)))
    ps = Paths(g, backends=["numpy", "torch", "jax"], cost_model=PlantedCosts())
    x = np.random.default_rng(0).standard_normal((2, 3)).astype(np.float32)
    ref = tgx.transforms.evaluate.eval_graph(g, x)
    for p in itertools.islice(ps, 0, None, max(1, ps.count() // 25)):
        np.testing.assert_allclose(p.run(x), ref, rtol=1e-5, atol=1e-6)


def test_filters():
    g = tgx.make_graph(lambda x: tnn.softmax(tnp.exp(x), axis=-1))(S((4, 4)))
    full = Paths(g, backends=NT, cost_model=PlantedCosts())
    only_np = Paths(g, backends=["numpy"], cost_model=PlantedCosts())
    assert all(s.option.backend == "numpy" for p in only_np for s in p.steps)
    assert only_np.count() < full.count()
    nodec = Paths(g, backends=NT, decompose=False, cost_model=PlantedCosts())
    assert all(t["d"] != "decomposition" for p in nodec for t in p.tokens())
    n_kernels = [sum(c.kind == "kernel" for c in tgx.candidates(e, NT)) for e in g.eqns]
    assert nodec.count() == n_kernels[0] * n_kernels[1]
    zero = Paths(g, backends=NT, decompose=False, max_transfers=0, cost_model=PlantedCosts())
    plans = list(zero)
    assert zero.count() == len(plans) and all(p.ntransfers == 0 for p in plans)
    assert all(p.backends() == ["numpy"] for p in plans)
    one = Paths(g, backends=NT, decompose=False, max_transfers=2, cost_model=PlantedCosts())
    assert zero.count() < one.count() <= nodec.count()
    kern = Paths(g, backends=NT, decompose=False, cost_model=PlantedCosts(),
                 kernels_only=["exp@numpy", "softmax"])
    assert kern.count() == 1 * n_kernels[1]


def test_pointless_round_trips_pruned():
    def f(x):  # copies with no work between: no choice, no transfer of their own
        return tnp.exp(copy_to(copy_to(x, backend="torch"), backend="numpy"))
    g = tgx.make_graph(f)(S((4,)))
    plain = tgx.make_graph(lambda x: tnp.exp(x))(S((4,)))
    ps = Paths(g, backends=NT, cost_model=PlantedCosts())
    assert ps.count() == Paths(plain, backends=NT, cost_model=PlantedCosts()).count() == 4
    for p in ps:
        assert p.ntransfers == (0 if p.backends() == ["numpy"] else 2)
        for s in p.steps:  # never copied to a backend already holding it
            assert all(src != dst for _, src, dst, _ in s.transfers)


def _uses_pattern(p) -> bool:
    return any(s.option.kernel is not None and s.option.kernel.pattern is not None
               for s in p.steps)


def test_pattern_kernel_found_in_hand_written_rmsnorm():
    def rmsnorm(x, w):
        ms = tnp.mean(x * x, axis=-1, keepdims=True)
        return x / tnp.sqrt(ms + 1e-6) * w
    g = tgx.make_graph(rmsnorm)(S((8, 64)), S((64,)))
    ps = Paths(g, backends=NT, decompose=False, cost_model=PlantedCosts())
    # the graph tgx.compile plans: the occurrence is one equation, its kernels or its ops
    (unit,) = ps.root.eqn_units
    assert unit.label == "fused" and unit.eqn.params["name"] == "rms_norm_pattern"
    assert [c.kind for c in unit.options] == ["kernel", "kernel", "decomposition"]
    pat = [p for p in ps if _uses_pattern(p)]
    assert len(pat) == 2  # on numpy and on torch
    no_pat = Paths(g, backends=NT, decompose=False, patterns=False, cost_model=PlantedCosts())
    assert ps.count() == no_pat.count() + 2
    rng = np.random.default_rng(0)
    x = rng.standard_normal((8, 64)).astype(np.float32)
    w = rng.standard_normal(64).astype(np.float32)
    for p in pat:
        assert len(p.steps) == 1 and "rms_norm_pattern" in p.summary()
        np.testing.assert_allclose(p.run(x, w), p.reference(x, w), rtol=1e-5, atol=1e-5)


def test_pattern_kernel_in_rms_norm_decomposition():
    g = tgx.make_graph(lambda x, w: tnn.rms_norm(x, 64, w, eps=1e-6))(S((2, 8, 64)), S((64,)))
    ps = Paths(g, backends=NT, cost_model=PlantedCosts())
    sub = ps.root.eqn_units[0].sub
    assert any(u is not None and u.eqn.params.get("name") == "rms_norm_pattern"
               for u in sub.eqn_units)
    assert ps.count() == sum(1 for _ in itertools.islice(ps, 10**6))
    pat = next(p for p in ps if _uses_pattern(p))
    x = np.random.default_rng(0).standard_normal((2, 8, 64)).astype(np.float32)
    w = np.ones(64, np.float32)
    np.testing.assert_allclose(pat.run(x, w), pat.reference(x, w), rtol=1e-5, atol=1e-5)


def test_sources_and_summary():
    ps = tgx.paths(lambda x: tnp.exp(x) * 2.0)(S((8,)), backends=NT, cost_model=PlantedCosts())
    worst = max(ps, key=lambda p: p.ntransfers)
    text = worst.summary()
    for word in ("step", "primitive", "choice", "backend", "predicted", "source", "copy_to",
                 "measured", "cost model"):
        assert word in text
    assert worst.sources["measured"] == worst.ntransfers


def test_count_is_fast_on_big_spaces():
    def block(x, w1, w2, g):
        h = tnn.rms_norm(x, 32, g)
        h = tnn.softmax(h @ w1, axis=-1) @ w2
        return x + tnn.gelu(h)
    ps = tgx.paths(block)(S((8, 32)), S((32, 32)), S((32, 32)), S((32,)))
    assert ps.count() > 10**6
    best = next(iter(ps.ranked()))
    assert best.cost <= next(iter(ps)).cost


def test_plan_save_load_run(tmp_path):
    g = tgx.make_graph(lambda x: tnn.softmax(tnp.exp(x), axis=-1))(S((3, 4)))
    ps = Paths(g, backends=NT, cost_model=PlantedCosts())
    plan = list(itertools.islice(ps.ranked(), 3))[-1]
    store = tgx.BenchmarkStore(tmp_path / "s.json")
    key = plan.save(store)
    rec = store.get_implementation(key)
    assert rec["kind"] == "GRAPH_RECIPE"
    back = ps.plan_from_tokens(Assignment.from_bytes(rec["payload"]).meta["tokens"])
    assert back.tokens() == plan.tokens() and back.cost == pytest.approx(plan.cost)
    x = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
    np.testing.assert_allclose(back.run(x), plan.run(x), rtol=1e-6)
    rec = plan.profile(x, store=store, budget_s=0.01)
    assert rec["status"] == "PASSED"
    assert ps.measured(store)[0][0] == rec["median_s"]


def test_plan_load_fails_when_kernel_source_changed():
    g = tgx.make_graph(lambda x: tnp.exp(x))(S((3,)))
    ps = Paths(g, backends=["numpy"], cost_model=PlantedCosts())
    plan = next(iter(ps))
    tokens = [dict(t) for t in plan.tokens()]
    tokens[0]["source_hash"] = "0" * 64
    with pytest.raises(SerializationError, match="changed since the plan was saved"):
        ps.plan_from_tokens(tokens)
    tokens[0]["backend"] = "nowhere"
    with pytest.raises(SerializationError, match="not available"):
        ps.plan_from_tokens(tokens)
    # the stored assignment checks its kernels too
    import msgpack
    d = msgpack.unpackb(plan.assignment().to_bytes(), raw=False)
    d["kernels"][0][2] = "0" * 64
    with pytest.raises(SerializationError, match="changed since the plan was stored"):
        Assignment.from_bytes(msgpack.packb(d, use_bin_type=True))


# -- backend-switch penalties: the same plan cost as selection -----------------------------
from tgx.planning.cost_model import CostModel  # noqa: E402
from tgx.planning.selection import select  # noqa: E402


class SwitchCosts(CostModel):
    """PlantedCosts plus a planted penalty per backend switch (as `CostModel.switch`), in a
    `CostModel` so selection can use it too (no store: nothing excluded)."""

    def __init__(self, seed=0, scale=1.0):
        super().__init__()
        self.planted = PlantedCosts(seed)
        self.scale = scale

    def kernel(self, eqn, kernel, dims):
        return self.planted.kernel(eqn, kernel, dims)

    def transfer(self, aval, src, dst, dims):
        if src == dst:
            return Estimate(0.0, "cost model")
        return self.planted.transfer(aval, src, dst, dims)

    def switch(self, src, dst, eqn=None, kernel=None, pool=None):
        return 0.0 if src == dst else self.scale * self.planted._t("switch", src, dst)


def plan_cost_by_hand(p, cm) -> float:
    """Kernels + transfers + switches between consecutive kernels and last → first."""
    bs = [s.option.backend for s in p.steps]
    t = sum(s.estimate.seconds + sum(x[-1].seconds for x in s.transfers) for s in p.steps)
    t += sum(x[-1].seconds for x in p.final_transfers)
    t += sum(cm.switch(a, b) for a, b in zip(bs, bs[1:] + bs[:1])) if len(bs) > 1 else 0.0
    return t


ATOMIC = ["exp", "neg", "add", "mul", "matmul"]  # no decompositions: same space as selection
atomic_programs = st.lists(st.tuples(st.sampled_from(ATOMIC), st.integers(0, 5)), min_size=1,
                           max_size=4)


@settings(max_examples=10, deadline=None)
@given(programs, st.integers(0, 3))
def test_ranked_with_switch_penalties_matches_brute_force(ops, seed):
    g = build(ops)
    cm = SwitchCosts(seed)
    ps = Paths(g, backends=NT, decompose=False, cost_model=cm)
    everything = list(ps)
    for p in everything:
        assert p.cost == pytest.approx(plan_cost_by_hand(p, cm), rel=1e-12)
    assert all((p.switch_s > 0) == (len(p.backends()) > 1) for p in everything)
    costs = [p.cost for p in itertools.islice(ps.ranked(distinct=False), 20)]
    assert costs == sorted(costs)
    assert costs == pytest.approx(sorted(p.cost for p in everything)[:20])


@settings(max_examples=15, deadline=None)
@given(atomic_programs, st.integers(0, 5), st.sampled_from([0.2, 1.0, 20.0]))
def test_best_path_cost_equals_selection_total(ops, seed, scale):
    # Same option space: atomic primitives only (no decompositions: selection would solve one
    # with all sub-equations on one backend, paths mixes them) and no pattern kernels;
    # selection keeps the fastest kernel per backend, which is the best variant in paths.
    g = build(ops)
    assert all(e.primitive.decomposition is None for e in g.eqns)
    cm = SwitchCosts(seed, scale)
    backends = ["numpy", "torch", "jax"]
    best = Paths(g, backends=backends, decompose=False, patterns=False, cost_model=cm).best()
    sel = select(g, backends, cm, {})
    assert best.cost == pytest.approx(sel.total, rel=1e-9)
    assert [s.option.backend for s in best.steps] == [c.backend for c in sel.choices] or \
        best.cost == pytest.approx(sel.total, rel=1e-9)  # ties may pick other backends


def test_switch_penalties_steer_ranking_to_one_backend():
    # torch kernels are cheaper one by one, the exp on numpy is cheaper still, but going
    # numpy → torch → numpy costs two switches: the best plan stays on torch.
    g = tgx.make_graph(lambda x: tnp.exp(x @ x) * 2.0)(S((8, 8)))

    class Costs(SwitchCosts):
        def kernel(self, eqn, kernel, dims):
            cheap = 1e-6 if eqn.primitive.name == "exp" else 5e-6
            return Estimate(cheap if kernel.backend == "numpy" and eqn.primitive.name == "exp"
                            else 2e-6 if kernel.backend == "torch" else 9e-6, "cost model")

        def switch(self, src, dst, eqn=None, kernel=None, pool=None):
            return 0.0 if src == dst else 1e-3

        def transfer(self, aval, src, dst, dims):
            return Estimate(0.0 if src == dst else 1e-6, "cost model")

    ps = Paths(g, backends=NT, decompose=False, patterns=False, cost_model=Costs())
    best = ps.best()
    assert best.backends() == ["torch"]
    assert best.switch_s == 0.0
    mixed = next(p for p in ps.ranked() if len(p.backends()) == 2)
    assert mixed.switch_s == pytest.approx(2e-3)
    assert "backend switches" in mixed.summary()


def _class_key(p):
    return tuple((t.get("d"), t.get("name"), t.get("backend"), tuple(t.get("m", ())))
                 for t in p.tokens())


def test_ranked_distinct_by_default():
    g = tgx.make_graph(lambda x, y: tnp.exp(x + y) * y)(S((16, 16)), S((16, 16)))
    ps = Paths(g, backends=NT, cost_model=PlantedCosts(3))
    every = list(ps.ranked(distinct=False))
    assert len(every) == ps.count()
    distinct = list(ps.ranked())
    keys = [_class_key(p) for p in distinct]
    assert len(keys) == len(set(keys))                     # no near-duplicates
    assert set(keys) == {_class_key(p) for p in every}     # every class still there
    assert len(distinct) < len(every)                      # variants exist (e.g. [out])
    best_of = {}
    for p in every:
        best_of.setdefault(_class_key(p), p.cost)          # first = cheapest of its class
    for p in distinct:
        assert p.cost == pytest.approx(best_of[_class_key(p)])
    assert [p.cost for p in distinct] == sorted(p.cost for p in distinct)


@settings(max_examples=25, deadline=None)
@given(programs, st.integers(0, 5), st.sampled_from([0.2, 5.0]), st.integers(0, 2**16))
def test_heuristic_is_admissible_and_consistent(ops, seed, scale, walk):
    # A*'s exact order needs h(s) <= cost(s -> s') + h(s') on every move and h = 0 at the end
    # (the backend tables count switches, copies between consecutive units and first reads of
    # graph inputs); random walks through decompositions and switch-priced plans check it
    import random

    g = build(ops)
    cm = SwitchCosts(seed, scale)
    ps = Paths(g, backends=["numpy", "torch", "jax"], cost_model=cm)
    rnd = random.Random(walk)
    st_ = ps._start()
    best = min(p.cost for p in itertools.islice(ps.ranked(distinct=False), 1))
    assert st_.cost + st_.h() <= best * (1 + 1e-12)
    while not st_.done:
        kids = [c for c in (ps._apply(st_, ch) for ch in ps._choices(st_)) if c is not None]
        nxt = rnd.choice(kids)
        assert st_.cost + st_.h() <= nxt.cost + nxt.h() + 1e-12
        st_ = nxt
    assert st_.h() == 0.0
