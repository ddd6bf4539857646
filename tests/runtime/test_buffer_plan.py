"""The static buffer plan: no overlap of live buffers at any binding, exact results, in-place
writes, symbolic sizes (no re-planning), and OutOfMemory before any kernel runs."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tgx
import tgx.numpy as tnp
from tgx.backends import backend_available

D = 6
UNARY = {"exp": lambda x: tnp.exp(tnp.minimum(x, 3.0)), "neg": tnp.negative, "sin": tnp.sin,
         "sq": lambda x: x * x}
BINARY = {"add": tnp.add, "mul": tnp.multiply, "sub": tnp.subtract}

op = st.one_of(
    st.tuples(st.just("unary"), st.sampled_from(sorted(UNARY)), st.integers(0, 99)),
    st.tuples(st.just("binary"), st.sampled_from(sorted(BINARY)), st.integers(0, 99),
              st.integers(0, 99)),
    st.tuples(st.just("reduce"), st.integers(0, 99)),
    st.tuples(st.just("matmul"), st.integers(0, 99)),
    st.tuples(st.just("view"), st.integers(0, 99)),
)


def build(program, w):
    def fn(x):
        vals = [x]
        for instr in program:
            pick = lambda i: vals[i % len(vals)]  # noqa: E731
            if instr[0] == "unary":
                vals.append(UNARY[instr[1]](pick(instr[2])))
            elif instr[0] == "binary":
                vals.append(BINARY[instr[1]](pick(instr[2]), pick(instr[3])))
            elif instr[0] == "reduce":
                v = pick(instr[1])
                vals.append(v - tnp.sum(v, axis=1, keepdims=True) * 0.1)
            elif instr[0] == "view":  # views of a buffer keep it alive
                v = tnp.reshape(pick(instr[1]), (-1, 2, 3))
                vals.append(tnp.reshape(tnp.transpose(v, (0, 2, 1)), (-1, D)))
            else:
                vals.append(pick(instr[1]) @ w * 0.3)
        return vals[-1], vals[len(vals) // 2]
    return fn


def assert_no_overlap(memory, **dims):
    offs = memory.offsets(**dims)
    sizes = memory.sizes(**dims)
    group = {}
    for out, src in memory.aliases.items():  # an in-place output shares its input's storage
        group[out] = group.get(src, src)
    reqs = [r for r in memory.requests if r.name in offs]
    for i, a in enumerate(reqs):
        for b in reqs[i + 1:]:
            if a.device != b.device or a.end < b.start or b.end < a.start:
                continue
            if group.get(a.name, a.name) == group.get(b.name, b.name):
                continue
            ra = (offs[a.name], offs[a.name] + sizes[a.name])
            rb = (offs[b.name], offs[b.name] + sizes[b.name])
            assert ra[1] <= rb[0] or rb[1] <= ra[0], (
                f"{a.name} {ra} [{a.start},{a.end}] overlaps {b.name} {rb} [{b.start},{b.end}] "
                f"at {dims}")
    peak = memory.peak(**dims).get("cpu", 0)
    assert all(offs[r.name] + sizes[r.name] <= peak for r in reqs if r.device == "cpu")


BACKENDS = [["numpy"]] + ([["torch"]] if backend_available("torch") else [])


@settings(max_examples=25, deadline=None)
@given(program=st.lists(op, min_size=1, max_size=12), which=st.sampled_from(range(len(BACKENDS))))
def test_random_graphs_plan_is_safe_and_exact(program, which):
    rng = np.random.default_rng(len(program))
    w = rng.standard_normal((D, D)).astype(np.float32)
    fn = build(program, w)
    f = tgx.compile(fn, backends=BACKENDS[which], dynamic={"x": {0: "N"}})
    plan = f.lower(tgx.Spec(("N", D), "float32"))
    graph = tgx.make_graph(fn)(tgx.Spec(("N", D), "float32"))
    for n in (1, 7, 64, 33):
        if plan.memory is not None:
            assert_no_overlap(plan.memory, N=n)
        x = rng.standard_normal((n, D)).astype(np.float32)
        got = f(x)
        want = tgx.eval_graph(graph, x)
        for g, e in zip(got, want):
            np.testing.assert_allclose(g, e, rtol=1e-4, atol=1e-4)
    assert f.trace_count == 1


def test_workspace_and_inplace_are_used():
    f = tgx.compile(lambda x: tnp.sin(-tnp.exp(x * 2.0)) + 1.0, backends=["numpy"],
                    dynamic={"x": {0: "N"}})
    plan = f.lower(tgx.Spec(("N", 16), "float32"))
    assert plan.compiled.workspace, "out= kernels write into the workspace"
    assert plan.memory.aliases, "elementwise kernels whose input dies write in place"
    x = np.random.default_rng(0).standard_normal((5, 16)).astype(np.float32)
    np.testing.assert_allclose(f(x), np.sin(-np.exp(x * 2)) + 1, rtol=1e-6)
    # a second call reuses the workspace and still returns fresh outputs
    y1 = f(x)
    y2 = f(x + 1)
    assert not np.shares_memory(y1, y2)
    np.testing.assert_allclose(y1, np.sin(-np.exp(x * 2)) + 1, rtol=1e-6)


def test_symbolic_sizes_resolve_without_replanning():
    f = tgx.compile(lambda x: tnp.exp(x) @ tnp.ones((16, 16), "float32"), backends=["numpy"],
                    dynamic={"x": {0: "N"}})
    plan = f.lower(tgx.Spec(("N", 16), "float32"))
    mem = plan.memory
    assert any(getattr(e, "free_symbols", None) for e in mem.size_expr.values())
    for n in (1, 10, 1000):
        f(np.ones((n, 16), np.float32))
    assert f.trace_count == 1
    assert plan.estimate_memory(N=1000)["cpu"] > plan.estimate_memory(N=10)["cpu"]


def test_out_of_memory_before_running():
    calls = []

    def fn(x):
        calls.append(1)  # traced once; kernels never call Python user code
        return tnp.exp(x) * 2.0 + 1.0

    f = tgx.compile(fn, backends=["numpy"], dynamic={"x": {0: "N"}}, memory_budget=64 * 1024)
    f(np.ones((8, 16), np.float32))  # fits
    with pytest.raises(tgx.OutOfMemory, match=r"on cpu needs .* \(N=100000: .*library-owned.*\) "
                                              r"but memory_budget is 64\.0 KiB"):
        f(np.ones((100_000, 16), np.float32))
    plan = f.lower(tgx.Spec(("N", 16), "float32"))
    with pytest.raises(tgx.OutOfMemory):
        plan.check_budget(1024, N=4096)


def test_memory_ratios_are_reported():
    f = tgx.compile(lambda x: tnp.sum(tnp.exp(tnp.sin(x) * 2.0) + x, axis=1),
                    backends=["numpy"], dynamic={"x": {0: "N"}})
    mem = f.lower(tgx.Spec(("N", 64), "float32")).memory
    peak = mem.peak(N=256)["cpu"]
    assert mem.lower_bound(N=256)["cpu"] <= peak <= mem.sum_of_intermediates(N=256)["cpu"]
