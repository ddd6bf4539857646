"""The in-process cache every engine answers the planner's queries from.

Records are the store's documented records (docs/store.md, "File format"), shared, never
copied here: callers hand out copies. An engine builds a `StoreIndex` when it opens a store
and adds what it (or, after a refresh, another process) wrote since, so `best()` is a dict
look-up and a list scan instead of a query.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Mapping

from .schema import (
    ENVIRONMENTS,
    GRAPHS,
    IMPLEMENTATIONS,
    PENDING,
    TRACES,
    WORKLOADS,
    Status,
    StoreError,
)

_PASSED = Status.PASSED.value


def _median_key(rec: dict) -> float:
    return rec["median_s"]


class StoreIndex:
    """Look-up tables over the records of one store.

    `traces` (in insertion order), `by_graph`, `by_gwe` ((graph, workload, env) -> traces),
    `passed` (the same key -> PASSED traces sorted by median), `measured`
    ((graph, impl, workload, env) -> latest trace), `workloads_ge` ((graph, env) -> ordered
    set of traced workload keys), `workloads_g`, and key -> record maps `graphs`, `impls`,
    `envs`, `workloads`, `pending` (key -> (id, record))."""

    def __init__(self, tables: Mapping[str, Iterable[dict]],
                 pending: Iterable[tuple[int, dict]] = ()):
        self.graphs = {r["hash"]: r for r in tables.get(GRAPHS, ())}
        self.impls = {r["key"]: r for r in tables.get(IMPLEMENTATIONS, ())}
        self.envs = {r["id"]: r for r in tables.get(ENVIRONMENTS, ())}
        self.workloads = {r["key"]: r for r in tables.get(WORKLOADS, ())}
        self.pending = {r["key"]: (int(i), r) for i, r in pending}
        self.workloads_g: dict[str, dict[str, None]] = {}
        for r in self.workloads.values():
            self.workloads_g.setdefault(r["graph_hash"], {})[r["key"]] = None
        self.traces: list[dict] = []
        self.by_graph: dict[str, list[dict]] = {}
        self.by_gwe: dict[tuple, list[dict]] = {}
        self.passed: dict[tuple, list[dict]] = {}  # sorted by median_s
        self.measured: dict[tuple, dict] = {}  # (g, impl, w, env) -> latest trace
        self.workloads_ge: dict[tuple, dict[str, None]] = {}  # ordered set of workload keys
        passed_unsorted: dict[tuple, list[dict]] = {}
        for rec in tables.get(TRACES, ()):
            self._add_trace(rec, passed_unsorted)
        for key, lst in passed_unsorted.items():
            lst.sort(key=_median_key)  # one sort beats 100k insorts on open
            self.passed[key] = lst

    def _add_trace(self, rec: dict, passed: dict | None = None) -> None:
        g, w, e = rec["graph_hash"], rec["workload"], rec["env_id"]
        self.traces.append(rec)
        self.by_graph.setdefault(g, []).append(rec)
        self.by_gwe.setdefault((g, w, e), []).append(rec)
        self.workloads_ge.setdefault((g, e), {})[w] = None
        mkey = (g, rec["impl"], w, e)
        old = self.measured.get(mkey)
        if old is None or rec["timestamp"] >= old["timestamp"]:
            self.measured[mkey] = rec
        if rec["status"] == _PASSED and rec["median_s"] is not None:
            if passed is not None:
                passed.setdefault((g, w, e), []).append(rec)
            else:
                bisect.insort(self.passed.setdefault((g, w, e), []), rec, key=_median_key)

    def add(self, table: str, rec: dict) -> None:
        """Add one record of `table` (pending flags: `add_pending`)."""
        if table == TRACES:
            self._add_trace(rec)
        elif table == GRAPHS:
            self.graphs[rec["hash"]] = rec
        elif table == IMPLEMENTATIONS:
            self.impls[rec["key"]] = rec
        elif table == ENVIRONMENTS:
            self.envs[rec["id"]] = rec
        elif table == WORKLOADS:
            self.workloads[rec["key"]] = rec
            self.workloads_g.setdefault(rec["graph_hash"], {})[rec["key"]] = None
        else:
            raise StoreError(f"internal error: no table {table!r} to index")

    def add_pending(self, doc_id: int, rec: dict) -> None:
        self.pending[rec["key"]] = (doc_id, rec)

    def keys(self, table: str) -> dict:
        """The key -> record map of a data table other than traces (`PENDING`: key ->
        (id, record))."""
        return {GRAPHS: self.graphs, IMPLEMENTATIONS: self.impls, ENVIRONMENTS: self.envs,
                WORKLOADS: self.workloads, PENDING: self.pending}[table]
