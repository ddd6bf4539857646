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


# -- `linear[held-t]`: the weight held transposed, once per bound array ----------------------

def _linear(w, x, b):
    import tgx.nn as tnn
    return tnn.linear(x, w, b)


def _held_t_plan(tmp_path, fn, args):
    import tgx
    from tgx.store import BenchmarkStore

    from .planted import plant_kernel
    store = BenchmarkStore(tmp_path / "s.json")
    plant_kernel(store, fn, args, "held-t")
    f = tgx.compile(fn, weights="w", backends=["numpy"], store=store)
    return f


@settings(max_examples=10, deadline=None)
@given(rows=st.sampled_from([(1,), (5,), (3, 4)]), k=st.integers(1, 40), n=st.integers(1, 40),
       dtype=st.sampled_from([np.float32, np.float64]))
def test_linear_held_t_matches_torch_and_follows_new_weights(tmp_path_factory, rows, k, n,
                                                             dtype):
    tmp_path = tmp_path_factory.mktemp("held")
    rng = np.random.default_rng(k * 41 + n)
    w, x, b = (rng.standard_normal(s).astype(dtype) for s in ((n, k), (*rows, k), (n,)))
    f = _held_t_plan(tmp_path, _linear, (w, x, b))
    plan = f.lower(w, x, b)
    assert [k.variant for k in plan.kernels if k is not None] == ["held-t"]
    tol = 1e-5 if dtype == np.float32 else 1e-12
    want = torch.nn.functional.linear(*(torch.from_numpy(a.astype(np.float64)) for a in (x, w, b)))
    np.testing.assert_allclose(f(w, x, b), want.numpy(), rtol=tol, atol=tol * k)
    cg = plan.compiled
    n_conv = cg.weight_conversions
    w2 = (w * -2).astype(dtype)        # a new weight array: held transposed again, once
    want2 = torch.nn.functional.linear(*(torch.from_numpy(a.astype(np.float64))
                                         for a in (x, w2, b)))
    for _ in range(2):
        np.testing.assert_allclose(f(w2, x, b), want2.numpy(), rtol=tol, atol=tol * k)
    assert cg.weight_conversions == n_conv + 1


def test_linear_held_t_is_not_offered_for_a_computed_weight(tmp_path):
    """`w * 2` is computed on every call: holding it transposed would copy it every call,
    which the kernel's measured time does not include."""
    rng = np.random.default_rng(0)
    w, x, b = (rng.standard_normal(s).astype(np.float32) for s in ((6, 4), (3, 4), (6,)))
    fn = lambda w, x, b: _linear(w * 2, x, b)  # noqa: E731
    f = _held_t_plan(tmp_path, fn, (w, x, b))
    np.testing.assert_allclose(f(w, x, b), x @ (2 * w).T + b, rtol=1e-5, atol=1e-5)
    assert all(k is None or k.variant != "held-t" for k in f.lower(w, x, b).kernels)
