"""Triton kernels generated from fused regions (`tgx.backends.triton_codegen`): without a GPU,
(a) the generated source run by Triton's interpreter on CPU torch tensors against float64
(hypothesis over shapes: elementwise chains, broadcast operands, row reductions), and (b)
every generated kernel compiled ahead of time to PTX for a CUDA target; on a GPU (marked
`cuda`), the kernel inside a compiled torch plan against float64."""

from __future__ import annotations

import importlib.util

import hypothesis.strategies as st
import numpy as np
import pytest
from hypothesis import given, settings

import tgx
import tgx.numpy as tnp
from tgx.backends import triton_codegen as T
from tgx.backends.registry import kernels_for

from .test_numba_codegen import BROADCASTS, REDUCING, TOL, _draw, chain, ops_strategy

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None,
                                reason="triton is not installed")
torch = pytest.importorskip("torch")
HAS_CUDA = torch.cuda.is_available()
S = tgx.Spec


def region_of(f, *specs):
    """The one region the fuse stage's grouping makes of `f` (decomposed)."""
    g = tgx.fuse(tgx.decompose(tgx.make_graph(f)(*specs)), rows=True)
    (eqn,) = g.eqns
    assert eqn.primitive.name == "fused", g
    return g, eqn


def interpreted(g, eqn, args):
    """The kernel of the region run by Triton's interpreter on CPU tensors of `args`."""
    run = T.load(eqn.params["graph"], interpret=True)
    by_id = {v.id: a for v, a in zip(g.invars, args)}
    ins = [torch.from_numpy(np.ascontiguousarray(by_id[v.id])) if isinstance(v, tgx.Var)
           else torch.tensor(v.val) for v in eqn.invars]
    out = run(*ins)
    return [o.numpy() for o in out] if isinstance(out, list) else [out.numpy()]


def close(got, want, dtype, scale=1.0):
    tol = TOL[dtype] * max(1.0, scale)
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)


dtypes = st.sampled_from(["float32", "float64"])
# no pow / atan (libdevice calls the interpreter cannot run): the chains of the numba tests
# use neither


@settings(max_examples=25, deadline=None)
@given(ops=ops_strategy, lead=st.lists(st.integers(1, 4), min_size=0, max_size=2).map(tuple),
       n=st.integers(1, 40), form=st.sampled_from(sorted(BROADCASTS)), dtype=dtypes,
       seed=st.integers(0, 2**16))
def test_interpreted_elementwise_with_broadcasts_matches_float64(ops, lead, n, form, dtype,
                                                                 seed):
    f, ref = chain(ops)
    xs, ys = (*lead, n), BROADCASTS[form](lead, n)
    g, eqn = region_of(f, S(xs, dtype), S(ys, dtype))
    assert T.unsupported(eqn) is None
    rng = np.random.default_rng(seed)
    x, y = rng.standard_normal(xs).astype(dtype), rng.standard_normal(ys).astype(dtype)
    (got,) = interpreted(g, eqn, (x, y))
    assert got.dtype == np.dtype(dtype) and got.shape == xs
    close(got, ref(x.astype(np.float64), y.astype(np.float64)), dtype)


@settings(max_examples=25, deadline=None)
@given(name=st.sampled_from(sorted(REDUCING)),
       lead=st.lists(st.integers(1, 4), min_size=1, max_size=2).map(tuple),
       n=st.integers(1, 70), dtype=dtypes, seed=st.integers(0, 2**16))
def test_interpreted_row_reductions_match_float64(name, lead, n, dtype, seed):
    f, ref, shapes = REDUCING[name]
    specs = [S(s[1:], "bool") if s[0] == "bool" else S(s, dtype) for s in shapes(lead, n)]
    g, eqn = region_of(f, *specs)
    assert T.unsupported(eqn) is None
    rng = np.random.default_rng(seed)
    args = [_draw(rng, s, dtype) for s in shapes(lead, n)]
    got = interpreted(g, eqn, args)
    want = ref(*[a.astype(np.float64) if a.dtype.kind == "f" else a for a in args])
    for a, b in zip(got, want if isinstance(want, tuple) else [want]):
        assert a.dtype == np.dtype(dtype) and a.shape == b.shape
        close(a, b, dtype, scale=np.sqrt(n))


