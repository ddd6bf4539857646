"""The generated GEMVs (numba) and weights held in a lower precision: each kernel against a
float64 NumPy reference, the held forms, the one-time conversion of bound weights, and the
path-level error budget that decides whether a lossy plan is kept."""

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tgx
import tgx.nn as tnn
import tgx.numpy as tnp
from tgx.backends.registry import kernels_for
from tgx.planning.cost_model import CostModel
from tgx.store import BenchmarkStore

from .planted import plant_kernel
from .references import attention64

nk = pytest.importorskip("tgx.backends.numba_kernels")
if not nk.HAVE_NUMBA:
    pytest.skip("numba is not installed", allow_module_level=True)

# float32 accumulation over K terms of O(1) values: a few K·eps of the output's scale
F32_RTOL = 1e-5


def _rand(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


def _close(got, want, k):
    scale = max(float(np.max(np.abs(want))), 1e-30)
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=0, atol=F32_RTOL * np.sqrt(k) * scale)


shapes = st.tuples(st.integers(1, nk.MAX_ROWS), st.integers(1, 300), st.integers(1, 150),
                   st.booleans(), st.integers(0, 2**31 - 1))


@settings(max_examples=25, deadline=None)
@given(shapes)
def test_float32_gemv_matches_float64_reference(case):
    m, k, n, bias, seed = case
    rng = np.random.default_rng(seed)
    x, w, b = _rand(rng, m, k), _rand(rng, n, k), _rand(rng, n)
    want = x.astype(np.float64) @ w.T.astype(np.float64) + (b if bias else 0)
    _close(nk.linear_f32(x, w, *([b] if bias else [])), want, k)


@settings(max_examples=25, deadline=None)
@given(shapes)
def test_bf16_gemv_computes_with_the_rounded_weights(case):
    """The bf16 kernel is exact but for float32 accumulation on the weights as rounded to
    bfloat16 (ml_dtypes' rounding): its only loss is the one it declares."""
    m, k, n, bias, seed = case
    rng = np.random.default_rng(seed)
    x, w, b = _rand(rng, 1, m, k), _rand(rng, n, k), _rand(rng, n)
    held = nk.to_bf16_bits(w)
    assert held.dtype == np.uint16 and held.shape == w.shape
    wr = w.astype(ml_dtypes.bfloat16).astype(np.float64)
    want = x.astype(np.float64) @ wr.T + (b if bias else 0)
    got = nk.linear_bf16(x, held, *([b] if bias else []))
    assert got.shape == (1, m, n)
    _close(got, want, k)


@settings(max_examples=25, deadline=None)
@given(shapes)
def test_int8_gemv_computes_with_the_quantized_weights(case):
    m, k, n, bias, seed = case
    rng = np.random.default_rng(seed)
    x, w, b = _rand(rng, m, k), _rand(rng, n, k), _rand(rng, n)
    q, scale = nk.to_int8(w)
    assert q.dtype == np.int8 and scale.dtype == np.float32
    # each weight within half a step of its row's scale
    assert np.all(np.abs(q * scale[:, None].astype(np.float64) - w) <= scale[:, None] * 0.5001)
    want = x.astype(np.float64) @ (q * scale[:, None].astype(np.float64)).T + (b if bias else 0)
    _close(nk.linear_int8(x, (q, scale), *([b] if bias else [])), want, k)


def test_held_weights_that_are_views_give_the_same_products():
    """The lower-precision loops read their weights flat (to prefetch rows ahead): a held
    weight that is a strided view computes what its contiguous copy does."""
    rng = np.random.default_rng(3)
    x, w = _rand(rng, 2, 40), _rand(rng, 70, 80)[:, ::2]   # (70, 40) views
    q, scale = nk.to_int8(np.ascontiguousarray(w))
    strided = np.zeros((70, 80), np.int8)
    strided[:, ::2] = q
    np.testing.assert_array_equal(nk.linear_int8(x, (strided[:, ::2], scale)),
                                  nk.linear_int8(x, (q, scale)))
    wide = np.zeros((70, 80), np.uint16)
    wide[:, ::2] = nk.to_bf16_bits(np.ascontiguousarray(w))
    np.testing.assert_array_equal(nk.linear_bf16(x, wide[:, ::2]),
                                  nk.linear_bf16(x, nk.to_bf16_bits(np.ascontiguousarray(w))))


