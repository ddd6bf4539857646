"""Store jobs as data (`pending_jobs`, `resolve_kernel`) and the speedup of kernel traces."""

from __future__ import annotations

import json

import numpy as np
import pytest

import tgx
import tgx.numpy as tnp
from tgx.cli import main
from tgx.profiling.pending import measure_job, pending_jobs, resolve_kernel
from tgx.profiling.speedup import fill_speedup, is_reference
from tgx.store import BenchmarkStore

X = np.linspace(-1, 1, 256).astype(np.float32)


def f(x):
    return tnp.exp(x) * 2.0


@pytest.fixture
def store(tmp_path):
    with BenchmarkStore(tmp_path / "s.json") as st:
        yield st


def test_pending_jobs_are_data_naming_registered_kernels(store):
    tgx.compile(f, store=store, backends=["numpy"]).lower(X)
    env = store.environment_id()
    flags = store.pending(env)
    jobs = pending_jobs(store, env)
    assert len(jobs) == len(flags) >= 4
    json.dumps(jobs)  # plain data: nothing callable, nothing to import
    assert {"graph_hash", "workload", "impl", "kernel", "equation", "flags",
            "label"} == set(jobs[0])
    assert sorted(k for j in jobs for k in j["flags"]) == sorted(r["key"] for r in flags)
    refs = [is_reference(j["impl"]) for j in jobs]
    assert refs == sorted(refs, reverse=True)  # references first: the others' speedup
    for job in jobs:
        k = resolve_kernel(job)
        assert k is not None and k.backend == "numpy" and k.label == job["kernel"]["label"]
        # the same kernel name with another source hash is another implementation: not run
        assert resolve_kernel(dict(job, impl=job["impl"][:-4] + "0000")) is None
    rec = measure_job(jobs[0], env, budget_s=0.01)
    assert rec["status"] == "PASSED" and rec["impl"] == jobs[0]["impl"]


def test_unprofiled_jobs_come_from_other_environments_traces(store):
    tgx.compile(f, store=store, backends=["numpy"]).lower(X)
    env = store.environment_id()
    assert main(["profile", "--pending", "--store", store.path, "--budget", "0.01",
                 "--no-progress"]) == 0
    store.refresh()
    measured = store.traces(env_id=env)
    assert pending_jobs(store, env, unprofiled=True) == []  # all measured here
    # another machine's view of the same store: everything is unprofiled there
    other = pending_jobs(store, "env-other", unprofiled=True)
    assert sorted(j["impl"] for j in other) == sorted(t["impl"] for t in measured)
    assert all(resolve_kernel(j) is not None and j["flags"] == [] for j in other)
    assert pending_jobs(store, "env-other") == []  # no flag of that environment


def test_speedup_is_against_the_numpy_reference_of_the_same_workload(store):
    tgx.compile(f, store=store, backends=["numpy"]).lower(X)
    assert main(["profile", "--pending", "--store", store.path, "--budget", "0.01",
                 "--no-progress"]) == 0
    store.refresh()
    traces = store.traces(status="PASSED")
    refs = {(t["graph_hash"], t["workload"], t["env_id"]): t for t in traces
            if is_reference(t["impl"])}
    assert len(refs) == 2  # exp and mul
    for t in traces:
        ref = refs[(t["graph_hash"], t["workload"], t["env_id"])]
        assert t["speedup"] == pytest.approx(ref["median_s"] / t["median_s"])
        if t is ref or t["impl"] == ref["impl"]:
            assert t["speedup"] == 1.0


def test_speedup_under_explore_and_none_without_a_reference(store):
    tgx.compile(f, store=store, policy="explore", backends=["numpy"]).lower(X)
    passed = store.traces(status="PASSED")
    plans = [t for t in passed if store.get_implementation(t["impl"])["kind"] != "KERNEL"]
    assert plans and all(t["speedup"] is None for t in plans)  # a whole plan: none
    passed = [t for t in passed if t not in plans]
    refs = {(t["graph_hash"], t["workload"]) for t in passed if is_reference(t["impl"])}
    with_ref = [t for t in passed if (t["graph_hash"], t["workload"]) in refs]
    # exp, mul and their fused region (its NumPy kernel runs the decomposition)
    assert len(refs) == 3 and all(t["speedup"] > 0 for t in with_ref)
    # a graph with no NumPy reference kernel measured: no speedup
    assert all(t["speedup"] is None for t in passed if t not in with_ref)
    lone = [{"graph_hash": "g", "workload": "w", "env_id": "e", "status": "PASSED",
             "timestamp": 1.0, "impl": "neg[out]@numpy#0", "median_s": 1e-6, "speedup": None}]
    assert fill_speedup(lone, store)[0]["speedup"] is None  # no reference measured


