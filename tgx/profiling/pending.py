"""Pending work: what ``tgx profile --pending`` and ``tgx profile --ray`` measure.

A store job is data, never code (docs/store.md, "A row is data, never code"): a dict naming
a (graph, workload, implementation) triple, the kernel by (name, backend, variant, label)
and the one-equation graph it runs (`describe_equation`'s data). `pending_jobs` lists them;
`resolve_kernel` finds the kernel in this process's registry, by source hash too, or
nothing; `store_job`/`measure_job` turn a resolved job into a profiler job or a trace.
Inputs are drawn from the workload's input descriptors with a fixed seed.
"""

from __future__ import annotations

import contextlib
import functools
import glob
import itertools
import math
import os
import warnings
from typing import Any

import ml_dtypes
import numpy as np

from ..backends import get_backend
from ..backends.registry import kernels_for
from ..core import Literal, equation_key, primitive_by_name
from ..devices import ALIGNMENT, aligned_copy, aligned_empty
from ..errors import TgxError
from ..shapes import DTYPES, ShapedArray, concrete_shape, concretize, name_binding
from ..store.names import signature
from ..store.schema import implementation_key, make_implementation, make_workload
from ..backends.threads import one_blas_thread
from ..graph.hashing import structural_hash
from ..tracing import GraphBuilder, one_equation_graph
from ..transforms.decompose import decompose
from .accuracy import DEFAULT_ATOL
from .accuracy import golden as compute_golden
from .runner import _refused, profile
from .timing import sync_for
from .speedup import fill_speedup, is_reference


def random_inputs(inputs: list, seed: int = 0, aligned: bool = False,
                  cache: dict | None = None) -> tuple:
    """Arrays for ``[(shape, dtype), ...]``: floats ~ N(0, 1) rounded to their dtype,
    integers in [0, 10), bools uniform; with `aligned`, each starting on
    `tgx.devices.ALIGNMENT` (as `tgx.aligned` places arrays: XLA reads those in place).

    Each array is drawn from its own stream, named by `seed`, its shape and dtype and how
    many inputs of the same shape and dtype come before it, so equations that share an
    input shape get the same array for it, whatever their other inputs; `cache`, a dict
    shared by calls, keeps them (a Gemma head's 21M-weight table is the embedding's, the
    head's and their decompositions': drawing it was 0.35 s each time).

    >>> [a.dtype.name for a in random_inputs([((2,), "float32"), ((), "int64")])]
    ['float32', 'int64']
    >>> x, y = random_inputs([((3,), "float32"), ((3,), "float32")])
    >>> z = random_inputs([((), "int64"), ((3,), "float32")])[1]
    >>> bool((x != y).all()), bool((x == z).all())
    (True, True)
    """
    out, seen = [], {}
    for shape, dtype in inputs:
        shape = tuple(int(n) for n in shape)
        k = seen[(shape, dtype)] = seen.get((shape, dtype), -1) + 1
        key = (shape, dtype, seed, k, aligned)
        x = None if cache is None else cache.get(key)
        if x is None:
            x = _draw(shape, dtype, np.random.default_rng(
                [seed, k, len(shape), *shape, sum(map(ord, str(dtype)))]), aligned)
            if cache is not None:
                cache[key] = x
        out.append(x)
    return tuple(out)


def _draw(shape: tuple, dtype, rng, aligned: bool) -> np.ndarray:
    dt = ml_dtypes.bfloat16 if dtype == "bfloat16" else np.dtype(dtype)
    if dt == np.bool_:
        x = rng.random(shape) < 0.5
    elif np.issubdtype(dt, np.integer):
        x = rng.integers(0, 10, shape).astype(dt)
    elif dt in (np.float32, np.float64):   # drawn in the dtype: 4x faster for float32
        # ... and in place when aligned: a copy of an 18-layer Gemma's 463 MiB of
        # weights was 1 s, as long as drawing them (first touch of fresh pages)
        x = aligned_empty(shape, dt) if aligned else None
        x = np.asarray(rng.standard_normal(None if aligned else shape, dtype=dt, out=x))
    else:
        x = np.asarray(rng.standard_normal(shape, dtype=np.float32)).astype(dt)
    return aligned_copy(x) if aligned and x.ctypes.data % ALIGNMENT else x


