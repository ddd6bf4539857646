"""The run loop is one generated Python function per specialization (`tgx.runtime.codegen`):
same results as NumPy, its source reads as straight-line code, dead values are dropped, and a
failing kernel is still named by its instruction."""

from __future__ import annotations

import functools
import gc
import operator
import re
import weakref

import numpy as np
import pytest

import tgx
import tgx.lax as lax
import tgx.nn as tnn
import tgx.numpy as tnp
from tgx.backends import available_backends
from tgx.backends.registry import Kernel
from tgx.lowering.lower import lower_assignment
from tgx.planning.assignment import Assignment
from tgx.planning.heuristic import heuristic_assignment
from tgx.planning.options import PlanOptions
from tgx.runtime.codegen import generate

HAS_JAX = "jax" in available_backends()
HAS_TORCH = "torch" in available_backends()
RNG = np.random.default_rng(0)


def chain(x, y):
    for i in range(24):
        x = (x + y, x * y, tnp.sin(x), -x)[i % 4]
    return x


def chain_np(x, y):
    for i in range(24):
        x = (x + y, x * y, np.sin(x), -x)[i % 4]
    return x


# -- the generator alone --------------------------------------------------------------------------

def test_generate_straight_line_with_partials_multi_outputs_and_dead_values():
    steps = [(operator.mul, (0, 9), 2, ()),                      # a constant input
             (functools.partial(operator.sub, 100), (2,), 3, (2,)),
             (divmod, (3, 1), (4, 5), (3,)),                     # two results
             (operator.neg, (7,), 6, ())]                        # a bound weight
    run = generate(steps, in_slots=(0, 1), bound_slots=(7,), consts={9: 10},
                   out_slots=(4, 6, 5, 0), labels=("mul", "rsub", "divmod", "neg"))
    assert run.source.splitlines() == [
        "def run(args, bound):",
        "    a0, a1 = args",
        "    w0, = bound",
        "    v2 = k0(a0, c9)  # 0: mul",
        "    v3 = k1(k1_0, v2)  # 1: rsub",
        "    del v2",
        "    v4, v5 = k2(v3, a1)  # 2: divmod",
        "    del v3",
        "    v6 = k3(w0)  # 3: neg",
        "    return [v4, v6, v5, a0]"]
    assert run([3, 7], (5,)) == [10, -5, 0, 3]
    assert run([4, 7], (-1,)) == [8, 1, 4, 4]      # the bound values are read per call
    assert run.fn.__name__ == "run" and "run" not in run.fn.__globals__  # no cycle


def test_generate_finds_the_failing_step_and_its_inputs():
    steps = [(operator.add, (0, 1), 2, ()), (operator.truediv, (2, 1), 3, (2,)),
             (operator.neg, (3,), 4, (3,))]
    run = generate(steps, in_slots=(0, 1), out_slots=(4,))
    with pytest.raises(ZeroDivisionError) as info:
        run([1, 0], ())
    assert run.failure(info.value) == (1, [1, 0])
    assert run.failure(ValueError("raised elsewhere")) is None


# -- compiled graphs -------------------------------------------------------------------------------

def test_chain_matches_numpy_and_reads_as_one_call_per_instruction():
    f = tgx.compile(chain, backends=["numpy"], policy="heuristic")
    x, y = RNG.random((4, 16), np.float32), RNG.random((4, 16), np.float32)
    np.testing.assert_allclose(f(x, y), chain_np(x, y), rtol=1e-5, atol=1e-6)
    cg = f.lower(x, y).compiled
    src = cg.source()
    lines = src.splitlines()
    assert lines[:2] == ["def run(args, bound):", "    a0, a1 = args"]
    calls = [ln for ln in lines if " = k" in ln]
    assert len(calls) == len(cg.instructions) == 24
    # out= ufuncs are called directly with their workspace view (no wrapper, no partial)
    assert calls[0] == "    v2 = k0(a0, a1, out=k0_out)  # 0: add[out]@numpy"
    assert lines[-1].startswith("    return [v")
    np.testing.assert_allclose(f(x, y), chain_np(x, y), rtol=1e-5, atol=1e-6)   # again


def test_in_place_updates_share_one_view_object():
    """NumPy runs `np.add(x, y, out=x)` in place directly; a second view of the same memory
    costs it an overlap check, so an in-place result gets its input's view object."""
    f = tgx.compile(chain, backends=["numpy"], policy="heuristic")
    cg = f.lower(tgx.Spec((4, 16)), tgx.Spec((4, 16))).compiled
    spec = cg.specialize(())
    outs = [fn.keywords["out"] for fn, *_ in spec.instrs if isinstance(fn, functools.partial)]
    assert len(outs) == 23 and all(o is outs[0] for o in outs)


def test_dead_value_is_dropped_in_the_source():
    f = tgx.compile(lambda x: tnn.softmax(x, axis=-1) * 2.0 + x, backends=["numpy"],
                    policy="heuristic")
    x = RNG.random((3, 4), np.float32)
    e = np.exp(x - x.max(-1, keepdims=True))
    np.testing.assert_allclose(f(x), e / e.sum(-1, keepdims=True) * 2 + x, rtol=1e-6)
    src = f.lower(x).compiled.source()
    # library-owned: freed after use
    assert re.search(r"\n    v1 = k0\(a0[^\n]*\)  # 0: softmax(\[library\])?@numpy\n", src), src
    assert "\n    del v1\n" in src


