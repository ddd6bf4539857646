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

from typing import Any

import ml_dtypes
import numpy as np


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
        else:
            out.append(np.asarray(rng.standard_normal(shape)).astype(dt))
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
                         "workload": w, "env_id": env_id})
    return jobs
