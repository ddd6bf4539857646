"""Loops generated from fused regions (`tgx.backends.numba_codegen`, the fuse stage): random
elementwise regions, broadcast operands and row reductions against float64 (hypothesis),
the parallel loops, what is declined and why, the regions the fuse stage forms, the on-disk
kernel cache (a second process compiles nothing; a broken cache is never in the way), and
the choice by measurement."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap

import hypothesis.strategies as st
import numpy as np
import pytest
from hypothesis import given, settings

import tgx
import tgx.nn as tnn
import tgx.numpy as tnp
from tgx.backends import numba_codegen as C
from tgx.planning.regions import fuse_regions

pytestmark = pytest.mark.skipif(importlib.util.find_spec("numba") is None,
                                reason="numba is not installed")
S = tgx.Spec
TOL = {"float32": 2e-5, "float64": 1e-12}

# (tgx op, float64 reference) on bounded values: each keeps |v| moderate
UNARY = [(lambda v: tnp.sin(v), np.sin), (lambda v: -v, np.negative),
         (lambda v: tnp.exp(v * 0.1), lambda v: np.exp(v * 0.1)),
         (lambda v: tnp.sqrt(tnp.abs(v) + 1.0), lambda v: np.sqrt(np.abs(v) + 1)),
         (lambda v: tnn.sigmoid(v), lambda v: 1 / (1 + np.exp(-v))),
         (lambda v: tnp.tanh(v), np.tanh),
         (lambda v: tnp.where(v > 0.0, v, v * 0.5), lambda v: np.where(v > 0, v, v * 0.5))]
BINARY = [(lambda a, b: a + b, np.add), (lambda a, b: a * b, np.multiply),
          (lambda a, b: a - b, np.subtract), (lambda a, b: tnp.maximum(a, b), np.maximum),
          (lambda a, b: a / (tnp.abs(b) + 1.0), lambda a, b: a / (np.abs(b) + 1))]


def chain(ops):
    def f(x, y):
        v = x
        for kind, i in ops:
            v = UNARY[i % len(UNARY)][0](v) if kind == "u" else BINARY[i % len(BINARY)][0](v, y)
        return v

    def ref(x, y):
        v = x
        for kind, i in ops:
            v = UNARY[i % len(UNARY)][1](v) if kind == "u" else BINARY[i % len(BINARY)][1](v, y)
        return v
    return f, ref


def run_region(g, eqn, kernel_fn, args):
    """Call a region's kernel with the graph inputs `args` bound to its operands."""
    by_id = {v.id: a for v, a in zip(g.invars, args)}
    return kernel_fn(*[by_id[v.id] if isinstance(v, tgx.Var) else np.asarray(v.val, v.aval.dtype)
                       for v in eqn.invars])


def one_region(f, *specs, decompose=True):
    g = tgx.make_graph(f)(*specs)
    g = fuse_regions(tgx.decompose(g) if decompose else g, ["numpy"])
    (eqn,) = [e for e in g.eqns if e.primitive.name == "fused"]
    assert g.eqns == (eqn,), g                     # the whole computation is one region
    return g, eqn


def close(got, want, dtype, scale=1.0):
    tol = TOL[dtype] * max(1.0, scale)
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)


ops_strategy = st.lists(st.tuples(st.sampled_from("ub"), st.integers(0, 20)),
                        min_size=2, max_size=7)
dtypes = st.sampled_from(["float32", "float64"])


@settings(max_examples=30, deadline=None)
@given(ops=ops_strategy, shape=st.lists(st.integers(1, 9), min_size=1, max_size=3).map(tuple),
       dtype=dtypes, seed=st.integers(0, 2**16))
def test_generated_loop_matches_float64(ops, shape, dtype, seed):
    f, ref = chain(ops)
    g, eqn = one_region(f, S(shape, dtype), S(shape, dtype), decompose=False)
    k = C.generated_kernel(eqn)
    assert k is not None, C.unsupported(eqn)
    rng = np.random.default_rng(seed)
    x, y = (rng.standard_normal(shape).astype(dtype) for _ in range(2))
    got = run_region(g, eqn, k.fn, (x, y))
    assert got.dtype == np.dtype(dtype) and got.shape == shape
    close(got, ref(x.astype(np.float64), y.astype(np.float64)), dtype)


