"""Selection: DP (+ local improvement) against brute force on planted costs."""

import itertools

import hypothesis.strategies as st
import pytest
from hypothesis import given

import tgx
import tgx.numpy as tnp
from tgx.planning.cost_model import CostModel, Estimate
from tgx.planning.selection import select, select_brute_force

BACKENDS = ["numpy", "torch", "jax"]


class Planted(CostModel):
    """Kernel and transfer costs drawn from a table (by equation position and backend)."""

    def __init__(self, costs, transfer):
        super().__init__()
        self.costs, self.tr = costs, transfer

    def kernel(self, eqn, kernel, dims):
        return Estimate(self.costs[(self.pos[id(eqn)], kernel.backend)], "measured", "planted")

    def transfer(self, aval, src, dst, dims):
        return Estimate(0.0 if src == dst else self.tr[(src, dst)], "cost model")

    def switch(self, src, dst, eqn=None, kernel=None, pool=None):  # planted: after another backend
        return 0.0 if src == dst else self.tr[(src, dst)] / 3


def chain(n):
    def f(x):
        for i in range(n):
            x = tnp.exp(x) if i % 2 else tnp.sin(x)
        return x
    return tgx.make_graph(f)(tgx.Spec((8,)))


def dag(n):
    def f(x):
        vals = [x]
        for i in range(n):
            a, b = vals[-1], vals[max(0, len(vals) - 3)]
            vals.append(a * b if i % 2 else tnp.exp(a) + b)
        return vals[-1]
    return tgx.make_graph(f)(tgx.Spec((8,)))


costs_st = st.lists(st.floats(0.1, 10.0), min_size=40, max_size=40)
tr_st = st.lists(st.floats(0.0, 5.0), min_size=6, max_size=6)


def planted(graph, cs, ts):
    costs = {(i, b): cs[(3 * i + j) % len(cs)] for i in range(len(graph.eqns))
             for j, b in enumerate(BACKENDS)}
    pairs = [(a, b) for a, b in itertools.permutations(BACKENDS, 2)]
    cm = Planted(costs, dict(zip(pairs, ts)))
    cm.pos = {id(e): i for i, e in enumerate(graph.eqns)}
    return cm


@given(n=st.integers(1, 5), cs=costs_st, ts=tr_st)
def test_dp_matches_brute_force_on_chains(n, cs, ts):
    g = chain(n)
    cm = planted(g, cs, ts)
    assert select(g, BACKENDS, cm, {}).total == pytest.approx(
        select_brute_force(g, BACKENDS, cm, {}).total)


@given(n=st.integers(2, 5), cs=costs_st, ts=tr_st)
def test_dp_matches_brute_force_on_small_dags(n, cs, ts):
    g = dag(n)
    cm = planted(g, cs, ts)
    assert select(g, BACKENDS, cm, {}).total == pytest.approx(
        select_brute_force(g, BACKENDS, cm, {}).total)


@given(n=st.integers(2, 4), cs=costs_st, ts=tr_st)
def test_fallback_dp_with_local_improvement_is_a_valid_plan(n, cs, ts):
    import tgx.planning.selection as sel

    g = dag(n)
    cm = planted(g, cs, ts)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(sel, "MAX_STATES", 0)  # too wide for the exact DP: DP + local improvement
        fallback = select(g, BACKENDS, cm, {}).total
    assert fallback >= select_brute_force(g, BACKENDS, cm, {}).total - 1e-12


class Pooled(Planted):
    """Planted kernel and transfer times, the real switch penalties (`CostModel.switch`:
    a pool woken after another backend's, `Backend.wakes_pool`)."""

    switch = CostModel.switch

    def __init__(self, planted_by: Planted):
        CostModel.__init__(self)
        self.planted, self.tr, self.pos = planted_by.costs, planted_by.tr, planted_by.pos

    def kernel(self, eqn, kernel, dims):  # inside a decomposition: a fixed time
        at = self.pos.get(id(eqn))
        return Estimate(1e-3 if at is None else self.planted[(at, kernel.backend)],
                        "measured", "planted")


