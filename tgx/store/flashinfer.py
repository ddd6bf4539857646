"""The store in the FlashInfer-Bench trace layout (``tgx store export --format flashinfer-bench``).

FlashInfer-Bench keeps a data set as JSON files under one root, which its ``TraceSet.from_path``
reads back::

    definitions/<op_type>/<definition>.json            one Definition per graph
    solutions/<author>/<op_type>/<definition>/<solution>.json
                                                       one Solution per implementation run on it
    workloads/<op_type>/<definition>.jsonl             one line per workload (no solution)
    traces/<author>/<op_type>/<definition>.jsonl       one line per measurement

What maps to what (docs/store.md, "FlashInfer-Bench export", says it in full):

* a graph (structural hash) -> a Definition named ``<op>_<12 hex of the hash>``; ``op_type``
  is what the graph computes (`names.graph_ops`). Its axes come from the workloads: a dim
  that equals a workload axis (``s0`` …) in every workload is that ``var`` axis, any other is
  a ``const`` axis ``d<size>``. Inputs are ``x0``, ``x1`` …; outputs and a runnable
  ``reference`` (tgx's NumPy reference of the primitive) only where the store holds the
  equation (a pending flag's), else no outputs and the tag ``tgx:outputs-unknown``.
* an implementation (kernel or whole-plan recipe) -> a Solution per definition, author
  ``tgx``: its sources are a stub that names the tgx kernel (it runs inside tgx).
* a workload -> a workload entry: its ``var`` axes and ``random`` inputs (the profiler draws
  them), uuid derived from the workload key.
* a trace -> a trace entry: status as is; ``max_rel_err``/``max_abs_err`` -> correctness;
  ``median_s`` -> ``latency_ms`` (a median, not a mean); the reference latency is the best
  NumPy-backend kernel's on the same workload and machine, when there is one; the
  environment -> ``hardware`` (CPU model, GPUs) and ``libs``.

The raw store is written beside them as ``tgx-store.json``.
"""

from __future__ import annotations

import datetime
import json
import os
import re
import uuid
from collections.abc import Callable
from typing import Any

from .db import atomic_write_json
from .names import graph_ops, kernel_base

#: the author of every exported solution and trace file
AUTHOR = "tgx"
RAW_DUMP = "tgx-store.json"
_UNSAFE = re.compile(r"[^A-Za-z0-9.-]+")  # runs of anything else (underscores too) -> "_"

Outputs = Callable[[dict], list[tuple[tuple[int, ...], str]]]


def _safe(text: str) -> str:
    return _UNSAFE.sub("_", text).strip("_") or "x"


def export_flashinfer(store: Any, root: str | os.PathLike,
                      outputs_of: Outputs | None = None) -> dict[str, int]:
    """Write `store` under `root` in the FlashInfer-Bench layout (see the module doc); returns
    how many definitions, solutions, workloads and traces were written. `outputs_of`: a
    pending flag's ``equation`` -> its outputs ``[(shape, dtype), ...]`` (the store cannot
    rebuild an equation itself; ``tgx store export`` passes `tgx.profiling.pending`'s)."""
    root = os.fspath(root)
    os.makedirs(root, exist_ok=True)
    ops = graph_ops(store)
    equations = {r["graph_hash"]: r["equation"] for r in store.pending() if r.get("equation")}
    for g in {w["graph_hash"] for w in store.workloads()} - set(equations):
        rec = store.get_graph(g)  # a flag's equation is kept with its graph
        if rec is not None and rec.get("equation"):
            equations[g] = rec["equation"]
    impls = {r["key"]: r for r in store.implementations()}
    envs: dict[str, dict | None] = {}
    counts = dict.fromkeys(("definitions", "solutions", "workloads", "traces"), 0)
    by_graph: dict[str, list[dict]] = {}
    for t in store.traces():
        by_graph.setdefault(t["graph_hash"], []).append(t)
    graphs = sorted({w["graph_hash"] for w in store.workloads()} | set(by_graph))
    for g in graphs:
        workloads = store.workloads(g)
        if not workloads:
            continue
        op = ops.get(g, f"graph {g[:8]}")
        op_type = _safe(op.replace(" ", "_")).lower()
        name = f"{op_type}_{g[:12]}"
        eq = equations.get(g)
        outputs = None
        if eq is not None and outputs_of is not None:
            try:
                outputs = outputs_of(eq)
            except Exception:  # noqa: BLE001 - an equation tgx cannot rebuild: outputs unknown
                outputs = None
        definition, var_axes, arg_names = _definition(name, op, op_type, g, workloads, eq,
                                                      outputs)
        _write_json(root, ("definitions", op_type, f"{name}.json"), definition)
        counts["definitions"] += 1
        entries = {w["key"]: _workload_entry(w, var_axes, arg_names) for w in workloads}
        _write_jsonl(root, ("workloads", op_type, f"{name}.jsonl"),
                     [{"definition": name, "workload": e, "solution": None, "evaluation": None}
                      for e in entries.values()])
        counts["workloads"] += len(entries)
        traces = by_graph.get(g, [])
        solutions: dict[str, str] = {}
        for t in traces:
            if t["impl"] not in solutions:
                sol = _solution(t["impl"], impls.get(t["impl"]), name, g, arg_names)
                solutions[t["impl"]] = sol["name"]
                _write_json(root, ("solutions", AUTHOR, op_type, name, f"{sol['name']}.json"),
                            sol)
                counts["solutions"] += 1
        lines = []
        for t in traces:
            if t["workload"] not in entries:
                continue  # a workload the store never recorded
            if t["env_id"] not in envs:
                envs[t["env_id"]] = store.get_environment(t["env_id"])
            lines.append({"definition": name, "workload": entries[t["workload"]],
                          "solution": solutions[t["impl"]],
                          "evaluation": _evaluation(t, envs[t["env_id"]],
                                                    _reference_s(t, traces))})
        if lines:
            _write_jsonl(root, ("traces", AUTHOR, op_type, f"{name}.jsonl"), lines)
            counts["traces"] += len(lines)
    store.export(os.path.join(root, RAW_DUMP))
    return counts