# broadcast forms of the second operand against x of shape (*lead, n)
BROADCASTS = {
    "weight": lambda lead, n: (n,),               # a (D,) weight
    "row": lambda lead, n: (*lead, 1),            # a (S, 1) row statistic
    "leading": lambda lead, n: (1,) * len(lead) + (n,),
    "inner": lambda lead, n: lead[1:] + (n,),     # an (L, S) mask against (H, L, S)
    "outer": lambda lead, n: lead[:1] + (1,) * (len(lead) - 1) + (n,),   # (B, 1, D)
    "scalar": lambda lead, n: (),
}


@settings(max_examples=40, deadline=None)
@given(ops=ops_strategy, lead=st.lists(st.integers(1, 5), min_size=0, max_size=3).map(tuple),
       n=st.integers(1, 20), form=st.sampled_from(sorted(BROADCASTS)), dtype=dtypes,
       seed=st.integers(0, 2**16))
def test_broadcast_operands_match_float64(ops, lead, n, form, dtype, seed):
    f, ref = chain(ops)
    xs, ys = (*lead, n), BROADCASTS[form](lead, n)
    g, eqn = one_region(f, S(xs, dtype), S(ys, dtype), decompose=False)
    k = C.generated_kernel(eqn)
    assert k is not None, C.unsupported(eqn)
    rng = np.random.default_rng(seed)
    x, y = rng.standard_normal(xs).astype(dtype), rng.standard_normal(ys).astype(dtype)
    got = run_region(g, eqn, k.fn, (x, y))
    assert got.dtype == np.dtype(dtype) and got.shape == xs
    close(got, ref(x.astype(np.float64), y.astype(np.float64)), dtype)


def _rms(x, h, w):
    return x + tnn.rms_norm(h, (h.shape[-1],), 1.0 + w, 1e-6)


def _rms_ref(x, h, w):
    return x + h / np.sqrt(np.mean(h * h, -1, keepdims=True) + 1e-6) * (1 + w)


def _softmax(s, m):
    return tnn.softmax(tnp.where(m, s * 0.125, -np.inf), axis=-1)


