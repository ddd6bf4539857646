"""`speedup` (the store's ``speedup_factor``) of kernel traces: the reference's median over
the trace's own, on the same graph, workload and environment.

The reference of a one-equation graph is its NumPy kernel of the default variant
(``exp@numpy#…``): tgx's NumPy reference implementation of the primitive, which every
machine has. A reference's own trace has 1.0; a trace with no PASSED reference measured
before it (or in the same batch) has None. Traces are never updated once written (a
profiling worker may not), so sweeps measure references first.
"""

from __future__ import annotations

from typing import Any




def is_reference(impl: str) -> bool:
    """Whether an implementation key names a reference: a NumPy kernel of the default
    variant (``exp@numpy#…``, not ``exp[out]@numpy#…``).

    >>> is_reference("exp@numpy#0123456789ab"), is_reference("exp[out]@numpy#0123456789ab")
    (True, False)
    """
    name, _, rest = impl.partition("@")
    return rest.startswith("numpy#") and "[" not in name


def _is_ref(impl: str, store: Any) -> bool:
    """`is_reference`, and a kernel (a whole plan measured on NumPy is no reference)."""
    if not is_reference(impl):
        return False
    rec = None if store is None else store.get_implementation(impl)
    return rec is None or rec.get("kind") == "KERNEL"


def fill_speedup(records: list[dict], store: Any = None) -> list[dict]:
    """Fill ``speedup`` of PASSED kernel traces in `records` (in place) against the
    reference's latest PASSED trace among `records` or in `store`; a reference's own is
    1.0; None where no reference is measured. Returns `records`.

    >>> recs = [{"graph_hash": "g", "workload": "w", "env_id": "e", "status": "PASSED",
    ...          "timestamp": 1.0, "impl": k, "median_s": m, "speedup": None}
    ...         for k, m in (("neg@numpy#1", 2e-6), ("neg@torch#2", 1e-6))]
    >>> [r["speedup"] for r in fill_speedup(recs)]
    [1.0, 2.0]
    """
    refs: dict[tuple, dict] = {}
    for r in records:
        if r.get("status") == "PASSED" and r.get("median_s") and _is_ref(r["impl"], store):
            key = (r["graph_hash"], r["workload"], r["env_id"])
            if key not in refs or r["timestamp"] >= refs[key]["timestamp"]:
                refs[key] = r
    for r in records:
        if r.get("status") != "PASSED" or not r.get("median_s") or r.get("speedup"):
            continue
        if store is not None and (rec := store.get_implementation(r["impl"])) is not None \
                and rec.get("kind") != "KERNEL":
            continue  # a whole plan's trace: no reference
        key = (r["graph_hash"], r["workload"], r["env_id"])
        ref = refs.get(key)
        if ref is None and store is not None:
            ref = refs[key] = _stored_reference(store, *key)
        if ref is not None:
            r["speedup"] = ref["median_s"] / r["median_s"]
    return records


def _stored_reference(store: Any, graph_hash: str, workload: str, env_id: str) -> dict | None:
    found = [t for t in store.traces(graph_hash=graph_hash, workload=workload, env_id=env_id,
                                     status="PASSED")
             if t["median_s"] and _is_ref(t["impl"], store)]
    return max(found, key=lambda t: t["timestamp"]) if found else None