def test_a_sweep_computes_one_golden_per_computation(tmp_path, monkeypatch):
    """A `linear` and the `dot_general` it decomposes into compute the same on the same
    inputs: a sweep over both computes their float64 golden once (a Gemma head's took
    ~0.9 s), while a different computation on inputs of the same shapes (`tnp.matmul`'s
    x @ w, a `dot_general` contracting other axes than `linear`'s x @ w.T) gets its own."""
    import tgx.nn as tnn
    from tgx.planning.candidates import accepted_kernels
    from tgx.planning.cost_model import CostModel
    from tgx.profiling import pending
    from tgx.transforms.decompose import decomposition_graph

    specs = (tgx.Spec((16, 16)), tgx.Spec((16, 16)))
    lin = tgx.make_graph(lambda x, w: tnn.linear(x, w))(*specs)
    dot = decomposition_graph(lin.eqns[0])
    mm = tgx.make_graph(lambda x, w: tnp.matmul(x, w))(*specs)
    eqns = [lin.eqns[0], dot.eqns[0], mm.eqns[0]]
    assert [e.primitive.name for e in eqns] == ["linear", "dot_general", "dot_general"]
    calls = []
    golden = pending.compute_golden
    monkeypatch.setattr(pending, "compute_golden",
                        lambda fn, args: calls.append(fn) or golden(fn, args))
    store = BenchmarkStore(str(tmp_path / "s.json"))
    cm, cache = CostModel(store), {}
    for e in eqns:
        for k in accepted_kernels(e, "numpy"):
            rec = pending.profile_kernel(e, k, {}, store, cm, 0.01, cache, [])
            assert rec["status"] == "PASSED", (k, rec)
    assert len(calls) == 2
    x, w = pending.random_inputs([((16, 16), "float32")] * 2, cache={})
    x64, w64 = x.astype(np.float64), w.astype(np.float64)
    got = sorted(cache["goldens"].values(), key=lambda g: float(np.abs(g - x64 @ w64.T).max()))
    np.testing.assert_allclose(got[0], x64 @ w64.T, rtol=1e-6)
    np.testing.assert_allclose(got[1], x64 @ w64, rtol=1e-6)


@pytest.mark.parametrize("backend", ["numpy", "torch"])
def test_cold_copies_of_large_operands_are_disjoint_and_cover_the_cache(backend, monkeypatch):
    """A kernel with large operands is timed cycling through copies of them that together
    exceed the last-level cache. In a sweep its float32 operands come from one block of
    random numbers (copying them was 1.4 s of an 18-layer prefill's sweep): disjoint,
    aligned, N(0, 1); other dtypes are copied, values and all. The first set is the
    arguments themselves (the one the accuracy check reads)."""
    from tgx.backends import get_backend
    from tgx.devices import ALIGNMENT
    from tgx.profiling import pending

    if backend == "torch":
        pytest.importorskip("torch")
    monkeypatch.setattr(pending, "COLD_SET", pending.MIN_COLD_SET)
    b = get_backend(backend)
    rng = np.random.default_rng(1)
    w = b.convert(rng.standard_normal((512, 640), dtype=np.float32))
    idx = b.convert(rng.integers(0, 512, 4096).astype(np.int32))
    arena: dict = {}
    for _ in range(2):  # a second equation takes the block from its start again
        copies = pending._cold_copies((w, idx), b, arena)
        assert copies[0][0] is w and copies[0][1] is idx
        host = [[np.asarray(b.to_host(a)) for a in c] for c in copies]
        assert sum(h.nbytes for c in host for h in c) >= pending.COLD_SET
        floats = [c[0] for c in host]
        for i, x in enumerate(floats):
            assert x.shape == (512, 640) and x.dtype == np.float32
            assert all(not np.shares_memory(x, y) for y in floats[i + 1:])
        assert all(x.ctypes.data % ALIGNMENT == 0 for x in floats[1:])
        drawn = np.concatenate([x.ravel() for x in floats[1:]])
        assert abs(drawn.mean()) < 0.01 and abs(drawn.std() - 1) < 0.01
        assert all(np.array_equal(c[1], host[0][1]) for c in host[1:])
    plain = pending._cold_copies((w,), b)       # outside a sweep: copies of the values
    assert all(np.array_equal(np.asarray(b.to_host(c[0])), host[0][0]) for c in plain)