def test_int8_of_a_zero_row_is_zero():
    q, scale = nk.to_int8(np.zeros((2, 5), np.float32))
    assert not q.any() and np.all(scale == 1)


def test_out_view_is_written():
    rng = np.random.default_rng(0)
    x, w = _rand(rng, 1, 16), _rand(rng, 8, 16)
    out = np.empty((1, 8), np.float32)
    assert nk.linear_f32(x, w, out=out) is out
    _close(out, x.astype(np.float64) @ w.T, 16)


def test_checker_declines_what_a_gemv_loop_does_not_run():
    k = next(k for k in kernels_for("linear", "numpy") if k.variant == "numba")
    spec = lambda *s, dt=np.float32: tgx.ShapedArray(s, np.dtype(dt))  # noqa: E731
    assert k.check([spec(1, 64), spec(32, 64)], {}) is None
    assert "rows" in k.check([spec(128, 64), spec(32, 64)], {})
    assert "float32" in k.check([spec(1, 64, dt=np.float64), spec(32, 64, dt=np.float64)], {})


# -- planning: lossy kernels only under tolerance, weights held once ------------------------

def _linear(w, x):
    return tnn.linear(x, w)


@pytest.fixture
def weights():
    rng = np.random.default_rng(1)
    return _rand(rng, 96, 64), _rand(rng, 1, 64)


def _compile(store, **kw):
    return tgx.compile(_linear, weights="w", backends=["numpy"], store=store, **kw)


