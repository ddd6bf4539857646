"""torch's pattern kernels (`tgx.backends.torch_patterns`): the CUDA source compiles with nvcc
(on any machine with nvcc), the torch expression matches float64, and on a GPU the CUDA
kernel runs inside a compiled plan and matches float64 (marked `cuda`)."""

from __future__ import annotations

import shutil
import subprocess

import hypothesis.strategies as st
import numpy as np
import pytest
from hypothesis import given, settings

import tgx
import tgx.nn as tnn
from tgx.backends import torch_patterns as TP

torch = pytest.importorskip("torch")
HAS_CUDA = torch.cuda.is_available()


def ref(x, h, w, eps, plus):
    h = h.astype(np.float64)
    y = h / np.sqrt(np.mean(h * h, -1, keepdims=True) + eps) * (w.astype(np.float64) + plus)
    return y if x is None else x + y


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
def test_cuda_source_compiles_with_nvcc(tmp_path):
    out = tmp_path / "rms_norm.ptx"
    run = subprocess.run(["nvcc", "--ptx", "-arch=sm_80", "-O3", "-o", str(out),
                          str(TP.SOURCE)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    ptx = out.read_text()
    assert ".entry tgx_residual_rms_norm_f32" in ptx
    assert "shfl.sync.down" in ptx          # the warp-shuffle reduction


@settings(max_examples=20, deadline=None)
@given(rows=st.lists(st.integers(1, 6), max_size=2).map(tuple), d=st.integers(1, 50),
       eps=st.sampled_from([1e-6, 1e-5]), seed=st.integers(0, 2**16))
def test_torch_expression_matches_float64(rows, d, eps, seed):
    rng = np.random.default_rng(seed)
    x, h = (rng.standard_normal((*rows, d)).astype(np.float32) for _ in range(2))
    w = rng.standard_normal(d).astype(np.float32)
    t = torch.from_numpy
    tol = dict(rtol=2e-5, atol=2e-5)
    np.testing.assert_allclose(TP.rms_norm_1p(t(h), t(w), eps=eps).numpy(),
                               ref(None, h, w, eps, 1.0), **tol)
    np.testing.assert_allclose(TP.residual_rms_norm(t(x), t(h), t(w), eps=eps).numpy(),
                               ref(x, h, w, eps, 0.0), **tol)
    np.testing.assert_allclose(TP.residual_rms_norm_1p(t(x), t(h), t(w), eps=eps).numpy(),
                               ref(x, h, w, eps, 1.0), **tol)


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="no CUDA device")
@pytest.mark.parametrize("d", [1, 31, 640, 1024, 2500])
def test_cuda_kernel_matches_float64(d):
    rng = np.random.default_rng(d)
    x, h = (rng.standard_normal((3, 5, d)).astype(np.float32) for _ in range(2))
    w = rng.standard_normal(d).astype(np.float32)
    c = lambda a: torch.from_numpy(a).cuda()   # noqa: E731
    before = TP.CUDA_CALLS[0]
    got = TP.residual_rms_norm_1p(c(x), c(h), c(w), eps=1e-6).cpu().numpy()
    assert TP.CUDA_CALLS[0] == before + 1
    np.testing.assert_allclose(got, ref(x, h, w, 1e-6, 1.0), rtol=1e-5, atol=1e-5)
    got = TP.rms_norm_1p(c(h), c(w), eps=1e-5).cpu().numpy()
    np.testing.assert_allclose(got, ref(None, h, w, 1e-5, 1.0), rtol=1e-5, atol=1e-5)


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="no CUDA device")
def test_cuda_kernel_runs_in_a_gpu_plan():
    def block(x, h, w):
        return x + tnn.rms_norm(h, (h.shape[-1],), 1.0 + w, 1e-6)
    rng = np.random.default_rng(0)
    x, h = (rng.standard_normal((4, 640)).astype(np.float32) for _ in range(2))
    w = rng.standard_normal(640).astype(np.float32)
    f = tgx.compile(block, device="cuda:0", backends=["torch"])
    before = TP.CUDA_CALLS[0]
    np.testing.assert_allclose(f(x, h, w), ref(x, h, w, 1e-6, 1.0), rtol=1e-5, atol=1e-5)
    assert TP.CUDA_CALLS[0] > before
    assert [k.name for k in f.lower(x, h, w).kernels if k.pattern is not None] == \
        ["residual_rms_norm_1p"]
