"""Attention kernels skip the trailing keys the mask hides from every query (a KV cache's
unfilled positions): the result is the float64 reference's, on NumPy, numba and torch."""

from __future__ import annotations

import numpy as np
import pytest

from tgx.backends.numpy_library import numpy_sdpa, trim_masked_keys


def reference(q, k, v, mask, scale):
    q, k, v = (a.astype(np.float64) for a in (q, k, v))
    reps = q.shape[-3] // k.shape[-3]
    k, v = np.repeat(k, reps, axis=-3), np.repeat(v, reps, axis=-3)
    s = np.where(mask, q @ np.swapaxes(k, -1, -2) * scale, -np.inf)
    w = np.exp(s - s.max(-1, keepdims=True))
    return (w / w.sum(-1, keepdims=True)) @ v


def cache_case(rows: int, valid: int, t_max: int = 256, seed: int = 0):
    """q (4 heads, rows, 32) against a (1 head, t_max, 32) cache of which `valid` positions
    are filled; the mask causal over them (rows at positions valid - rows .. valid - 1)."""
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((4, rows, 32)).astype(np.float32)
    k, v = (rng.standard_normal((1, t_max, 32)).astype(np.float32) for _ in range(2))
    q_pos = np.arange(valid - rows, valid)[:, None]
    mask = np.arange(t_max)[None, :] <= q_pos
    return q, k, v, mask


@pytest.mark.parametrize("rows,valid", [(1, 129), (128, 128), (3, 250), (2, 256)])
def test_trimmed_attention_matches_float64(rows, valid):
    q, k, v, mask = cache_case(rows, valid)
    kt, vt, mt = trim_masked_keys(k, v, mask)
    assert kt.shape[-2] == (valid if valid <= 256 - 16 else 256) == mt.shape[-1]
    want = reference(q, k, v, mask, 0.125)
    kw = dict(has_mask=True, is_causal=False, scale=0.125, enable_gqa=True)
    np.testing.assert_allclose(numpy_sdpa(q, k, v, mask, **kw), want, rtol=1e-5, atol=1e-5)
    from tgx.backends import numba_kernels as NK
    if NK.HAVE_NUMBA:
        np.testing.assert_allclose(NK.attention_f32(q, k, v, mask, **kw), want, rtol=1e-5,
                                   atol=1e-5)
    torch = pytest.importorskip("torch")
    from tgx.backends.torch_backend import _composite_table

    sdpa = _composite_table()["scaled_dot_product_attention"][0]
    got = sdpa(*map(torch.from_numpy, (q, k, v, mask)), **kw)
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=1e-5)


def test_nothing_is_trimmed_where_no_key_is_visible_or_the_mask_is_not_boolean():
    q, k, v, mask = cache_case(2, 100)
    none = np.zeros_like(mask)
    assert trim_masked_keys(k, v, none)[0] is k
    additive = np.where(mask, 0.0, -np.inf).astype(np.float32)
    assert trim_masked_keys(k, v, additive)[0] is k
    assert trim_masked_keys(k[:, :32], v[:, :32], mask[:, :32])[0].shape[-2] == 32  # short