def products_and_ufuncs(n):
    def f(x):
        for i in range(n):
            x = x @ x if i % 2 == 0 else tnp.tanh(x)
        return x
    return tgx.make_graph(f)(tgx.Spec((8, 8)))


@given(n=st.integers(2, 6), cs=st.lists(st.floats(1e-5, 1e-2), min_size=40, max_size=40),
       ts=st.lists(st.floats(0.0, 1e-3), min_size=6, max_size=6))
def test_dp_matches_brute_force_with_the_pools_a_plan_wakes(n, cs, ts):
    """The DP carries the pool the last pool-waking equation left (torch's workers still
    spin through NumPy ufuncs up to the next BLAS call): its plan costs what trying every
    plan finds cheapest."""
    g = products_and_ufuncs(n)
    cm = Pooled(planted(g, cs, ts))
    assert select(g, BACKENDS, cm, {}).total == pytest.approx(
        select_brute_force(g, BACKENDS, cm, {}).total)


def test_a_numpy_blas_call_after_torch_pays_the_switch_through_the_ufuncs_between():
    """torch's OpenMP workers spin on after its GEMM: a NumPy ufunc or numba loop right
    after it pays a little (`switch_in_light`, 1-33 µs measured), the next NumPy BLAS
    product, however many ufuncs later, the full contention (`switch_in`, ~7 ms)."""
    from tgx.backends import get_backend
    from tgx.planning.selection import _Selector

    g = products_and_ufuncs(4)              # matmul, tanh, matmul, tanh
    cm = CostModel(None)
    s = _Selector(["numpy", "torch"], cm, {})
    s.prepare(g, "numpy", 0)
    numpy = get_backend("numpy")
    heavy, light = numpy.switch_in["torch"], numpy.switch_in_light["torch"]
    assert s.S(["torch", "numpy", "numpy", "numpy"], range(4)) == pytest.approx(heavy + light)
    assert s.S(["torch", "numpy", "torch", "numpy"], range(4)) == pytest.approx(2 * light)
    assert s.S(["numpy"] * 4, range(4)) == 0.0


def test_select_reports_sources_and_total():
    g = chain(3)
    s = select(g, ["numpy"], CostModel(), {})
    assert s.sources() == ["cost model"] * 3 and s.total > 0
    assert "µs" in str(s)


def test_decomposition_graphs_are_shared_by_selections_until_the_registry_changes(tmp_path,
                                                                                  monkeypatch):
    """Every selection of a process sees the same decomposition graph of an equation (EXPLORE
    selects on each set of backends, for a shortened graph and a whole one: building them
    again was ~1 s of an 18-layer prefill's explore), until a kernel is registered or
    removed: then it is built again, with what the registry now offers."""
    import numpy as np

    import tgx.nn as tnn
    from tgx.backends.registry import generation, register_kernel, remove_kernel
    from tgx.planning import selection
    from tgx.store import BenchmarkStore

    monkeypatch.setattr(selection, "_SUBS", {})
    g = tgx.make_graph(lambda x: tnn.gelu(x, approximate="tanh") * 2.0)(tgx.Spec((64, 64)))
    cm = CostModel(BenchmarkStore(str(tmp_path / "s.json")))

    def subs():
        return {k: v for k, v in selection._SUBS.items() if k[1] == ("numpy",)}
    select(g, ["numpy"], cm, {})
    first = subs()
    assert first and all(k[-1] == generation() for k in first)
    select(g, ["numpy"], cm, {})
    assert subs() == first and all(subs()[k] is v for k, v in first.items())
    before = generation()
    register_kernel("tanh", "numpy", variant="test-generation")(np.tanh)
    try:
        assert generation() != before
        select(g, ["numpy"], cm, {})
        assert {k[-1] for k in subs()} == {before, generation()}
    finally:
        remove_kernel("tanh", "numpy", "test-generation")
    assert generation() not in (before, before + 1)


