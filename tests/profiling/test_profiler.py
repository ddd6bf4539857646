"""The profiler: timing stability, batching, accuracy/ULP, statuses, isolation, store."""

import io
import os
import time

import ml_dtypes
import numpy as np
import pytest

from tgx.profiling import (
    Progress, accuracy, golden, golden_inputs, measure, profile, profile_many,
    progress_enabled, summarize, ulp_spacing,
)
from tgx.profiling.pending import pending_jobs, refused_record
from tgx.store import BenchmarkStore, Status

# ---------------------------------------------------------------- candidate kernels
# Module level, so an isolated child process can import them by name.


def ref_scale(x):
    return x * 2.0


def good_scale(x):
    return x * np.float32(2.0)


def wrong_scale(x):
    return x * np.float32(2.0) + np.float32(1e-2)


def raising_scale(x):
    raise ValueError("kernel exploded on purpose")


def hanging_scale(x):
    time.sleep(1e6)


def crashing_scale(x):
    os.abort()


def slow_scale(x):
    time.sleep(0.002)
    return x * np.float32(2.0)


def naive_softmax(x):
    e = np.exp(x)  # no max subtraction: overflows at large inputs
    return e / e.sum(axis=-1, keepdims=True)


def stable_softmax(x):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


X = np.linspace(-1, 1, 64, dtype=np.float32)
FAST = {"budget_s": 0.05, "warmup": 1}

# ---------------------------------------------------------------- timing


def test_measure_known_sleep_is_accurate_and_stable():
    t = measure(time.sleep, (0.002,), budget_s=0.5)
    # The OS may oversleep on a loaded 2-core CI machine: bound loosely, but per call.
    assert 0.002 <= t.median_s < 0.004, t
    assert t.min_s <= t.median_s and t.samples >= 5 and t.batch == 1
    assert t.spread < 0.5, t
    assert t.total_s >= 0.002 * (t.samples + 3)


def test_measure_batches_a_fast_function():
    calls = []
    t = measure(lambda: calls.append(1), budget_s=0.1)
    assert t.batch > 1
    assert len(calls) >= t.samples * t.batch  # every sample really ran `batch` calls
    assert t.median_s < 5e-6, t  # per call, not per loop


def test_measure_respects_min_and_max_repeats():
    assert measure(lambda: None, min_repeats=12, rel_tol=10.0).samples == 12
    assert measure(time.sleep, (1e-4,), max_repeats=3, rel_tol=0.0).samples == 3


def test_measure_stops_at_the_budget():
    # each sample sleeps >= 20 ms, so a 0.1 s budget allows at most ~5 (more only if
    # `measure` ignored the budget; a loaded machine gives fewer, never more)
    t = measure(time.sleep, (0.02,), budget_s=0.1, rel_tol=0.0, warmup=1)
    assert 1 <= t.samples <= 7


def test_measure_warms_up_for_warmup_s_before_timing():
    calls = []

    def f():
        calls.append(time.perf_counter())
        time.sleep(1e-3)

    start = time.perf_counter()
    t = measure(f, warmup=1, warmup_s=0.05, budget_s=0.01, rel_tol=10.0, min_repeats=1)
    untimed = len(calls) - t.samples
    assert calls[untimed - 1] - start >= 0.04  # calls went on until warmup_s had passed
    assert untimed > 1


def test_measure_syncs_every_unbatched_call():
    seen = []
    t = measure(lambda: time.sleep(1e-4) or 7, sync=seen.append, warmup=2, max_repeats=4,
                rel_tol=0.0)
    assert seen == [7] * (2 + t.samples)


def test_cold_l2_is_a_noop_with_a_note_on_cpu():
    import sys

    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        pytest.skip("CPU-only behaviour")
    t = measure(lambda: None, cold_l2=True, budget_s=0.02)
    assert "cold_l2 ignored" in t.note

# ---------------------------------------------------------------- accuracy


def _one_ulp_up(a):
    if a.dtype == ml_dtypes.bfloat16:  # +1 on the bit pattern = one step away from zero
        return (a.view(np.uint16) + np.uint16(1)).view(ml_dtypes.bfloat16)
    return np.nextafter(a, np.copysign(np.inf, a).astype(a.dtype))


