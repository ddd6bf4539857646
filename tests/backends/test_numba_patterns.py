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
from tgx.transforms.decompose import decompose

pytestmark = pytest.mark.skipif(importlib.util.find_spec("numba") is None,
                                reason="numba is not installed")

from tgx.backends import numba_patterns as NP  # noqa: E402

from .adam_steps import check_adam_step_against_torch_optim  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[2]


def rms64(h, w, eps):
    h = h.astype(np.float64)
    return h / np.sqrt(np.mean(h * h, -1, keepdims=True) + eps) * w


def gelu64(a):
    a = a.astype(np.float64)
    return 0.5 * a * (1 + np.tanh(np.sqrt(2 / np.pi) * (a + 0.044715 * a ** 3)))


def sigmoid64(x):
    return 1 / (1 + np.exp(-x.astype(np.float64)))


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
@pytest.mark.parametrize("gate", ["gelu_tanh_gate", "silu_gate"])
def test_gates_match_float64_everywhere_the_nonlinearity_saturates_or_not(gate, shape, scale,
                                                                          seed):
    rng = np.random.default_rng(seed)
    a = (rng.standard_normal(shape) * scale).astype(np.float32)
    b = rng.standard_normal(shape).astype(np.float32)
    want = (gelu64(a) if gate == "gelu_tanh_gate" else a * sigmoid64(a)) * b
    got = getattr(NP, gate)(a, b)
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
    """Planted figures: pattern kernels take `pattern_s`, other kernels `other_s`."""

    def __init__(self, pattern_s=1e-7, other_s=1e-5):
        super().__init__()
        self.pattern_s, self.other_s = pattern_s, other_s

    def kernel(self, eqn, kernel, dims):
        return Estimate(self.pattern_s if kernel.pattern is not None else self.other_s,
                        "measured", "planted")

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
       n=st.integers(1, 40), full_mask=st.booleans(),
       scale=st.sampled_from([0.3, -0.3, 0.0, 2.0]), seed=st.integers(0, 2**16))
def test_masked_softmax_matches_float64(lead, rows, n, full_mask, scale, seed):
    rng = np.random.default_rng(seed)
    s = rng.standard_normal((*lead, rows, n)).astype(np.float32) * 4
    mask = rng.random((*lead, rows, n) if full_mask else (rows, n)) < 0.7
    got = NP.scaled_masked_softmax(s, mask, np.float32(scale))   # a negative scale: the
    want = softmax64(s, mask, np.float64(np.float32(scale)))     # row's minimum leads
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
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


def rope64(x, cos, sin):
    x = x.astype(np.float64)
    h = x.shape[-1] // 2
    return x * cos + np.concatenate([-x[..., h:], x[..., :h]], -1) * sin


@settings(max_examples=25, deadline=None)
@given(lead=st.lists(st.integers(1, 3), max_size=2).map(tuple), t=st.integers(1, 9),
       half=st.integers(1, 40), seed=st.integers(0, 2**16))
