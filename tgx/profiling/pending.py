"""Pending implementations: what ``tgx profile --pending`` measures.

Convention (store API only, no schema change): an implementation is *profilable* when its
``requirements`` hold ``"pending": true``, ``"entry": "module.path:function"`` (the
candidate) and ``"graph_hash"``, optionally ``"golden": "module.path:function"`` (a NumPy
reference) and ``"workloads"`` (workload keys). Its workloads are those listed plus every
workload of that graph already traced on any machine. A (graph, implementation, workload)
is *pending* on this machine while the store has no trace of it for this environment.
Inputs are drawn from the workload's input descriptors with a fixed seed.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import math
import warnings
from typing import Any

import ml_dtypes
import numpy as np

from ..backends import get_backend
from ..backends.registry import kernels_for
from ..core import Literal, primitive_by_name
from ..shapes import DTYPES, ShapedArray, concrete_shape, concretize, name_binding
from ..store.names import signature
from ..store.schema import implementation_key
from ..backends.threads import one_blas_thread
from ..tracing import GraphBuilder
from .accuracy import DEFAULT_ATOL
from .accuracy import golden as compute_golden
from .runner import profile


def random_inputs(inputs: list, seed: int = 0) -> tuple:
    """Arrays for ``[(shape, dtype), ...]``: floats ~ N(0, 1) rounded to their dtype,
    integers in [0, 10), bools uniform.

    >>> [a.dtype.name for a in random_inputs([((2,), "float32"), ((), "int64")])]
    ['float32', 'int64']
    """
    rng = np.random.default_rng(seed)
    out = []
    for shape, dtype in inputs:
        dt = ml_dtypes.bfloat16 if dtype == "bfloat16" else np.dtype(dtype)
        shape = tuple(shape)
        if dt == np.bool_:
            out.append(rng.random(shape) < 0.5)
        elif np.issubdtype(dt, np.integer):
            out.append(rng.integers(0, 10, shape).astype(dt))
        elif dt in (np.float32, np.float64):   # drawn in the dtype: 4x faster for float32
            out.append(np.asarray(rng.standard_normal(shape, dtype=dt)))
        else:
            out.append(np.asarray(rng.standard_normal(shape, dtype=np.float32)).astype(dt))
    return tuple(out)


def pending_jobs(store: Any, env_id: str) -> list[dict]:
    """`profile_many` jobs for every pending (graph, implementation, workload) on `env_id`."""
    jobs = []
    for impl in store.implementations():
        req = impl.get("requirements") or {}
        if not (req.get("pending") and req.get("entry") and req.get("graph_hash")):
            continue
        g = req["graph_hash"]
        keys = list(req.get("workloads") or [])
        keys += [t["workload"] for t in store.traces(graph_hash=g)]
        for w in dict.fromkeys(keys):  # unique, in order
            wl = store.get_workload(w)
            if wl is None or store.measured(g, impl["key"], w, env_id) is not None:
                continue
            jobs.append({"fn": req["entry"], "args": random_inputs(wl["inputs"]),
                         "golden": req.get("golden"), "graph_hash": g, "impl": impl["key"],
                         "workload": w, "env_id": env_id,
                         "label": f"{signature(impl['name'], wl['inputs'])} "
                                  f"on {impl['backend']}"})
    return jobs


# ------------------------------------------------------------------ one equation on one kernel
# Pending flags written by the "fastest" policy (store table `pending`, schema 2) describe a
# one-equation graph as msgpack-friendly data: primitive name, concrete params, input avals.


class Unencodable(Exception):
    """A param that has no msgpack-friendly form (the combination is then not flagged)."""


def encode_param(v: Any) -> Any:
    """A param as JSON/msgpack data; tuples and dtypes are tagged so they decode exactly.

    >>> decode_param(encode_param((1, (2, 3), np.dtype("float32"))))
    (1, (2, 3), dtype('float32'))
    """
    if v is None or isinstance(v, bool | int | float | str):
        return v
    if isinstance(v, np.generic):
        return v.item()
    if isinstance(v, np.dtype):
        return {"dtype": v.name}
    if isinstance(v, tuple):
        return {"t": [encode_param(x) for x in v]}
    if isinstance(v, list):
        return [encode_param(x) for x in v]
    raise Unencodable(f"cannot encode param {v!r} ({type(v).__name__})")


def decode_param(v: Any) -> Any:
    if isinstance(v, dict):
        if "dtype" in v:
            return DTYPES[v["dtype"]]
        return tuple(decode_param(x) for x in v["t"])
    if isinstance(v, list):
        return [decode_param(x) for x in v]
    return v


def describe_equation(eqn: Any, dims: dict) -> dict:
    """{"primitive", "params", "inputs"} of `eqn` at the concrete binding `dims`."""
    env = name_binding(dims)
    syms = _symbol_binding(eqn, env)
    params = {k: encode_param(concretize(v, syms)) for k, v in sorted(eqn.params.items())}
    inputs = []
    for a in eqn.invars:
        if isinstance(a, Literal):
            inputs.append({"literal": encode_param(np.asarray(a.val).item()),
                           "dtype": a.aval.dtype.name})
        else:
            inputs.append([list(concrete_shape(a.aval.shape, env)), a.aval.dtype.name])
    return {"primitive": eqn.primitive.name, "params": params, "inputs": inputs}


def equation_from(desc: dict) -> Any:
    """The one-equation graph's equation rebuilt from `describe_equation`'s data."""
    prim = primitive_by_name(desc["primitive"])
    params = {k: decode_param(v) for k, v in desc["params"].items()}
    with GraphBuilder() as b:
        ins = []
        for d in desc["inputs"]:
            if isinstance(d, dict):
                dt = DTYPES[d["dtype"]]
                ins.append(Literal(np.asarray(d["literal"], dt).item(), ShapedArray((), dt)))
            else:
                ins.append(b.new_arg(ShapedArray(tuple(d[0]), DTYPES[d[1]])))
        prim.bind(*ins, **params)
        return b.eqns[-1]


def _param_symbols(v: Any) -> set:
    if isinstance(v, tuple):
        return set().union(*(_param_symbols(x) for x in v))
    return set(getattr(v, "free_symbols", ()) or ()) if hasattr(v, "xreplace") else set()


def _symbol_binding(eqn: Any, env: dict) -> dict:
    """{Symbol: int} for every symbol of `eqn`'s input shapes and params (iota's shape is
    only in its params), from the binding `env` {name: int}."""
    free = set().union(*(d.free_symbols for a in eqn.invars if not isinstance(a, Literal)
                         for d in a.aval.shape if type(d) is not int),
                       *(_param_symbols(v) for v in eqn.params.values()))
    return {s: env[s.name] for s in free}


def kernel_job(eqn: Any, kernel: Any, dims: dict, seed: int = 0, *,
               cap_each_call: bool = True, inputs: dict | None = None) -> dict:
    """A `profile` job: `kernel` on random inputs of `eqn` at `dims`, the primitive's NumPy
    reference (float64 inputs) as golden. A kernel with a pool of its own runs with BLAS on
    one thread, as in a plan: each call capped, or (`cap_each_call=False`) the caller caps
    the whole job (switching BLAS's pool on and off between calls disturbs the timing).
    `inputs`: a cache of the random inputs by shapes, shared by the kernels of one equation
    (drawing a Gemma head's 21M weights took as long as timing a kernel)."""
    env = name_binding(dims)
    syms = _symbol_binding(eqn, env)
    params = {k: concretize(v, syms) for k, v in eqn.params.items()}
    descs = tuple((tuple(concrete_shape(a.aval.shape, env)), a.aval.dtype.name)
                  for a in eqn.invars if not isinstance(a, Literal))
    if inputs is None:
        drawn = random_inputs(list(descs), seed)
    else:
        drawn = inputs.get((descs, seed))
        if drawn is None:
            drawn = inputs[(descs, seed)] = random_inputs(list(descs), seed)
    arrays = list(drawn)
    args = [np.asarray(a.val, a.aval.dtype) if isinstance(a, Literal) else arrays.pop(0)
            for a in eqn.invars]
    backend = get_backend(kernel.backend)
    # operands a kernel prepares (weights held in a lower precision) are prepared once, as
    # for a bound weight, and not timed
    bargs = tuple(kernel.prepared([backend.convert(x) for x in args]))
    out_aval = eqn.outvars[0].aval
    out_shape = concrete_shape(out_aval.shape, env)
    out = backend.empty(out_shape, out_aval.dtype) if kernel.writes_out else None
    fn = _cold(kernel.bind(params, out), bargs, backend)
    if kernel.own_pool and cap_each_call:  # BLAS on one thread (tgx.backends.threads)
        fn = _blas_capped(fn)
    ref = functools.partial(eqn.primitive.impl, **params)
    job = {"fn": fn, "args": bargs, "host_args": tuple(args),
           "golden": ref if eqn.primitive.impl else None,
           "dtype": out_aval.dtype, "sync": kernel.backend,
           "atol": reduction_atol(eqn, args, out_shape, out_aval.dtype)}
    if kernel.own_pool:
        # another library's pool may still spin from the kernel profiled before (torch's
        # OpenMP workers: a parallel GEMV measured 8 ms instead of 0.1 ms): let it settle
        job["warmup_s"] = OWN_POOL_WARMUP_S
    if kernel.lossy is not None and eqn.primitive.impl:
        # a lossy kernel passes within the error it promises, relative to the output's scale
        golden = np.asarray(ref(*args))
        scale = float(np.max(np.abs(golden))) if golden.size else 1.0
        job.update(golden=golden, rtol=kernel.lossy, atol=kernel.lossy * scale)
    return job


#: untimed calls before timing a kernel with a thread pool of its own (see `kernel_job`)
OWN_POOL_WARMUP_S = 0.03
#: Operands at least this large are timed cold: in a model each layer reads its own weights,
#: which a loop over one copy would keep in the cache (a 2048x640 float32 GEMV: 37 µs hot,
#: ~230 µs streamed from memory, as decode runs it).
COLD_BYTES = 256 * 1024
#: ... by cycling through copies of the inputs that together exceed the last-level cache
COLD_SET = 64 * 1024 * 1024
MAX_COPIES = 256


def _cold(fn, args: tuple, backend):
    """`fn`, timed as a model runs it: when its inputs are large, each call reads the next
    of several copies of them (the first copy is `args`, so results are the same)."""
    nbytes = sum(_nbytes(a) for a in args)
    if nbytes < COLD_BYTES:
        return fn
    n = min(MAX_COPIES, -(-COLD_SET // nbytes))
    if n <= 1:
        return fn
    copies = [args] + [tuple(_copy(a, backend) for a in args) for _ in range(n - 1)]
    turn = itertools.cycle(copies)

    def cold(*_):
        return fn(*next(turn))
    return cold


def _blas_capped(fn):
    def capped(*args):
        with one_blas_thread():
            return fn(*args)
    return capped


def _nbytes(x) -> int:
    if isinstance(x, tuple):
        return sum(_nbytes(a) for a in x)
    return int(getattr(x, "nbytes", 0) or 0)


def _copy(x, backend):
    if isinstance(x, tuple):  # a prepared operand (int8 values and their scales)
        return tuple(_copy(a, backend) for a in x)
    if isinstance(x, np.ndarray):
        return x.copy()
    return backend.convert(np.array(backend.to_host(x), copy=True))


def reduction_atol(eqn: Any, args: list, out_shape: tuple, dtype: Any) -> float | None:
    """An absolute tolerance that grows with the number of terms summed per output.

    A float32 dot over K terms of N(0, 1) inputs carries absolute rounding error ~K·eps, so a
    fixed atol flags correct matmuls as INCORRECT_NUMERICAL near zero. Per output element,
    K = the largest input's elements / output elements; atol = max(default, 4·K·eps).
    Elementwise ops (K ≤ 1) keep the default (None).
    """
    if not (np.issubdtype(dtype, np.floating) or dtype.name == "bfloat16") or not args:
        return None
    if eqn.primitive.name == "dot_general":
        (lc, _), _ = eqn.params["dimension_numbers"]
        k = int(np.prod([np.shape(args[0])[a] for a in lc]))
    elif eqn.primitive.name in ("linear", "matmul") and np.ndim(args[0]) >= 1:
        # the contraction is x's last axis (the size ratio below would say 5 for a
        # (128, 640) x (32768, 640) linear and flag correct float32 kernels as incorrect)
        k = int(np.shape(args[0])[-1])
    else:
        k = max(int(np.size(a)) for a in args) / max(1, int(np.prod(out_shape)))
    if k <= 1:
        return None
    return max(DEFAULT_ATOL.get(dtype.name, 1e-6), 4 * k * float(ml_dtypes.finfo(dtype).eps))


def profile_kernel(eqn: Any, kernel: Any, dims: dict, store: Any, cost_model: Any,
                   budget_s: float = 0.05, cache: dict | None = None,
                   deferred: list | None = None) -> dict:
    """Profile `kernel` on `eqn` at `dims`; record the trace under the cost model's keys.

    For a sweep over many kernels (`tgx.explore`): `cache`, a dict shared by the calls, keeps
    the random inputs and the golden result of each workload (the kernels of one equation
    share both: the float64 golden of an 18-layer prefill's head took ~0.3 s per kernel);
    `deferred`, a list the trace is appended to instead of being written (the caller writes
    them at once with `store.add_traces`: one store write per trace was 2.4 s of an explore)."""
    ghash, axes, descs = cost_model.workload(eqn, dims)
    wkey = store.add_workload(ghash, axes, descs)
    inputs = None if cache is None else cache.setdefault("inputs", {})
    goldens = None if cache is None else cache.setdefault("goldens", {})
    job = kernel_job(eqn, kernel, dims, cap_each_call=False, inputs=inputs)
    if goldens is not None and callable(job["golden"]):
        key = (ghash, wkey)
        if key not in goldens:
            try:  # inputs may leave an op's domain: NaN where the golden has it too
                with np.errstate(all="ignore"), warnings.catch_warnings():
                    warnings.simplefilter("ignore", RuntimeWarning)
                    goldens[key] = compute_golden(job["golden"], job["host_args"])
            except Exception:  # the profiler reports a failing reference itself
                goldens[key] = job["golden"]
        job["golden"] = goldens[key]
    store.add_implementation("KERNEL", kernel.label, kernel.backend, kernel.source_hash)
    # Random inputs may leave an op's domain (sqrt of a negative): the golden result has the
    # NaN in the same place, so the trace is still right; the warnings are noise.
    impl, env_id = cost_model.impl_key(kernel), cost_model.env_id
    if not kernel.own_pool:
        # a plan that runs a generated kernel elsewhere caps BLAS: time a competitor so too
        with (one_blas_thread() if _competes_with_own_pool(eqn, kernel)
              else contextlib.nullcontext()):
            rec = _profile_job(job, None, ghash, impl, wkey, env_id, budget_s)
        return _record(store, rec, deferred)
    # As a plan runs it: BLAS on one thread. Twice (half the budget each), keeping the
    # faster: a kernel that needs every core waits out any other runnable thread (on the
    # 2-core CPU, 1 in ~18 figures came out at 5-8 ms for a 0.05 ms GEMV, each time for the
    # whole measurement).
    with one_blas_thread():
        recs = [_profile_job(job, None, ghash, impl, wkey, env_id, budget_s / 2)
                for _ in range(2)]
    rec = min(recs, key=lambda r: (r["status"] != "PASSED", r.get("median_s") or math.inf))
    return _record(store, rec, deferred)


def _record(store, rec: dict, deferred: list | None) -> dict:
    if deferred is None:
        store.add_trace(**rec)
    else:
        deferred.append(rec)
    return rec


def _competes_with_own_pool(eqn, kernel) -> bool:
    """Whether a kernel with a pool of its own (`Kernel.own_pool`) also runs `eqn` on
    `kernel`'s backend: then a plan holding such kernels runs `kernel` with BLAS on one
    thread (`tgx.backends.threads`), and that is how it is timed (a decode GEMV through
    BLAS: 0.16 ms on two threads, 0.28 ms in such a plan)."""
    avals = [a.aval for a in eqn.invars]
    return any(k.own_pool and k.check(avals, dict(eqn.params)) is None
               for k in kernels_for(eqn.primitive.name, kernel.backend))


def _profile_job(job, store, ghash, impl, wkey, env_id, budget_s):
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return profile(job["fn"], job["args"], golden=job["golden"], dtype=job["dtype"],
                       atol=job["atol"], rtol=job.get("rtol"), store=store, graph_hash=ghash,
                       impl=impl, workload=wkey, env_id=env_id, sync=job["sync"],
                       budget_s=budget_s,
                       **({"warmup_s": job["warmup_s"]} if "warmup_s" in job else {}))


def flagged_jobs(store: Any, env_id: str) -> tuple[list[dict], list[str]]:
    """`profile_many` jobs for the store's pending flags on `env_id` (written by the
    "fastest" policy) and the flag keys they cover. A flag whose kernel is gone or changed
    (source hash) is covered without a job: it is stale."""
    jobs, keys = [], []
    for rec in store.pending(env_id):
        keys.append(rec["key"])
        kd, desc = rec["kernel"], rec["equation"]
        try:
            k = next(k for k in kernels_for(kd["name"], kd["backend"])
                     if k.variant == kd["variant"])
        except Exception:
            continue
        if implementation_key("KERNEL", kd.get("label", k.name), k.backend,
                              k.source_hash) != rec["impl"]:
            continue
        eqn = equation_from(desc)
        inputs = [(tuple(d[0]), d[1]) for d in desc["inputs"] if not isinstance(d, dict)]
        store.add_workload(rec["graph_hash"], desc.get("axes", {}), inputs)
        store.add_implementation("KERNEL", kd.get("label", k.name), k.backend, k.source_hash)
        job = kernel_job(eqn, k, {})
        job.pop("host_args")
        job.update(graph_hash=rec["graph_hash"], impl=rec["impl"], workload=rec["workload"],
                   env_id=env_id, label=f"{signature(desc['primitive'], inputs)} on "
                                        f"{kd.get('label', k.name)}@{k.backend}")
        jobs.append(job)
    return jobs, keys
