"""Persistent weights: `tgx.compile(..., weights=...)` binds them once per array object."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tgx
import tgx.numpy as tnp
from tgx.backends import available_backends

HAS_JAX = "jax" in available_backends()
HAS_TORCH = "torch" in available_backends()


def mlp(params, x):
    h = tnp.tanh(x @ params["w1"] + params["b1"])
    return h @ params["w2"]


def make_params(seed=0):
    rng = np.random.default_rng(seed)
    return {"w1": rng.standard_normal((8, 16)).astype(np.float32),
            "b1": rng.standard_normal(16).astype(np.float32),
            "w2": rng.standard_normal((16, 4)).astype(np.float32)}


def ref(params, x):
    return np.tanh(x @ params["w1"] + params["b1"]) @ params["w2"]


def copies_of_weights(plan):
    """copy_to instructions whose input is a weight argument's slot."""
    cg = plan.compiled
    wslots = {cg.in_slots[i] for i in cg.weight_args}
    return [ins for ins in cg.instructions if ins.label.startswith("copy_to")
            and set(ins.ins) & wslots]


@pytest.mark.skipif(not HAS_JAX, reason="jax missing")
@pytest.mark.parametrize("weights", ["params", 0, ("params",)])
def test_jax_weights_converted_once(weights, monkeypatch):
    from tgx.backends import get_backend

    p = make_params()
    calls = []  # conversions of the weight arrays to jax
    jb = get_backend("jax")
    orig = jb.convert

    def convert(x, device="cpu"):
        if any(x is w for w in p.values()):
            calls.append(x)
        return orig(x, device)
    monkeypatch.setattr(jb, "convert", convert)
    f = tgx.compile(mlp, policy="heuristic", backends=["jax"], weights=weights,
                    dynamic={"x": {0: "N"}})
    x = np.ones((5, 8), np.float32)
    np.testing.assert_allclose(f(p, x), ref(p, x), rtol=1e-5)
    plan = f.lower(p, x)
    cg = plan.compiled
    assert not copies_of_weights(plan)          # no per-call transfer of a weight
    assert cg.weight_conversions == 3 and len(calls) == 3
    for n in (5, 7, 5):                         # later calls: no conversion at all
        x = np.full((n, 8), 0.5, np.float32)
        np.testing.assert_allclose(f(p, x), ref(p, x), rtol=1e-5)
    assert cg.weight_conversions == 3 and len(calls) == 3
    # a jax-only plan is one XLA call taking the NumPy input itself, then the output transfer
    assert [i.label.split("[")[0] for i in cg.instructions] == ["jax.jit", "copy_to@numpy"]


@pytest.mark.skipif(not HAS_JAX, reason="jax missing")
def test_new_params_object_rebinds_without_replanning():
    f = tgx.compile(mlp, policy="heuristic", backends=["jax"], weights="params")
    p, x = make_params(0), np.ones((3, 8), np.float32)
    f(p, x)
    cg = f.lower(p, x).compiled
    assert cg.weight_conversions == 3
    q = make_params(1)                          # new arrays: re-bound, same plan
    np.testing.assert_allclose(f(q, x), ref(q, x), rtol=1e-5)
    assert cg.weight_conversions == 6 and f.trace_count == 1
    q2 = dict(q, w2=q["w2"] * 2)                # one new array: only it is converted
    np.testing.assert_allclose(f(q2, x), ref(q2, x), rtol=1e-5)
    assert cg.weight_conversions == 7
    # in-place mutation is NOT detected (documented): nothing is re-bound (whether the
    # result sees the change depends on whether jax's device_put copied or aliased)
    q2["b1"][:] = 0
    f(q2, x)
    assert cg.weight_conversions == 7


@pytest.mark.skipif(not HAS_JAX, reason="jax missing")
def test_estimate_memory_counts_weights_as_persistent():
    p = make_params()
    spec = tgx.Spec(("N", 8), "float32")
    nbytes = sum(v.nbytes for v in p.values())
    plain = tgx.compile(mlp, policy="heuristic", backends=["jax"]).lower(p, spec)
    bound = tgx.compile(mlp, policy="heuristic", backends=["jax"],
                        weights="params").lower(p, spec)
    kinds = [r.kind for r in bound.memory.requests if r.name.startswith("w")]
    assert kinds and set(kinds) == {"persistent"}
    diff = bound.estimate_memory(N=64)["cpu"] - plain.estimate_memory(N=64).get("cpu", 0)
    # the NumPy originals and their jax copies (a real copy on the CPU)
    assert diff >= 2 * nbytes - 1024


@pytest.mark.skipif(not HAS_TORCH, reason="torch missing")
def test_torch_and_numpy_plans_with_weights():
    p, x = make_params(), np.ones((4, 8), np.float32)
    for backends in (["numpy"], ["torch"], ["numpy", "torch"]):
        f = tgx.compile(mlp, policy="heuristic", backends=backends, weights="params")
        np.testing.assert_allclose(f(p, x), ref(p, x), rtol=1e-5)
        plan = f.lower(p, x)
        n = plan.compiled.weight_conversions
        np.testing.assert_allclose(f(p, x), ref(p, x), rtol=1e-5)
        assert plan.compiled.weight_conversions == n and not copies_of_weights(plan)


def test_unknown_weight_name():
    with pytest.raises(ValueError, match="unknown argument"):
        tgx.compile(mlp, weights="nope")


def test_weights_of_keyword_argument():
    f = tgx.compile(mlp, policy="heuristic", backends=["numpy"], weights="params")
    p, x = make_params(), np.ones((2, 8), np.float32)
    np.testing.assert_allclose(f(params=p, x=x), ref(p, x), rtol=1e-5)


# -- values of the weights alone: computed once per binding -----------------------------------