def test_rotary_emb_matches_float64(lead, t, half, seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((*lead, t, 2 * half)).astype(np.float32)
    cos, sin = (rng.standard_normal((t, 2 * half)).astype(np.float32) for _ in range(2))
    got = NP.rotary_emb(x, cos, sin)
    assert got.dtype == np.float32 and got.shape == x.shape
    np.testing.assert_allclose(got, rope64(x, cos, sin), rtol=1e-5, atol=1e-5)


def lstm64(xw, b_ih, hw, b_hh, c):
    z = (xw.astype(np.float64) + b_ih) + (hw + b_hh)
    i, f, g, o = np.split(z, 4, -1)
    c2 = sigmoid64(f) * c + sigmoid64(i) * np.tanh(g)
    return sigmoid64(o) * np.tanh(c2), c2


def gru64(xw, b_ih, hw, b_hh, h):
    ir, iz, in_ = np.split(xw.astype(np.float64) + b_ih, 3, -1)
    hr, hz, hn = np.split(hw.astype(np.float64) + b_hh, 3, -1)
    r, z = sigmoid64(ir + hr), sigmoid64(iz + hz)
    n = np.tanh(in_ + r * hn)
    return (1 - z) * n + z * h


@settings(max_examples=25, deadline=None)
@given(rows=st.integers(1, 9), hid=st.integers(1, 40), scale=st.sampled_from([0.1, 1.0, 8.0]),
       seed=st.integers(0, 2**16))
def test_cell_gates_match_float64(rows, hid, scale, seed):
    rng = np.random.default_rng(seed)

    def draw(*s):
        return (rng.standard_normal(s) * scale).astype(np.float32)
    xw, hw, b_ih, b_hh, c = draw(rows, 4 * hid), draw(rows, 4 * hid), draw(4 * hid), \
        draw(4 * hid), draw(rows, hid)
    tol = dict(rtol=1e-5, atol=2e-6 * max(1.0, scale))
    for got, want in zip(NP.lstm_gates(xw, b_ih, hw, b_hh, c), lstm64(xw, b_ih, hw, b_hh, c)):
        assert got.dtype == np.float32 and got.shape == (rows, hid)
        np.testing.assert_allclose(got, want, **tol)
    xw, hw, b_ih, b_hh = xw[:, :3 * hid], hw[:, :3 * hid], b_ih[:3 * hid], b_hh[:3 * hid]
    got = NP.gru_gates(xw, b_ih, hw, b_hh, c)
    assert got.dtype == np.float32 and got.shape == (rows, hid)
    np.testing.assert_allclose(got, gru64(xw, b_ih, hw, b_hh, c), **tol)


def test_rope_found_in_gemma_layers_once_apply_rotary_emb_is_decomposed():
    G = _gemma()
    cfg = G.Config(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                   num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                   sliding_window=8)
    g = tgx.make_graph(lambda p, t: G.gemma3(p, t, cfg))(G.random_params(cfg),
                                                        tgx.Spec((5,), "int64"))
    g = decompose(tgx.simplify(g), keep={"rms_norm", "gelu", "softmax"})
    assert "apply_rotary_emb" not in {e.primitive.name for e in g.eqns}
    names = Counter(pattern_name(e) for e in match_patterns(g, ["numpy"]).eqns)
    assert names["rotary_emb"] == 2 * 2                   # q and k of each layer


class CellPrices(Prices):
    """Planted figures: pattern kernels fast, the cells' and RoPE's own kernels slow (so the
    selection runs their decomposition, where the pattern kernels are)."""

    def kernel(self, eqn, kernel, dims):
        if eqn.primitive.name in ("lstm_cell", "gru_cell", "apply_rotary_emb"):
            return Estimate(1.0, "measured", "planted")
        return super().kernel(eqn, kernel, dims)


def test_models_that_never_name_them_get_gate_rope_and_cell_kernels(monkeypatch):
    monkeypatch.setattr(fastest, "CostModel", lambda *a, **k: CellPrices())
    rng = np.random.default_rng(0)

    def draw(*s):
        return rng.standard_normal(s).astype(np.float32)

    def compiled(fn, *args):
        plan = tgx.compile(fn, backends=["numpy"], store=False).lower(*args)
        return {k.name for k in plan.kernels if k.pattern is not None}, plan(*args)

    def swiglu(x, wg, wu):        # a Llama MLP's gate
        return tnn.silu(x @ wg) * (x @ wu)
    x, wg, wu = draw(3, 16), draw(16, 32), draw(16, 32)
    names, got = compiled(swiglu, x, wg, wu)
    assert names == {"silu_gate"}
    h = x.astype(np.float64) @ wg
    np.testing.assert_allclose(got, h * sigmoid64(h) * (x.astype(np.float64) @ wu),
                               rtol=1e-4, atol=1e-5)

    def hf_rope(q, cos, sin):     # HF's rotate_half, written out
        q1, q2 = q[..., :8], q[..., 8:]
        return q * cos + tnp.concatenate([-q2, q1], axis=-1) * sin
    q, cos, sin = draw(2, 4, 5, 16), draw(5, 16), draw(5, 16)
    for fn in (hf_rope, tnn.apply_rotary_emb):
        names, got = compiled(fn, q, cos, sin)
        assert names == {"rotary_emb"}
        np.testing.assert_allclose(got, rope64(q, cos, sin), rtol=1e-5, atol=1e-5)

    B, I, H = 3, 5, 7
    x, h, c = draw(B, I), draw(B, H), draw(B, H)
    w_ih, w_hh, b_ih, b_hh = draw(4 * H, I), draw(4 * H, H), draw(4 * H), draw(4 * H)
    names, (h2, c2) = compiled(lambda *a: tnn.lstm_cell(a[0], (a[1], a[2]), *a[3:]),
                               x, h, c, w_ih, w_hh, b_ih, b_hh)
    assert names == {"lstm_gates"}
    want = lstm64(x.astype(np.float64) @ w_ih.T, b_ih, h.astype(np.float64) @ w_hh.T, b_hh, c)
    np.testing.assert_allclose(h2, want[0], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(c2, want[1], rtol=1e-4, atol=1e-5)

    w_ih, w_hh, b_ih, b_hh = w_ih[:3 * H], w_hh[:3 * H], b_ih[:3 * H], b_hh[:3 * H]
    names, got = compiled(tnn.gru_cell, x, h, w_ih, w_hh, b_ih, b_hh)
    assert names == {"gru_gates"}
    np.testing.assert_allclose(got, gru64(x.astype(np.float64) @ w_ih.T, b_ih,
                                          h.astype(np.float64) @ w_hh.T, b_hh, h),
                               rtol=1e-4, atol=1e-5)


def test_a_gate_kernel_measured_slower_is_left_out(monkeypatch):
    monkeypatch.setattr(fastest, "CostModel", lambda *a, **k: Prices(1e-3, 1e-6))
    x = np.ones((3, 16), np.float32)
    plan = tgx.compile(lambda a, b: tnn.silu(a) * b, backends=["numpy"], store=False).lower(x, x)
    assert all(k.pattern is None for k in plan.kernels)
    np.testing.assert_allclose(plan(x, x), x * sigmoid64(x), rtol=1e-6)


def test_pattern_forms_are_traced_on_first_use_not_at_import():
    # a compile that loads a measured plan matches no pattern: importing the backends must
    # not trace the library's pattern forms (~0.25 s) nor import scipy (~0.2 s)
    import subprocess
    import sys

    code = ("import sys, tgx.backends.numpy_backend, tgx.backends.numba_patterns as p\n"
            "from tgx.backends.registry import all_kernels\n"
            "ks = [k for k in all_kernels() if k.name == 'rms_norm_1p']\n"
            "print(len(ks), p.pattern_forms.cache_info().currsize, 'scipy' in sys.modules)\n"
            "print(len(ks[0].forms) > 0, p.pattern_forms.cache_info().currsize)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.split("\n")
    assert out[0].split()[1:] == ["0", "False"] and int(out[0].split()[0]) > 0, out
    assert out[1] == "True 1", out


def _adam_ops(p, g, m, v, nss, bc2, c1, b2, c2, eps, dr=None):
    """The pattern op by op in NumPy, in the arrays' dtype (what the kernel must equal)."""
    m2 = m + c1 * (g - m)
    v2 = v * b2 + c2 * g * g
    u = nss * (m2 / (np.sqrt(v2) / bc2 + eps))
    return (p + u if dr is None else p + (u - dr * p)), m2, v2


@settings(max_examples=30, deadline=None)
@given(shape=st.lists(st.integers(1, 9), min_size=1, max_size=4).map(tuple),
       t=st.sampled_from([1, 2, 10, 30000]), decay=st.sampled_from([None, 0.0, 0.05]),
       dtype=st.sampled_from([np.float32, np.float64]), into=st.sampled_from(["fresh", "inputs",
                                                                               "others"]),
       transposed=st.booleans(), seed=st.integers(0, 2**16))
def test_adam_update_is_numpys_op_by_op_result_bit_for_bit(shape, t, decay, dtype, into,
                                                           transposed, seed):
    """numba's Adam (AdamW) step equals the pattern computed op by op in NumPy, bit for bit
    (no fastmath, the same order of operations), into fresh arrays, in place into its own
    inputs (a plan's state), or into other buffers; and matches float64 to float32's
    precision."""
    rng = np.random.default_rng(seed)
    p, g, m = (rng.standard_normal(shape).astype(dtype) for _ in range(3))
    v = (np.abs(rng.standard_normal(shape)) * 1e-2).astype(dtype)
    if transposed and len(shape) == 2:   # a transposed gradient: read through its strides
        g = np.ascontiguousarray(g.T).T
    lr, b1, b2 = 1e-3, 0.9, 0.999
    nss = dtype(-(lr / -np.expm1(t * np.log(b1))))
    bc2 = dtype(np.sqrt(-np.expm1(t * np.log(b2))))
    scalars = [np.asarray(x, dtype) for x in (nss, bc2, 1 - b1, b2, 1 - b2, 1e-8)]
    extra = [] if decay is None else [np.asarray(lr * decay, dtype)]
    want = _adam_ops(p, g, m, v, *scalars, *extra)
    p0 = p.copy()
    ins = [p, g, m, v]
    outs = None
    if into == "inputs":
        outs = {0: p, 1: m, 2: v}
    elif into == "others":
        outs = {i: np.empty(shape, dtype) for i in range(3)}
    fn = NP.adam_update if decay is None else NP.adamw_update
    got = fn(*ins, *scalars, *extra, outs=outs)
    for a, b, name in zip(got, want, "pmv"):
        assert a.dtype == dtype and a.shape == shape
        np.testing.assert_array_equal(a, b, err_msg=name)
    if outs is not None:
        assert all(got[i] is outs[i] for i in range(3))
    # float64: the update itself (p' - p) to float32's precision of its own size
    assert np.all(np.isfinite(got[0]))
    d64 = (got[0].astype(np.float64) - p0)
    ref = float(nss) * (want[1].astype(np.float64) / (np.sqrt(want[2].astype(np.float64))
                                                      / float(bc2) + 1e-8))
    if decay:
        ref = ref - lr * decay * p0
    assert np.abs(d64 - ref).max() <= 1e-5 * np.abs(ref).max() + 1e-6 * np.abs(p0).max()


@pytest.mark.parametrize("kind", ["adam", "adamw"])
def test_adam_step_on_numpy_uses_the_numba_kernel_and_matches_torch_optim(kind):
    """A compiled Adam (AdamW) step on NumPy runs one numba `adam_update` (`adamw_update`)
    per parameter, in place into the caller's state arrays, and follows `torch.optim.Adam`
    (`AdamW`) step for step."""
    pytest.importorskip("torch")
    check_adam_step_against_torch_optim(kind, ["numpy"], "numba")
