"""tgx.compile: caching by abstract signature, dynamic dims, plans, errors, policies."""

from __future__ import annotations

import numpy as np
import pytest

import tgx
import tgx.numpy as tnp
from tgx.errors import BindingError, DTypeError, KernelError
from tgx.lowering.rebackend import rebackend
from tgx.backends import backend_available
from tgx.primitives.transfer import copy_to

HAS_TORCH = backend_available("torch")
HAS_JAX = backend_available("jax")


def mlp(params, x):
    h = tnp.maximum(x @ params["w1"] + params["b1"], 0.0)
    return tnp.sum(h @ params["w2"], axis=-1)


def _params(rng, d=8, h=16):
    return {"w1": rng.standard_normal((d, h)).astype(np.float32),
            "b1": rng.standard_normal(h).astype(np.float32),
            "w2": rng.standard_normal((h, 4)).astype(np.float32)}


def _ref(params, x):
    return np.sum(np.maximum(x @ params["w1"] + params["b1"], 0) @ params["w2"], axis=-1)


@pytest.mark.parametrize("backends", [["numpy"], ["torch"], ["jax"], None])
def test_mlp_matches_numpy(backends, rng):
    if backends and not backend_available(backends[0]):
        pytest.importorskip(backends[0])
    p = _params(rng)
    x = rng.standard_normal((5, 8)).astype(np.float32)
    f = tgx.compile(mlp, backends=backends)
    out = f(p, x)
    assert isinstance(out, np.ndarray) and out.dtype == np.float32
    np.testing.assert_allclose(out, _ref(p, x), rtol=1e-5, atol=1e-5)


def test_decorator_forms_and_cache(rng):
    @tgx.compile
    def f(x):
        return tnp.exp(x) * 2.0

    x = rng.standard_normal((3, 4)).astype(np.float32)
    np.testing.assert_allclose(f(x), np.exp(x) * 2, rtol=1e-6)
    f(x + 1)
    assert f.trace_count == 1
    f(rng.standard_normal((5, 4)).astype(np.float32))  # not dynamic: a new signature
    assert f.trace_count == 2


@pytest.mark.parametrize("backend", ["numpy", "torch", "jax"])
def test_dynamic_dims_trace_once(backend, rng):
    if not backend_available(backend):
        pytest.importorskip(backend)
    p = _params(rng)
    f = tgx.compile(mlp, backends=[backend], dynamic={"x": {0: "N"}})
    for n in (5, 9, 1, 9):
        x = rng.standard_normal((n, 8)).astype(np.float32)
        np.testing.assert_allclose(f(p, x), _ref(p, x), rtol=1e-4, atol=1e-4)
    assert f.trace_count == 1
    plan = f.lower(p, tgx.Spec(("N", 8), "float32"))
    assert f.trace_count == 1  # the Spec spells the same signature
    assert [str(s) for s in plan.symbols] == ["N"]


def test_lower_with_spec_and_print(rng):
    p = _params(rng)
    plan = tgx.compile(mlp, backends=["numpy"]).lower(p, tgx.Spec(("N", 8), "float32"))
    text = str(plan)
    assert "dot_general" in text and "@numpy" in text
    assert "buffer plan:" in text and "transfers: 0" in text
    x = rng.standard_normal((7, 8)).astype(np.float32)
    np.testing.assert_allclose(plan.run(p, x), _ref(p, x), rtol=1e-5, atol=1e-5)
    small, big = plan.estimate_memory(N=16)["cpu"], plan.estimate_memory(N=4096)["cpu"]
    assert big > small > 0


@pytest.mark.skipif(not HAS_TORCH, reason="torch not installed")
def test_plan_shows_transfers_and_counts_bytes():
    f = tgx.compile(lambda x: tnp.sum(tnp.exp(x), axis=0), backends=["torch", "numpy"],
                    policy="heuristic")
    plan = f.lower(tgx.Spec((256, "N"), "float32"))
    tr = plan.transfers()
    assert tr and tr[0][1] == "torch"
    assert "copy_to" in str(plan) and "→ torch" in str(plan)


def test_wrong_shape_and_dtype_name_the_argument(rng):
    plan = tgx.compile(lambda x, y: x + y, backends=["numpy"]).lower(
        tgx.Spec(("N", 3), "float32"), tgx.Spec(("N", 3), "float32"))
    a = np.zeros((4, 3), np.float32)
    with pytest.raises(BindingError, match=r"y.*expected.*\(4, 3\).*got.*\(4, 2\)"):
        plan.run(a, np.zeros((4, 2), np.float32))
    with pytest.raises(DTypeError, match=r"x.*float32.*got float64"):
        plan.run(np.zeros((4, 3)), a)
    with pytest.raises(BindingError, match="argument x"):
        plan.run(np.zeros(3, np.float32), a)


def test_dynamic_names_unknown_argument():
    with pytest.raises(ValueError, match="unknown arguments"):
        tgx.compile(lambda x: x, dynamic={"y": {0: "N"}})


def test_unknown_policies_are_clear():
    with pytest.raises(ValueError, match="unknown policy"):
        tgx.compile(lambda x: x, policy="quickest")