class NotHere(TgxError):
    """A store job this process cannot run: its kernel is not registered here (or not with
    that source hash), or declines the job's equation on this machine."""


def pending_jobs(store: Any, env_id: str, *, unprofiled: bool = False) -> list[dict]:
    """The work the store holds for environment `env_id`, as data (nothing is resolved,
    imported or run): one job per (graph, workload, implementation) with no trace on
    `env_id` yet, references (`is_reference`) first.

    Each job is ``{"graph_hash", "workload", "impl", "kernel": {"name", "backend",
    "variant", "label"}, "equation", "flags", "label"}``: the pending flags of `env_id`
    (``flags``: their keys, cleared once measured) and, with `unprofiled`, every other triple
    the store can describe (flagged for another environment, or traced on one) whose
    one-equation graph the store holds at that workload. An implementation row in the
    former form, whose ``requirements`` name code (``"entry"``, ``"golden"``), becomes
    ``{"refuse": [specs], ...}``: recorded as refused, never run (`refused_record`).

    >>> import tempfile, os
    >>> from tgx.store import BenchmarkStore, schema
    >>> eq = {"primitive": "neg", "params": {}, "inputs": [[[4], "float32"]], "axes": {}}
    >>> with tempfile.TemporaryDirectory() as d, BenchmarkStore(os.path.join(d, "s.json")) as st:
    ...     st.add_pending([schema.make_pending("g", "w", "neg@numpy#1", "env-a", {
    ...         "name": "neg", "backend": "numpy", "variant": "default", "label": "neg"}, eq)])
    ...     [(j["impl"], j["kernel"]["backend"], j["flags"]) for j in pending_jobs(st, "env-a")]
    1
    [('neg@numpy#1', 'numpy', ['g|w|neg@numpy#1|env-a'])]
    """
    jobs: dict[tuple, dict] = {}
    flags = store.pending()
    equations: dict[tuple, dict] = {}
    for rec in flags:
        equations.setdefault((rec["graph_hash"], rec["workload"]), rec["equation"])

    def add(g: str, w: str, impl: str, kernel: dict, equation: dict) -> dict | None:
        if store.measured(g, impl, w, env_id) is not None:
            return None
        job = jobs.get((g, w, impl))
        if job is None:
            job = jobs[(g, w, impl)] = {
                "graph_hash": g, "workload": w, "impl": impl, "kernel": dict(kernel),
                "equation": equation, "flags": [],
                "label": f"{_equation_name(equation)} on {kernel.get('label')}@"
                         f"{kernel.get('backend')}"}
        return job

    for rec in flags:
        if rec["env_id"] == env_id or unprofiled:
            job = add(rec["graph_hash"], rec["workload"], rec["impl"], rec["kernel"],
                      rec["equation"])
            if job is not None and rec["env_id"] == env_id:
                job["flags"].append(rec["key"])
    if unprofiled:
        for t in store.traces():
            g, w, impl = t["graph_hash"], t["workload"], t["impl"]
            if (g, w, impl) in jobs:
                continue
            eq = equations.get((g, w))
            if eq is None:
                eq = equations[(g, w)] = _stored_equation(store, g, w) or {}
            kernel = _kernel_of(store.get_implementation(impl), eq)
            if kernel is not None:
                add(g, w, impl, kernel, eq)
    out = sorted(jobs.values(), key=lambda j: not is_reference(j["impl"]))
    return out + _legacy_jobs(store, env_id)


def _equation_name(desc: dict) -> str:
    inputs = [(d[0], d[1]) for d in desc.get("inputs", ()) if not isinstance(d, dict)]
    return signature(desc.get("primitive", "?"), inputs)


def _stored_equation(store: Any, graph_hash: str, workload: str) -> dict | None:
    """The equation a flagged graph's record keeps, if it is the one of `workload` (same
    axes and inputs: a graph's record holds the binding it was first flagged at)."""
    g, wl = store.get_graph(graph_hash), store.get_workload(workload)
    eq = (g or {}).get("equation")
    if not eq or wl is None:
        return None
    inputs = [[list(d[0]), d[1]] for d in eq.get("inputs", ()) if not isinstance(d, dict)]
    same = (dict(eq.get("axes") or {}) == dict(wl["axes"])
            and inputs == [[list(s), dt] for s, dt in wl["inputs"]])
    return eq if same else None