def _softmax_ref(s, m):
    z = np.where(m, s * 0.125, -np.inf)
    e = np.exp(z - z.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _stats(x, w):   # several reductions, row outputs beside a per-element one
    c = x - tnp.mean(x, axis=-1, keepdims=True)
    return (c * w, tnp.max(tnp.abs(c), axis=-1), tnp.min(x * w + c, axis=-1, keepdims=True))


def _stats_ref(x, w):
    c = x - x.mean(-1, keepdims=True)
    return c * w, np.abs(c).max(-1), (x * w + c).min(-1, keepdims=True)


def _hand_rms(x, w):   # RMSNorm written out (the rms_norm_pattern form)
    return x / tnp.sqrt(tnp.mean(x * x, axis=-1, keepdims=True) + 1e-5) * w


def _hand_rms_ref(x, w):
    return x / np.sqrt(np.mean(x * x, -1, keepdims=True) + 1e-5) * w


REDUCING = {   # name -> (tgx fn, float64 reference, input shapes from (lead, n))
    "residual_rms_norm_1p": (_rms, _rms_ref,
                             lambda lead, n: [(*lead, n), (*lead, n), (n,)]),
    "masked_softmax": (_softmax, _softmax_ref,
                       lambda lead, n: [(*lead, n), ("bool", *lead[1:], n)]),
    "row_stats": (_stats, _stats_ref, lambda lead, n: [(*lead, n), (n,)]),
    "hand_rms_norm": (_hand_rms, _hand_rms_ref, lambda lead, n: [(*lead, n), (n,)]),
}


def _draw(rng, shape, dtype):
    if shape and shape[0] == "bool":
        m = rng.random(shape[1:]) < 0.8
        m[..., 0] = True                     # no row fully masked (0/0 is NaN either way)
        return m
    return rng.standard_normal(shape).astype(dtype)


@settings(max_examples=40, deadline=None)
@given(name=st.sampled_from(sorted(REDUCING)),
       lead=st.lists(st.integers(1, 5), min_size=1, max_size=2).map(tuple),
       n=st.integers(1, 40), dtype=dtypes, seed=st.integers(0, 2**16))
def test_row_reductions_match_float64(name, lead, n, dtype, seed):
    f, ref, shapes = REDUCING[name]
    specs = [S(s[1:], "bool") if s[0] == "bool" else S(s, dtype) for s in shapes(lead, n)]
    g, eqn = one_region(f, *specs)
    k = C.generated_kernel(eqn)
    assert k is not None, C.unsupported(eqn)
    rng = np.random.default_rng(seed)
    args = [_draw(rng, s, dtype) for s in shapes(lead, n)]
    got = run_region(g, eqn, k.fn, args)
    want = ref(*[a.astype(np.float64) if a.dtype.kind == "f" else a for a in args])
    got, want = (list(v) if isinstance(v, (list, tuple)) else [v] for v in (got, want))
    for a, b in zip(got, want):
        assert a.dtype == np.dtype(dtype) and a.shape == b.shape
        close(a, b, dtype, scale=np.sqrt(n))    # sums of n terms


@pytest.mark.parametrize("name", sorted(REDUCING))
def test_parallel_loops_match_float64_and_are_offered_from_a_size(name):
    f, ref, shapes = REDUCING[name]
    lead, n = (4, 96), 128                        # 49152 elements: over PARALLEL_MIN
    specs = [S(s[1:], "bool") if s[0] == "bool" else S(s) for s in shapes(lead, n)]
    g, eqn = one_region(f, *specs)
    par = C.parallel_checker([v.aval for v in eqn.invars], dict(eqn.params))
    assert par is None, par
    run = C._generate(eqn.params["graph"])[1]
    rng = np.random.default_rng(0)
    args = [_draw(rng, s, "float32") for s in shapes(lead, n)]
    got = run_region(g, eqn, run, args)
    want = ref(*[a.astype(np.float64) if a.dtype.kind == "f" else a for a in args])
    for a, b in zip(got if isinstance(got, list) else [got],
                    want if isinstance(want, tuple) else [want]):
        close(a, b, "float32", scale=np.sqrt(n))
    small = one_region(f, *[S(s[1:], "bool") if s[0] == "bool" else S(s)
                            for s in shapes((2, 3), 8)])[1]
    assert "serial loops" in C.parallel_checker([v.aval for v in small.invars],
                                                dict(small.params))


def test_scalar_inputs_and_bool_predicates():
    def f(x, s, lo):
        return tnp.where(x > lo, tnp.exp(x) * s, x - s)
    g, eqn = one_region(f, S((3, 5)), S(()), S(()), decompose=False)
    x = np.linspace(-2, 2, 15, dtype=np.float32).reshape(3, 5)
    got = run_region(g, eqn, C.generated_kernel(eqn).fn, (x, np.float32(1.5), np.float32(0.25)))
    x64 = x.astype(np.float64)
    np.testing.assert_allclose(got, np.where(x64 > 0.25, np.exp(x64) * 1.5, x64 - 1.5),
                               rtol=1e-6)


def test_what_is_declined():
    def region_of(f, *specs):
        return tgx.fuse(tgx.make_graph(f)(*specs)).eqns[0]
    assert "dtype int32" in C.unsupported(region_of(lambda x: (x + 1) * 2, S((4,), "int32")))
    assert "only the last axis" in C.unsupported(
        region_of(lambda x: tnp.sum(tnp.exp(x) * 2.0, axis=0), S((4, 3))))
    assert "float32 and float64" in C.unsupported(
        region_of(lambda x: (x * 2.0).astype("float64") + 1.0, S((4,))))
    assert "broadcast in the middle" in C.unsupported(
        region_of(lambda x, b: tnp.exp(x) + b, S((2, 3, 4, 5)), S((2, 1, 4, 5))))
    # the fuse stage leaves such ops out of its regions: the reduction over axis 0 stays
    g = fuse_regions(tgx.make_graph(lambda x: tnp.sum(tnp.exp(x) * 2.0, axis=0))(S((4, 3))),
                     ["numpy"])
    assert [e.primitive.name for e in g.eqns] == ["fused", "reduce_sum"]
    assert C.unsupported(g.eqns[0]) is None


def test_a_generated_loop_that_misses_its_tolerance_is_declined_without_a_warning(
        monkeypatch):
    # the user cannot act on it; the reason is what `plan.explain()` shows
    import warnings

    from tgx.planning import kernel_patterns

    eqn = tgx.fuse(tgx.make_graph(lambda x: tnp.exp(x) * 2.0 - 1.0)(S((4, 8)))).eqns[0]
    k = C.generated_kernel(eqn)
    monkeypatch.setattr(kernel_patterns, "verify_kernel", lambda k, e: "differs (planted)")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert kernel_patterns.declines(k, eqn) == "differs (planted)"
        declined = []
        assert kernel_patterns.generated_kernels(eqn, "numpy", declined) == []
    assert declined == [("generated numba loop", "differs (planted)")]


def test_fuse_stage_forms_row_regions_where_the_loops_apply():
    # softmax and RMSNorm, decomposed: one region each, reductions included
    for f, specs in ((lambda s: tnn.softmax(s, axis=-1), [S((2, 4, 8))]),
                     (_rms, [S(("S", 16)), S(("S", 16)), S((16,))])):
        g = fuse_regions(tgx.decompose(tgx.make_graph(f)(*specs)), ["numpy"])
        assert [e.primitive.name for e in g.eqns] == ["fused"], g
    # a region stops where the analysis would refuse it: the (4,) value read outside is
    # neither per element nor per row of the (3, 4) region, so `w + 1` stays apart
    def f(x, w):
        v = w + 1.0
        return tnp.sum(x * v, axis=-1), v * 2.0
    g = fuse_regions(tgx.make_graph(f)(S((3, 4)), S((4,))), ["numpy"])
    assert all(C.unsupported(e) is None for e in g.eqns if e.primitive.name == "fused")
    x = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
    w = np.float32([1, 2, 3, 4])
    for a, b in zip(tgx.compile(f, backends=["numpy"], store=None).lower(x, w)(x, w),
                    ((x * (w + 1)).sum(-1), (w + 1) * 2)):
        np.testing.assert_allclose(a, b, rtol=1e-6)


def test_fuse_stage_without_numba_or_numpy_changes_nothing():
    g = tgx.make_graph(lambda x: tnp.exp(x) * 2.0 + x)(S((8,)))
    assert fuse_regions(g, ["jax"]) is g


def test_source_is_the_same_for_every_size_and_trace():
    def src(*shape):
        return C.source(one_region(_softmax, S(shape), S(shape[1:], "bool"))[1], "fn")
    # var ids and sizes never reach the source (only literals do: a mean's 1/N)
    assert src(2, 3, 8) == src(2, 3, 8) == src(4, 128, 640)
    assert "reduce_max(red0, N, C" in src(2, 3, 8)


def test_kernel_cache_on_disk_is_reused_and_a_broken_one_is_not_in_the_way(tmp_path,
                                                                           monkeypatch):
    monkeypatch.setenv("TGX_KERNEL_CACHE", str(tmp_path / "kernels"))
    c = float(np.random.default_rng().integers(1, 10**6))   # a region no test compiled before

    def f(x):
        return tnp.exp(x) * c - x
    eqn = tgx.fuse(tgx.make_graph(f)(S((5,)))).eqns[0]
    x = np.arange(5, dtype=np.float32)
    want = np.exp(x.astype(np.float64)) * c - x
    k = C.generated_kernel(eqn)
    np.testing.assert_allclose(k.fn(x), want, rtol=1e-6)
    (src,) = (tmp_path / "kernels").glob("fused_*.py")
    assert "for c in range(N):" in src.read_text()
    # a fresh kernel object reads the same file (same name, same source)
    monkeypatch.setattr(C, "_KERNELS", {})
    mtime = src.stat().st_mtime_ns
    np.testing.assert_allclose(C.generated_kernel(eqn).fn(x), want, rtol=1e-6)
    assert src.stat().st_mtime_ns == mtime
    # numba's cached machine code corrupted: compiled afresh, the result still right
    for p in (tmp_path / "kernels" / "__pycache__").glob("*.nb*"):
        p.write_bytes(b"garbage")
    monkeypatch.setattr(C, "_KERNELS", {})
    np.testing.assert_allclose(C.generated_kernel(eqn).fn(x), want, rtol=1e-6)
    # a cache that cannot be written: compiled in memory
    (tmp_path / "file").write_text("")
    monkeypatch.setenv("TGX_KERNEL_CACHE", str(tmp_path / "file" / "kernels"))
    monkeypatch.setattr(C, "_KERNELS", {})
    np.testing.assert_allclose(C.generated_kernel(eqn).fn(x), want, rtol=1e-6)
    # switched off: compiled in memory, nothing written anywhere
    monkeypatch.setenv("TGX_KERNEL_CACHE", "off")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(C, "_KERNELS", {})
    np.testing.assert_allclose(C.generated_kernel(eqn).fn(x), want, rtol=1e-6)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file", "kernels"]


SECOND_PROCESS = textwrap.dedent("""
    import numpy as np, tgx, tgx.nn as tnn
    from tgx.backends import numba_codegen as C
    from tgx.planning.regions import fuse_regions
    f = lambda x, h, w: x + tnn.rms_norm(h, (16,), 1.0 + w, {eps})
    g = fuse_regions(tgx.decompose(tgx.make_graph(f)(*[tgx.Spec(s) for s in
                     [(3, 16), (3, 16), (16,)]])), ["numpy"])
    e = g.eqns[0]
    k = C.generated_kernel(e)
    ones = {{v.id: np.ones(v.aval.shape, np.float32) for v in g.invars}}
    out = k.fn(*[ones[v.id] for v in e.invars])
    lib = k.fn.__closure__[[c.cell_contents.__class__.__name__ for c in
                            k.fn.__closure__].index("_Library")].cell_contents
    fn = lib.get(lib.fn_name)
    print(sum(fn.stats.cache_misses.values()), sum(fn.stats.cache_hits.values()),
          float(out[0, 0]))
""")


def test_a_second_process_compiles_nothing(tmp_path):
    """The loops of a region are compiled once per machine: another process loads the
    source and numba's machine code from the kernel cache (a cache hit, no miss)."""
    eps = float(np.random.default_rng().integers(1, 10**6)) * 1e-12   # a fresh region
    env = {**os.environ, "TGX_KERNEL_CACHE": str(tmp_path)}
    code = SECOND_PROCESS.format(eps=eps)
    runs = [subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                           text=True, timeout=300) for _ in range(2)]
    for r in runs:
        assert r.returncode == 0, r.stderr
    (m1, h1, y1), (m2, h2, y2) = (r.stdout.split() for r in runs)
    assert (int(m1), int(h1)) == (1, 0)       # the first compiles
    assert (int(m2), int(h2)) == (0, 1)       # the second loads
    assert float(y1) == float(y2) == pytest.approx(3.0, rel=1e-5)   # 1 + 1 · (1 + 1)