@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16, np.float16])
def test_ulp_error_exact_and_one_ulp(rng, dtype):
    x = rng.standard_normal(256).astype(dtype)
    ref = golden_inputs((x,))[0]
    exact = accuracy(x, ref)
    assert exact.status == Status.PASSED and exact.ulp_err == 0 and exact.max_abs_err == 0
    off = accuracy(_one_ulp_up(x), ref)
    assert off.ulp_err == 1.0, off
    assert off.max_abs_err > 0


def test_one_ulp_down_across_a_power_of_two_is_one_ulp():
    x = np.float32([1.0, 2.0, 0.5])
    below = np.nextafter(x, np.float32(0))
    assert accuracy(below, x.astype(np.float64)).ulp_err == 1.0


def test_ulp_spacing_matches_numpy(rng):
    for dt in (np.float32, np.float16, np.float64):
        x = np.concatenate([rng.standard_normal(100) * 1e3, [0.0, 1e-40, 6e-8]]).astype(dt)
        assert np.array_equal(ulp_spacing(x.astype(np.float64), dt),
                              np.spacing(np.abs(x)).astype(np.float64))
    assert ulp_spacing(np.array([1.0]), ml_dtypes.bfloat16)[0] == 2.0**-7


def test_golden_inputs_keep_the_rounded_values():
    x = np.float16([0.1, 1 / 3])
    g = golden_inputs((x, 3, [np.float32(0.1)]))
    assert g[0].dtype == np.float64 and np.array_equal(g[0], x.astype(np.float64))
    assert g[0][0] != 0.1  # the f16-rounded value, not the decimal
    assert g[1] == 3 and g[2][0].dtype == np.float64
    assert golden(ref_scale, (x,)).dtype == np.float64


def test_nan_in_a_different_place_fails_same_place_passes():
    ref = np.array([1.0, np.nan, np.inf])
    same = accuracy(np.float32([1.0, np.nan, np.inf]), ref)
    assert same.status == Status.PASSED and not same.nonfinite_mismatch
    moved = accuracy(np.float32([np.nan, 1.0, np.inf]), ref)
    assert moved.status == Status.INCORRECT_NUMERICAL and moved.nonfinite_mismatch
    assert "non-finite" in moved.message
    sign = accuracy(np.float32([1.0, np.nan, -np.inf]), ref)
    assert sign.nonfinite_mismatch


def test_shape_and_structure_mismatch():
    assert accuracy(np.zeros((2, 3), np.float32), np.zeros((3, 2))).status == \
        Status.INCORRECT_SHAPE
    assert accuracy((np.zeros(2),), (np.zeros(2), np.zeros(2))).status == \
        Status.INCORRECT_SHAPE


def test_default_tolerances_per_dtype():
    ref = np.ones(4)
    assert accuracy(np.float32([1 + 5e-5] * 4), ref).passed  # f32 rtol 1e-4
    assert not accuracy(np.float32([1 + 5e-4] * 4), ref).passed
    assert accuracy(np.float32([1 + 5e-4] * 4), ref, rtol=1e-3).passed
    assert accuracy(np.float16([1.005] * 4), ref).passed  # f16 rtol 1e-2
    assert not accuracy(np.float64([1 + 1e-8] * 4), ref).passed  # f64 rtol 1e-9
    assert not accuracy(np.int32([1, 1, 1, 2]), ref).passed  # ints: exact