def test_interpreted_long_rows_tile_the_columns():
    """An elementwise region over more columns than one block holds: several column blocks
    per row; a reduction over them: the whole row in one block."""
    g, eqn = region_of(lambda x, w: tnp.exp(x * 0.1) * w, S((2, 2500)), S((2500,)))
    rng = np.random.default_rng(0)
    x, w = rng.standard_normal((2, 2500)).astype(np.float32), rng.standard_normal(2500)
    w = w.astype(np.float32)
    (got,) = interpreted(g, eqn, (x, w))
    close(got, np.exp(x.astype(np.float64) * 0.1) * w, "float32")
    g, eqn = region_of(lambda x: tnp.sum(x * x, axis=-1), S((2, 2500)))
    (got,) = interpreted(g, eqn, (x,))
    close(got, (x.astype(np.float64) ** 2).sum(-1), "float32", scale=50)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_interpreted_gelu_gate_keeps_tanh_whole(dtype):
    """The gate's `tanh` stays one op of the body (`region_ir.KEEP`), written from `exp`."""
    import tgx.nn as tnn
    g = tgx.fuse(tgx.make_graph(lambda a, b: tnn.gelu(a, approximate="tanh") * b)(
        S((3, 50), dtype), S((3, 50), dtype)), rows=True)
    (eqn,) = g.eqns
    assert "tl.exp(-2.0 * tl.abs(" in T.source(eqn, "fn")
    rng = np.random.default_rng(0)
    a, b = (rng.uniform(-6, 6, (3, 50)).astype(dtype) for _ in range(2))
    (got,) = interpreted(g, eqn, (a, b))
    a64 = a.astype(np.float64)
    want = 0.5 * a64 * (1 + np.tanh(np.sqrt(2 / np.pi) * (a64 + 0.044715 * a64 ** 3))) * b
    close(got, want, dtype, scale=10)


# every kernel the tests above generate, at one shape and dtype each: compiled ahead of time
AOT = {f"{name}-{dt}": (REDUCING[name], dt) for name in REDUCING for dt in ("float32",
                                                                            "float64")}


@pytest.mark.parametrize("case", sorted(AOT))
def test_every_generated_kernel_compiles_to_ptx(case):
    (f, _, shapes), dtype = AOT[case]
    specs = [S(s[1:], "bool") if s[0] == "bool" else S(s, dtype) for s in shapes((3, 5), 640)]
    g, eqn = region_of(f, *specs)
    ptx = T.compile_ptx(eqn.params["graph"], arch=90)
    assert ".entry triton_" in ptx and ".target sm_90" in ptx
    assert "ld.global" in ptx and "st.global" in ptx


@settings(max_examples=10, deadline=None)
@given(ops=ops_strategy, form=st.sampled_from(sorted(BROADCASTS)), dtype=dtypes)
def test_elementwise_kernels_compile_to_ptx(ops, form, dtype):
    f, _ = chain(ops)
    g, eqn = region_of(f, S((3, 4, 64), dtype), S(BROADCASTS[form]((3, 4), 64), dtype))
    assert ".entry triton_" in T.compile_ptx(eqn.params["graph"], arch=80)


def test_what_is_declined():
    _, eqn = region_of(lambda x: tnp.power(tnp.abs(x) + 1.0, x) * 2.0, S((4, 8)))
    assert "no Triton code for pow" in T.unsupported(eqn)
    _, eqn = region_of(lambda x: tnp.sum(x * 2.0, axis=0), S((4, 8)))
    assert "only the last axis" in T.unsupported(eqn)


@pytest.mark.skipif(HAS_CUDA, reason="checks the CPU-only case")
def test_without_a_gpu_the_kernel_is_declined_with_the_reason():
    (k,) = [k for k in kernels_for("fused", "torch") if k.variant == "triton"]
    _, eqn = region_of(lambda x: tnp.exp(x) * 2.0, S((4, 8)))
    assert "no CUDA device" in k.check([v.aval for v in eqn.invars], dict(eqn.params))
    cs = tgx.candidates(eqn, backends=["torch"])
    assert all(c.kernel is None or c.kernel.variant != "triton" for c in cs)
    assert any(getattr(k, "variant", "") == "triton" and "no CUDA" in why
               for k, why in cs.declined)


def test_without_triton_nothing_is_offered(monkeypatch):
    monkeypatch.setattr(T, "HAVE_TRITON", False)
    assert T.available.__wrapped__() == "triton is not installed"


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="no CUDA device")
@pytest.mark.parametrize("name", sorted(REDUCING))
def test_cuda_kernel_in_a_compiled_plan_matches_float64(name):
    # on a GPU the plan keeps a region whose Triton kernel torch accepts (heuristic rule 5);
    # tnn.rms_norm is a composite torch has a kernel of its own for, which the plan keeps
    # (rule 1), so no region forms around it
    f, ref, shapes = REDUCING[name]
    rng = np.random.default_rng(0)
    args = [_draw(rng, s, "float32") for s in shapes((4, 64), 640)]
    plan = tgx.compile(f, backends=["torch"], device="cuda", store=None,
                       patterns=False).lower(*args)
    if name == "residual_rms_norm_1p":
        assert "rms_norm[library]@torch" in map(repr, plan.kernels), plan.kernels
    else:
        assert any(k.variant == "triton" for k in plan.kernels), plan.kernels
    got = plan(*args)
    want = ref(*[a.astype(np.float64) if a.dtype.kind == "f" else a for a in args])
    for a, b in zip(got if isinstance(got, (list, tuple)) else [got],
                    want if isinstance(want, tuple) else [want]):
        close(np.asarray(a.cpu() if hasattr(a, "cpu") else a), b, "float32", scale=25)
