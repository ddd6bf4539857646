"""`profile`: accuracy then timing of one candidate, optionally in a child process, recorded
as a benchmark-store trace; `profile_many` runs a sweep with batched store writes."""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
import pickle
import select
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from tgx.errors import TgxError
from tgx.profiling.accuracy import accuracy, to_numpy
from tgx.profiling.accuracy import golden as compute_golden
from tgx.profiling.progress import Progress
from tgx.profiling.speedup import fill_speedup
from tgx.profiling.timing import measure, sync_for
from tgx.store import Status
from tgx.store.schema import TRACE_FIELDS

_MEASURE_KEYS = ("sync", "warmup", "min_repeats", "max_repeats", "budget_s", "rel_tol",
                 "cold_l2", "warmup_s")
_PROFILE_KEYS = ("golden", "dtype", "graph_hash", "impl", "workload", "env_id", "isolate",
                 "timeout_s")
_SCRIPT_PREFIX = "_tgx_script_"
_LOG_TAIL = 4000


class ProfilingError(TgxError):
    """The harness itself failed (bad job spec, broken golden reference), not the candidate."""


# ------------------------------------------------------------------ job specs


def _load_script(path: str) -> Any:
    path = os.path.abspath(path)
    name = _SCRIPT_PREFIX + hashlib.sha256(path.encode()).hexdigest()[:12]
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ProfilingError(f"cannot load {path!r} as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def resolve(spec: str | Callable) -> Callable:
    """The function named by a job spec: ``"package.module:function"`` (dots after the colon
    walk attributes) or ``"/path/to/file.py:function"``; a callable is returned as is.
    Resolving imports (and so runs) code: only specs the user gave (a script's jobs, a
    call) come here, never one a benchmark store supplied (`store_specs`).

    >>> resolve("numpy:exp") is np.exp
    True
    """
    if callable(spec):
        return spec
    if not isinstance(spec, str) or ":" not in spec:
        raise ProfilingError(f"a job spec is 'module.path:function' or 'file.py:function', "
                             f"got {spec!r}")
    where, _, name = spec.rpartition(":")
    module = _load_script(where) if where.endswith(".py") else importlib.import_module(where)
    obj = module
    for part in name.split("."):
        obj = getattr(obj, part)
    return obj


def spec_of(fn: str | Callable) -> str | None:
    """The job spec a child process can import `fn` by, or None (lambdas, closures).

    >>> spec_of(np.exp)
    'numpy:exp'
    """
    if isinstance(fn, str):
        return fn
    mod_name, qual = getattr(fn, "__module__", None), getattr(fn, "__qualname__", "")
    if not mod_name or not qual or "<" in qual:
        return None
    module = sys.modules.get(mod_name)
    if mod_name.startswith(_SCRIPT_PREFIX) or mod_name == "__main__":
        file = getattr(module, "__file__", None)
        return f"{os.path.abspath(file)}:{qual}" if file else None
    return f"{mod_name}:{qual}"


def _name_of(fn: str | Callable) -> str:
    spec = spec_of(fn)
    if spec is None:
        spec = getattr(fn, "__qualname__", None) or repr(fn)
    if spec.partition(":")[0].endswith(".py"):  # scripts: file name, not the whole path
        where, _, name = spec.rpartition(":")
        spec = f"{os.path.basename(where)}:{name}"
    return spec


def input_descriptors(args: Sequence[Any]) -> list[tuple[tuple[int, ...], str]]:
    """``[(shape, dtype), ...]`` of the array arguments, for `BenchmarkStore.add_workload`.

    >>> input_descriptors((np.zeros((2, 3), np.float32), 1.5))
    [((2, 3), 'float32'), ((), 'float64')]
    """
    out = []
    for a in args:
        a = to_numpy(a)
        arr = a if isinstance(a, np.ndarray | np.generic) else np.asarray(a)
        out.append((tuple(int(d) for d in arr.shape), str(arr.dtype)))
    return out


# ------------------------------------------------------------------ jobs from a store
# A store row is data: a shared store is written by other people and machines, so nothing
# it holds may make this process import or run code. Work taken from a store names a
# kernel registered in this process by (name, backend, source hash) (the `pending` flags,
# `tgx.profiling.pending.flagged_jobs`); a job whose function or golden reference is a spec
# string the store supplied is refused and recorded as a refused trace.

#: how a refused job's trace log starts
REFUSED = "refused:"


def store_specs(store: Any) -> frozenset[str]:
    """Every string the store's implementation rows (``requirements``) and pending flags
    hold: what a job spec must not be, since it would be code a store row named.

    >>> store_specs(None)
    frozenset()
    """
    if store is None:
        return frozenset()
    out: set[str] = set()

    def walk(v: Any) -> None:
        if isinstance(v, str):
            out.add(v)
        elif isinstance(v, Mapping):
            for k, x in v.items():
                walk(k)
                walk(x)
        elif isinstance(v, list | tuple):
            for x in v:
                walk(x)

    for impl in store.implementations():
        walk(impl.get("requirements"))
    for rec in store.pending():
        walk(rec.get("kernel"))
    return frozenset(out)


def _refused(named: list[str], args: Sequence[Any], store: Any, graph_hash: str | None,
             impl: str | None, workload: str | None, env_id: str | None) -> dict:
    """The trace of a job refused because the store named its code (nothing imported)."""
    graph_hash = graph_hash or named[0]
    if store is not None:
        workload = workload or store.add_workload(graph_hash, {}, input_descriptors(args))
        env_id = env_id or _env_id(store)
    rec = dict.fromkeys(TRACE_FIELDS)
    rec.update(graph_hash=graph_hash, impl=impl or named[0], workload=workload or "-",
               env_id=env_id or "-", timestamp=time.time(), status=Status.RUNTIME_ERROR.value,
               log=f"{REFUSED} the benchmark store named code to import and run "
                   f"({', '.join(repr(s) for s in named)}); a job from a store runs only a "
                   "kernel registered in this process, named by (name, backend, source "
                   "hash). Nothing was imported or run.")
    return rec


# ------------------------------------------------------------------ one candidate


def _tail(text: str) -> str:
    return text if len(text) <= _LOG_TAIL else "...\n" + text[-_LOG_TAIL:]


#: a first call at least this long warms a kernel up enough: timing starts right after it
LONG_CALL_S = 0.02


def _profile_here(fn: Callable, args: Sequence[Any], golden_value: Any, dtype: Any,
                  options: Mapping[str, Any]) -> dict:
    """Accuracy then timing in this process; the measured fields of a trace."""
    options = dict(options)
    if isinstance(options.get("sync"), str):  # a backend name travels to a child process
        options["sync"] = sync_for(options["sync"])
    try:
        start = time.perf_counter()
        out = fn(*args)
        sync = options.get("sync")
        if sync is not None:
            sync(out)
        if time.perf_counter() - start >= LONG_CALL_S and not options.get("warmup_s"):
            # the check's call was the warm-up (a Gemma head's 12 kernels at 50-190 ms per
            # call: ~1 s of an 18-layer prefill's kernel sweep)
            options["warmup"] = 0
        if golden_value is None:
            acc, note = None, "no golden result: accuracy not checked"
        else:
            acc = accuracy(out, golden_value, dtype, atol=options.get("atol"),
                           rtol=options.get("rtol"))
            note = acc.message
        rec: dict[str, Any] = {"status": Status.PASSED if acc is None else acc.status}
        if acc is not None:
            rec.update(max_abs_err=acc.max_abs_err, max_rel_err=acc.max_rel_err,
                       ulp_err=acc.ulp_err)
        if rec["status"] == Status.PASSED and options.get("timed", True):
            t = measure(fn, args, **{k: options[k] for k in _MEASURE_KEYS if k in options})
            rec.update(median_s=t.median_s, min_s=t.min_s, spread=t.spread,
                       samples=t.samples)
            note = "; ".join(s for s in (note, t.note, f"batch={t.batch}" * (t.batch > 1))
                             if s)
        rec["log"] = note
        rec["status"] = str(rec["status"])
        return rec
    except Exception as err:  # noqa: BLE001 - the candidate's failure is the result
        return {"status": Status.RUNTIME_ERROR.value,
                "log": _tail(f"{type(err).__name__}: {err}\n" + traceback.format_exc())}


def _child_env() -> dict:
    env = dict(os.environ)
    # The child must import what the parent can: same sys.path, first.
    paths = [p for p in sys.path if p and os.path.isdir(p)]
    if os.getcwd() not in paths:
        paths.insert(0, os.getcwd())
    if env.get("PYTHONPATH"):
        paths.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(paths)
    return env


#: Seconds a child may take to start (interpreter, imports, unpickling the job) before the
#: candidate's own `timeout_s` starts counting.
STARTUP_LIMIT_S = 60.0


def _profile_isolated(spec: str, args: Sequence[Any], golden_value: Any, dtype: Any,
                      options: Mapping[str, Any], timeout_s: float) -> dict:
    """Run `_profile_here` in ``python -m tgx.profiling._worker`` with a timeout.

    The child reports on a pipe once the candidate is imported; `timeout_s` counts from
    then, so interpreter start-up on a loaded machine does not turn into a TIMEOUT.
    """
    with tempfile.TemporaryDirectory(prefix="tgx-profile-") as tmp:
        in_path, out_path = os.path.join(tmp, "job.pkl"), os.path.join(tmp, "result.pkl")
        job = {"spec": spec, "args": tuple(args), "golden": golden_value, "dtype": dtype,
               "options": options, "timeout_s": timeout_s}
        try:
            with open(in_path, "wb") as f:
                pickle.dump(job, f)
        except Exception as err:
            raise ProfilingError(f"cannot pickle the job for {spec!r} to send it to the "
                                 f"child process: {err}") from err
        ready_r, ready_w = os.pipe()
        with open(os.path.join(tmp, "output.txt"), "w+b") as output:
            try:
                proc = subprocess.Popen(
                    [sys.executable, "-m", "tgx.profiling._worker", in_path, out_path,
                     str(ready_w)], stdout=output, stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL, env=_child_env(), start_new_session=True,
                    pass_fds=(ready_w,))
            finally:
                os.close(ready_w)
            try:
                status = _wait(proc, ready_r, timeout_s)
            finally:
                os.close(ready_r)
            output.seek(0)
            text = output.read().decode(errors="replace")
        if status is not None:
            return {"status": Status.TIMEOUT.value, "log": _tail(status + "\n" + text)}
        if os.path.exists(out_path):
            with open(out_path, "rb") as f:
                return pickle.load(f)
        rc = proc.returncode
        why = (f"killed by signal {signal.Signals(-rc).name}" if rc < 0 else
               f"exited with status {rc}")
        return {"status": Status.RUNTIME_ERROR.value,
                "log": _tail(f"child process {why} without a result\n" + text)}


def _wait(proc: subprocess.Popen, ready_fd: int, timeout_s: float) -> str | None:
    """Wait for the child; kill it and return why on a timeout, else None."""
    ready, _, _ = select.select([ready_fd], [], [], STARTUP_LIMIT_S)
    limit, what = timeout_s, f"killed after {timeout_s:g} s (timeout)"
    if not ready:  # neither ready nor exited (exit closes the pipe, which is readable)
        limit, what = 0, f"killed: not started after {STARTUP_LIMIT_S:g} s (timeout)"
    try:
        proc.wait(timeout=limit)
        return None
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the child and anything it started
        proc.wait()
        return what


def _env_id(store: Any) -> str:
    return store.environment_id()


def _prepare(fn: str | Callable, args: Sequence[Any], golden: Any, graph_hash: str | None,
             impl: str | None, workload: str | None, store: Any, env_id: str | None) -> tuple:
    args = tuple(args)
    if isinstance(golden, str):  # a job spec naming the NumPy reference
        try:
            golden = resolve(golden)
        except Exception as err:
            raise ProfilingError(f"cannot import golden reference {golden!r}: {err}") from err
    if callable(golden):
        ref_name = _name_of(golden)
        try:
            golden_value = compute_golden(golden, args)
        except Exception as err:
            raise ProfilingError(f"golden reference {ref_name} failed: "
                                 f"{type(err).__name__}: {err}") from err
    else:
        ref_name, golden_value = None, golden
    graph_hash = graph_hash or ref_name or _name_of(fn)
    impl = impl or _name_of(fn)
    if store is not None:
        workload = workload or store.add_workload(graph_hash, {}, input_descriptors(args))
        env_id = env_id or _env_id(store)
    return args, golden_value, graph_hash, impl, workload, env_id


def profile(fn: str | Callable, args: Sequence[Any] = (), *, golden: Any = None,
            dtype: Any = None, store: Any = None, graph_hash: str | None = None,
            impl: str | None = None, workload: str | None = None, env_id: str | None = None,
            isolate: bool = False, timeout_s: float = 30, atol: float | None = None,
            rtol: float | None = None, timed: bool = True, **measure_kw: Any) -> dict:
    """Check ``fn(*args)`` against `golden`, time it, and return the trace record.

    `fn` is a callable or a job spec ``"module.path:function"`` / ``"file.py:function"``.
    `golden` is the float64 expected result, or a NumPy reference function (or its job spec)
    applied to `golden_inputs(args)`, or None (accuracy not checked). Timing (`measure`, options in
    `measure_kw`; ``sync`` may be a backend name for `sync_for`) runs only if the accuracy
    check passed, and not at all with ``timed=False`` (a check whose caller times the
    function itself: the record then has no timing). Statuses: PASSED,
    INCORRECT_NUMERICAL, INCORRECT_SHAPE, RUNTIME_ERROR (traceback in ``log``), TIMEOUT.

    With ``isolate=True`` the candidate runs in ``python -m tgx.profiling._worker``: a crash
    becomes RUNTIME_ERROR, and a run longer than `timeout_s` (import and warm-up included) is
    killed and becomes TIMEOUT. `fn` must then be importable (a job spec, or a module-level
    function) and `args` picklable. Without isolation `timeout_s` is not enforced.

    With a `store`, the trace is written (``store.add_trace``); `graph_hash` defaults to the
    golden function's name, else the candidate's; `impl` to the candidate's name; `workload`
    to one registered from the argument shapes; `env_id` to this machine's.

    >>> rec = profile(np.add, (np.float32([1]), np.float32([2])), golden=np.add, budget_s=0.01)
    >>> rec["status"], rec["max_abs_err"]
    ('PASSED', 0.0)
    """
    rec = _profile_record(fn, args, golden, dtype, store, graph_hash, impl, workload, env_id,
                          isolate, timeout_s,
                          dict(measure_kw, atol=atol, rtol=rtol, timed=timed),
                          store_specs(store))
    if store is not None:
        store.add_trace(**fill_speedup([rec], store)[0])
    return rec


def _profile_record(fn: str | Callable, args: Sequence[Any], golden: Any, dtype: Any,
                    store: Any, graph_hash: str | None, impl: str | None,
                    workload: str | None, env_id: str | None, isolate: bool,
                    timeout_s: float, options: dict,
                    untrusted: frozenset[str] = frozenset()) -> dict:
    named = [s for s in (fn, golden) if isinstance(s, str) and s in untrusted]
    if named:  # checked before anything is resolved: no import, no call
        return _refused(named, args, store, graph_hash, impl, workload, env_id)
    args, golden_value, graph_hash, impl, workload, env_id = _prepare(
        fn, args, golden, graph_hash, impl, workload, store, env_id)
    if isolate:
        spec = spec_of(fn)
        if spec is None:
            raise ProfilingError(f"isolate=True needs an importable function; {fn!r} is not "
                                 "(use a job spec 'module.path:function')")
        result = _profile_isolated(spec, args, golden_value, dtype, options, timeout_s)
    else:
        try:
            resolved = resolve(fn)
        except Exception as err:
            result = {"status": Status.RUNTIME_ERROR.value,
                      "log": f"cannot import {fn!r}: {type(err).__name__}: {err}"}
        else:
            result = _profile_here(resolved, args, golden_value, dtype, options)
    rec = dict.fromkeys(TRACE_FIELDS)
    rec.update(graph_hash=graph_hash, impl=impl, workload=workload, env_id=env_id,
               timestamp=time.time(), log="")
    rec.update({k: v for k, v in result.items() if k in rec})
    return rec


# ------------------------------------------------------------------ sweeps


def normalize_job(job: Any) -> dict:
    """A job as `profile` keyword arguments: ``(fn, args)``, ``(fn, args, options)`` or a
    dict with ``fn``, ``args`` and any `profile` options (plus ``label``: what the progress
    bar and error messages call it; default the function's job spec or name).

    >>> normalize_job(("numpy:exp", (1.0,), {"golden": np.exp}))["fn"]
    'numpy:exp'
    """
    if isinstance(job, Mapping):
        out = dict(job)
    elif isinstance(job, tuple | list) and len(job) in (2, 3):
        out = {"fn": job[0], "args": job[1], **(job[2] if len(job) == 3 else {})}
    else:
        raise ProfilingError(f"a job is (fn, args), (fn, args, options) or a dict, got {job!r}")
    if "fn" not in out:
        raise ProfilingError(f"job {job!r} names no 'fn'")
    out.setdefault("args", ())
    return out


def profile_many(jobs: Iterable[Any], *, store: Any = None, progress: bool | None = None,
                 batch_size: int = 20, on_error: Callable[[str], None] | None = None,
                 **defaults: Any) -> list[dict]:
    """Profile every job (see `normalize_job`; `defaults` are `profile` options each job may
    override) and return the trace records. Traces go to `store` in batches of
    `batch_size` (one file write each). A failing candidate is a trace and the sweep goes
    on; a harness error (unimportable job, broken golden) is reported to `on_error`
    (default: a line on stderr) and the job skipped. A job whose ``fn`` or ``golden`` is a
    spec string the store supplied (`store_specs`) is refused: nothing is imported, and a
    RUNTIME_ERROR trace whose log starts with ``refused:`` records it. `progress`: see
    `progress_enabled`.

    >>> recs = profile_many([(np.negative, (np.float32([1]),), {"golden": np.negative})],
    ...                     budget_s=0.01)
    >>> [r["status"] for r in recs]
    ['PASSED']
    """
    jobs = [normalize_job(j) for j in jobs]
    untrusted = store_specs(store)  # a job naming code a store row supplied is refused
    report = on_error or (lambda msg: print(f"tgx profile: {msg}", file=sys.stderr))
    bar = Progress(len(jobs), enabled=progress)
    records: list[dict] = []
    pending: list[dict] = []
    try:
        for job in jobs:
            kw = {**defaults, **job}
            fn, args = kw.pop("fn"), kw.pop("args")
            label = kw.pop("label", None) or _name_of(fn)
            fixed = {k: kw.pop(k, None) for k in _PROFILE_KEYS}
            try:
                rec = _profile_record(fn, args, fixed["golden"], fixed["dtype"], store,
                                      fixed["graph_hash"], fixed["impl"], fixed["workload"],
                                      fixed["env_id"], bool(fixed["isolate"]),
                                      fixed["timeout_s"] or 30, kw, untrusted)
            except ProfilingError as err:
                report(f"skipped {label}: {err}")
                bar.update(label + " (skipped)")
                continue
            records.append(rec)
            if store is not None:
                pending.append(rec)
                if len(pending) >= batch_size:
                    store.add_traces(fill_speedup(pending, store))
                    pending = []
            bar.update(f"{label}: {rec['status']}")
    finally:
        if store is not None and pending:
            store.add_traces(fill_speedup(pending, store))
        bar.close()
    return records


def summarize(records: Sequence[Mapping[str, Any]]) -> str:
    """A text table: traces per status, then the fastest PASSED implementation per graph.

    >>> print(summarize([{"graph_hash": "g", "impl": "k", "status": "PASSED",
    ...                   "median_s": 1e-3, "max_rel_err": 0.0}]))
    1 traces: PASSED 1
    graph  fastest  median     max_rel_err
    g      k        1.000 ms   0
    """
    counts: dict[str, int] = {}
    best: dict[str, Mapping] = {}
    for r in records:
        counts[r["status"]] = counts.get(r["status"], 0) + 1
        if r["status"] == Status.PASSED and r.get("median_s") is not None:
            cur = best.get(r["graph_hash"])
            if cur is None or r["median_s"] < cur["median_s"]:
                best[r["graph_hash"]] = r
    lines = [f"{len(records)} traces: " + ", ".join(f"{s} {n}" for s, n in sorted(counts.items()))]
    if best:
        rows = [("graph", "fastest", "median", "max_rel_err")]
        rows += [(g, r["impl"], format_seconds(r["median_s"]),
                  "-" if r.get("max_rel_err") is None else f"{r['max_rel_err']:.3g}")
                 for g, r in sorted(best.items())]
        widths = [max(len(row[i]) for row in rows) for i in range(4)]
        lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows]
    return "\n".join(lines)


def format_seconds(s: float | None) -> str:
    """``1.000 ms``, ``12.30 us`` ... for tables.

    >>> format_seconds(1.23e-5)
    '12.300 us'
    """
    if s is None:
        return "-"
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if s >= scale:
            return f"{s / scale:.3f} {unit}"
    return f"{s / 1e-9:.1f} ns"
