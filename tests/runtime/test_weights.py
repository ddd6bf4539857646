"""Persistent weights: `tgx.compile(..., weights=...)` binds them once per array object."""

import numpy as np
import pytest

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