@pytest.mark.parametrize("chunk", [3, 64, 1 << 15])
@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16, np.float16])
def test_errors_compared_in_chunks_are_those_of_the_whole_arrays(monkeypatch, chunk, dtype):
    """`accuracy` compares large outputs a chunk at a time: the figures and the worst element
    it reports are those computed over the whole arrays at once."""
    import sys

    monkeypatch.setattr(sys.modules["tgx.profiling.accuracy"], "CHUNK", chunk)
    rng = np.random.default_rng(chunk)
    for _ in range(40):
        n = int(rng.integers(1, 300))
        g = rng.standard_normal(n) * 10.0 ** rng.integers(-3, 4, n)
        g[rng.integers(0, n)] = 0.0
        a = (g * (1 + rng.standard_normal(n) * 10.0 ** rng.integers(-6, -1))).astype(dtype)
        at, rt = 1e-3, 1e-2
        got = accuracy(a, g, atol=at, rtol=rt)
        a64 = a.astype(np.float64)
        diff = np.abs(a64 - g)
        big = np.abs(g) > max(at, 1e-3 * np.abs(g).max())
        ref = np.minimum(np.abs(a64), np.abs(g.astype(dtype).astype(np.float64)))
        assert got.max_abs_err == diff.max()
        assert got.max_rel_err == ((diff[big] / np.abs(g[big])).max() if big.any() else 0.0)
        assert got.ulp_err == (diff / ulp_spacing(ref, dtype)).max()
        over = diff > at + rt * np.abs(g)
        assert got.passed == (not over.any())
        if over.any():
            j = int(np.argmax(diff - (at + rt * np.abs(g))))
            assert f"{int(over.sum())} elements outside" in got.message
            assert f"worst got {a64[j]!r} expected {g[j]!r}" in got.message

# ---------------------------------------------------------------- statuses


def test_statuses_in_process():
    ok = profile(good_scale, (X,), golden=ref_scale, **FAST)
    assert ok["status"] == "PASSED" and ok["median_s"] > 0 and ok["samples"] >= 1
    assert ok["ulp_err"] == 0
    wrong = profile(wrong_scale, (X,), golden=ref_scale, **FAST)
    assert wrong["status"] == "INCORRECT_NUMERICAL"
    assert wrong["max_abs_err"] == pytest.approx(1e-2, rel=1e-3)
    assert wrong["median_s"] is None  # not timed
    boom = profile(raising_scale, (X,), golden=ref_scale, **FAST)
    assert boom["status"] == "RUNTIME_ERROR"
    assert "kernel exploded on purpose" in boom["log"] and "Traceback" in boom["log"]
    shape = profile(lambda x: x[:-1], (X,), golden=ref_scale, **FAST)
    assert shape["status"] == "INCORRECT_SHAPE"


def test_naive_softmax_at_large_inputs_is_incorrect():
    x = np.array([[1e4, -1e4, 0.0, 1e4 - 1]], np.float32)
    rec = profile(naive_softmax, (x,), golden=stable_softmax, **FAST)
    assert rec["status"] == "INCORRECT_NUMERICAL"
    assert "non-finite" in rec["log"]
    assert profile(stable_softmax, (x,), golden=stable_softmax, **FAST)["status"] == "PASSED"


def test_isolated_hang_times_out_and_the_sweep_goes_on():
    recs = profile_many([(hanging_scale, (X,)), (good_scale, (X,))], golden=ref_scale,
                        isolate=True, timeout_s=2, progress=False, **FAST)
    assert [r["status"] for r in recs] == ["TIMEOUT", "PASSED"]
    assert "timeout" in recs[0]["log"]
    assert recs[1]["median_s"] > 0


def test_isolated_crash_is_a_runtime_error():
    rec = profile(crashing_scale, (X,), golden=ref_scale, isolate=True, timeout_s=20, **FAST)
    assert rec["status"] == "RUNTIME_ERROR"
    assert "SIGABRT" in rec["log"]


def test_isolation_needs_an_importable_function():
    from tgx.profiling import ProfilingError

    with pytest.raises(ProfilingError, match="importable"):
        profile(lambda x: x, (X,), isolate=True)

# ---------------------------------------------------------------- store


def test_traces_land_in_the_store_and_best_is_the_fastest_passed(tmp_path):
    with BenchmarkStore(tmp_path / "store.json") as st:
        recs = profile_many([(slow_scale, (X,)), (good_scale, (X,)), (wrong_scale, (X,)),
                             (raising_scale, (X,))], store=st, golden=ref_scale,
                            progress=False, batch_size=3, **FAST)
        assert len(st.traces()) == 4
        g, w, e = recs[0]["graph_hash"], recs[0]["workload"], recs[0]["env_id"]
        assert {r["graph_hash"] for r in recs} == {g}  # same golden, same graph
        best = st.best(g, w, e)
        assert best["impl"].endswith(":good_scale")
        assert best["median_s"] < st.measured(g, recs[0]["impl"], w, e)["median_s"]
        statuses = {t["impl"].rpartition(":")[2]: t["status"] for t in st.traces()}
        assert statuses == {"slow_scale": "PASSED", "good_scale": "PASSED",
                            "wrong_scale": "INCORRECT_NUMERICAL",
                            "raising_scale": "RUNTIME_ERROR"}
        assert st.get_workload(w)["inputs"] == [((64,), "float32")]
    text = summarize(recs)
    assert "PASSED 2" in text and "good_scale" in text