def gated(params, x):
    """Gemma's norm weight `1 + w`, a weight scaled and shifted, a bias built from two."""
    return x @ (params["w1"] * 0.5 + 1.0) * (1.0 + params["g"]) + (params["b1"] - params["g"])


def gated_ref(params, x):
    p = {k: v.astype(np.float64) for k, v in params.items()}
    return x @ (p["w1"] * 0.5 + 1.0) * (1.0 + p["g"]) + (p["b1"] - p["g"])


def gated_params(seed=0):
    rng = np.random.default_rng(seed)
    return {"w1": rng.standard_normal((8, 16)).astype(np.float32),
            "g": rng.standard_normal(16).astype(np.float32),
            "b1": rng.standard_normal(16).astype(np.float32)}


@pytest.mark.parametrize("backend", ["numpy", "torch", "jax"])
def test_weight_only_equations_run_once_per_binding(backend):
    if backend not in available_backends():
        pytest.skip(f"{backend} missing")
    f = tgx.compile(gated, policy="heuristic", backends=[backend], weights="params",
                    dynamic={"x": {0: "N"}})
    p, x = gated_params(0), np.ones((5, 8), np.float32)
    np.testing.assert_allclose(f(p, x), gated_ref(p, x), rtol=1e-5, atol=1e-5)
    cg = f.lower(p, x).compiled
    # w1 * 0.5 + 1, 1 + g, b1 - g: none of them in the call's schedule
    hoisted = [i.label.split("[")[0].split("@")[0] for i in cg.bind_instructions]
    assert sorted(hoisted) == ["add", "add", "mul", "sub"], hoisted
    assert cg.bind_runs == 1
    for n in (5, 3):
        x = np.full((n, 8), 0.25, np.float32)
        np.testing.assert_allclose(f(p, x), gated_ref(p, x), rtol=1e-5, atol=1e-5)
    assert cg.bind_runs == 1                    # the same arrays: not computed again
    q = dict(p, g=p["g"] * 3)                   # one new array: computed again from it
    np.testing.assert_allclose(f(q, x), gated_ref(q, x), rtol=1e-5, atol=1e-5)
    assert cg.bind_runs == 2 and f.trace_count == 1
    # the held values are persistent buffers of the memory plan, not workspace
    plan = f.lower(q, x)
    held = [r for r in plan.memory.requests if r.name.startswith("b")]
    assert held and {r.kind for r in held} == {"persistent"}
    assert "once per weight binding" in str(plan)


def test_weight_values_returned_or_of_symbolic_shape_stay_in_the_call():
    def f(params, x):
        return params["w1"] + 1.0, x * (params["b1"] * 2.0)

    p = make_params()
    # `w1 + 1` is returned: the caller gets a new array per call, never a held one
    g = tgx.compile(f, policy="heuristic", backends=["numpy"], weights="params")
    x = np.ones((2, 16), np.float32)
    a, _ = g(p, x)
    b, y = g(p, x)
    assert a is not b and not np.shares_memory(a, b)
    np.testing.assert_allclose(y, x * p["b1"] * 2.0, rtol=1e-6)
    cg = g.lower(p, x).compiled
    assert [i.label.split("@")[0] for i in cg.bind_instructions] == ["mul[out]"]
    # a weight of a symbolic shape: its values are computed per call
    h = tgx.compile(lambda b, x: x * (b * 2.0), policy="heuristic", backends=["numpy"],
                    weights="b", dynamic={"b": {0: "M"}, "x": {1: "M"}})
    np.testing.assert_allclose(h(p["b1"], x), x * p["b1"] * 2.0, rtol=1e-6)
    assert not h.lower(p["b1"], x).compiled.bind_instructions


def test_bind_instruction_failing_names_it_and_the_user_line():
    f = tgx.compile(gated, policy="heuristic", backends=["numpy"], weights="params")
    p, x = gated_params(), np.ones((2, 8), np.float32)
    f(p, x)
    cg = f.lower(p, x).compiled
    ins = cg.bind_instructions[0]

    def broken(dims, out):
        def run(*xs):
            raise FloatingPointError("planted")
        return run
    ins.build = broken
    with pytest.raises(tgx.KernelError, match=r"bind instruction 0 of \d+.*planted") as e:
        f(gated_params(1), x)                   # new arrays: bound again
    assert "test_weights.py" in str(e.value)    # the user's line of the equation


@settings(max_examples=25, deadline=None)
@given(ops=st.lists(st.sampled_from(["add", "mul", "tanh", "neg", "sq"]), min_size=1,
                    max_size=5),
       n=st.integers(1, 4), seed=st.integers(0, 2**16))
def test_weight_chains_property(ops, n, seed):
    """Any chain of ops on a weight, then a product with the call's input: the hoisted plan
    computes what NumPy does, once per binding, for each binding."""
    def chain(w, lib):
        for op in ops:
            w = {"add": lambda v: v + 0.5, "mul": lambda v: v * 1.5, "tanh": lib.tanh,
                 "neg": lambda v: -v, "sq": lambda v: v * v}[op](w)
        return w

    def f(params, x):
        return x @ chain(params["w"], tnp)

    rng = np.random.default_rng(seed)
    f_c = tgx.compile(f, policy="heuristic", backends=["numpy"], weights="params")
    x = rng.standard_normal((n, 6)).astype(np.float32)
    for _ in range(2):
        p = {"w": rng.standard_normal((6, 3)).astype(np.float32)}
        want = x.astype(np.float64) @ chain(p["w"].astype(np.float64), np)
        np.testing.assert_allclose(f_c(p, x), want, rtol=1e-4, atol=1e-5)
    cg = f_c.lower(p, x).compiled
    assert cg.bind_runs == 2 and len(cg.instructions) == 1  # the product alone per call