@pytest.mark.parametrize("ratio,decomposed", [(0.9, False), (0.6, False), (0.45, True)])
def test_on_xla_a_composite_is_decomposed_only_when_clearly_cheaper(ratio, decomposed):
    """Inside one XLA program `linear` and its `dot_general` are one dot: their figures,
    each a one-op program, differ by noise (an 18-layer prefill's: 39.6/34.5, 4.18/3.19,
    2.06/1.20 ms).
    On jax the decomposition is taken only when cheaper by more than
    `FUSED_DECOMPOSE_MARGIN`; on NumPy, whenever it is cheaper."""
    pytest.importorskip("jax")
    import tgx.nn as tnn
    from tgx.planning import selection

    g = tgx.make_graph(lambda x, w: tnn.linear(x, w))(tgx.Spec((16, 32)), tgx.Spec((8, 32)))

    class Priced(CostModel):
        def kernel(self, eqn, kernel, dims):
            s = ratio if eqn.primitive.name == "dot_general" else 1.0
            return Estimate(s * 1e-3, "measured", "planted")

        def transfer(self, aval, src, dst, dims):
            return Estimate(0.0 if src == dst else 1.0, "cost model")

    assert selection.FUSED_DECOMPOSE_MARGIN == 0.5
    for b, want in (("jax", decomposed), ("numpy", True)):
        a = selection.realize(select(g, [b], Priced(), {}))
        names = [e.primitive.name for e in a.graph.eqns]
        assert ("dot_general" in names and "linear" not in names) is want, (b, names)


def test_state_made_on_jax_pays_its_write_back():
    """A new state value computed on jax is copied into the caller's array every call (jax
    arrays cannot be written); on NumPy or torch the kernel writes it in place."""
    pytest.importorskip("jax")
    from tgx.backends import backend_available

    g = tgx.make_graph(lambda s, x: (s * 0.9 + x,))(tgx.Spec((1024, 256)), tgx.Spec((1024, 256)))
    cm = CostModel()
    back = cm.state_write_back(g.outvars[0].aval, "jax", "numpy", {})
    assert back > 0
    plain = select(g, ["jax"], cm, {}).total
    assert select(g, ["jax"], cm, {}, state=((0, 0),)).total == pytest.approx(plain + back)
    for b in [b for b in ("numpy", "torch") if backend_available(b)]:
        assert cm.state_write_back(g.outvars[0].aval, b, "numpy", {}) == 0.0
        assert select(g, [b], cm, {}, state=((0, 0),)).total == select(g, [b], cm, {}).total


def test_values_leaving_a_jax_region_are_priced_once_per_value():
    """`region_values`: a value a jax region makes and anything outside that region reads
    (another backend, a later jax region, the caller) costs `region_value_s` once; so a
    plan splitting one region in two pays for what crosses the split."""
    pytest.importorskip("jax")
    from tgx.backends import host_name
    from tgx.planning.selection import _Selector

    def f(x):
        s = tnp.sin(x)
        return tnp.exp(s) + s

    g = tgx.make_graph(f)(tgx.Spec((64,)))
    assert [e.primitive.name for e in g.eqns] == ["sin", "exp", "add"]
    cm = CostModel()
    sel = _Selector(["numpy", "jax"], cm, {})
    sel.prepare(g, host_name(), 0)
    per = cm.region_value_s("jax")
    assert per > 0
    assert sel.region_values(["jax", "jax", "jax"]) == pytest.approx(per)   # the result
    # sin's value leaves for NumPy (exp) and the second region (add): one value, once
    assert sel.region_values(["jax", "numpy", "jax"]) == pytest.approx(2 * per)
    assert sel.region_values(["numpy", "numpy", "numpy"]) == 0.0
    assert sel.region_values(["numpy", "jax", "numpy"]) == pytest.approx(per)
    # ... and `total` holds them
    assert sel.total(["jax", "numpy", "jax"])[1] >= 2 * per
    # a decomposition's result stays in its parent's region: not charged as returned
    sub = _Selector(["jax"], cm, {})
    sub.prepare(g, "jax", 1)
    assert sub.region_values(["jax", "jax", "jax"]) == 0.0
