"""tgx's numba pattern kernels (`tgx.backends.numba_patterns`): each against a float64 NumPy
reference over shapes (hypothesis), found in a Gemma decoder layer that never names them, and
run inside a compiled plan."""

from __future__ import annotations

import importlib.util
import pathlib
import sys
from collections import Counter

import hypothesis.strategies as st
import numpy as np
import pytest
from hypothesis import given, settings

import tgx
import tgx.nn as tnn
import tgx.numpy as tnp
from tgx.planning import fastest
from tgx.planning.cost_model import CostModel, Estimate
from tgx.planning.kernel_patterns import match_patterns, pattern_name

pytestmark = pytest.mark.skipif(importlib.util.find_spec("numba") is None,
                                reason="numba is not installed")

from tgx.backends import numba_patterns as NP  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[2]


def rms64(h, w, eps):
    h = h.astype(np.float64)
    return h / np.sqrt(np.mean(h * h, -1, keepdims=True) + eps) * w


def gelu64(a):
    a = a.astype(np.float64)
    return 0.5 * a * (1 + np.tanh(np.sqrt(2 / np.pi) * (a + 0.044715 * a ** 3)))


shapes = st.lists(st.integers(1, 9), min_size=0, max_size=2).map(tuple)


@settings(max_examples=25, deadline=None)
@given(rows=shapes, d=st.integers(1, 70), eps=st.sampled_from([1e-6, 1e-5, 0.1]),
       seed=st.integers(0, 2**16))
def test_norm_kernels_match_float64(rows, d, eps, seed):
    rng = np.random.default_rng(seed)
    x, h = (rng.standard_normal((*rows, d)).astype(np.float32) for _ in range(2))
    w = rng.standard_normal(d).astype(np.float32)
    tol = dict(rtol=2e-5, atol=2e-5)
    np.testing.assert_allclose(NP.rms_norm_1p(h, w, eps=eps), rms64(h, 1.0 + w, eps), **tol)
    np.testing.assert_allclose(NP.residual_rms_norm(x, h, w, eps=eps), x + rms64(h, w, eps),
                               **tol)
    np.testing.assert_allclose(NP.residual_rms_norm_1p(x, h, w, eps=eps),
                               x + rms64(h, 1.0 + w, eps), **tol)


@settings(max_examples=25, deadline=None)
@given(shape=st.lists(st.integers(1, 40), min_size=1, max_size=3).map(tuple),
       scale=st.sampled_from([0.1, 1.0, 4.0, 30.0]), seed=st.integers(0, 2**16))
def test_gelu_gate_matches_float64_everywhere_tanh_saturates_or_not(shape, scale, seed):
    rng = np.random.default_rng(seed)
    a = (rng.standard_normal(shape) * scale).astype(np.float32)
    b = rng.standard_normal(shape).astype(np.float32)
    want = gelu64(a) * b
    got = NP.gelu_tanh_gate(a, b)
    assert got.dtype == np.float32 and got.shape == shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * max(1.0, np.abs(want).max()))


