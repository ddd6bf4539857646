"""torch's select with a +0.0 branch as a bit mask (`select_zero_cpu`): bit for bit
`np.where`, special values included, through the compiled kernels and the helper."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")

import tgx  # noqa: E402
import tgx.numpy as tnp  # noqa: E402
from tgx.backends.torch_backend import select_zero_cpu  # noqa: E402

SPECIAL = [np.nan, np.inf, -np.inf, -0.0, 0.0, 1e-45, -3.5]


def _bits(a: np.ndarray) -> np.ndarray:
    return a.view(np.int32 if a.dtype == np.float32 else np.int64)


@settings(max_examples=40, deadline=None)
@given(rows=st.integers(1, 96), cols=st.sampled_from([1, 64, 130]),
       dtype=st.sampled_from([np.float32, np.float64]), zero_true=st.booleans(),
       seed=st.integers(0, 2**16))
def test_select_with_a_zero_branch_is_where_bit_for_bit(rows, cols, dtype, zero_true, seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, cols)).astype(dtype)
    x.flat[:len(SPECIAL)] = SPECIAL[:x.size]
    pred = rng.random((rows, cols)) > 0.5
    zero = np.zeros((), dtype)
    args = (pred, zero, x) if zero_true else (pred, x, zero)
    want = np.where(*args)
    got = select_zero_cpu(*(torch.from_numpy(np.asarray(a)) for a in args))
    if x.size < 4096:
        assert got is None    # small arrays keep torch.where
    else:
        np.testing.assert_array_equal(_bits(got.numpy()), _bits(want))


def test_other_scalars_keep_where():
    x = torch.ones(64, 64)
    pred = torch.ones(64, 64, dtype=torch.bool)
    for s in (-0.0, 1.0, float("nan")):
        assert select_zero_cpu(pred, x, torch.tensor(s)) is None


def test_compiled_relu_gradient_matches_numpy():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((128, 512)).astype(np.float32)
    g = rng.standard_normal((128, 512)).astype(np.float32)
    g[0, :3] = [np.nan, np.inf, -np.inf]
    f = tgx.compile(lambda x, g: tnp.where(x > 0, g, 0.0), backends=["torch"],
                    policy="heuristic")
    got = np.asarray(f(x, g))
    np.testing.assert_array_equal(_bits(got), _bits(np.where(x > 0, g, np.float32(0))))