def test_fuse_stage_in_compile_and_choice_by_measurement(monkeypatch):
    from tgx.planning import fastest
    from tgx.planning.cost_model import CostModel, Estimate

    from tgx.planning import candidates, kernel_patterns

    def f(x, y):
        return tnp.maximum((x * 2.0 + y) * y - x, 0.0)
    checked = []   # loops run against the reference (which compiles them)
    for mod in (candidates, kernel_patterns):
        monkeypatch.setattr(mod, "declines", lambda k, e, _d=mod.declines:
                            checked.append(k.variant) or _d(k, e))
    x = np.random.default_rng(0).standard_normal((8, 8)).astype(np.float32)
    plan = tgx.compile(f, backends=["numpy"], store=None).lower(x, x)
    assert "fused[" in str(plan.stages["fuse"])
    # unmeasured, the loop is priced as its ops plus a call: op by op wins, and it is not
    # even compiled (a cold kernel cache made a training step's first compile 48 s)
    assert all(k.name != "fused" for k in plan.kernels)
    assert "numba" not in checked

    class Measured(CostModel):   # as if the store had measured the loop faster
        def kernel(self, eqn, kernel, dims):
            fast = kernel.name == "fused" and kernel.variant == "numba"
            return Estimate(1e-7 if fast else 1e-5, "measured", "planted")

    monkeypatch.setattr(fastest, "CostModel", lambda *a, **k: Measured())
    plan = tgx.compile(f, backends=["numpy"], store=None).lower(x, x)
    assert [repr(k) for k in plan.kernels] == ["fused[numba]@numpy"]
    assert "numba" in checked     # measured: checked before it is offered
    x64 = x.astype(np.float64)
    np.testing.assert_allclose(plan(x, x), np.maximum((x64 * 2 + x64) * x64 - x64, 0),
                               rtol=1e-6)
    off = tgx.compile(f, backends=["numpy"], store=None, fuse=False).lower(x, x)
    assert "fused" not in str(off.stages["fuse"])


