"""Attention for NumPy plans by torch's fused CPU kernel (`tgx.backends.torch_attention`):
against a float64 NumPy reference over shapes, grouped-query heads and masks (rows masked
whole included), `out=`, what its checker declines, and its place among the candidates."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tgx
import tgx.nn as tnn
from tgx.backends.registry import kernels_for

from .references import attention64

ta = pytest.importorskip("tgx.backends.torch_attention")
if not ta.available():
    pytest.skip("torch is not installed", allow_module_level=True)


def _rand(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 3), st.sampled_from([1, 2, 4]), st.integers(1, 70), st.integers(1, 90),
       st.integers(1, 40), st.sampled_from(["mask", "causal", "none"]), st.booleans(),
       st.integers(0, 2**31 - 1))
def test_attention_matches_float64_reference(hk, reps, rows, keys, dim, masking, batch, seed):
    rng = np.random.default_rng(seed)
    q, k, v = _rand(rng, hk * reps, rows, dim), _rand(rng, hk, keys, dim), _rand(rng, hk, keys,
                                                                                    dim)
    if batch:
        q, k, v = q[None], k[None], v[None]
    mask = None
    if masking == "mask":
        mask = rng.random((rows, keys)) < 0.6
        mask[rng.random(rows) < 0.2] = False   # rows that attend to nothing: zeros
    scale = float(rng.uniform(0.05, 1.0))
    causal = masking == "causal" and rows <= keys
    got = ta.attention(q, k, v, *([mask] if mask is not None else []),
                       has_mask=mask is not None, is_causal=causal, scale=scale,
                       enable_gqa=reps > 1)
    want = attention64(q, k, v, mask, scale, causal)
    assert got.dtype == np.float32 and got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * max(1.0, np.abs(want).max()))


def test_out_is_written_and_returned():
    rng = np.random.default_rng(0)
    q, k, v = _rand(rng, 4, 8, 16), _rand(rng, 1, 12, 16), _rand(rng, 1, 12, 16)
    mask = np.tril(np.ones((8, 12), bool), 4)
    out = np.full((4, 8, 16), np.nan, np.float32)
    got = ta.attention(q, k, v, mask, has_mask=True, is_causal=False, scale=0.25,
                       enable_gqa=True, out=out)
    assert got is out
    np.testing.assert_allclose(out, attention64(q, k, v, mask, 0.25), rtol=1e-4, atol=1e-5)


def test_checker_declines_what_it_cannot_run():
    kernel = next(k for k in kernels_for("scaled_dot_product_attention", "numpy")
                  if k.variant == "torch-sdpa")
    assert kernel.own_pool   # torch's OpenMP pool: BLAS capped beside it

    def why(*specs, **params):
        g = tgx.make_graph(lambda *xs: tnn.scaled_dot_product_attention(*xs, **params))(*specs)
        e = g.eqns[-1]
        return kernel.check([a.aval for a in e.invars], e.params)

    s = tgx.Spec((2, 8, 16))
    assert why(s, s, s) is None
    assert "float32" in why(*[tgx.Spec((2, 8, 16), "float64")] * 3)
    assert "rank" in why(tgx.Spec((8, 16)), tgx.Spec((8, 16)), tgx.Spec((8, 16)))
    assert "boolean" in why(s, s, s, tgx.Spec((8, 8)))


def test_it_serves_a_traced_grouped_query_attention():
    """Its checker admits a traced Gemma-shaped attention (4 query heads over one key/value
    head, a boolean mask) and the bound kernel gives the reference's result."""
    rng = np.random.default_rng(1)
    q, k, v = _rand(rng, 4, 16, 32), _rand(rng, 1, 24, 32), _rand(rng, 1, 24, 32)
    mask = np.tril(np.ones((16, 24), bool), 8)
    f = lambda q, k, v, m: tnn.scaled_dot_product_attention(  # noqa: E731
        q, k, v, m, scale=0.125, enable_gqa=True)
    g = tgx.make_graph(f)(q, k, v, mask)
    kernel = next(k for k in kernels_for("scaled_dot_product_attention", "numpy")
                  if k.variant == "torch-sdpa")
    e = g.eqns[-1]
    assert kernel.check([a.aval for a in e.invars], e.params) is None
    got = kernel.bind(e.params, None)(q, k, v, mask)
    np.testing.assert_allclose(got, attention64(q, k, v, mask, 0.125), rtol=1e-4, atol=1e-5)


def test_read_only_operands_are_read_without_a_warning():
    """A mask folded once per binding is read-only: torch warns on such arrays (its tensors
    are writable), so the kernel copies it."""
    import warnings

    rng = np.random.default_rng(2)
    q, k, v = _rand(rng, 2, 4, 8), _rand(rng, 2, 6, 8), _rand(rng, 2, 6, 8)
    mask = np.tril(np.ones((4, 6), bool), 2)
    for a in (q, k, v, mask):
        a.flags.writeable = False
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = ta.attention(q, k, v, mask, has_mask=True, is_causal=False, scale=0.3,
                           enable_gqa=False)
    np.testing.assert_allclose(got, attention64(q, k, v, mask, 0.3), rtol=1e-4, atol=1e-5)
