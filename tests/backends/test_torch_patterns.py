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

from .adam_steps import check_adam_step_against_torch_optim

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


@pytest.mark.parametrize("policy", ["heuristic", "fastest"])
def test_a_norm_returned_by_a_torch_plan_matches_float64(policy):
    """A pattern kernel whose result is the plan's own (not a workspace view) gets a fresh
    array per call and its wildcard params only: Gemma's norm as a function's result failed
    on torch with `rms_norm_1p() got an unexpected keyword argument 'graph'`."""
    rng = np.random.default_rng(0)
    h = rng.standard_normal((8, 64)).astype(np.float32)
    w = rng.standard_normal(64).astype(np.float32)
    f = tgx.compile(lambda h, w: tnn.rms_norm(h, (64,), 1.0 + w, 1e-6), backends=["torch"],
                    policy=policy, store=None)
    np.testing.assert_allclose(f(h, w), ref(None, h, w, 1e-6, 1.0), rtol=2e-5, atol=2e-5)
    assert any("rms_norm_1p" in i.label for i in f.lower(h, w).compiled.instructions)


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


# -- Adam's update: torch's fused kernel --------------------------------------------------------
B1, B2, EPS = 0.9, 0.999, 1e-8


def adam_scalars(t: int, lr: float = 1e-3):
    """nss and bc2 as `tgx.optim.adam` computes them in float32 at count t."""
    t32 = np.float32(t)
    nss = np.float32(-(np.float32(lr) / -np.expm1(t32 * np.float32(np.log(B1)))))
    bc2 = np.sqrt(-np.expm1(t32 * np.float32(np.log(B2))), dtype=np.float32)
    return nss, bc2


def adam64(p, g, m, v, nss, bc2, c1, b2, c2, eps, dr=0.0):
    p, g, m, v = (x.astype(np.float64) for x in (p, g, m, v))
    m2 = m + float(c1) * (g - m)
    v2 = v * float(b2) + float(c2) * g * g
    return p + (float(nss) * (m2 / (np.sqrt(v2) / float(bc2) + float(eps))) - float(dr) * p), \
        m2, v2


@settings(max_examples=25, deadline=None)
@given(shape=st.lists(st.integers(1, 7), min_size=1, max_size=3).map(tuple),
       t=st.sampled_from([1, 2, 3, 10, 1000, 30000]), in_place=st.booleans(),
       adam=st.booleans(), decay=st.sampled_from([0.0, 1e-4, 0.05]),
       seed=st.integers(0, 2**16))
def test_adam_update_matches_float64(shape, t, in_place, adam, decay, seed):
    """The fused kernels (torch's Adam constants; AdamW's with a decay) and the fallback
    (constants no Adam has: b2 + c2 != 1) compute the pattern, into given buffers or fresh
    ones."""
    rng = np.random.default_rng(seed)
    p, g, m = (rng.standard_normal(shape).astype(np.float32) for _ in range(3))
    v = np.abs(rng.standard_normal(shape)).astype(np.float32) * 1e-2
    nss, bc2 = adam_scalars(t)
    consts = [np.float32(x) for x in ((1 - B1, B2, 1 - B2, EPS) if adam else (0.3, 0.5, 0.2, 1e-3))]
    dr = np.float32(decay)
    want = adam64(p, g, m, v, nss, bc2, *consts, dr)
    tp, tg, tm, tv = (torch.from_numpy(x.copy()) for x in (p, g, m, v))
    if len(shape) == 2:   # a transposed gradient (not contiguous) takes the fused kernel too
        tg = torch.from_numpy(np.ascontiguousarray(g.T)).T
    outs = {0: tp, 1: tm, 2: tv} if in_place else None
    scalars = [torch.tensor(x) for x in (nss, bc2, *consts)]
    got = (TP.adamw_update(tp, tg, tm, tv, *scalars, torch.tensor(dr), outs=outs) if decay
           else TP.adam_update(tp, tg, tm, tv, *scalars, outs=outs))
    for a, b, name in zip(got, want, "pmv"):
        np.testing.assert_allclose(a.numpy(), b, rtol=1e-6, atol=1e-6 * np.abs(b).max(),
                                   err_msg=name)
    # the update itself (p' - p) to float32's precision of its own size
    du, dw = got[0].numpy().astype(np.float64) - p, want[0] - p
    assert np.abs(du - dw).max() <= 1e-5 * np.abs(dw).max() + 1e-7 * np.abs(p).max()
    assert (got[0] is tp) == in_place and (got[0].data_ptr() == tp.data_ptr()) == in_place