def test_a_hand_written_rms_norm_runs_as_one_generated_loop(monkeypatch):
    """With patterns off, the fuse stage makes the hand-written norm one region; measured
    faster, the plan runs it as one loop."""
    from tgx.planning import fastest
    from tgx.planning.cost_model import CostModel, Estimate

    class Measured(CostModel):
        def kernel(self, eqn, kernel, dims):
            fast = kernel.name == "fused" and kernel.variant == "numba"
            return Estimate(1e-7 if fast else 1e-5, "measured", "planted")

    monkeypatch.setattr(fastest, "CostModel", lambda *a, **k: Measured())
    x = np.random.default_rng(1).standard_normal((5, 24)).astype(np.float32)
    w = np.random.default_rng(2).standard_normal(24).astype(np.float32)
    plan = tgx.compile(_hand_rms, backends=["numpy"], store=None, patterns=False).lower(x, w)
    assert [repr(k) for k in plan.kernels] == ["fused[numba]@numpy"]
    close(plan(x, w), _hand_rms_ref(x.astype(np.float64), w.astype(np.float64)), "float32")


def test_parallel_loops_measured_faster_run_in_a_plan_with_blas_on_one_thread(monkeypatch):
    from tgx.planning import fastest
    from tgx.planning.cost_model import CostModel, Estimate

    class Measured(CostModel):
        def kernel(self, eqn, kernel, dims):
            fast = kernel.name == "fused" and kernel.variant == "numba-parallel"
            return Estimate(1e-7 if fast else 1e-5, "measured", "planted")

    monkeypatch.setattr(fastest, "CostModel", lambda *a, **k: Measured())
    rng = np.random.default_rng(3)
    x = rng.standard_normal((64, 640)).astype(np.float32)
    w = rng.standard_normal(640).astype(np.float32)
    plan = tgx.compile(_hand_rms, backends=["numpy"], store=None, patterns=False).lower(x, w)
    assert [repr(k) for k in plan.kernels] == ["fused[numba-parallel]@numpy"]
    assert plan.kernels[0].own_pool                 # the plan holds BLAS to one thread
    close(plan(x, w), _hand_rms_ref(x.astype(np.float64), w.astype(np.float64)), "float32",
          scale=np.sqrt(640))


