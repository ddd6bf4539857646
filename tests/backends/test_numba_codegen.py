"""Loops generated from fused regions (`tgx.backends.numba_codegen`, the fuse stage): random
elementwise regions against float64 (hypothesis), what is declined and why, the on-disk
kernel cache (reused, and never in the way when broken), and the choice by measurement."""

from __future__ import annotations

import importlib.util

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


def region(ops):
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


ops_strategy = st.lists(st.tuples(st.sampled_from("ub"), st.integers(0, 20)),
                        min_size=2, max_size=7)


@settings(max_examples=30, deadline=None)
@given(ops=ops_strategy, shape=st.lists(st.integers(1, 9), min_size=1, max_size=3).map(tuple),
       dtype=st.sampled_from(["float32", "float64"]), seed=st.integers(0, 2**16))
def test_generated_loop_matches_float64(ops, shape, dtype, seed):
    f, ref = region(ops)
    g = fuse_regions(tgx.make_graph(f)(S(shape, dtype), S(shape, dtype)), ["numpy"])
    (eqn,) = [e for e in g.eqns if e.primitive.name == "fused"]
    assert g.eqns == (eqn,)                     # the whole chain is one region
    k = C.generated_kernel(eqn)
    assert k is not None, C.unsupported(eqn)
    rng = np.random.default_rng(seed)
    x, y = (rng.standard_normal(shape).astype(dtype) for _ in range(2))
    by_id = {g.invars[0].id: x, g.invars[1].id: y}
    got = k.fn(*[by_id[v.id] if isinstance(v, tgx.Var) else np.asarray(v.val, v.aval.dtype)
                 for v in eqn.invars])
    assert got.dtype == np.dtype(dtype) and got.shape == shape
    tol = 1e-5 if dtype == "float32" else 1e-12
    np.testing.assert_allclose(got, ref(x.astype(np.float64), y.astype(np.float64)),
                               rtol=tol * 10, atol=tol * 10)


def test_scalar_inputs_and_bool_predicates():
    def f(x, s, lo):
        return tnp.where(x > lo, tnp.exp(x) * s, x - s)
    g = fuse_regions(tgx.make_graph(f)(S((3, 5)), S(()), S(())), ["numpy"])
    (eqn,) = g.eqns
    x = np.linspace(-2, 2, 15, dtype=np.float32).reshape(3, 5)
    s, lo = np.float32(1.5), np.float32(0.25)
    by_id = dict(zip((v.id for v in g.invars), (x, s, lo)))
    got = C.generated_kernel(eqn).fn(*[by_id[v.id] for v in eqn.invars])
    x64 = x.astype(np.float64)
    np.testing.assert_allclose(got, np.where(x64 > 0.25, np.exp(x64) * 1.5, x64 - 1.5),
                               rtol=1e-6)


def test_what_is_declined():
    def fused(f, *specs):
        return tgx.fuse(tgx.make_graph(f)(*specs)).eqns[0]
    assert "no broadcasts" in C.unsupported(
        fused(lambda x, b: tnp.exp(x) + b, S((4, 3)), S((3,))))
    assert "dtype int32" in C.unsupported(
        fused(lambda x: (x + 1) * 2, S((4,), "int32")))
    assert "no code for reduce_sum" in C.unsupported(
        fused(lambda x: tnp.sum(tnp.exp(x) * 2.0, axis=-1), S((4, 3))))
    g = fuse_regions(tgx.make_graph(lambda x: tnp.sum(tnp.exp(x) * 2.0, axis=-1))(S((4, 3))),
                     ["numpy"])
    assert all(e.primitive.name != "fused" for e in g.eqns)   # put back as it was


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
    assert "for i in range(r0.size):" in src.read_text()
    # another process: a fresh kernel object reads the same file (same name, same source)
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


def test_fuse_stage_in_compile_and_choice_by_measurement(monkeypatch):
    from tgx.planning import fastest
    from tgx.planning.cost_model import CostModel, Estimate

    def f(x, y):
        return tnp.maximum((x * 2.0 + y) * y - x, 0.0)
    x = np.random.default_rng(0).standard_normal((8, 8)).astype(np.float32)
    plan = tgx.compile(f, backends=["numpy"], store=None).lower(x, x)
    assert "fused[" in str(plan.stages["fuse"])
    # unmeasured, the loop is priced as its ops plus a call: op by op wins
    assert all(k.name != "fused" for k in plan.kernels)

    class Measured(CostModel):   # as if the store had measured the loop faster
        def kernel(self, eqn, kernel, dims):
            fast = kernel.name == "fused" and kernel.variant == "numba"
            return Estimate(1e-7 if fast else 1e-5, "measured", "planted")

    monkeypatch.setattr(fastest, "CostModel", lambda *a, **k: Measured())
    plan = tgx.compile(f, backends=["numpy"], store=None).lower(x, x)
    assert [repr(k) for k in plan.kernels] == ["fused[numba]@numpy"]
    x64 = x.astype(np.float64)
    np.testing.assert_allclose(plan(x, x), np.maximum((x64 * 2 + x64) * x64 - x64, 0),
                               rtol=1e-6)
    off = tgx.compile(f, backends=["numpy"], store=None, fuse=False).lower(x, x)
    assert "fused" not in str(off.stages["fuse"])


def test_rounding_as_numpy_and_infinite_literals():
    """No fastmath: float32 rounds each op as NumPy does; ±inf literals are spelled exactly
    (an attention mask's -inf)."""
    def f(a, m):
        return tnp.where(m, (a + 1e8) - 1e8, -np.inf)
    g = fuse_regions(tgx.make_graph(f)(S((4,)), S((4,), "bool")), ["numpy"])
    (eqn,) = g.eqns
    a = np.float32([0.5, 3.0, -2.0, 1.0])
    m = np.array([True, True, False, True])
    by_id = dict(zip((v.id for v in g.invars), (a, m)))
    got = C.generated_kernel(eqn).fn(*[by_id[v.id] for v in eqn.invars])
    want = np.where(m, (a + np.float32(1e8)) - np.float32(1e8), np.float32(-np.inf))
    np.testing.assert_array_equal(got, want)


def test_a_region_with_a_0d_output_is_declined():
    def f(x):
        y = tnp.exp(x) * 2.0
        return y, y + 1.0
    g = tgx.fuse(tgx.make_graph(lambda x, s: (tnp.exp(x) * 2.0, tnp.exp(s) * 3.0))(
        S((8,)), S(())))
    for e in g.eqns:
        if e.primitive.name == "fused" and any(v.aval.ndim == 0 for v in e.outvars):
            assert "no broadcasts" in C.unsupported(e) or "0-d" in C.unsupported(e)


def test_a_stored_plan_with_a_generated_loop_loads_again():
    """Measured whole plans are stored as bytes naming their kernels: a generated loop is
    found again from its region (EXPLORE's measured plan was otherwise skipped)."""
    from tgx.planning.assignment import Assignment
    g = fuse_regions(tgx.make_graph(lambda x: tnp.exp(x) * 3.0 - x)(S((6,))), ["numpy"])
    k = C.generated_kernel(g.eqns[0])
    back = Assignment.from_bytes(Assignment(g, ("numpy",), (k,)).to_bytes())
    assert back.kernels[0].variant == "numba" and back.kernels[0].source_hash == k.source_hash
