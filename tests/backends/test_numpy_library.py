"""The NumPy library kernels' edge cases, against torch (an independent implementation).

`numpy_sdpa` (and its variant with numba's softmax loop) shifts the scores by the maximum
of the whole array rather than of each row (a reduction over short rows is slow in NumPy),
and computes again the rows whose sum comes out tiny: those are checked here, rows far below
the others, rows with every key masked, a NaN, float and causal masks, grouped-query heads.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tgx.backends.numba_kernels import HAVE_NUMBA
from tgx.backends.numpy_library import numpy_sdpa

torch = pytest.importorskip("torch")

KERNELS = [numpy_sdpa]
if HAVE_NUMBA:   # the products by BLAS, the softmax by numba's loop
    from tgx.backends.numba_patterns import numba_softmax_sdpa
    KERNELS.append(numba_softmax_sdpa)


def _torch_sdpa(q, k, v, mask, is_causal, scale):
    """torch's attention in float64; a row with every key masked gives zeros (as tgx's)."""
    t = lambda a: torch.from_numpy(np.asarray(a, np.float64))
    q, k, v = t(q), t(k), t(v)
    reps = q.shape[-3] // k.shape[-3]
    k, v = k.repeat_interleave(reps, -3), v.repeat_interleave(reps, -3)
    s = q @ k.transpose(-1, -2) * scale
    L, S = s.shape[-2:]
    if is_causal:
        s = s.masked_fill(~torch.ones(L, S, dtype=torch.bool).tril(), -torch.inf)
    if mask is not None:
        m = torch.from_numpy(mask)
        s = s.masked_fill(~m, -torch.inf) if m.dtype == torch.bool else s + m.double()
    p = torch.softmax(s, -1).nan_to_num(0.0) if not torch.isnan(s).any() else torch.softmax(s, -1)
    return (p @ v).numpy()


@pytest.mark.parametrize("sdpa", KERNELS, ids=lambda f: f.__name__)
@settings(max_examples=40, deadline=None)
@given(heads=st.sampled_from([(2, 2), (4, 2), (4, 1)]), L=st.integers(1, 9),
       S=st.integers(1, 9), kind=st.sampled_from(["none", "bool", "float", "causal"]),
       far_row=st.booleans(), dead_row=st.booleans(), seed=st.integers(0, 2**16))
def test_sdpa_matches_torch_with_rows_far_below_and_rows_masked(sdpa, heads, L, S, kind,
                                                                 far_row, dead_row, seed):
    rng = np.random.default_rng(seed)
    hq, hk = heads
    q = rng.standard_normal((hq, L, 8)).astype(np.float32)
    k = rng.standard_normal((hk, S, 8)).astype(np.float32)
    v = rng.standard_normal((hk, S, 8)).astype(np.float32)
    if far_row:  # one query whose scores are all ~300 below the others: exp underflows
        q[0, 0] = -q[0, 0] * 0 - 40.0
        k[:, :, :] += 1.0
    mask = None
    if kind in ("bool", "float"):
        b = rng.random((L, S)) < 0.7
        if dead_row:
            b[0] = False
        mask = b if kind == "bool" else np.where(b, 0.0, -np.inf).astype(np.float32)
    got = sdpa(q, k, v, *([mask] if mask is not None else []), has_mask=mask is not None,
                     is_causal=kind == "causal", scale=0.35, enable_gqa=hq != hk)
    want = _torch_sdpa(q, k, v, mask, kind == "causal", 0.35)
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("sdpa", KERNELS, ids=lambda f: f.__name__)
def test_sdpa_a_nan_score_gives_nan_in_its_row_only(sdpa):
    rng = np.random.default_rng(0)
    q = rng.standard_normal((2, 4, 8)).astype(np.float32)
    k = rng.standard_normal((2, 5, 8)).astype(np.float32)
    v = rng.standard_normal((2, 5, 8)).astype(np.float32)
    q[1, 2, 0] = np.nan
    got = sdpa(q, k, v, has_mask=False, is_causal=False, scale=0.5, enable_gqa=False)
    want = _torch_sdpa(q, k, v, None, False, 0.5)
    assert np.isnan(got[1, 2]).all() and not np.isnan(np.delete(got.reshape(8, 8), 6, 0)).any()
    np.testing.assert_allclose(np.nan_to_num(got, nan=7.0), np.nan_to_num(want, nan=7.0),
                               rtol=2e-5, atol=2e-5)