def test_rounding_as_numpy_and_infinite_literals():
    """No fastmath: float32 rounds each op as NumPy does; ±inf literals are spelled exactly
    (an attention mask's -inf)."""
    def f(a, m):
        return tnp.where(m, (a + 1e8) - 1e8, -np.inf)
    g, eqn = one_region(f, S((4,)), S((4,), "bool"), decompose=False)
    a = np.float32([0.5, 3.0, -2.0, 1.0])
    m = np.array([True, True, False, True])
    got = run_region(g, eqn, C.generated_kernel(eqn).fn, (a, m))
    want = np.where(m, (a + np.float32(1e8)) - np.float32(1e8), np.float32(-np.inf))
    np.testing.assert_array_equal(got, want)


def test_nan_propagates_through_row_maxima_as_in_numpy():
    g, eqn = one_region(lambda x: tnp.max(x * 2.0, axis=-1), S((3, 20)))
    x = np.arange(60, dtype=np.float32).reshape(3, 20)
    x[1, 13] = np.nan
    got = run_region(g, eqn, C.generated_kernel(eqn).fn, (x,))
    np.testing.assert_array_equal(got, np.max(x * 2, -1))


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_transcendentals_of_the_loops_match_float64_at_their_edges(dtype):
    """float32 exp / log / tanh are polynomials (they vectorize; libm's are scalar calls):
    within float32's tolerance everywhere, and 0, ±inf and NaN as NumPy gives them."""
    def f(x):
        return tnp.exp(x) + tnp.log(tnp.abs(x)) * tnp.tanh(x)
    g, eqn = one_region(f, S((64,), dtype), decompose=False)
    x = np.concatenate([np.linspace(-120, 100, 54), [0.0, -0.0, np.inf, -np.inf, np.nan,
                                                     1e-40, -88.0, 88.5, 7.9, 1e-3]])
    x = x.astype(dtype)
    with np.errstate(all="ignore"):
        got = run_region(g, eqn, C.generated_kernel(eqn).fn, (x,))
        x64 = x.astype(np.float64)
        want = np.exp(x64) + np.log(np.abs(x64)) * np.tanh(x64)
    fin = np.isfinite(want) & (np.abs(want) < np.finfo(dtype).max)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_array_equal(got[np.isinf(want)], want[np.isinf(want)])
    np.testing.assert_allclose(got[fin], want[fin], rtol=4 * TOL[dtype], atol=1e-30)
    src = C.source(eqn, "fn")
    assert ("np.float32(exp_f32(" in src) == (dtype == "float32")
    assert ("np.float64(np.exp(" in src) == (dtype == "float64")