def _gemma():
    spec = importlib.util.spec_from_file_location("gemma3_example", ROOT / "examples/gemma3.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("gemma3_example", mod)
    spec.loader.exec_module(mod)
    return mod


def test_found_in_gemma_decoder_layers_that_never_name_them():
    G = _gemma()
    cfg = G.Config(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                   num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                   sliding_window=8)
    params = G.random_params(cfg)
    g = tgx.make_graph(lambda p, t: G.gemma3(p, t, cfg))(params, tgx.Spec((5,), "int64"))
    names = Counter(pattern_name(e) for e in match_patterns(tgx.simplify(g), ["numpy"]).eqns)
    # per layer: 2 residual adds of a normalised branch; input, q, k and pre-MLP norms; a gate
    assert names["residual_rms_norm_1p"] == 2 * 2
    assert names["rms_norm_1p"] == 2 * 4 + 1           # + the final norm
    assert names["gelu_tanh_gate"] == 2


class Prices(CostModel):
    def kernel(self, eqn, kernel, dims):
        return Estimate(1e-7 if kernel.pattern is not None else 1e-5, "measured", "planted")

    def transfer(self, aval, src, dst, dims):
        return Estimate(0.0 if src == dst else 1.0, "cost model")


def test_in_a_compiled_block_against_float64(monkeypatch):
    monkeypatch.setattr(fastest, "CostModel", lambda *a, **k: Prices())

    def block(x, wn, wo, wg, wu, eps=1e-5):   # Gemma's MLP half of a decoder layer
        h = tnn.rms_norm(x, (x.shape[-1],), 1.0 + wn, eps)
        gate = tnn.gelu(tnn.linear(h, wg), approximate="tanh") * tnn.linear(h, wu)
        return x + tnn.rms_norm(gate, (gate.shape[-1],), 1.0 + wo, eps)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 16)).astype(np.float32)
    wn, wo = (rng.standard_normal(16).astype(np.float32) * 0.1 for _ in range(2))
    wg, wu = (rng.standard_normal((16, 16)).astype(np.float32) * 0.3 for _ in range(2))
    plan = tgx.compile(block, backends=["numpy"], store=None).lower(x, wn, wo, wg, wu)
    assert {k.name for k in plan.kernels if k.pattern is not None} == \
        {"rms_norm_1p", "gelu_tanh_gate", "residual_rms_norm_1p"}
    h = rms64(x, 1.0 + wn, 1e-5)
    gate = gelu64(h @ wg.T) * (h @ wu.T)
    np.testing.assert_allclose(plan(x, wn, wo, wg, wu), x + rms64(gate, 1.0 + wo, 1e-5),
                               rtol=1e-4, atol=1e-4)


def softmax64(s, mask, scale):
    z = np.where(mask, s.astype(np.float64) * scale, -np.inf)
    with np.errstate(invalid="ignore"):
        e = np.exp(z - z.max(-1, keepdims=True))
        return e / e.sum(-1, keepdims=True)          # a fully masked row: NaN


@settings(max_examples=25, deadline=None)
@given(lead=st.lists(st.integers(1, 3), max_size=2).map(tuple), rows=st.integers(1, 6),
       n=st.integers(1, 40), full_mask=st.booleans(), seed=st.integers(0, 2**16))
def test_masked_softmax_matches_float64(lead, rows, n, full_mask, seed):
    rng = np.random.default_rng(seed)
    s = rng.standard_normal((*lead, rows, n)).astype(np.float32) * 4
    mask = rng.random((*lead, rows, n) if full_mask else (rows, n)) < 0.7
    got = NP.scaled_masked_softmax(s, mask, np.float32(0.3))
    np.testing.assert_allclose(got, softmax64(s, mask, 0.3), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(NP.masked_softmax(s, mask), softmax64(s, mask, 1.0), rtol=1e-5,
                               atol=1e-6)


def test_hand_written_attention_gets_the_softmax_kernel(monkeypatch):
    monkeypatch.setattr(fastest, "CostModel", lambda *a, **k: Prices())

    def attn(q, k, v, mask):
        s = q @ k.swapaxes(-1, -2)
        return tnn.softmax(tnp.where(mask, s * 0.25, -np.inf), axis=-1) @ v
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((2, 5, 16)).astype(np.float32) for _ in range(3))
    mask = np.tril(np.ones((5, 5), bool))
    plan = tgx.compile(attn, backends=["numpy"], store=None).lower(q, k, v, mask)
    assert "scaled_masked_softmax" in [kk.name for kk in plan.kernels]
    s = q.astype(np.float64) @ k.swapaxes(-1, -2)
    np.testing.assert_allclose(plan(q, k, v, mask), softmax64(s, mask, 0.25) @ v, rtol=1e-5,
                               atol=1e-6)
