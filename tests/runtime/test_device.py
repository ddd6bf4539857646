"""`tgx.compile(device=...)`: CPU behaviour, device errors, the device-aware heuristic, the
memory accounting per device, a simulated CUDA device (every path but the real GPU), and the
GPU tests proper (marked `cuda`, skipped without a CUDA device)."""

from __future__ import annotations

import importlib.util
import math
import pathlib

import numpy as np
import pytest

import tgx
import tgx.numpy as tnp
from tgx.errors import KernelError, OutOfMemory
from tgx.backends import backend_available, get_backend
from tgx.devices import Device
from tgx.lowering.lower import lower
from tgx.pipeline import plan_graph
from tgx.planning.heuristic import assign_backends, choose_kernels, decompose_unsupported
from tgx.tracing import tree_flatten

HAS_TORCH = backend_available("torch")
HAS_JAX = backend_available("jax")
HAS_CUDA = HAS_TORCH and get_backend("torch").device_reason("cuda:0") is None


def _jax_has_gpu() -> bool:
    return HAS_JAX and get_backend("jax").device_reason("cuda:0") is None


_spec = importlib.util.spec_from_file_location(
    "bench_runtime", pathlib.Path(__file__).resolve().parents[2] / "bench" / "bench_runtime.py")
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)  # the benchmark's MLP and transformer block


def mlp_params(rng, d=32, h=64):
    return {"w1": rng.standard_normal((d, h)).astype(np.float32) / math.sqrt(d),
            "b1": rng.standard_normal(h).astype(np.float32) / 10,
            "w2": rng.standard_normal((h, h)).astype(np.float32) / math.sqrt(h),
            "b2": rng.standard_normal(h).astype(np.float32) / 10,
            "w3": rng.standard_normal((h, 10)).astype(np.float32) / math.sqrt(h)}


def block_args(rng, t=16, d=32, f=64):
    p, cos, sin = bench.block_params(rng, t, d, f)
    return p, rng.standard_normal((t, d)).astype(np.float32), cos, sin


def positions(x):
    """iota and a symbolic dim as a value: kernels without inputs (built on the CPU by torch)."""
    return x * tnp.arange(x.shape[0], dtype="float32")[:, None] + x.shape[0]


def plan_key(plan):
    dims = {s.name: 64 for s in plan.symbols}
    return (plan.summary(), plan.graph.backends, [repr(k) for k in plan.kernels],
            [i.label for i in plan.compiled.instructions], plan.estimate_memory(**dims),
            sorted(plan.compiled.workspace))


# -- CPU: the default is "cpu" ------------------------------------------------------------------
@pytest.mark.parametrize("backends", [["numpy"], ["numpy", "torch"], ["torch"], ["jax"], None])
@pytest.mark.parametrize("policy", ["heuristic", "fastest"])
def test_cpu_device_is_the_default(backends, policy, rng, tmp_path):
    if backends and not all(backend_available(b) for b in backends):
        pytest.skip(f"{backends} not installed")
    store = tgx.BenchmarkStore(tmp_path / "s.json")
    p = mlp_params(rng)
    x = rng.standard_normal((8, 32)).astype(np.float32)
    plans, policies = [], set()
    for kw in ({}, {"device": "cpu"}, {"device": tgx.Device("cpu")}, {"device": "cpu:0"}):
        f = tgx.compile(bench.mlp, policy=policy, backends=backends, store=store,
                        dynamic={"x": {0: "N"}}, weights="p", **kw)
        np.testing.assert_allclose(f(p, x), bench.mlp_np(p, x), rtol=1e-4, atol=1e-5)
        plan = f.lower(p, tgx.Spec(("N", 32), "float32"))
        assert plan.device == "cpu" and f.device == "cpu"
        policies.add(plan.policy)
        assert set(plan.estimate_memory(N=64)) == {"cpu"}
        plans.append(plan_key(plan))
    assert all(k == plans[0] for k in plans) and len(policies) == 1
    assert policies.pop().startswith(policy)