def test_store_and_tolerance_are_kept():
    f = tgx.compile(lambda x: x, store="somewhere", tolerance=1e-3)
    assert f.store == "somewhere" and f.tolerance == 1e-3


def test_pytree_outputs(rng):
    f = tgx.compile(lambda x: {"a": x * 2.0, "b": (tnp.sum(x), x)}, backends=["numpy"])
    x = rng.standard_normal(4).astype(np.float32)
    out = f(x)
    np.testing.assert_allclose(out["a"], x * 2)
    np.testing.assert_allclose(out["b"][0], x.sum(), rtol=1e-6)
    np.testing.assert_array_equal(out["b"][1], x)


@pytest.mark.skipif(not HAS_JAX, reason="jax not installed")
def test_whole_graph_on_jax_is_one_jit(rng):
    p = _params(rng)
    plan = tgx.compile(mlp, backends=["jax"]).lower(p, tgx.Spec(("N", 8), "float32"))
    labels = [i.label for i in plan.compiled.instructions]
    assert sum(lbl.startswith("jax.jit") for lbl in labels) == 1
    assert all(lbl.startswith(("jax.jit", "copy_to")) for lbl in labels)


@pytest.mark.skipif(not HAS_TORCH, reason="torch not installed")
def test_return_backend_arrays(rng):
    import torch

    f = tgx.compile(lambda x: tnp.exp(x), backends=["torch"], return_backend_arrays=True)
    out = f(rng.standard_normal((64, 128)).astype(np.float32))
    assert isinstance(out, torch.Tensor)


@pytest.mark.skipif(not HAS_TORCH, reason="torch not installed")
def test_heuristic_keeps_tiny_tensors_on_numpy():
    f = tgx.compile(lambda x, s: tnp.exp(x) * tnp.sum(s), backends=["numpy", "torch"],
                    policy="heuristic")
    plan = f.lower(tgx.Spec((512, 512), "float32"), tgx.Spec((4,), "float32"))
    by_prim = {e.primitive.name: b for e, b in zip(plan.graph.eqns, plan.graph.backends)}
    assert by_prim["reduce_sum"] == "numpy" and by_prim["exp"] == "torch"


@pytest.mark.skipif(not HAS_TORCH, reason="torch not installed")
def test_rebackend_inserts_and_prunes_transfers():
    g = tgx.make_graph(lambda x: tnp.exp(x) * 2.0 + 1.0)(tgx.Spec(("N",)))
    bg = rebackend(g, {0: "torch", 1: "torch", 2: "numpy"})
    names = [e.primitive.name for e in bg.eqns]
    assert names.count("copy_to") == 2
    tgx.check_graph(bg)
    # everything back on numpy: the copy_to equations carry no work and disappear
    flat = rebackend(bg, "numpy")
    assert [e.primitive.name for e in flat.eqns] == ["exp", "mul", "add"]
    # a round trip written by hand is removed too
    g2 = tgx.make_graph(lambda x: copy_to(copy_to(x, "torch"), "numpy") + 1.0)(
        tgx.Spec(("N",)))
    assert [e.primitive.name for e in rebackend(g2, "numpy").eqns] == ["add"]
    assert "@torch" in str(bg)


@pytest.mark.skipif(not HAS_TORCH, reason="torch not installed")
def test_candidates_list_kernels_decomposition_and_declined():
    g = tgx.make_graph(lambda x, y: x + y)(tgx.Spec((3,), "uint32"), tgx.Spec((3,), "uint32"))
    cs = tgx.candidates(g.eqns[0], backends=["numpy", "torch"])
    assert any(c.kind == "kernel" and c.backend == "numpy" for c in cs)
    assert not any(c.backend == "torch" for c in cs)
    assert any("uint32" in reason for _, reason in cs.declined)
    g = tgx.make_graph(lambda x: tnp.exp(x))(tgx.Spec((3,)))
    kinds = {(c.kind, c.backend) for c in tgx.candidates(g.eqns[0], backends=["numpy", "torch"])}
    assert ("kernel", "torch") in kinds and ("kernel", "numpy") in kinds
    g = tgx.make_graph(lambda x: tnp.tanh(x))(tgx.Spec((3,)))
    assert str(tgx.candidates(g.eqns[0], backends=["numpy"])[-1]) == "decomposition"


def test_unavailable_backend_is_reported():
    with pytest.raises(KernelError, match="unknown backend"):
        tgx.compile(lambda x: x, backends=["tpu"])


@pytest.mark.cuda
def test_cuda_device_runs():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    assert str(tgx.Device.parse("cuda:0")) == "cuda:0"


def test_namedtuple_arguments_trace_once():
    import collections

    Params = collections.namedtuple("Params", "w b")

    @tgx.compile(policy="heuristic", backends=["numpy"])
    def f(p, x):
        return x @ p.w + p.b

    rng = np.random.default_rng(0)
    p = Params(rng.standard_normal((3, 2)).astype(np.float32), np.ones(2, np.float32))
    for _ in range(3):
        x = rng.standard_normal((4, 3)).astype(np.float32)
        np.testing.assert_allclose(f(p, x), x @ p.w + p.b, rtol=1e-6)
    assert f.trace_count == 1