def _kernel_of(impl: dict | None, equation: dict) -> dict | None:
    """The kernel descriptor of a KERNEL implementation record on `equation`'s primitive."""
    if not impl or impl.get("kind") != "KERNEL" or not equation.get("primitive"):
        return None
    label = impl["name"]
    name, _, variant = label.partition("[")
    if name != equation["primitive"]:
        return None
    return {"name": name, "backend": impl["backend"],
            "variant": variant.rstrip("]") or "default", "label": label}


def _legacy_jobs(store: Any, env_id: str) -> list[dict]:
    """Implementation rows in the form of before the store rewrite (``requirements`` naming
    a job spec): jobs to refuse, one per workload not yet traced on `env_id`."""
    out = []
    for impl in store.implementations():
        req = impl.get("requirements") or {}
        if not (req.get("pending") and req.get("graph_hash")):
            continue
        named = [s for s in (req.get("entry"), req.get("golden")) if isinstance(s, str)]
        if not named:
            continue
        g = req["graph_hash"]
        keys = list(req.get("workloads") or [])
        keys += [t["workload"] for t in store.traces(graph_hash=g)]
        for w in dict.fromkeys(keys):  # unique, in order
            wl = store.get_workload(w)
            if wl is None or store.measured(g, impl["key"], w, env_id) is not None:
                continue
            out.append({"refuse": named, "graph_hash": g, "impl": impl["key"], "workload": w,
                        "flags": [], "label": f"{signature(impl['name'], wl['inputs'])} "
                                              f"on {impl['backend']}"})
    return out


def refused_record(job: dict, env_id: str) -> dict:
    """The RUNTIME_ERROR trace of a job whose row named code (``job["refuse"]``): its log
    starts with ``refused:``; nothing was imported or run."""
    return _refused(job["refuse"], (), None, job["graph_hash"], job["impl"], job["workload"],
                    env_id)


def resolve_kernel(job: dict) -> Any:
    """The kernel of this process's registry that `job` names (name, backend, variant, and
    the source hash in its implementation key), or None: a job never names code, only a
    kernel registered here.

    >>> resolve_kernel({"kernel": {"name": "system", "backend": "os", "variant": "default"},
    ...                 "impl": "system@os#0"}) is None
    True
    """
    kd = job.get("kernel") or {}
    try:
        candidates = kernels_for(kd["name"], kd["backend"])
    except Exception:  # an unknown backend or primitive: nothing to run
        return None
    for k in candidates:
        if k.variant == kd.get("variant", "default") and implementation_key(
                "KERNEL", kd.get("label", k.label), k.backend, k.source_hash) == job["impl"]:
            return k
    return None


def store_job(job: dict, kernel: Any, store: Any, env_id: str) -> dict:
    """The `profile_many` job of a resolved store job (`resolve_kernel`), with the workload
    and implementation recorded in `store` (None: not recorded here)."""
    desc = job["equation"]
    eqn = equation_from(desc)
    if store is not None:
        inputs = [(tuple(d[0]), d[1]) for d in desc["inputs"] if not isinstance(d, dict)]
        store.add_workload(job["graph_hash"], desc.get("axes", {}), inputs)
        store.add_implementation("KERNEL", job["kernel"].get("label", kernel.label),
                                 kernel.backend, kernel.source_hash)
    if kernel.check([v.aval for v in eqn.invars], dict(eqn.params)) is not None:
        raise NotHere(f"{kernel!r} declines {_equation_name(desc)} on this machine")
    pj = kernel_job(eqn, kernel, {})
    pj.pop("host_args")
    pj.update(graph_hash=job["graph_hash"], impl=job["impl"], workload=job["workload"],
              env_id=env_id, label=job["label"])
    return pj


def measure_job(job: dict, env_id: str, budget_s: float | None = None) -> dict | None:
    """The trace record of one store job measured in this process (not written), or None
    when no kernel of this process's registry matches it (the job is stale here)."""
    if job.get("refuse"):
        return refused_record(job, env_id)
    kernel = resolve_kernel(job)
    if kernel is None:
        return None
    try:
        pj = store_job(job, kernel, None, env_id)
    except NotHere:
        return None
    pj.pop("label")
    fn, args = pj.pop("fn"), pj.pop("args")
    if budget_s is not None:
        pj["budget_s"] = budget_s
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return profile(fn, args, **pj)