def test_a_stored_plan_with_a_generated_loop_loads_again():
    """Measured whole plans are stored as bytes naming their kernels: a generated loop is
    found again from its region (EXPLORE's measured plan was otherwise skipped)."""
    from tgx.backends.registry import kernels_for
    from tgx.planning.assignment import Assignment
    g = fuse_regions(tgx.make_graph(lambda x: tnp.exp(x) * 3.0 - x)(S((6,))), ["numpy"])
    k = C.generated_kernel(g.eqns[0])
    back = Assignment.from_bytes(Assignment(g, ("numpy",), (k,)).to_bytes())
    assert back.kernels[0].variant == "numba" and back.kernels[0].source_hash == k.source_hash
    (par,) = [k for k in kernels_for("fused", "numpy") if k.variant == "numba-parallel"]
    back = Assignment.from_bytes(Assignment(g, ("numpy",), (par,)).to_bytes())
    assert back.kernels[0] is par and par.own_pool


@pytest.mark.parametrize("variant", ["numba", "numba-parallel"])
def test_generated_loops_write_an_optimizer_step_into_the_state(monkeypatch, variant):
    """An Adam step over several parameters is one elementwise region with an output per
    new parameter and moment: its loops write each straight into the caller's array
    (`Kernel.outs_into`), reading the old value at the index they write, so no leaf is
    copied at the end of the call (an optimizer step over a 4-layer LM's 3.9M parameters:
    9.8 ms op by op, 22 ms through the loops with the copies, 3.8 ms without)."""
    from tgx import optim
    from tgx.planning import fastest
    from tgx.planning.cost_model import CostModel, Estimate

    class Measured(CostModel):   # as if the store had measured the loops faster
        def kernel(self, eqn, kernel, dims):
            fast = kernel.name == "fused" and kernel.variant == variant
            return Estimate(1e-7 if fast else 1e-5, "measured", "planted")

    monkeypatch.setattr(fastest, "CostModel", lambda *a, **k: Measured())
    opt = optim.adam(1e-2)

    def step(p, s, g):
        u, s = opt.update(g, s, p)
        return tnp.sum(g["w"]), (optim.apply_updates(p, u), s)

    rng = np.random.default_rng(4)
    shapes = {"w": (64, 640), "b": (640,)}
    params = {k: rng.standard_normal(v).astype(np.float32) for k, v in shapes.items()}
    grads = {k: rng.standard_normal(v).astype(np.float32) for k, v in shapes.items()}
    ref_p = {k: v.astype(np.float64) for k, v in params.items()}
    ref_m = {k: np.zeros(v) for k, v in shapes.items()}
    ref_v = {k: np.zeros(v) for k, v in shapes.items()}
    f = tgx.compile(step, state=("p", "s"), backends=["numpy"], store=None, patterns=False)
    state = opt.init(params)
    w_obj = params["w"]
    for t in range(1, 4):
        _, (params, state) = f(params, state, grads)
        for k, g in grads.items():   # Adam in float64, by hand
            ref_m[k] = 0.9 * ref_m[k] + 0.1 * g
            ref_v[k] = 0.999 * ref_v[k] + 0.001 * g.astype(np.float64) ** 2
            mhat, vhat = ref_m[k] / (1 - 0.9 ** t), ref_v[k] / (1 - 0.999 ** t)
            ref_p[k] = ref_p[k] - 1e-2 * mhat / (np.sqrt(vhat) + 1e-8)
    assert params["w"] is w_obj
    for k in shapes:
        np.testing.assert_allclose(params[k], ref_p[k], rtol=1e-5, atol=1e-6)
    cg = f.lower(params, state, grads).compiled
    into = [i for i in cg.instructions if "[into state]" in i.label]
    loops = [i for i in into if f"fused[{variant}]" in i.label]
    # a region per shape, each writing a parameter and its two moments (the parallel loops
    # only for w: b's 640 elements are one row)
    assert sorted(len(i.view_of) for i in loops) == ([3, 3] if variant == "numba" else [3])
    assert not any(copy for _, _, copy in cg.state), cg.state_reasons