def test_plan_graph_device_default():
    g = tgx.make_graph(lambda x: tnp.exp(x) * 2.0)(tgx.Spec(("N", 4)))
    a = plan_graph(g, policy="heuristic", backends=["numpy"])
    b = plan_graph(g, policy="heuristic", backends=["numpy"], device="cpu")
    assert plan_key(a) == plan_key(b) and a.device == b.device == "cpu"
    assert "device" not in str(a).split("\n")[0]  # the CPU printout is unchanged


# -- device strings -----------------------------------------------------------------------------
@pytest.mark.parametrize("name,parsed", [("cpu", "cpu"), ("cpu:0", "cpu"), ("cuda", "cuda:0"),
                                         ("cuda:1", "cuda:1"), (" cuda:0 ", "cuda:0")])
def test_device_parse(name, parsed):
    assert str(Device.parse(name)) == parsed


@pytest.mark.parametrize("bad", ["gpu", "cuda:x", "cuda:-1", "cpu:1", "tpu:0", "", "cuda:"])
def test_bad_device_string(bad):
    with pytest.raises(KernelError, match="unknown device"):
        tgx.compile(lambda x: x, device=bad)
    g = tgx.make_graph(lambda x: tnp.exp(x))(tgx.Spec((3,)))
    with pytest.raises(KernelError, match="unknown device"):
        plan_graph(g, policy="heuristic", backends=["numpy"], device=bad)
    with pytest.raises(KernelError, match="unknown device"):
        tgx.rebackend(g, "numpy", device=bad)


# -- CUDA asked for where there is none ---------------------------------------------------------
@pytest.mark.skipif(HAS_CUDA, reason="CUDA is available here")
def test_missing_cuda_is_a_clear_error():
    with pytest.raises(KernelError, match=r"device cuda:0 is not available") as e:
        tgx.compile(lambda x: x + 1.0, device="cuda:0")  # raised at compile time
    if HAS_TORCH:
        assert r"torch.cuda.is_available() is False" in str(e.value)
    if HAS_TORCH:
        with pytest.raises(KernelError, match=r"cuda:0.*torch: torch\.cuda\.is_available\(\) "
                                              r"is False"):
            tgx.compile(lambda x: x + 1.0, device="cuda", backends=["torch"])
    with pytest.raises(KernelError, match="cuda:0.*numpy runs on the host"):
        tgx.compile(lambda x: x + 1.0, device="cuda:0", backends=["numpy"])
    g = tgx.make_graph(lambda x: tnp.exp(x))(tgx.Spec((3,)))
    with pytest.raises(tgx.TgxError, match="cuda:0"):
        plan_graph(g, policy="heuristic", device="cuda:0")


@pytest.mark.skipif(not HAS_JAX or _jax_has_gpu(), reason="needs jax without a gpu")
def test_jax_without_gpu_is_a_clear_error():
    with pytest.raises(KernelError, match=r"device cuda:0 is not available to jax: jax has no "
                                          r"gpu device"):
        tgx.compile(lambda x: x + 1.0, device="cuda:0", backends=["jax"])


def test_device_unavailable_reason_on_cpu():
    for b in ("numpy", "torch", "jax"):
        if backend_available(b):
            assert get_backend(b).device_reason("cpu") is None
    assert "host" in get_backend("numpy").device_reason("cuda:0")


# -- the heuristic rule is device-aware (pure function, no GPU needed) --------------------------
def _small_between_big(x, s):
    """A big torch-worthy product, a tiny op on a graph input, and a consumer of both."""
    big = x @ x
    scale = tnp.exp(s) * 2.0              # tiny, inputs on the host
    return tnp.tanh(big * scale[None, :])