def test_held_weights_are_viewed_in_the_arena_as_finite_normal_numbers(monkeypatch):
    """Weights a kernel holds as int8 (with float32 scales) or as bfloat16 bits are timed
    on views of the sweep's block, not copies (copying ~1 GiB per kernel was 11 s of an
    18-layer decode's explore); viewed as bfloat16 or float16 the block holds finite normal
    numbers only (a denormal or NaN would slow a kernel down). Indices are still copied."""
    import ml_dtypes

    from tgx.backends import get_backend
    from tgx.profiling import pending

    monkeypatch.setattr(pending, "COLD_SET", pending.MIN_COLD_SET)
    b = get_backend("numpy")
    rng = np.random.default_rng(2)
    x = rng.standard_normal((1, 640), dtype=np.float32)
    q = rng.integers(-127, 128, (2048, 640)).astype(np.int8)
    scale = rng.random(2048, dtype=np.float32)
    bits = rng.standard_normal((2048, 640)).astype(ml_dtypes.bfloat16).view(np.uint16)
    idx = rng.integers(0, 2048, 64).astype(np.int32)
    arena: dict = {}
    copies = pending._cold_copies((x, (q, scale), bits, idx), b, arena, frozenset({1, 2}))
    block = arena["block"].bytes
    assert len(copies) > 2
    for c in copies[1:]:
        cx, (cq, cs), cbits, cidx = c
        assert cq.dtype == np.int8 and cq.shape == q.shape and np.shares_memory(cq, block)
        assert cbits.dtype == np.uint16 and np.shares_memory(cbits, block)
        for half in (cbits.view(ml_dtypes.bfloat16), cbits.view(np.float16)):
            wide = np.abs(half.astype(np.float32))
            tiny = float(ml_dtypes.finfo(half.dtype).smallest_normal)
            assert np.isfinite(wide).all() and (wide[wide > 0] >= tiny).all()
        assert not np.shares_memory(cidx, block) and np.array_equal(cidx, idx)
    plain = pending._cold_copies((x, (q, scale), bits), b, {})   # not held: copied
    assert all(np.array_equal(c[2], bits) for c in plain)


@pytest.mark.parametrize("llc_mib, memory_gib, want_mib", [
    (0, 24, 64), (32, 24, 64), (480, 24, 480), (2048, 24, 1024), (480, 2, 256)])
def test_the_cold_set_spans_the_last_level_cache(monkeypatch, llc_mib, memory_gib,
                                                       want_mib):
    """Cold copies span the last-level cache: a 2048x640 float32 GEMV timed over 64 MiB of
    copies on a machine with a 480 MiB L3 ran as fast as its int8 twin (97 vs ~110 µs), over
    480 MiB at 172 µs, as decode runs it (1536 MiB: 175). Bounded by 64 MiB below, 1 GiB
    and an eighth of the memory above."""
    from tgx.profiling import pending

    monkeypatch.setattr(pending, "_memory_bytes", lambda: memory_gib << 30)
    assert pending.cold_set_bytes(llc=llc_mib << 20) == want_mib << 20


def test_the_last_level_cache_is_read_from_sysconf_then_sysfs(monkeypatch, tmp_path):
    """glibc's figure where it has one, else the largest cache sysfs lists, else 0."""
    from tgx.profiling import pending

    for i, size in enumerate(["48K", "2048K", "480M"]):
        (tmp_path / f"index{i}").mkdir()
        (tmp_path / f"index{i}" / "size").write_text(size + "\n")
    monkeypatch.setattr(pending.glob, "glob",
                        lambda pattern: sorted(str(p / "size") for p in tmp_path.iterdir()))
    monkeypatch.setattr(pending.os, "sysconf", lambda name: 123 << 20)
    assert pending.last_level_cache_bytes() == 123 << 20
    monkeypatch.setattr(pending.os, "sysconf", lambda name: 0)      # glibc does not know
    assert pending.last_level_cache_bytes() == 480 << 20

    def unknown(name):
        raise ValueError(name)
    monkeypatch.setattr(pending.os, "sysconf", unknown)
    assert pending.last_level_cache_bytes() == 480 << 20
    monkeypatch.setattr(pending.glob, "glob", lambda pattern: [])
    assert pending.last_level_cache_bytes() == 0


def test_a_kernel_job_waits_for_its_backends_copies_of_the_cold_operands(monkeypatch):
    """A copy to jax is asynchronous: the first timed calls of a kernel would wait for its
    cold operand sets (an 18-layer prefill's first jax kernel of an equation measured 4.31
    ms, its twin on the same operands 2.20). The job waits for them before it is timed."""
    pytest.importorskip("jax")
    import tgx.nn as tnn
    from tgx.backends.registry import kernels_for
    from tgx.profiling import pending

    synced = []
    real = pending.sync_for

    def spy(backend):
        fn = real(backend)
        return None if fn is None else (lambda x: synced.append((backend, x)) or fn(x))
    monkeypatch.setattr(pending, "sync_for", spy)
    g = tgx.make_graph(lambda x, w: tnn.linear(x, w))(tgx.Spec((64, 512)),
                                                      tgx.Spec((512, 512)))
    for backend in ("numpy", "jax"):
        k = next(k for k in kernels_for("linear", backend) if k.variant == "library")
        job = pending.kernel_job(g.eqns[0], k, {}, operands={})
        assert job["fn"](*job["args"]) is not None
    assert [b for b, _ in synced] == ["jax"]
    copies = synced[0][1]
    assert len(copies) > 1 and all(len(c) == 2 for c in copies)