def test_lossy_kernel_is_chosen_only_under_tolerance(tmp_path, weights):
    store = BenchmarkStore(tmp_path / "s.json")
    plant_kernel(store, _linear, weights, "numba-int8")
    w, x = weights
    want = x.astype(np.float64) @ w.T.astype(np.float64)
    f = _compile(store)
    np.testing.assert_allclose(f(w, x), want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
    plan = f._plans[next(iter(f._plans))]
    assert all(k.lossy is None for k in plan.kernels) and plan.precision is None

    g = _compile(store, tolerance=5e-2)
    y = g(w, x)
    plan = g._plans[next(iter(g._plans))]
    assert [k.variant for k in plan.kernels] == ["numba-int8"]
    rep = plan.precision
    assert rep.kept and rep.held == (("w", "int8", "linear[numba-int8]@numpy"),)
    err = np.abs(y - want).max() / np.abs(want).max()
    assert rep.error == pytest.approx(err, rel=1e-3) and 1e-4 < err < 5e-2
    assert "held as int8" in str(plan)


def test_weight_is_held_once_per_bound_array(tmp_path, weights):
    store = BenchmarkStore(tmp_path / "s.json")
    plant_kernel(store, _linear, weights, "numba-bf16")
    w, x = weights
    f = _compile(store, tolerance=5e-2)
    f(w, x)
    cg = f._plans[next(iter(f._plans))].compiled
    n = cg.weight_conversions
    for _ in range(3):
        f(w, x + 1)
    assert cg.weight_conversions == n           # the same array: not converted again
    w2 = w * 2
    want = x.astype(np.float64) @ w2.astype(ml_dtypes.bfloat16).astype(np.float64).T
    np.testing.assert_allclose(f(w2, x), want, rtol=0, atol=1e-4 * np.abs(want).max())
    assert cg.weight_conversions == n + 1       # a new array: converted once more


def test_a_plan_over_the_tolerance_is_planned_again_with_less_loss(tmp_path, weights):
    """int8 (~1e-2 of the scale) fails a 4e-3 tolerance, bf16 (~2e-3) passes; 1e-4 rejects
    both and the plan runs in float32."""
    store = BenchmarkStore(tmp_path / "s.json")
    plant_kernel(store, _linear, weights, "numba-int8", 1e-9)
    plant_kernel(store, _linear, weights, "numba-bf16", 2e-9)
    w, x = weights
    want = x.astype(np.float64) @ w.T.astype(np.float64)
    f = _compile(store, tolerance=4e-3)
    f(w, x)
    plan = f._plans[next(iter(f._plans))]
    assert [k.variant for k in plan.kernels] == ["numba-bf16"] and plan.precision.kept

    f = _compile(store, tolerance=1e-4)
    y = f(w, x)
    plan = f._plans[next(iter(f._plans))]
    assert all(k.lossy is None for k in plan.kernels)
    rep = plan.precision
    assert not rep.kept and rep.error > 1e-4 and rep.held[0][1] == "bf16"
    assert "rejected" in str(plan)
    np.testing.assert_allclose(y, want, rtol=0, atol=1e-5 * np.abs(want).max())


def test_kernel_that_prepares_a_computed_operand_is_not_offered(tmp_path, weights):
    """`w * 2` is computed per call: holding it in int8 would convert it every call, which the
    kernel's measured time does not include."""
    store = BenchmarkStore(tmp_path / "s.json")
    fn = lambda w, x: tnn.linear(x, w * 2)  # noqa: E731
    plant_kernel(store, fn, weights, "numba-int8")
    f = tgx.compile(fn, weights="w", backends=["numpy"], store=store, tolerance=5e-2)
    w, x = weights
    np.testing.assert_allclose(f(w, x), x @ (2 * w).T, rtol=1e-4, atol=1e-4)
    plan = f._plans[next(iter(f._plans))]
    assert all(k.lossy is None for k in plan.kernels)


def test_lossy_kernel_is_profiled_within_the_error_it_promises(tmp_path):
    from tgx.profiling.pending import profile_kernel

    g = tgx.make_graph(_linear)(tgx.Spec((300, 64)), tgx.Spec((1, 64)))
    eqn = g.eqns[0]
    store = BenchmarkStore(tmp_path / "s.json")
    for variant in ("numba", "numba-bf16", "numba-int8"):
        k = next(k for k in kernels_for("linear", "numpy") if k.variant == variant)
        rec = profile_kernel(eqn, k, {}, store, CostModel(store), budget_s=0.01)
        assert rec["status"] == "PASSED", rec
        assert rec["max_abs_err"] is not None


def test_plan_with_generated_kernels_caps_blas_while_it_runs(tmp_path, weights, monkeypatch):
    """numba's pool and OpenBLAS's spinning threads fight on few cores: the plan runs with
    BLAS on one thread, and leaves BLAS as it found it."""
    from tgx.backends import threads
    from tgx.backends.threads import blas_threads

    store = BenchmarkStore(tmp_path / "s.json")
    plant_kernel(store, _linear, weights, "numba")
    w, x = weights
    f = _compile(store)
    before = blas_threads()
    seen = []
    real = threads.set_blas_threads

    def spy(n):
        seen.append(n)
        return real(n)
    monkeypatch.setattr("tgx.backends.threads.set_blas_threads", spy)
    f(w, x)
    plan = f._plans[next(iter(f._plans))]
    assert [k.variant for k in plan.kernels] == ["numba"]
    assert plan.compiled.blas_threads == 1
    assert seen[0] == 1 and seen[-1] == before and blas_threads() == before

    h = tgx.compile(_linear, weights="w", backends=["numpy"], policy="heuristic")
    h(w, x)
    assert h._plans[next(iter(h._plans))].compiled.blas_threads is None


# -- RMSNorm and few-query attention ---------------------------------------------------------

@settings(max_examples=25, deadline=None)
@given(st.integers(1, 9), st.integers(1, 300), st.integers(0, 2**31 - 1))
def test_rms_norm_matches_float64_reference(rows, d, seed):
    rng = np.random.default_rng(seed)
    x, w = _rand(rng, rows, 1, d), _rand(rng, d)
    x64 = x.astype(np.float64)
    want = x64 / np.sqrt(np.mean(x64 ** 2, axis=-1, keepdims=True) + 1e-6) * w
    got = nk.rms_norm_f32(x, w, normalized_shape=(d,), eps=1e-6, has_weight=True)
    assert got.shape == x.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6 * np.abs(want).max())