def test_generated_loops_write_into_an_input_only_where_it_is_read_in_place():
    """`outs=` may name an input: the loops write into it where they read it at the index
    they write, and into a fresh array copied there where they read it broadcast."""
    def two(s, x):
        t = s * 2.0 + x
        return t, t * s - 1.0

    body = tgx.make_graph(two)(S((4, 8)), S((4, 8)))
    kernel = C.generated_kernel(fuse_regions(body, ["numpy"]).eqns[0])
    s = np.arange(32, dtype=np.float32).reshape(4, 8)
    x = np.ones((4, 8), np.float32)
    want = (s * 2 + x, (s * 2 + x) * s - 1)
    got = kernel.fn(s, x, outs={0: s})
    assert got[0] is s
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_array_equal(got[1], want[1])   # read the old s, index for index
    row = np.arange(8, dtype=np.float32).reshape(1, 8)
    body = tgx.make_graph(lambda r, x: r * 2.0 + x)(S((1, 8)), S((4, 8)))
    kernel = C.generated_kernel(fuse_regions(body, ["numpy"]).eqns[0])
    out = x.copy()
    got = kernel.fn(row, out, outs={0: out})        # x read in place, as the output
    assert got is out
    np.testing.assert_array_equal(out, np.broadcast_to(row * 2 + 1, (4, 8)))
    body = tgx.make_graph(lambda s: s - tnp.mean(s, axis=-1, keepdims=True))(S((4, 8)))
    kernel = C.generated_kernel(fuse_regions(body, ["numpy"]).eqns[0])
    s = np.arange(32, dtype=np.float32).reshape(4, 8) ** 2
    want = s - s.mean(-1, keepdims=True)
    got = kernel.fn(s, outs={0: s})                  # two passes: written at the end
    assert got is s
    np.testing.assert_allclose(s, want, rtol=1e-6)


def test_explore_also_races_each_selection_without_kernels_on_pools_of_their_own():
    """A kernel with a thread pool of its own caps BLAS for the whole plan, which no
    per-kernel figure shows: the shortlist holds each selection again without such kernels
    (a 4-layer LM's training step: 188 ms with numba's parallel loops, 133 without)."""
    from tgx.explore import candidate_assignments
    from tgx.pipeline import transform
    from tgx.planning.cost_model import CostModel, Estimate
    from tgx.planning.options import PlanOptions

    class Measured(CostModel):   # as if the store had measured the parallel loops fastest
        def kernel(self, eqn, kernel, dims):
            fast = kernel.name == "fused" and kernel.variant == "numba-parallel"
            return Estimate(1e-7 if fast else 1e-5, "measured", "planted")

    rng = np.random.default_rng(5)
    x = rng.standard_normal((64, 640)).astype(np.float32)
    w = rng.standard_normal(640).astype(np.float32)
    opts = PlanOptions(backends=["numpy"], patterns=False)
    g = transform(tgx.make_graph(_hand_rms)(x, w), opts)
    cands = candidate_assignments(g, ["numpy"], Measured(), {}, opts)
    pools = {label: any(k is not None and k.own_pool for k in a.kernels)
             for label, a in cands.items()}
    assert pools["numpy selected"] and not pools["numpy selected serial"]
    assert any(k is not None and k.variant == "numba"
               for k in cands["numpy selected serial"].kernels)