def settle_flags(store: Any, env_id: str, stale: list[str] = ()) -> int:
    """Clear the pending flags of `env_id` that have a trace now, and the `stale` ones (their
    kernel is gone or changed); returns how many were cleared."""
    done = [r["key"] for r in store.pending(env_id)
            if store.measured(r["graph_hash"], r["impl"], r["workload"], env_id) is not None]
    return store.clear_pending(list(dict.fromkeys(done + list(stale))))


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
               cap_each_call: bool = True, inputs: dict | None = None,
               operands: dict | None = None, golden_of=None) -> dict:
    """A `profile` job: `kernel` on random inputs of `eqn` at `dims`, the primitive's NumPy
    reference (float64 inputs) as golden. A kernel with a pool of its own runs with BLAS on
    one thread, as in a plan: each call capped, or (`cap_each_call=False`) the caller caps
    the whole job (switching BLAS's pool on and off between calls disturbs the timing).
    `inputs`: `random_inputs`'s cache, shared by the kernels of a sweep (drawing a Gemma
    head's 21M weights took as long as timing a kernel); `operands`: a
    dict holding the last kernel's operands on its backend and their cold copies, which the
    next kernel of the same equation and backend reuses (a sweep takes them in that order;
    copying 64 MiB per kernel was ~15% of an 18-layer explore's kernel sweep)."""
    env = name_binding(dims)
    syms = _symbol_binding(eqn, env)
    params = {k: concretize(v, syms) for k, v in eqn.params.items()}
    descs = tuple((tuple(concrete_shape(a.aval.shape, env)), a.aval.dtype.name)
                  for a in eqn.invars if not isinstance(a, Literal))
    arrays = list(random_inputs(list(descs), seed, cache=inputs))
    args = [np.asarray(a.val, a.aval.dtype) if isinstance(a, Literal) else arrays.pop(0)
            for a in eqn.invars]
    backend = get_backend(kernel.backend)
    # operands a kernel prepares (weights held in a lower precision) are prepared once, as
    # for a bound weight, and not timed
    key = (descs, seed, tuple(repr(a.val) for a in eqn.invars if isinstance(a, Literal)),
           kernel.backend, tuple((p.operand, p.fn) for p in kernel.prepare))
    if operands is not None and operands.get("key") == key:
        bargs, copies = operands["value"]
    else:
        bargs = tuple(kernel.prepared([backend.convert(x) for x in args]))
        copies = _cold_copies(bargs, backend,
                              None if operands is None else operands.setdefault("arena", {}),
                              frozenset(p.operand for p in kernel.prepare))
        sync = sync_for(kernel.backend)
        if copies and sync is not None:
            # a copy to jax is asynchronous: the first timed calls would wait for it (an
            # 18-layer prefill's first jax kernel of an equation measured 4.31 ms where its
            # twin on the same operands, timed later, measured 2.20)
            sync(copies)
        if operands is not None:
            operands.update(key=key, value=(bargs, copies))
    out_aval = eqn.outvars[0].aval
    out_shape = concrete_shape(out_aval.shape, env)
    out = backend.empty(out_shape, out_aval.dtype) if kernel.writes_out else None
    fn = _cold(kernel.bind(params, out), copies)
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
        # (`golden_of(ref, args)`: a sweep's golden of the computation, computed once)
        golden = None if golden_of is None else golden_of(ref, args)
        golden = np.asarray(ref(*args) if golden is None or callable(golden) else golden)
        scale = float(np.max(np.abs(golden))) if golden.size else 1.0
        job.update(golden=golden, rtol=kernel.lossy, atol=kernel.lossy * scale)
    return job


#: untimed calls before timing a kernel with a thread pool of its own (see `kernel_job`)
OWN_POOL_WARMUP_S = 0.03
#: untimed calls before timing a kernel in a sweep: its accuracy check has just run it once
#: (compiled it, touched its inputs), so one more is enough (three were ~2 s of an 18-layer
#: prefill's 17 s sweep)
SWEEP_WARMUP = 1
#: Operands at least this large are timed cold: in a model each layer reads its own weights,
#: which a loop over one copy would keep in the cache (a 2048x640 float32 GEMV: 37 µs hot,
#: ~230 µs streamed from memory, as decode runs it).
COLD_BYTES = 256 * 1024
#: the fewest bytes a cold operand set spans (the machines before 2026-11 had L3s of 32 MiB)
MIN_COLD_SET = 64 * 1024 * 1024
#: the most a sweep holds for a while beside the model
MAX_COLD_SET = 1024 * 1024 * 1024