def test_symbolic_dims_two_bindings():
    f = tgx.compile(lambda x, w: tnp.sum(tnp.exp(x @ w) * 2.0, axis=1), backends=["numpy"],
                    dynamic={"x": {0: "N"}}, policy="heuristic")
    w = RNG.random((8, 4), np.float32)
    for n in (3, 7, 3):
        x = RNG.random((n, 8), np.float32)
        np.testing.assert_allclose(f(x, w), np.sum(np.exp(x @ w) * 2.0, axis=1), rtol=1e-5)
    cg = f.lower(tgx.Spec(("N", 8)), w).compiled
    assert set(cg._specs) >= {(3,), (7,)} and f.trace_count == 1
    assert cg.source(N=3) == cg.source(3)                   # by name or by position
    three, seven = cg.specialize((3,)).run, cg.specialize((7,)).run
    assert three.fn is not seven.fn                          # each has its own views
    assert three.code is seven.code                          # compiled once


def test_state_updated_in_place():
    def step(x, cache, pos):
        keys = lax.dynamic_update_slice(cache, x[None], (pos, 0))
        return keys @ x, keys

    f = tgx.compile(step, state="cache", backends=["numpy"], policy="heuristic")
    cache = np.zeros((6, 4), np.float32)
    ref = cache.copy()
    for pos in range(3):
        x = RNG.random(4, np.float32)
        ref[pos] = x
        y, new = f(x, cache, np.int32(pos))
        assert new is cache
        np.testing.assert_allclose(cache, ref)
        np.testing.assert_allclose(y, ref @ x, rtol=1e-6)


@pytest.mark.skipif(not (HAS_TORCH or HAS_JAX), reason="needs a backend with weight copies")
def test_weights_swapped_between_calls():
    def mlp(params, x):
        return tnp.tanh(x @ params["w1"]) @ params["w2"]

    backend = "torch" if HAS_TORCH else "jax"
    f = tgx.compile(mlp, backends=[backend], weights="params", policy="heuristic")
    x = RNG.random((2, 8), np.float32)
    p1 = {"w1": RNG.random((8, 16), np.float32), "w2": RNG.random((16, 4), np.float32)}
    p2 = {"w1": RNG.random((8, 16), np.float32), "w2": p1["w2"]}
    cg = f.lower(p1, x).compiled
    assert cg.weight_copies and "= bound" in cg.source()
    for p in (p1, p2, p1):
        np.testing.assert_allclose(f(p, x), np.tanh(x @ p["w1"]) @ p["w2"], rtol=1e-4)


@pytest.mark.skipif(not HAS_JAX, reason="jax missing")
def test_multi_output_region():
    f = tgx.compile(lambda x: (tnp.sin(x) * 2.0, tnp.exp(x) + 1.0), backends=["jax"],
                    policy="heuristic")
    x = RNG.random(5, np.float32)
    a, b = f(x)
    np.testing.assert_allclose(a, np.sin(x) * 2, rtol=1e-6)
    np.testing.assert_allclose(b, np.exp(x) + 1, rtol=1e-6)
    # the region takes the NumPy argument itself (no copy_to before it) and unpacks two values
    assert "v2, v3 = k0(a0)  # 0: jax.jit[4 eqns" in f.lower(x).compiled.source()


def test_a_dropped_specialization_frees_its_workspace_without_the_collector():
    f = tgx.compile(lambda x: tnp.exp(tnp.sin(x)) * 2.0, backends=["numpy"],
                    dynamic={"x": {0: "N"}}, policy="heuristic")
    cg = f.lower(tgx.Spec(("N", 4))).compiled
    gc.collect()
    gc.disable()
    try:
        spec = cg.specialize((1000,))
        ws = weakref.ref(spec.workspace["cpu"].base)
        del spec
        cg._specs.clear()
        assert ws() is None
    finally:
        gc.enable()


# -- errors ---------------------------------------------------------------------------------------

def _boom(*xs):
    raise FloatingPointError("the kernel gave up")


@pytest.mark.parametrize("which", [0, 3, 5, 7])
def test_a_failing_kernel_is_named_by_its_instruction(which):
    def model(x, y):
        for _ in range(2):
            x = tnp.exp(tnp.sin(x) * y) + 1.0
        return x

    g = tgx.make_graph(model)(tgx.Spec((3, 4)), tgx.Spec((3, 4)))
    a = heuristic_assignment(g, ["numpy"])
    kernels = list(a.kernels)
    k = kernels[which]
    kernels[which] = Kernel(k.name, "numpy", _boom, variant="boom")
    plan = lower_assignment(Assignment(a.graph, a.backends, kernels), PlanOptions())
    n = len(plan.compiled.instructions)
    with pytest.raises(tgx.KernelError) as info:
        plan.run(np.ones((3, 4), np.float32), np.ones((3, 4), np.float32))
    msg = str(info.value)
    assert f"kernel {k.name}[boom]@numpy (instruction {which} of {n}, on numpy) failed: " \
           "FloatingPointError: the kernel gave up" in msg
    want = {"sin": "float32[3, 4]", "exp": "float32[3, 4]", "mul": "float32[3, 4], float32[3, 4]",
            "add": "float32[3, 4], float32[]"}[k.name]
    assert f"inputs: {want}" in msg
    assert isinstance(info.value.__cause__, FloatingPointError)