@settings(max_examples=25, deadline=None)
@given(st.lists(st.integers(1, 4), max_size=2), st.integers(1, 9), st.integers(1, 40),
       st.integers(0, 2**31 - 1))
def test_rope_matches_float64_reference(lead, n, half, seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((*lead, n, 2 * half)).astype(np.float32)
    cos, sin = (rng.standard_normal((n, 2 * half)).astype(np.float32) for _ in range(2))
    x64 = x.astype(np.float64)
    rot = np.concatenate([-x64[..., half:], x64[..., :half]], axis=-1)
    want = x64 * cos + rot * sin
    got = nk.rope_f32(x, cos, sin)
    assert got.shape == x.shape and got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    out = np.empty_like(x)
    assert nk.rope_f32(x.transpose(*range(x.ndim - 2), x.ndim - 2, x.ndim - 1), cos, sin,
                       out=out) is out
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-6)
    k = next(k for k in kernels_for("apply_rotary_emb", "numpy") if k.variant == "numba")
    bad = tgx.make_graph(lambda x, c, s: tnn.apply_rotary_emb(x, c, s))(
        tgx.Spec((2, 4, 8)), tgx.Spec((1, 8)), tgx.Spec((1, 8)))
    assert "cos and sin of x's last two axes" in k.check(
        [v.aval for v in bad.invars], {})


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 4), st.sampled_from([1, 2, 4]), st.integers(1, 3), st.integers(1, 80),
       st.integers(1, 40), st.integers(0, 2**31 - 1))
def test_attention_matches_float64_reference(hk, reps, rows, n, e, seed):
    """Grouped-query heads, a boolean mask with some rows fully masked (zeros, as the
    reference), any scale."""
    rng = np.random.default_rng(seed)
    q, k, v = _rand(rng, hk * reps, rows, e), _rand(rng, hk, n, e), _rand(rng, hk, n, e)
    mask = rng.random((rows, n)) < 0.7
    mask[rng.random(rows) < 0.2] = False
    scale = float(rng.uniform(0.05, 1.0))
    got = nk.attention_f32(q, k, v, mask, has_mask=True, is_causal=False, scale=scale,
                           enable_gqa=True)
    want = attention64(q, k, v, mask, scale)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * max(1.0, np.abs(want).max()))


def _plant_plan(store, fn, args, median_s, backends=("numpy",)):
    """Record the heuristic NumPy plan of fn (weights bound) as a measured whole plan, under
    the planned graph's key and the traced graph's, as EXPLORE records its plans."""
    from tgx.planning import recipes
    from tgx.planning.heuristic import heuristic_assignment
    from tgx.planning.options import PlanOptions

    traced = tgx.make_graph(fn)(*args)
    g = tgx.simplify(traced)
    dims = {}
    inputs = [(list(a.shape), a.dtype.name) for a in args]
    options = PlanOptions(weights=(0,))
    impl = recipes.record_recipe(store, g, heuristic_assignment(g, ["numpy"]), dims, options,
                                 "planted")
    for key in (None, recipes.traced_key(traced, PlanOptions(), backends)):
        ghash, wkey = recipes.graph_keys(g, dims, key)
        store.add_workload(ghash, {}, inputs)
        store.add_trace(graph_hash=ghash, impl=impl, workload=wkey,
                        env_id=CostModel(store).env_id, status="PASSED", median_s=median_s)


@pytest.mark.parametrize("plan_s,lossy_chosen", [(1.0, True), (1e-12, False)])
def test_under_tolerance_a_measured_plan_competes_with_the_lossy_selection(
        tmp_path, weights, plan_s, lossy_chosen):
    """A measured whole plan is kept under a tolerance unless the selection holds weights in
    a lower precision and predicts less time than the plan took."""
    store = BenchmarkStore(tmp_path / "s.json")
    plant_kernel(store, _linear, weights, "numba-int8", 1e-6)
    _plant_plan(store, _linear, weights, plan_s)
    f = _compile(store, tolerance=5e-2)
    f(*weights)
    plan = f._plans[next(iter(f._plans))]
    assert any(k.lossy for k in plan.kernels) is lossy_chosen
    assert ("measured plan planted" in plan.policy) is not lossy_chosen