@pytest.mark.skipif(not HAS_TORCH, reason="torch missing")
def test_tiny_tensors_stay_on_numpy_only_on_the_cpu():
    g = tgx.make_graph(_small_between_big)(tgx.Spec((128, 128)), tgx.Spec((128,)))
    names = [e.primitive.name for e in g.eqns]
    cpu = assign_backends(g, ["numpy", "torch"])
    gpu = assign_backends(g, ["numpy", "torch"], device="cuda:0")
    assert cpu[names.index("exp")] == "numpy"            # the CPU rule: tiny stays on NumPy
    assert set(gpu) == {"torch"}                         # on a GPU: no host detour at all
    assert assign_backends(g, ["numpy", "torch"], device="cpu") == cpu
    # the copies carry the device (NumPy's: "cpu")
    bg = tgx.rebackend(g, gpu, device="cuda:0")
    copies = {(e.params["backend"], e.params["device"]) for e in bg.eqns
              if e.primitive.name == "copy_to"}
    assert copies == {("torch", "cuda:0"), ("numpy", "cpu")}


@pytest.mark.skipif(not (HAS_TORCH and HAS_JAX), reason="needs torch and jax")
def test_gpu_fallback_prefers_the_other_device_backend():
    # torch declines uint32: on the CPU the tiny add stays on NumPy (inputs there); on a GPU
    # it goes to jax (still on the device) before NumPy
    g = tgx.make_graph(lambda a, b: a + b)(tgx.Spec((4,), "uint32"), tgx.Spec((4,), "uint32"))
    assert assign_backends(g, ["numpy", "torch", "jax"]) == ["numpy"]
    assert assign_backends(g, ["numpy", "torch", "jax"], device="cuda:0") == ["jax"]
    assert assign_backends(g, ["numpy", "torch"], device="cuda:0") == ["numpy"]


# -- a simulated CUDA device: the whole device path, with "cuda:0" tensors kept on the CPU -------
class _Log(list):
    tensors: list


@pytest.fixture
def fake_cuda(monkeypatch):
    """Pretend torch and jax reach cuda:0: availability says yes, and every conversion asked
    for cuda:0 is recorded and done on the CPU. Checks the plumbing (plans, transfers, memory
    accounting, weights, budgets) on machines without a GPU; the real thing is below."""
    pytest.importorskip("torch")
    import sys

    tb = get_backend("torch")
    asked = _Log()  # (backend, device) of every conversion
    tensors: list = []  # devices torch tensors were moved to (results of input-less kernels)
    real_convert = type(tb).convert

    def convert(x, device="cpu"):
        asked.append(("torch", device))
        if tb.is_array(x):
            tensors.append(device)
        return real_convert(tb, x, "cpu")

    monkeypatch.setattr(tb, "convert", convert)
    monkeypatch.setattr(tb, "device_reason", lambda d: None)
    if HAS_JAX:
        import jax

        jb = get_backend("jax")

        def jax_device(device):
            asked.append(("jax", device))
            return jax.devices("cpu")[0]
        monkeypatch.setattr(jb, "device_reason", lambda d: None)
        monkeypatch.setattr(sys.modules[type(jb).__module__], "_jax_device", jax_device)
    asked.tensors = tensors
    return asked


@pytest.mark.parametrize("backends", [["torch"], ["numpy", "torch"], None])
def test_simulated_cuda_mlp(fake_cuda, backends, rng):
    p = mlp_params(rng)
    x = rng.standard_normal((8, 32)).astype(np.float32)
    f = tgx.compile(bench.mlp, device="cuda:0", backends=backends, weights="p",
                    dynamic={"x": {0: "N"}})
    np.testing.assert_allclose(f(p, x), bench.mlp_np(p, x), rtol=1e-4, atol=1e-5)
    plan = f.lower(p, tgx.Spec(("N", 32), "float32"))
    assert plan.device == "cuda:0" and "device cuda:0" in str(plan).split("\n")[0]
    assert plan.policy.startswith("heuristic (device cuda:0: the benchmark store's selection "
                                  "is CPU-only")
    work = [b for e, b in zip(plan.graph.eqns, plan.graph.backends)
            if e.primitive.name != "copy_to"]
    # by default the device's whole-program backend (XLA) where it reaches the device
    lib = "jax" if backends is None and HAS_JAX else "torch"
    assert set(work) == {lib}
    for e in plan.graph.eqns:
        if e.primitive.name == "copy_to":
            assert e.params["device"] == ("cpu" if e.params["backend"] == "numpy" else "cuda:0")
    cg = plan.compiled
    # no device value in the CPU workspace; device values are library-owned on cuda:0
    assert not cg.workspace
    devices = {r.device for r in cg.memory.requests}
    assert "cuda:0/owned" in devices and "cuda:0" in devices
    est = plan.estimate_memory(N=8)
    assert set(est) == {"cpu", "cuda:0"} and est["cuda:0"] > sum(a.nbytes for a in p.values())
    # weights: converted once to the device
    assert {(b, d) for _, _, b, d in cg.weight_copies} == {(lib, "cuda:0")}
    n = cg.weight_conversions
    assert n == len(p)
    f(p, rng.standard_normal((3, 32)).astype(np.float32))
    assert cg.weight_conversions == n
    assert set(fake_cuda) == {(lib, "cuda:0")}