def test_pending_implementations_are_profiled_once(tmp_path):
    with BenchmarkStore(tmp_path / "s.json") as st:
        w = st.add_workload("g-scale", {"N": 8}, [((8,), "float32")])
        st.add_implementation("KERNEL", "good", "numpy", "h1", requirements={
            "pending": True, "entry": f"{__name__}:good_scale", "graph_hash": "g-scale",
            "golden": f"{__name__}:ref_scale", "workloads": [w]})
        st.add_implementation("KERNEL", "other", "numpy", "h2")  # not pending
        jobs = pending_jobs(st, "env-test")
        # the row names code to import: refused, never run (docs/store.md: a row is data),
        # and recorded, so it is not tried again
        assert len(jobs) == 1 and jobs[0]["refuse"] == [f"{__name__}:good_scale",
                                                        f"{__name__}:ref_scale"]
        recs = [refused_record(jobs[0], "env-test")]
        st.add_traces(recs)
        assert [r["status"] for r in recs] == ["RUNTIME_ERROR"]
        assert recs[0]["log"].startswith("refused:")
        assert pending_jobs(st, "env-test") == []


def test_progress_bar_only_on_a_tty_unless_forced(monkeypatch):
    monkeypatch.delenv("TGX_PROGRESS", raising=False)
    assert not progress_enabled(stream=io.StringIO())
    assert progress_enabled(True, io.StringIO())
    monkeypatch.setenv("TGX_PROGRESS", "1")
    assert progress_enabled(stream=io.StringIO())
    out = io.StringIO()
    p = Progress(3, stream=out)
    for _ in range(3):
        p.update("job")
    p.close()
    assert "3/3" in out.getvalue() and "#" * 30 in out.getvalue()


def test_relative_error_ignores_elements_near_a_zero_crossing():
    # an output of magnitude 1 computed in float32 carries ~1e-8 absolute error everywhere,
    # also on an element that is ~0 through cancellation (x - y with x ≈ y): its relative
    # error is meaningless and is judged by the absolute error instead (REL_FLOOR)
    golden = np.array([1.0, -0.5, 2e-6, 1e-5, 0.25])
    got = (golden + 1e-8).astype(np.float32)
    acc = accuracy(got, golden)
    assert acc.passed
    naive = float((np.abs(got - golden) / np.abs(golden))[np.abs(golden) > 1e-6].max())
    assert acc.max_rel_err < 1e-6 < 1e-3 < naive
    # a real relative error on the large elements is still reported
    bad = golden.astype(np.float32) * np.float32(1.01)
    assert accuracy(bad, golden).max_rel_err == pytest.approx(0.01, rel=1e-3)


def test_a_correct_float32_linear_with_a_wide_weight_passes(tmp_path):
    """The absolute tolerance near zero grows with the contraction length, which for a
    linear is x's last axis (640 here), not the ratio of the largest input to the output
    (5 here): that ratio failed every correct float32 kernel of a Gemma head."""
    import tgx
    import tgx.nn as tnn
    from tgx.backends.registry import kernels_for
    from tgx.planning.cost_model import CostModel
    from tgx.profiling.pending import profile_kernel
    from tgx.store import BenchmarkStore

    g = tgx.make_graph(lambda x, w: tnn.linear(x, w))(tgx.Spec((128, 640)),
                                                      tgx.Spec((8192, 640)))
    store = BenchmarkStore(tmp_path / "s.json")
    k = next(k for k in kernels_for("linear", "numpy") if k.variant == "library")
    rec = profile_kernel(g.eqns[0], k, {}, store, CostModel(store), budget_s=0.01)
    assert rec["status"] == "PASSED", rec["log"]