def _count_races(monkeypatch) -> list:
    """A list that gets an item each time a compile times a lossy selection whole."""
    from tgx import explore

    races = []
    race = explore.race_lossy
    monkeypatch.setattr("tgx.pipeline.race_lossy",
                        lambda *a, **kw: races.append(1) or race(*a, **kw))
    return races


def _int8_beside_a_planted_plan(tmp_path, weights, monkeypatch, rival_s):
    """(races, store, float64 `linear` of `weights`): a store with the int8 GEMV planted
    fast and the heuristic NumPy plan measured whole at `rival_s`, and a list counting the
    tolerance races (`_count_races`)."""
    races = _count_races(monkeypatch)
    store = BenchmarkStore(tmp_path / "s.json")
    plant_kernel(store, _linear, weights, "numba-int8", 1e-12)
    _plant_plan(store, _linear, weights, rival_s)
    w, x = weights
    return races, store, x.astype(np.float64) @ w.T.astype(np.float64)


@pytest.mark.parametrize("rival_s", [1e-7, 1.0])
def test_a_lossy_selection_priced_below_a_measured_plan_is_timed_whole_once(
        tmp_path, weights, monkeypatch, rival_s):
    """Under a tolerance the selection holding weights in a lower precision is priced by the
    cost model, which misprices whole plans (an 18-layer prefill's bf16 selection: priced
    159 ms, ran 280 ms, against 243 ms for the measured jax plan). Priced below the fastest
    plan measured whole, it is timed whole on the first call, once (recorded), and FASTEST
    takes the faster by measurement. A plan measured so is never taken without a tolerance.
    (No plan call takes 0.1 us: the rival planted at 1e-7 s is faster than any measurement.)"""
    from tgx.planning import fastest

    races, store, want = _int8_beside_a_planted_plan(tmp_path, weights, monkeypatch, rival_s)
    w, x = weights
    for _ in range(2):   # the second compile finds the lossy plan measured: no race
        f = _compile(store, tolerance=5e-2)
        y = f(w, x)
        plan = f._plans[next(iter(f._plans))]
        assert races == [1]
        assert any(k.lossy for k in plan.kernels) is (rival_s == 1.0)
        assert ("measured plan" in plan.policy)
        np.testing.assert_allclose(y, want, rtol=0, atol=5e-2 * np.abs(want).max())
    assert fastest.unraced_rival(plan.assignment, plan.assignment.graph, plan.options, store,
                                 {}) is None
    exact = _compile(store)
    np.testing.assert_allclose(exact(w, x), want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
    plan = exact._plans[next(iter(exact._plans))]
    assert all(k.lossy is None for k in plan.kernels)


def test_once_raced_under_a_tolerance_a_compile_skips_the_stages(tmp_path, weights,
                                                                   monkeypatch):
    """After the race, a compile with the same tolerance takes the fastest measured plan from
    the graph as traced, as FASTEST does without one (no simplify, patterns, fuse or
    selection: ~2 s of an 18-layer prefill's every compile); another tolerance plans
    through the stages, where no lossy plan is trusted on another tolerance's check."""
    import tgx.pipeline

    races, store, want = _int8_beside_a_planted_plan(tmp_path, weights, monkeypatch, 1.0)
    w, x = weights
    f = _compile(store, tolerance=5e-2)
    f(w, x)
    assert races == [1]
    staged = []
    real = tgx.pipeline.graph_stages
    monkeypatch.setattr(tgx.pipeline, "graph_stages",
                        lambda *a, **kw: staged.append(1) or real(*a, **kw))
    f = _compile(store, tolerance=5e-2)
    np.testing.assert_allclose(f(w, x), want, rtol=0, atol=5e-2 * np.abs(want).max())
    plan = f._plans[next(iter(f._plans))]
    assert not staged and "found from the traced graph" in plan.policy
    assert any(k.lossy for k in plan.kernels) and "(tolerance 0.05)" in plan.policy
    other = _compile(store, tolerance=4e-2)
    other(w, x)
    assert staged and races == [1]


def test_a_raced_lossy_plan_whose_kernel_changed_is_planned_again(tmp_path, weights,
                                                                   monkeypatch):
    """After an upgrade changed the lossy kernel, the plan raced under the tolerance no
    longer loads: the compile plans through the stages again instead of taking the fastest
    plan that still loads (the float32 one) from the graph as traced."""
    import tgx.pipeline
    import tgx.planning.assignment as assignment
    from tgx.serialize import SerializationError

    races, store, _ = _int8_beside_a_planted_plan(tmp_path, weights, monkeypatch, 1.0)
    w, x = weights
    _compile(store, tolerance=5e-2)(w, x)
    assert races == [1]
    real_find = assignment._find_kernel

    def changed(name, variant, source_hash, **kw):
        if "int8" in variant:
            raise SerializationError(f"kernel {name}[{variant}] changed since the plan was "
                                     "stored")
        return real_find(name, variant, source_hash, **kw)

    monkeypatch.setattr(assignment, "_find_kernel", changed)
    staged = []
    real = tgx.pipeline.graph_stages
    monkeypatch.setattr(tgx.pipeline, "graph_stages",
                        lambda *a, **kw: staged.append(1) or real(*a, **kw))
    f = _compile(store, tolerance=5e-2)
    f(w, x)
    assert staged and "found from the traced graph" not in f._plans[next(iter(f._plans))].policy


def test_a_lossy_selection_failing_its_whole_plan_check_is_not_raced_again(
        tmp_path, weights, monkeypatch):
    """int8 weights (~1e-2 of the scale) miss a 4e-3 tolerance on the whole plan: the race
    records the failure, FASTEST keeps the measured plan, and a later compile does not time
    the failing selection again."""
    races, store, want = _int8_beside_a_planted_plan(tmp_path, weights, monkeypatch, 1.0)
    w, x = weights
    for _ in range(2):
        f = _compile(store, tolerance=4e-3)
        y = f(w, x)
        plan = f._plans[next(iter(f._plans))]
        assert races == [1]
        assert all(k.lossy is None for k in plan.kernels)
        assert "measured plan planted" in plan.policy
        np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


def test_the_race_judges_a_lossy_plan_as_the_first_call_does(tmp_path, weights,
                                                              monkeypatch):
    """tanh of an int8 GEMV misses 5e-2 of the output's scale (0.067) while every element
    is within the race's float32 allowance (relative too): the race records it failed, so
    the first call runs the measured plan instead of a lossy plan it would reject and
    plan again."""
    fn = lambda w, x: tnp.tanh(tnn.linear(x, w))  # noqa: E731
    races = _count_races(monkeypatch)
    store = BenchmarkStore(tmp_path / "s.json")
    plant_kernel(store, fn, weights, "numba-int8", 1e-12)
    _plant_plan(store, fn, weights, 1.0)
    f = tgx.compile(fn, weights="w", backends=["numpy"], store=store, tolerance=5e-2)
    w, x = weights
    np.testing.assert_allclose(f(w, x), np.tanh(x.astype(np.float64) @ w.T.astype(np.float64)),
                               rtol=1e-5, atol=1e-5)
    plan = f._plans[next(iter(f._plans))]
    assert races == [1] and "measured plan planted" in plan.policy
    assert plan.precision is None   # no lossy plan was run and rejected
    failed = [r for r in store.traces() if r["status"] == "INCORRECT_NUMERICAL"]
    assert failed and "exceeds the tolerance 0.05" in failed[0]["log"]


def test_the_lossy_selection_on_each_backend_is_raced_too(tmp_path, weights, monkeypatch):
    """The selection over every backend is priced by per-kernel figures and modelled
    transfers, so the race also times the lossy selection on each single backend: here the
    int8 GEMV with `exp` planted fast on torch (the selection over both; torch's GEMV
    planted slow) and the int8 GEMV with NumPy's `exp` planted slow (NumPy's own). Both
    are recorded, FASTEST runs the faster as measured, and a later compile races
    nothing."""
    pytest.importorskip("torch")
    from tgx.planning import recipes

    fn = lambda w, x: tnp.exp(tnn.linear(x, w))  # noqa: E731
    races = _count_races(monkeypatch)
    store = BenchmarkStore(tmp_path / "s.json")
    plant_kernel(store, fn, weights, "numba-int8", 1e-12)
    plant_kernel(store, fn, weights, "default", 1e-13, name="exp", backend="torch")
    for name, variants in (("linear", ["library", "out"]), ("dot_general", ["default", "out"])):
        for variant in variants:   # torch's GEMV, whole or decomposed
            plant_kernel(store, _linear, weights, variant, 0.05, name=name, backend="torch",
                         decomposed=name == "dot_general")
    for variant in ("default", "out"):
        plant_kernel(store, fn, weights, variant, 0.1, name="exp", backend="numpy")
    _plant_plan(store, fn, weights, 10.0, ("numpy", "torch"))  # (a switch to torch: ~8 ms)
    w, x = weights[0] * 0.05, weights[1]   # exp's arguments near 0: int8's error stays small
    want = np.exp(x.astype(np.float64) @ w.T.astype(np.float64))
    for _ in range(2):
        f = tgx.compile(fn, weights="w", backends=["numpy", "torch"], store=store,
                        tolerance=5e-2)
        np.testing.assert_allclose(f(w, x), want, rtol=0, atol=5e-2 * np.abs(want).max())
        assert races == [1]
    plan = f._plans[next(iter(f._plans))]
    measured = {m.label: m.median_s for m in recipes.measured_plans(
        plan.source_graph, ["numpy", "torch"], store, plan.dims, options=plan.options)}
    assert {"tolerance selection (tolerance 0.05)",
            "tolerance numpy selected (tolerance 0.05)"} <= set(measured)
    fastest = min(measured, key=measured.get)
    assert fastest != "planted" and f"measured plan {fastest}:" in plan.policy
    assert any(k.lossy for k in plan.kernels) and plan.precision.kept


def test_a_hand_written_x_at_w_transposed_gets_the_same_kernels(tmp_path, weights):
    """`x @ w.T` written by hand simplifies to a dot_general: the generated GEMVs serve it,
    its weight held in int8 like a `linear`'s."""
    store = BenchmarkStore(tmp_path / "s.json")
    fn = lambda w, x: x @ w.T  # noqa: E731
    plant_kernel(store, fn, weights, "numba-int8", name="dot_general")
    f = tgx.compile(fn, weights="w", backends=["numpy"], store=store, tolerance=5e-2)
    w, x = weights
    y = f(w, x)
    plan = f._plans[next(iter(f._plans))]
    assert [repr(k) for k in plan.kernels] == ["dot_general[numba-int8]@numpy"]
    assert plan.precision.kept and plan.precision.held[0][1] == "int8"
    q, scale = nk.to_int8(w)
    want = x.astype(np.float64) @ (q * scale[:, None].astype(np.float64)).T
    _close(y, want, w.shape[1])


@settings(max_examples=30, deadline=None)
@given(st.lists(st.booleans(), min_size=1, max_size=12))
def test_overlapping_holds_of_the_blas_cap_restore_once(steps):
    """Plans running at once (threads) share the cap: whatever the interleaving of holds and
    releases, BLAS stays capped while any hold is open and is restored by the last release."""
    from tgx.backends.threads import (
        blas_threads,
        hold_one_blas_thread,
        release_blas_threads,
        set_blas_threads,
    )

    before = blas_threads()
    open_ = 0
    try:
        for hold in steps + [False] * len(steps):
            if hold:
                hold_one_blas_thread()
                open_ += 1
            elif open_:
                release_blas_threads()
                open_ -= 1
            assert blas_threads() == (before if not open_ else [1] * len(before))
    finally:
        for _ in range(open_):
            release_blas_threads()
        set_blas_threads(before)