def test_simulated_cuda_matches_the_cpu_memory_elsewhere(fake_cuda, rng):
    p = mlp_params(rng)
    cpu = tgx.compile(bench.mlp, backends=["torch"], policy="heuristic").lower(
        p, tgx.Spec((8, 32), "float32"))
    gpu = tgx.compile(bench.mlp, backends=["torch"], policy="heuristic",
                      device="cuda:0").lower(p, tgx.Spec((8, 32), "float32"))
    assert cpu.compiled.workspace and not gpu.compiled.workspace  # torch out= → workspace on CPU
    assert set(cpu.estimate_memory()) == {"cpu"}
    assert set(gpu.estimate_memory()) == {"cpu", "cuda:0"}
    assert [repr(k) for k in cpu.kernels] == [repr(k) for k in gpu.kernels]


def test_simulated_cuda_budget_names_the_device(fake_cuda, rng):
    p = mlp_params(rng)
    x = rng.standard_normal((8, 32)).astype(np.float32)
    f = tgx.compile(bench.mlp, device="cuda:0", backends=["torch"], policy="heuristic",
                    memory_budget={"cuda:0": 1024})
    with pytest.raises(OutOfMemory, match="on cuda:0"):
        f(p, x)
    plan = f.lower(p, x)
    with pytest.raises(OutOfMemory, match="on cuda:0"):
        plan.check_budget({"cuda:0": 1024})
    plan.check_budget({"cpu": 1 << 30})  # devices not named are not checked
    ok = tgx.compile(bench.mlp, device="cuda:0", backends=["torch"], policy="heuristic",
                     memory_budget={"cuda:0": 1 << 30, "cpu": 1 << 30})
    np.testing.assert_allclose(ok(p, x), bench.mlp_np(p, x), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("backends", [["torch"], ["numpy", "torch"], ["jax"], ["numpy", "jax"]])
def test_simulated_cuda_block(fake_cuda, backends, rng):
    if "jax" in backends and not HAS_JAX:
        pytest.skip("jax missing")
    p, x, cos, sin = block_args(rng)
    ref = bench.block(p, x, cos, sin, xp=np)
    f = tgx.compile(bench.block, device="cuda:0", backends=backends, weights="p")
    np.testing.assert_allclose(f(p, x, cos, sin), ref, rtol=2e-4, atol=2e-4)
    plan = f.lower(p, x, cos, sin)
    dev = backends[-1]
    assert {b for e, b in zip(plan.graph.eqns, plan.graph.backends)
            if e.primitive.name != "copy_to"} == {dev}
    assert ("torch" if dev == "torch" else "jax", "cuda:0") in fake_cuda
    g = tgx.compile(bench.block, device="cuda:0", backends=backends, return_backend_arrays=True)
    y = g(p, x, cos, sin)
    assert type(y).__module__.split(".")[0] in ("torch", "jax", "jaxlib")


def test_simulated_cuda_kernels_without_inputs(fake_cuda):
    f = tgx.compile(positions, device="cuda:0", backends=["torch"], dynamic={"x": {0: "N"}})
    x = np.ones((5, 3), np.float32)
    np.testing.assert_allclose(f(x), x * np.arange(5, dtype=np.float32)[:, None] + 5)
    assert fake_cuda.tensors.count("cuda:0") == 2  # iota and the dim value, moved each call


def _cache_step(x, cache, pos):
    import tgx.lax as lax

    cache = lax.dynamic_update_slice(cache, x[None], (pos, 0))
    return tnp.sum(cache), cache


def _state_round_trip():
    """Three steps of `_cache_step` compiled for cuda:0, checked against the values written;
    returns the compiled function and the caller's cache."""
    f = tgx.compile(_cache_step, state="cache", device="cuda:0", backends=["torch"])
    cache = np.zeros((4, 2), np.float32)
    for pos in range(3):
        y, new = f(np.full(2, pos + 1.0, np.float32), cache, np.int32(pos))
        assert new is cache
    assert float(y) == 12.0 and cache[:3, 0].tolist() == [1.0, 2.0, 3.0]
    return f, cache


def test_simulated_cuda_state_is_copied(fake_cuda):
    f, cache = _state_round_trip()
    cg = f.lower(np.ones(2, np.float32), cache, np.int32(0)).compiled
    assert [copy for _, _, copy in cg.state] == [True]  # the device copy, not the caller's array


# -- on a real GPU ------------------------------------------------------------------------------
cuda = pytest.mark.cuda
needs_cuda = pytest.mark.skipif(not HAS_CUDA, reason="no CUDA device")


def _on_device_only(plan):
    """No equation on NumPy: every non-transfer equation runs on the device."""
    return all(b != "numpy" for e, b in zip(plan.graph.eqns, plan.graph.backends)
               if e.primitive.name != "copy_to")


@cuda
@needs_cuda
@pytest.mark.parametrize("backends", [["torch"], ["numpy", "torch"]])
def test_cuda_mlp(backends, rng):
    import torch

    p = mlp_params(rng, d=256, h=512)
    x = rng.standard_normal((64, 256)).astype(np.float32)
    f = tgx.compile(bench.mlp, device="cuda:0", backends=backends, weights="p",
                    dynamic={"x": {0: "N"}})
    y = f(p, x)
    assert type(y) is np.ndarray
    np.testing.assert_allclose(y, bench.mlp_np(p, x), rtol=1e-3, atol=1e-3)
    plan = f.lower(p, tgx.Spec(("N", 256), "float32"))
    assert plan.device == "cuda:0" and _on_device_only(plan)
    assert plan.policy.startswith("heuristic (device cuda:0")
    cg = plan.compiled
    assert not cg.workspace
    est = plan.estimate_memory(N=64)
    assert "cuda:0" in est and est["cuda:0"] >= sum(a.nbytes for a in p.values())
    # weights: bound once, on the device
    n = cg.weight_conversions
    assert n == len(p)
    assert all(isinstance(v, torch.Tensor) and v.device == torch.device("cuda:0")
               for v in cg._bound)
    for m in (64, 7, 64):
        xm = rng.standard_normal((m, 256)).astype(np.float32)
        np.testing.assert_allclose(f(p, xm), bench.mlp_np(p, xm), rtol=1e-3, atol=1e-3)
    assert cg.weight_conversions == n
    # device tensors out
    g = tgx.compile(bench.mlp, device="cuda:0", backends=backends, return_backend_arrays=True)
    t = g(p, x)
    assert isinstance(t, torch.Tensor) and t.device.type == "cuda"
    np.testing.assert_allclose(t.cpu().numpy(), bench.mlp_np(p, x), rtol=1e-3, atol=1e-3)


@cuda
@needs_cuda
@pytest.mark.parametrize("backends", [["torch"], ["numpy", "torch"], None])
def test_cuda_block(backends, rng):
    import torch

    p, x, cos, sin = block_args(rng, t=32, d=64, f=128)
    ref = bench.block(p, x, cos, sin, xp=np)
    f = tgx.compile(bench.block, device="cuda:0", backends=backends, weights="p")
    np.testing.assert_allclose(f(p, x, cos, sin), ref, rtol=2e-3, atol=2e-3)
    np.testing.assert_allclose(f(p, x, cos, sin), ref, rtol=2e-3, atol=2e-3)  # bound weights
    plan = f.lower(p, x, cos, sin)
    assert _on_device_only(plan)
    assert "cuda:0" in plan.estimate_memory()
    g = tgx.compile(bench.block, device="cuda:0", backends=backends, return_backend_arrays=True)
    t = g(p, x, cos, sin)
    if backends is None and _jax_has_gpu():  # the device's whole-program backend (rule 5)
        import jax
        assert isinstance(t, jax.Array) and t.devices() == {jax.devices()[0]}
        assert jax.devices()[0].platform == "gpu"
    else:
        assert isinstance(t, torch.Tensor) and t.device == torch.device("cuda:0")


@cuda
@needs_cuda
def test_cuda_budget_and_kernels_without_inputs(rng):
    p = mlp_params(rng)
    x = rng.standard_normal((8, 32)).astype(np.float32)
    f = tgx.compile(bench.mlp, device="cuda:0", backends=["torch"],
                    memory_budget={"cuda:0": 1024})
    with pytest.raises(OutOfMemory, match="on cuda:0"):
        f(p, x)
    h = tgx.compile(positions, device="cuda:0", backends=["torch"], dynamic={"x": {0: "N"}})
    x = np.ones((5, 3), np.float32)
    np.testing.assert_allclose(h(x), x * np.arange(5, dtype=np.float32)[:, None] + 5)


@cuda
@needs_cuda
def test_cuda_state_round_trip():
    _state_round_trip()


@cuda
@pytest.mark.skipif(not _jax_has_gpu(), reason="jax has no gpu")
@pytest.mark.parametrize("backends", [["jax"], ["numpy", "jax"]])
def test_cuda_jax_block(backends, rng):
    import jax

    p, x, cos, sin = block_args(rng, t=32, d=64, f=128)
    ref = bench.block(p, x, cos, sin, xp=np)
    f = tgx.compile(bench.block, device="cuda:0", backends=backends, weights="p")
    np.testing.assert_allclose(f(p, x, cos, sin), ref, rtol=2e-3, atol=2e-3)
    plan = f.lower(p, x, cos, sin)
    assert _on_device_only(plan) and "cuda:0" in plan.estimate_memory()
    g = tgx.compile(bench.block, device="cuda:0", backends=backends, return_backend_arrays=True)
    y = g(p, x, cos, sin)
    assert isinstance(y, jax.Array) and y.devices() == {jax.devices("gpu")[0]}


@cuda
@pytest.mark.skipif(not (HAS_CUDA and _jax_has_gpu()), reason="needs torch CUDA and jax gpu")
def test_cuda_torch_and_jax_mixed(rng):
    p, x, cos, sin = block_args(rng)
    ref = bench.block(p, x, cos, sin, xp=np)
    # alternate backends by equation: every torch <-> jax hop is DLPack on the device
    np.testing.assert_allclose(_mixed(p, x, cos, sin), ref, rtol=2e-3, atol=2e-3)


def _mixed(p, x, cos, sin):
    """The block with backends alternating torch / jax by equation, lowered for cuda:0."""
    g = decompose_unsupported(tgx.make_graph(bench.block)(p, x, cos, sin), ["torch", "jax"],
                              "torch")
    assign = ["torch" if i % 3 else "jax" for i in range(len(g.eqns))]
    bg = tgx.rebackend(g, assign, device="cuda:0")
    cg = lower(bg, choose_kernels(bg, bg.backends), device="cuda:0")
    leaves, _ = tree_flatten(((p, x, cos, sin), {}))
    return cg.run_flat(leaves)[0]


@pytest.mark.skipif(not HAS_JAX, reason="jax missing")
def test_simulated_cuda_torch_and_jax_mixed(fake_cuda, rng):
    p, x, cos, sin = block_args(rng)
    ref = bench.block(p, x, cos, sin, xp=np)
    np.testing.assert_allclose(_mixed(p, x, cos, sin), ref, rtol=2e-4, atol=2e-4)
    assert {("torch", "cuda:0"), ("jax", "cuda:0")} <= set(fake_cuda)