def last_level_cache_bytes() -> int:
    """This machine's last-level cache in bytes (Linux: glibc's sysconf, then sysfs), or 0
    when unknown.

    >>> last_level_cache_bytes() >= 0
    True
    """
    for name in ("SC_LEVEL3_CACHE_SIZE", "SC_LEVEL2_CACHE_SIZE"):
        with contextlib.suppress(ValueError, OSError, AttributeError):
            size = os.sysconf(name)
            if size and size > 0:
                return int(size)
    sizes = []
    for index in glob.glob("/sys/devices/system/cpu/cpu0/cache/index*/size"):
        with contextlib.suppress(OSError, ValueError):
            text = open(index).read().strip().upper()
            scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
            sizes.append(int(text.rstrip("KMG")) * scale)
    return max(sizes, default=0)


def cold_set_bytes(llc: int | None = None) -> int:
    """How many bytes of operand copies a kernel cycles through to be timed cold: the
    last-level cache, within [`MIN_COLD_SET`, `MAX_COLD_SET`] and at most an eighth of the
    memory. A fixed 64 MiB was not enough on a machine with a 480 MiB L3: a 2048x640
    float32 GEMV cycling over 64 MiB of copies took 97 µs, over 128 / 256 / 480 / 1536 MiB
    132 / 157 / 172 / 175 µs (as decode streams it), so the sweep saw int8 weights (~110 µs
    either way) gain nothing.

    >>> MIN_COLD_SET <= cold_set_bytes(llc=480 << 20) <= MAX_COLD_SET
    True
    """
    llc = last_level_cache_bytes() if llc is None else llc
    size = min(max(MIN_COLD_SET, llc), MAX_COLD_SET)
    memory = _memory_bytes()
    return max(MIN_COLD_SET, min(size, memory // 8)) if memory else size


def _memory_bytes() -> int:
    with contextlib.suppress(ValueError, OSError, AttributeError):
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    return 0


#: ... by cycling through copies of the inputs that together exceed the last-level cache
COLD_SET = cold_set_bytes()
#: the most copies of an operand set: sets of at least COLD_SET / 256 (1.9 MiB with a 480
#: MiB L3: decode's weights) span the cache; smaller ones span less. 4096 copies, to span it
#: with every set, made 269k conversions (jax's `device_put` each) 7.5 s of an 18-layer
#: prefill's 40 s explore; float32 operands and held weights are views of one block
#: (`_Arena`), the others are copied once per equation and kernel
MAX_COPIES = 256


def _cold_copies(args: tuple, backend, arena: dict | None = None,
                 held: frozenset = frozenset()) -> list | None:
    """Copies of `args` (the first is `args`) that together exceed the last-level cache,
    or None when `args` are small. With `arena` (a dict a sweep shares), floating operands,
    and the operands at the indices `held` (weights the kernel holds as int8 or bfloat16
    bits, whose values matter for time only) are not copied but viewed in one block of
    random numbers (`_Arena`): copying them was 1.4 s of an 18-layer prefill's 11 s kernel
    sweep, and 11 s of an 18-layer decode's explore once the set spanned 960 MiB. Others
    (indices) are copied, values and all. Only the first copy's results are checked; the
    others are read, for time."""
    nbytes = sum(_nbytes(a) for a in args)
    if nbytes < COLD_BYTES:
        return None
    n = min(MAX_COPIES, -(-COLD_SET // nbytes))
    if n <= 1:
        return None
    block = None
    if arena is not None:
        block = arena.get("block") or arena.setdefault("block", _Arena(COLD_SET))
        block.rewind()
    return [args] + [tuple(_copy(a, backend, block, i in held) for i, a in enumerate(args))
                     for _ in range(n - 1)]


class _Arena:
    """`nbytes` of random numbers handed out as disjoint aligned arrays of any floating
    dtype, or of int8/uint16 for held weights, from the start again after each `rewind`.
    Each 32-bit word is two bfloat16 numbers drawn N(0, 1) (the distribution of
    `random_inputs`): as float32 the first, with the second as low mantissa bits; as
    bfloat16 bits, float16 or int8, finite normal numbers (no denormal or NaN slows a
    kernel down). The block is written as it is handed out, a 1 MiB draw repeated (drawing
    1 GiB took seconds; copies past the first are read for time only), so a sweep of
    small operands does not pay for a large cache's block."""

    SEED_WORDS = 1 << 18

    def __init__(self, nbytes: int):
        # room for `MAX_COPIES` alignment gaps per operand of a few
        self.bytes = np.empty(nbytes + 4 * MAX_COPIES * ALIGNMENT, dtype=np.uint8)
        halves = np.random.default_rng(0).standard_normal(2 * self.SEED_WORDS,
                                                          dtype=np.float32)
        bf16 = halves.astype(ml_dtypes.bfloat16).view(np.uint16).astype(np.uint32)
        self.seed = ((bf16[0::2] << 16) | bf16[1::2]).view(np.uint8)
        self.filled = 0
        self.at = 0

    def rewind(self) -> None:
        self.at = -self.bytes.ctypes.data % ALIGNMENT

    def take(self, shape: tuple, dtype) -> np.ndarray | None:
        """An array of `shape` and `dtype` from the block, or None when it is used up."""
        dtype = np.dtype(dtype)
        n = math.prod(shape) * dtype.itemsize
        if self.at + n > self.bytes.size:
            return None
        self._fill(self.at + n)
        x = self.bytes[self.at:self.at + n].view(dtype).reshape(shape)
        self.at += n + (-n % ALIGNMENT)
        return x

    def _fill(self, end: int) -> None:
        while self.filled < end:
            k = min(self.seed.size, self.bytes.size - self.filled)
            self.bytes[self.filled:self.filled + k] = self.seed[:k]
            self.filled += k


def _cold(fn, copies: list | None):
    """`fn`, timed as a model runs it: when its inputs are large, each call reads the next
    of several copies of them (`_cold_copies`; the first is the arguments themselves, so
    results are the same)."""
    if copies is None:
        return fn
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


def _copy(x, backend, arena: _Arena | None = None, held: bool = False):
    if isinstance(x, tuple):  # a prepared operand (int8 values and their scales)
        return tuple(_copy(a, backend, arena, held) for a in x)
    dtype = getattr(x, "dtype", None)
    if arena is not None and _arena_dtype(dtype, held):
        view = arena.take(tuple(x.shape), _host_dtype(dtype))
        if view is not None:
            return backend.convert(view)
    if isinstance(x, np.ndarray):
        return x.copy()
    return backend.convert(np.array(backend.to_host(x), copy=True))


def _host_dtype(dtype) -> np.dtype | None:
    """The NumPy dtype of an array of any backend (None when there is none)."""
    name = str(dtype).rsplit(".", 1)[-1]
    if name == "bfloat16":
        return np.dtype(ml_dtypes.bfloat16)
    try:
        return np.dtype(name)
    except TypeError:
        return None


def _arena_dtype(dtype, held: bool) -> bool:
    """Whether an operand of `dtype` may be viewed in the arena: floating ones, and int8 /
    uint16 (bfloat16 bits) ones a kernel holds (never indices, which must stay in range)."""
    host = _host_dtype(dtype)
    if host is None:
        return False
    return host.kind == "f" or host == np.dtype(ml_dtypes.bfloat16) or (
        held and host in (np.dtype(np.int8), np.dtype(np.uint16)))


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
    # the store's rows are written once per sweep (~1 ms each: 0.8 s of an 18-layer
    # prefill's 427 kernels, which share 124 workloads and a few dozen kernels), and with
    # `deferred`, all at once with the traces (`cache["rows"]`, `write_deferred`)
    written = {} if cache is None else cache.setdefault("written", {})
    rows = None if cache is None or deferred is None else cache.setdefault("rows", {})

    def add(table: str, args: tuple) -> str:   # the row's key
        if rows is None:
            return _ADD[table](store, *args)
        rows.setdefault(table, []).append(args)
        return _MAKE[table](*args)["key"]

    wkey = _once(written, ("workload", ghash, repr(axes), repr(descs)),
                 lambda: add("workloads", (ghash, axes, descs)))
    inputs = None if cache is None else cache.setdefault("inputs", {})
    goldens = None if cache is None else cache.setdefault("goldens", {})

    def golden_of(ref, host_args):
        # one golden per computation: a `linear` and the `dot_general` it decomposes into
        # compute the same on the same inputs (a Gemma head's float64 golden: ~0.9 s), and
        # a lossy kernel's check reads it too (it computed its own: ~0.5 s per head kernel)
        key = (_meaning(eqn, cache.setdefault("meanings", {})), repr(descs), repr(axes))
        if key not in goldens:
            try:  # inputs may leave an op's domain: NaN where the golden has it too
                with np.errstate(all="ignore"), warnings.catch_warnings():
                    warnings.simplefilter("ignore", RuntimeWarning)
                    goldens[key] = compute_golden(ref, _as_float64(
                        host_args, cache.setdefault("float64", {})))
            except Exception:  # the profiler reports a failing reference itself
                goldens[key] = ref
        return goldens[key]

    job = kernel_job(eqn, kernel, dims, cap_each_call=False, inputs=inputs,
                     operands=None if cache is None else cache.setdefault("operands", {}),
                     golden_of=None if goldens is None else golden_of)
    if goldens is not None and callable(job["golden"]):
        job["golden"] = golden_of(job["golden"], job["host_args"])
    _once(written, ("kernel", kernel.label, kernel.backend, kernel.source_hash),
          lambda: add("implementations",
                      ("KERNEL", kernel.label, kernel.backend, kernel.source_hash)))
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


def _once(memo: dict, key: tuple, write):
    if key not in memo:
        memo[key] = write()
    return memo[key]


def _meaning(eqn: Any, memo: dict) -> str:
    """What `eqn` computes, as a key: the structural hash of its graph decomposed to atomic
    primitives (equations that compute the same on the same inputs share it)."""
    key = equation_key(eqn)
    hit = memo.get(key)
    if hit is None:
        g = one_equation_graph(eqn)
        try:
            g = decompose(g)
        except Exception:  # noqa: BLE001 - a decomposition that does not trace: as it is
            pass
        hit = memo[key] = structural_hash(g)
    return hit


def _as_float64(args: tuple, memo: dict) -> tuple:
    """`args` with floating arrays as float64, each converted once per sweep (`memo`, by
    identity: the sweep's random inputs live as long as it)."""
    out = []
    for a in args:
        if isinstance(a, np.ndarray) and a.dtype.kind == "f" and a.dtype != np.float64:
            hit = memo.get(id(a))
            if hit is None or hit[0] is not a:
                hit = memo[id(a)] = (a, a.astype(np.float64))
            a = hit[1]
        out.append(a)
    return tuple(out)


#: the store rows `profile_kernel` adds: how one is written, and made (for its key)
_ADD = {"workloads": lambda st, *a: st.add_workload(*a),
        "implementations": lambda st, *a: st.add_implementation(*a)}
_MAKE = {"workloads": make_workload, "implementations": make_implementation}


def write_deferred(store, cache: dict, deferred: list) -> None:
    """Write what `profile_kernel` calls with `cache` and `deferred` left to write: the
    store rows they refer to first, then the traces (`deferred` is emptied)."""
    rows = cache.pop("rows", None)
    if rows:
        store.add_many(**rows)
    if deferred:
        store.add_traces(deferred)
        deferred.clear()


def _record(store, rec: dict, deferred: list | None) -> dict:
    if deferred is None:
        fill_speedup([rec], store)
        store.add_trace(**rec)
    else:
        deferred.append(rec)
        # the reference may come before or after the kernels of its equation in a sweep
        fill_speedup(deferred, store)
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
                       budget_s=budget_s, warmup=SWEEP_WARMUP,
                       **({"warmup_s": job["warmup_s"]} if "warmup_s" in job else {}))


def flagged_jobs(store: Any, env_id: str) -> tuple[list[dict], list[str]]:
    """`profile_many` jobs for the store's pending flags on `env_id` (written by the
    "fastest" policy) and the flag keys they cover. A flag whose kernel is gone or changed
    (source hash) is covered without a job: it is stale."""
    keys = [r["key"] for r in store.pending(env_id)]
    jobs = []
    for job in pending_jobs(store, env_id):
        kernel = None if job.get("refuse") else resolve_kernel(job)
        if kernel is None:
            continue
        with contextlib.suppress(NotHere):
            jobs.append(store_job(job, kernel, store, env_id))
    return jobs, keys