def _definition(name: str, op: str, op_type: str, g: str, workloads: list[dict],
                eq: dict | None, outputs: list | None) -> tuple[dict, list[str], list[str]]:
    """(the Definition, its var axis names, its input names)."""
    axes: dict[str, dict] = {}
    first = workloads[0]
    arg_names = [f"x{i}" for i in range(len(first["inputs"]))]

    def axis_of(position_values: list[int], binding: list[dict]) -> str:
        for a in binding[0]:
            if all(b.get(a) == v for b, v in zip(binding, position_values)):
                axes.setdefault(a, {"type": "var"})
                return a
        value = position_values[0]
        if all(v == value for v in position_values):
            const = f"d{value}"
            axes.setdefault(const, {"type": "const", "value": int(value)})
            return const
        var = f"v{len(axes)}"  # varies with no named axis: a var axis of its own
        axes[var] = {"type": "var"}
        return var

    bindings = [w["axes"] for w in workloads]
    same_rank = [w for w in workloads
                 if [len(s) for s, _ in w["inputs"]] == [len(s) for s, _ in first["inputs"]]]
    inputs = {}
    for i, (shape, dtype) in enumerate(first["inputs"]):
        dims = [axis_of([w["inputs"][i][0][d] for w in same_rank],
                        [w["axes"] for w in same_rank]) for d in range(len(shape))]
        inputs[arg_names[i]] = {"shape": dims, "dtype": dtype}
    out_specs = {}
    binding = [dict((eq or {}).get("axes") or bindings[0])]  # the flag's own workload
    for j, (shape, dtype) in enumerate(outputs or ()):
        out_specs[f"y{j}" if len(outputs) > 1 else "y"] = {
            "shape": [axis_of([d], binding) for d in shape], "dtype": dtype}
    tags = ["source:tgx", f"tgx:graph:{g}"]
    if outputs is None:
        tags.append("tgx:outputs-unknown")
    definition = {
        "name": name, "op_type": op_type, "tags": tags,
        "description": f"{op}: tgx graph {g} (structural hash)",
        "axes": axes, "inputs": inputs, "outputs": out_specs,
        "reference": _reference(op, eq, arg_names, g),
    }
    var_axes = [a for a, spec in axes.items() if spec["type"] == "var"]
    return definition, var_axes, arg_names


def _reference(op: str, eq: dict | None, arg_names: list[str], g: str) -> str:
    params = ", ".join(arg_names)
    if eq is None:
        return (f"def run({params}):\n"
                f"    raise NotImplementedError('tgx keeps no equation for graph {g} ({op}); "
                f"its kernels run inside tgx')\n")
    return ("import numpy as np\n"
            "import tgx  # registers the primitives\n"
            "from tgx.core import Literal\n"
            "from tgx.profiling.pending import equation_from\n\n"
            f"EQUATION = {json.dumps(eq, sort_keys=True)}\n\n\n"
            f"def run({params}):\n"
            f"    \"\"\"tgx's NumPy reference of {eq['primitive']} (the profiler's golden, "
            "on float64 inputs).\"\"\"\n"
            "    eqn = equation_from(EQUATION)\n"
            f"    arrays = iter([{params}])\n"
            "    args = [np.asarray(a.val, a.aval.dtype) if isinstance(a, Literal) else "
            "next(arrays)\n"
            "            for a in eqn.invars]\n"
            "    return eqn.primitive.impl(*args, **eqn.params)\n")


