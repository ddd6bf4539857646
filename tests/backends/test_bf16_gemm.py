"""The oneDNN bfloat16 GEMMs (`tgx.backends.bf16_gemm`): each against a float64 NumPy
reference within the error it promises, what its checker declines, and its choice by
`tgx.compile` only under a tolerance, with the weight held once and the path's error
measured."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tgx
import tgx.nn as tnn
from tgx.backends.registry import kernels_for
from tgx.planning.cost_model import CostModel
from tgx.store import BenchmarkStore

from .planted import plant_kernel

bg = pytest.importorskip("tgx.backends.bf16_gemm")
if not bg.available():
    pytest.skip("no torch, or no bfloat16 dot products on this CPU", allow_module_level=True)

# bfloat16 keeps 8 bits: inputs and the output each rounded to 2^-9 relative; over K terms
# of N(0, 1) values the error stays well under a few 2^-9 of the output's scale
BF16_OF_SCALE = 8 * 2.0 ** -9


def _rand(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


def _check(got, want):
    scale = float(np.max(np.abs(want)))
    assert got.dtype == np.float32 and got.shape == want.shape
    err = float(np.max(np.abs(got - want))) / scale
    assert err < BF16_OF_SCALE < bg.LOSSY
    return err


@settings(max_examples=25, deadline=None)
@given(st.tuples(st.integers(bg.MAX_ROWS + 1, 96), st.integers(1, 300), st.integers(1, 150),
                 st.booleans(), st.booleans(), st.integers(0, 2**31 - 1)))
def test_linear_matches_float64_reference(case):
    m, k, n, bias, three_d, seed = case
    rng = np.random.default_rng(seed)
    x, w = _rand(rng, m, k), _rand(rng, n, k)
    b = (_rand(rng, n),) if bias else ()
    want = x.astype(np.float64) @ w.T.astype(np.float64) + (b[0] if bias else 0.0)
    xs = x.reshape(1, m, k) if three_d else x
    got = bg.linear_bf16(xs, bg.to_bf16_bits(w), *b)
    _check(got.reshape(m, n), want)


def test_out_is_written_and_returned():
    rng = np.random.default_rng(0)
    x, w = _rand(rng, 32, 40), _rand(rng, 24, 40)
    out = np.full((32, 24), np.nan, np.float32)
    got = bg.dot_bf16(x, bg.to_bf16_bits(w), dimension_numbers=bg._XWT, out=out)
    assert got is out
    _check(out, x.astype(np.float64) @ w.T.astype(np.float64))


def test_checker_declines_few_rows_and_other_dtypes():
    (k,) = [k for k in kernels_for("linear", "numpy") if k.variant == "onednn-bf16"]
    params = {}

    def why(xs, ws, dtype="float32"):
        return k.check([tgx.ShapedArray(xs, np.dtype(dtype)), tgx.ShapedArray(ws, np.dtype(dtype))],
                       params)

    assert "numba GEMVs" in why((1, 64), (32, 64))          # decode: the GEMV loops
    assert "float32 only" in why((64, 64), (32, 64), "float64")
    assert why((64, 64), (32, 64)) is None
    assert why(("S", 64), (32, 64)) is None                   # a symbolic number of rows


# -- planning: chosen only under a tolerance, the weight held once --------------------------

def _linear(w, x):
    return tnn.linear(x, w)


def test_chosen_only_under_tolerance_with_the_weight_held_once(tmp_path):
    rng = np.random.default_rng(1)
    w, x = _rand(rng, 96, 64), _rand(rng, 48, 64)
    store = BenchmarkStore(tmp_path / "s.json")
    plant_kernel(store, _linear, (w, x), "onednn-bf16")
    want = x.astype(np.float64) @ w.T.astype(np.float64)

    f = tgx.compile(_linear, weights="w", backends=["numpy"], store=store)
    np.testing.assert_allclose(f(w, x), want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
    plan = f.lower(w, x)
    assert all(k.lossy is None for k in plan.kernels) and plan.precision is None

    g = tgx.compile(_linear, weights="w", backends=["numpy"], store=store, tolerance=2e-2)
    y = g(w, x)
    plan = g.lower(w, x)
    assert [k.variant for k in plan.kernels] == ["onednn-bf16"]
    rep = plan.precision
    assert rep.kept and rep.held == (("w", "bf16", "linear[onednn-bf16]@numpy"),)
    assert rep.error == pytest.approx(_check(y, want), rel=1e-3)
    n = plan.compiled.weight_conversions
    for _ in range(3):
        g(w, x + 1)
    assert plan.compiled.weight_conversions == n    # the same array: not converted again


def test_a_tolerance_tighter_than_bfloat16_keeps_float32(tmp_path):
    rng = np.random.default_rng(2)
    w, x = _rand(rng, 96, 64), _rand(rng, 48, 64)
    store = BenchmarkStore(tmp_path / "s.json")
    plant_kernel(store, _linear, (w, x), "onednn-bf16")
    f = tgx.compile(_linear, weights="w", backends=["numpy"], store=store, tolerance=1e-5)
    y = f(w, x)
    plan = f.lower(w, x)
    assert all(k.lossy is None for k in plan.kernels)
    assert plan.precision is not None and not plan.precision.kept
    want = x.astype(np.float64) @ w.T.astype(np.float64)
    np.testing.assert_allclose(y, want, rtol=0, atol=1e-5 * np.abs(want).max())


def test_profiled_within_the_error_it_promises(tmp_path):
    from tgx.profiling.pending import profile_kernel

    g = tgx.make_graph(_linear)(tgx.Spec((64, 64)), tgx.Spec((300, 64)))
    store = BenchmarkStore(tmp_path / "s.json")
    k = next(k for k in kernels_for("linear", "numpy") if k.variant == "onednn-bf16")
    rec = profile_kernel(g.eqns[0], k, {}, store, CostModel(store), budget_s=0.01)
    assert rec["status"] == "PASSED", rec
    assert 0 < rec["max_abs_err"]


def test_read_only_operands_are_read_without_a_warning():
    """Weights memory-mapped from safetensors are read-only, and torch warns on such arrays
    (its tensors are writable): a read-only activation or bias is copied, not warned about."""
    import warnings

    rng = np.random.default_rng(3)
    x, w, b = _rand(rng, 32, 40), _rand(rng, 24, 40), _rand(rng, 24)
    for a in (x, b):
        a.flags.writeable = False
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = bg.linear_bf16(x, bg.to_bf16_bits(w), b)
    _check(got, x.astype(np.float64) @ w.T.astype(np.float64) + b)