def test_fused_adam_args_only_for_adam_constants():
    nss, bc2 = adam_scalars(5)
    ok = TP._fused_adam_args(float(nss), float(bc2), *map(float, np.float32(
        [1 - B1, B2, 1 - B2, EPS])))
    assert ok is not None and abs(ok["step"] - 5) < 1e-3 and ok["beta1"] == pytest.approx(B1)
    assert TP._fused_adam_args(float(nss), float(bc2), 0.1, 0.5, 0.2, 1e-8) is None  # b2+c2
    assert TP._fused_adam_args(float(nss), float(bc2), 1.5, B2, 1 - B2, 1e-8) is None


@pytest.mark.parametrize("kind", ["adam", "adamw"])
def test_adam_step_on_torch_uses_the_fused_kernel_and_matches_torch_optim(kind):
    """A compiled Adam (AdamW) step on torch runs one `adam_update` (`adamw_update`) per
    parameter, written into the caller's state arrays, and follows `torch.optim.Adam`
    (`AdamW`) step for step."""
    check_adam_step_against_torch_optim(kind, ["torch"], "fused")


def gelu_tanh64(x):
    x = x.astype(np.float64)
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))


@settings(max_examples=20, deadline=None)
@given(shape=st.lists(st.integers(1, 9), min_size=1, max_size=3).map(tuple),
       big=st.booleans(), scale=st.sampled_from([1.0, 10.0, 1e4]),
       seed=st.integers(0, 2**16))