def _solution(impl_key: str, impl: dict | None, definition: str, g: str,
              arg_names: list[str]) -> dict:
    label, _, rest = impl_key.partition("@")
    backend, _, digest = rest.partition("#")
    kind = impl["kind"] if impl else "KERNEL"
    name = _safe(f"{label}_{backend}_{digest}_{g[:8]}")
    what = ("a whole plan tgx measured (GRAPH_RECIPE; its Assignment is the store's "
            "payload)" if kind == "GRAPH_RECIPE" else
            f"the tgx kernel {label} on the {backend} backend")
    params = ", ".join(arg_names)
    content = (f"# {what}.\n# tgx store key {impl_key}"
               + (f", source hash {impl['source_hash']}" if impl else "") + ".\n"
               "# It runs inside tgx (tgx.compile selects it by that key), not on its own.\n\n"
               f"def run({params}):\n"
               f"    raise NotImplementedError({('run ' + label + ' through tgx.compile')!r})\n")
    return {"name": name, "definition": definition, "author": AUTHOR,
            "description": f"{kernel_base(label)} ({kind}, {backend}): {impl_key}",
            "spec": {"language": "python", "target_hardware": ["CPU"],
                     "entry_point": "main.py::run", "destination_passing_style": False,
                     "dependencies": ["tgx-trace"] + ([backend] if backend in
                                                      ("torch", "jax", "numba") else [])},
            "sources": [{"path": "main.py", "content": content}]}


def _workload_entry(w: dict, var_axes: list[str], arg_names: list[str]) -> dict:
    return {"uuid": str(uuid.uuid5(uuid.NAMESPACE_URL, f"tgx-workload:{w['key']}")),
            "axes": {a: int(w["axes"][a]) for a in var_axes if a in w["axes"]},
            "inputs": {n: {"type": "random"} for n in arg_names}}


def _reference_s(t: dict, traces: list[dict]) -> float | None:
    """The best NumPy kernel's median on `t`'s workload and machine (tgx's baseline)."""
    best = [r["median_s"] for r in traces
            if r["workload"] == t["workload"] and r["env_id"] == t["env_id"]
            and r["status"] == "PASSED" and r["median_s"] is not None
            and r["impl"].partition("@")[2].partition("#")[0] == "numpy"]
    return min(best) if best else None


def _evaluation(t: dict, env: dict | None, ref_s: float | None) -> dict:
    status = t["status"]
    correctness = performance = None
    if status in ("PASSED", "INCORRECT_NUMERICAL"):
        correctness = {"max_relative_error": t["max_rel_err"],
                       "max_absolute_error": t["max_abs_err"]}
    if status == "PASSED" and t["median_s"] is not None:
        lat = t["median_s"] * 1e3
        ref = None if ref_s is None else ref_s * 1e3
        performance = {"latency_ms": lat, "reference_latency_ms": ref,
                       "speedup_factor": None if ref is None or not lat else ref / lat}
    env = env or {}
    gpus = [g.get("name") for g in env.get("gpus") or [] if g.get("name")]
    hardware = " + ".join([env.get("cpu_model") or "unknown CPU", *gpus])
    libs = {k: v for k, v in (env.get("libraries") or {}).items() if v}
    stamp = datetime.datetime.fromtimestamp(t["timestamp"], datetime.UTC)
    return {"status": status, "log": t["log"] or "", "correctness": correctness,
            "performance": performance,
            "environment": {"hardware": hardware, "libs": libs},
            "timestamp": stamp.isoformat().replace("+00:00", "Z")}


def _write_json(root: str, parts: tuple[str, ...], data: dict) -> None:
    path = os.path.join(root, *parts)  # every part is made of _safe names and hex digits
    os.makedirs(os.path.dirname(path), exist_ok=True)
    atomic_write_json(path, data)


def _write_jsonl(root: str, parts: tuple[str, ...], lines: list[dict]) -> None:
    path = os.path.join(root, *parts)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        for line in lines:
            f.write(json.dumps(line, separators=(",", ":")) + "\n")