def test_gelu_tanh_on_the_cpu_matches_float64(shape, big, scale, seed):
    """torch's tanh GELU as `x sigmoid(2z)` (the composite's kernel and the gate pattern;
    `big`: above the size where it takes over from `F.gelu`)."""
    from tgx.backends.torch_patterns import gelu_tanh_cpu

    if big:
        shape = (*shape[:-1], 40000 // int(np.prod(shape[:-1])) + 1)
        assert int(np.prod(shape)) >= 32768
    rng = np.random.default_rng(seed)
    a, b = ((rng.standard_normal(shape) * scale).astype(np.float32) for _ in range(2))
    tol = dict(rtol=1e-6, atol=1e-6 * scale)
    np.testing.assert_allclose(gelu_tanh_cpu(torch.from_numpy(a)).numpy(), gelu_tanh64(a), **tol)
    np.testing.assert_allclose(TP.gelu_tanh_gate(torch.from_numpy(a), torch.from_numpy(b)).numpy(),
                               gelu_tanh64(a) * b, rtol=2e-6, atol=2e-6 * scale * scale)


def test_gelu_tanh_on_the_cpu_keeps_the_edges():
    from tgx.backends.torch_patterns import gelu_tanh_cpu

    x = torch.tensor([-np.inf, -1e20, -30.0, -1e-30, 0.0, 1e20, np.inf, np.nan]).repeat(5000)
    want = torch.nn.functional.gelu(x, approximate="tanh")
    np.testing.assert_array_equal(gelu_tanh_cpu(x).numpy(), want.numpy())


@settings(max_examples=15, deadline=None)
@given(lead=st.lists(st.integers(1, 5), min_size=1, max_size=2).map(tuple),
       k=st.integers(1, 40), n=st.integers(1, 40), bias=st.booleans(), seed=st.integers(0, 99))
def test_linear_out_matches_float64(lead, k, n, bias, seed):
    """`linear[out]` on torch: `x @ w.T (+ b)` written into the plan's buffer."""
    from tgx.backends.torch_backend import torch_linear_out

    rng = np.random.default_rng(seed)
    x = rng.standard_normal((*lead, k)).astype(np.float32)
    w = rng.standard_normal((n, k)).astype(np.float32)
    b = [rng.standard_normal(n).astype(np.float32)] if bias else []
    out = torch.empty((*lead, n))
    got = torch_linear_out(*map(torch.from_numpy, (x, w, *b)), out=out)
    assert got is out
    want = x.astype(np.float64) @ w.T.astype(np.float64) + (b[0] if bias else 0)
    np.testing.assert_allclose(out.numpy(), want, rtol=1e-5, atol=1e-5 * np.sqrt(k))


# (x shape, y shape, dimension_numbers): matmuls, rank-3 activations against a weight,
# weight gradients contracting two axes, batched heads, transposed operands
DOT_CASES = [
    ((5, 3), (3, 4), (((1,), (0,)), ((), ()))),
    ((2, 5, 3), (3, 4), (((2,), (0,)), ((), ()))),
    ((2, 5, 3), (4, 3), (((2,), (1,)), ((), ()))),
    ((2, 5, 3), (2, 5, 4), (((0, 1), (0, 1)), ((), ()))),
    ((3, 2, 5), (4, 2, 5), (((1, 2), (1, 2)), ((), ()))),
    ((6, 5, 3), (6, 3, 4), (((2,), (1,)), ((0,), (0,)))),
    ((6, 3, 5), (6, 4, 3), (((1,), (2,)), ((0,), (0,)))),
    ((2, 6, 5, 3), (2, 6, 3, 4), (((3,), (2,)), ((0, 1), (0, 1)))),
    ((5, 2, 3), (2, 3, 4), (((2,), (1,)), ((1,), (0,)))),
]


@pytest.mark.parametrize("xs,ys,dn", DOT_CASES)
def test_matmul_out_runs_every_contraction_into_the_buffer(xs, ys, dn):
    """`dot_general[out]` on torch writes any contracting dot_general into the plan's
    buffer, the layouts that are no matmul collapsed to one (weight gradients, rank-3
    activations): against NumPy's dot_general in float64."""
    from tgx.backends.registry import kernels_for
    from tgx.backends.torch_backend import torch_matmul_out

    rng = np.random.default_rng(len(xs) * 7 + len(ys))
    x, y = rng.standard_normal(xs).astype(np.float32), rng.standard_normal(ys).astype(np.float32)
    ref = next(k for k in kernels_for("dot_general", "numpy") if not k.writes_out).fn
    want = ref(x.astype(np.float64), y.astype(np.float64), dimension_numbers=dn)
    out = torch.empty(want.shape)
    got = torch_matmul_out(torch.from_numpy(x), torch.from_numpy(y), dimension_numbers=dn,
                           out=out)
    assert got is out
    np.testing.assert_allclose(out.numpy(), want, rtol=1e-5, atol=1e-5)
    strided = torch.empty(want.shape[::-1]).T if want.ndim == 2 else None  # not contiguous
    if strided is not None:
        torch_matmul_out(torch.from_numpy(x), torch.from_numpy(y), dimension_numbers=dn,
                         out=strided)
        np.testing.assert_allclose(strided.numpy(), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("approximate", ["tanh", "none"])
@pytest.mark.parametrize("n", [7, 40000])   # below / above where the tanh form takes over
def test_gelu_and_its_gradient_into_the_buffer(approximate, n):
    from scipy.special import erf

    from tgx.backends.torch_backend import torch_gelu_grad_out, torch_gelu_out

    rng = np.random.default_rng(n)
    x, ct = (rng.standard_normal(n).astype(np.float32) * 3 for _ in range(2))
    x64 = x.astype(np.float64)
    if approximate == "tanh":
        want = gelu_tanh64(x)
        u = np.sqrt(2 / np.pi) * (x64 + 0.044715 * x64 ** 3)
        du = np.sqrt(2 / np.pi) * (1 + 3 * 0.044715 * x64 ** 2)
        grad = 0.5 * (1 + np.tanh(u)) + 0.5 * x64 * (1 - np.tanh(u) ** 2) * du
    else:
        want = 0.5 * x64 * (1 + erf(x64 / np.sqrt(2)))
        grad = 0.5 * (1 + erf(x64 / np.sqrt(2))) + x64 * np.exp(-x64 ** 2 / 2) / np.sqrt(2 * np.pi)
    out = torch.empty(n)
    assert torch_gelu_out(torch.from_numpy(x), approximate=approximate, out=out) is out
    np.testing.assert_allclose(out.numpy(), want, rtol=1e-6, atol=3e-6)
    torch_gelu_grad_out(torch.from_numpy(ct), torch.from_numpy(x), approximate=approximate,
                        out=out)
    np.testing.assert_allclose(out.numpy(), ct * grad, rtol=1e-5, atol=1e-5)


def test_div_and_select_into_the_buffer_broadcast():
    from tgx.backends.torch_backend import torch_div_out, torch_select_out

    rng = np.random.default_rng(3)
    x = rng.standard_normal((4, 3, 5)).astype(np.float32)
    y = rng.uniform(0.5, 2, (3, 1)).astype(np.float32)
    out = torch.empty(4, 3, 5)
    torch_div_out(torch.from_numpy(x), torch.from_numpy(y), out=out)
    np.testing.assert_allclose(out.numpy(), x.astype(np.float64) / y, rtol=1e-6)
    pred = rng.random((3, 5)) > 0.5
    torch_select_out(torch.from_numpy(pred), torch.from_numpy(x), torch.tensor(-1.0),
                     out=out)
    np.testing.assert_array_equal(out.numpy(), np.where(pred, x, np.float32(-1.0)))


@pytest.mark.parametrize("rows", [1, 200])
def test_pattern_kernels_write_into_a_given_buffer(rows):
    """The torch pattern kernels are `writes_out`: with `out=` they fill the plan's buffer
    and compute what they return without it."""
    from tgx.backends.torch_backend import torch_rotary_out

    rng = np.random.default_rng(rows)
    t = lambda *s: torch.from_numpy(rng.standard_normal(s).astype(np.float32))  # noqa: E731
    x, h, w = t(rows, 640), t(rows, 640), t(640)
    a, b = t(rows, 2048), t(rows, 2048)
    cases = [(TP.rms_norm_1p, (h, w), {"eps": 1e-6}),
             (TP.residual_rms_norm, (x, h, w), {"eps": 1e-6}),
             (TP.residual_rms_norm_1p, (x, h, w), {"eps": 1e-5}),
             (TP.gelu_tanh_gate, (a, b), {})]
    for fn, args, kw in cases:
        want = fn(*args, **kw)
        out = torch.empty_like(want)
        assert fn(*args, **kw, out=out) is out
        np.testing.assert_allclose(out.numpy(), want.numpy(), rtol=1e-6, atol=1e-6)
    q, cos, sin = t(4, rows, 256), t(rows, 256), t(rows, 256)
    out = torch.empty(4, rows, 256)
    torch_rotary_out(q, cos, sin, out=out)
    q64 = q.double().numpy()
    rot = np.concatenate([-q64[..., 128:], q64[..., :128]], -1)
    np.testing.assert_allclose(out.numpy(), q64 * cos.numpy() + rot * sin.numpy(), rtol=1e-5,
                               atol=1e-5)
