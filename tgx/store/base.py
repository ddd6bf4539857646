"""`BenchmarkStore`: one interface over three engines, chosen by the store's URL.

``BenchmarkStore(target)`` returns the engine's class for `target` (a path or URL, see
`tgx.store.url`): `tgx.store.db.TinyDBStore` for a JSON file, `tgx.store.sql.SQLStore` for
SQLite and PostgreSQL. Every engine keeps the same records (docs/store.md, "File format") in
the same in-process cache (`StoreIndex`), so every read below is engine-independent; an
engine supplies `_read` (the cache, refreshed when another process wrote) and the writes
(`_insert_unique`, `_insert_traces`, `_add_pending`, `_clear_pending`, `load_records`).
"""

from __future__ import annotations

import abc
import contextlib
import importlib
import json
import os
import threading
import warnings
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, Self

from . import schema
from .environment import environment_id, sniff_environment
from .index import StoreIndex
from .schema import ENVIRONMENTS, GRAPHS, IMPLEMENTATIONS, PENDING, WORKLOADS, Status
from .schema import StoreError
from .url import StoreTarget, default_store_path, parse_target

_ENV_IDS: dict[str, str] = {}  # store location -> this machine's environment id


def _target(path: Any) -> StoreTarget:
    if isinstance(path, StoreTarget):
        return path
    return parse_target(path if path else default_store_path())


#: engine -> the module defining its class as ``STORE_CLASS``, imported on first use: the
#: SQL engines need SQLAlchemy (the optional ``sql`` extra), which ``import tgx`` never loads
ENGINE_MODULES = {"tinydb": "tgx.store.db", "sqlite": "tgx.store.sql",
                  "postgresql": "tgx.store.sql"}


def engine_class(target: StoreTarget) -> type[BenchmarkStore]:
    """The `BenchmarkStore` subclass for a parsed target's engine."""
    try:
        module = importlib.import_module(ENGINE_MODULES[target.engine])
    except ImportError as err:
        raise StoreError(f"the {target.engine} store engine needs SQLAlchemy and (for "
                         f"PostgreSQL) psycopg: pip install 'tgx-trace[sql]' ({err})") from None
    return module.STORE_CLASS


class BenchmarkStore(abc.ABC):
    """A benchmark store, safe for many processes and threads writing at once.

    >>> import tempfile, os
    >>> with BenchmarkStore(os.path.join(tempfile.mkdtemp(), "s.json")) as st:
    ...     g = st.add_graph("g1", "mlp", b"msgpack bytes")
    ...     k = st.add_implementation("KERNEL", "matmul", "numpy", "src1")
    ...     w = st.add_workload(g, {"N": 128}, [((128, 128), "float32")])
    ...     e = st.add_environment({"cpu_model": "test"})
    ...     st.add_trace(graph_hash=g, impl=k, workload=w, env_id=e, status="PASSED",
    ...                  median_s=1e-4, max_rel_err=1e-7)
    ...     st.best(g, w, e)["impl"] == k
    1
    True

    `path`: a file path (TinyDB, the default engine), a URL ``tinydb:///…``,
    ``sqlite:///…`` or ``postgresql://…``, or None: `default_store_path()` (``$TGX_STORE``,
    which takes the same URLs). The engine's class is returned: `TinyDBStore` or
    `SQLStore`, both instances of `BenchmarkStore`.

    A corrupt file raises `CorruptStoreError` and is left as it is; ``recover=True`` moves
    it to ``<path>.corrupt-<timestamp>`` (see `recovered_from`) and starts a fresh store. A
    newer schema raises `StoreVersionError` and the store is never touched.

    ``best_effort=True`` (the store `tgx.compile` plans with, `open_for_planning`): a write
    that fails (lock held past `lock_timeout`, disk full, file turned read-only, connection
    lost, permission denied) warns once with a `StoreWarning`, writes nothing more and
    returns what the write would have returned (keys, no ids); a failed refresh keeps the
    copy already in memory.
    """

    #: the engine: "tinydb", "sqlite" or "postgresql"
    engine = ""

    def __new__(cls, path: Any = None, *args: Any, **kwargs: Any) -> BenchmarkStore:
        if cls is BenchmarkStore:
            cls = engine_class(_target(path))
        return super().__new__(cls)

    def _init_common(self, target: StoreTarget, best_effort: bool) -> None:
        #: the file (TinyDB, SQLite) or the URL without its password (PostgreSQL)
        self.path: str = target.path or target.display
        #: the store's URL without its password
        self.url: str = target.display if target.engine != "tinydb" else target.url
        #: Where a corrupt file was moved by ``recover=True``, else None.
        self.recovered_from: str | None = None
        self.best_effort = best_effort
        #: With ``best_effort``: why writes stopped (the first failure), else None.
        self.write_failure: str | None = None
        self._tlock = threading.RLock()
        self._idx: StoreIndex | None = None
        self._closed = False

    # ------------------------------------------------------------ engine hooks

    @abc.abstractmethod
    def _read(self) -> StoreIndex:
        """The cache, first refreshed if other processes wrote (at most every refresh_s)."""

    @abc.abstractmethod
    def _insert_unique(self, rows: list[tuple[str, str, str, dict]]) -> None:
        """Write graph, implementation, environment or workload records, given as (table,
        index attribute, key, record), in one write, each unless its key is there (checked
        again under the engine's write lock)."""

    @abc.abstractmethod
    def _insert_traces(self, records: list[dict]) -> list[int]:
        """Write trace records in one write; their ids."""

    @abc.abstractmethod
    def _add_pending(self, fresh: dict[str, dict]) -> int:
        """Write the pending flags not there yet (and their graphs); how many."""

    @abc.abstractmethod
    def _clear_pending(self, keys: list[str]) -> int:
        """Delete these pending flags; how many were there."""

    def refresh(self) -> None:
        """Bring the in-process cache up to date with what other processes wrote, now (a
        query does so by itself when the cache is older than `refresh_s`).

        Example (``st`` an open store)::

            st.refresh()  # -> None
        """
        with self._tlock:
            self._checked = float("-inf")
            self._read()

    # ------------------------------------------------------------ best effort

    def _give_up_writing(self, err: BaseException, what: str) -> None:
        if self.write_failure is None:
            self.write_failure = f"{type(err).__name__}: {err}"
            warnings.warn(f"benchmark store {self.path}: {what} failed ({self.write_failure}); "
                          "this process writes no more measurements or pending flags to it",
                          schema.StoreWarning, stacklevel=4)

    def _best_effort(self, write: Any, fallback: Any) -> Any:
        """``write()``; with ``best_effort``, ``fallback()`` when it fails or writes stopped."""
        if not self.best_effort:
            return write()
        if self.write_failure is not None:
            return fallback()
        try:
            return write()
        except (StoreError, OSError) as err:
            if self._closed:
                raise
            self._give_up_writing(err, "a write")
            return fallback()

    # ------------------------------------------------------------ pending flags

    def add_pending(self, records: Iterable[Mapping[str, Any]]) -> int:
        """Flag (graph, workload, implementation, env) combinations for the offline
        profiler (records from `schema.make_pending`); already flagged ones are skipped, and
        nothing is written when all are. Returns how many were added.

        Example (``st`` an open store)::

            st.add_pending([schema.make_pending("g", "w", "k", "e", {}, {})])  # -> 1
        """
        with self._tlock:
            fresh = {r["key"]: dict(r) for r in records if r["key"] not in self._read().pending}
            if not fresh:
                return 0
            return self._best_effort(lambda: self._add_pending(fresh), lambda: 0)

    @staticmethod
    def _flagged_graphs(new: list[dict], known: Mapping[str, Any]) -> dict[str, dict]:
        """Graph records for flagged one-equation graphs the store does not hold yet, so
        their names and shapes outlive the flags."""
        return {r["graph_hash"]: schema.make_graph(r["graph_hash"], eq["primitive"], None,
                                                   equation=eq)
                for r in new if (eq := r.get("equation")) and eq.get("primitive")
                and r["graph_hash"] not in known}

    def pending(self, env_id: str | None = None) -> list[dict]:
        """Pending records (bytes decoded into ``graph_bytes``), oldest first."""
        with self._tlock:
            recs = [r for _, r in sorted(self._read().pending.values(), key=lambda x: x[0])
                    if env_id is None or r["env_id"] == env_id]
            out = []
            for r in recs:
                r = json.loads(json.dumps(r))  # deep copy: kernel and equation are nested
                r["graph_bytes"] = schema.b64decode(r.pop("graph_b64", None))
                out.append(r)
            return out

    def clear_pending(self, keys: Iterable[str]) -> int:
        """Remove the pending flags with these keys; returns how many were removed."""
        keys = list(keys)
        with self._tlock:
            if not any(k in self._read().pending for k in keys):
                return 0
            return self._best_effort(lambda: self._clear_pending(keys), lambda: 0)

    @contextlib.contextmanager
    def claim(self, key: str) -> Iterator[bool]:
        """Claim the job `key` while profiling it: yields True when this process holds it,
        False when another does (skip the job: another fleet is measuring it). PostgreSQL:
        a session advisory lock, released on exit or when its holder dies (its connection
        closes), so a killed worker never keeps a job. TinyDB and SQLite: always True, a
        fleet's driver hands each job out once (`tgx.profiling.fleet`).

        Example (``st`` an open store)::

            with st.claim("g|w|k|env") as mine:
                if mine and st.measured("g", "k", "w", "env") is None:
                    ...  # measure, then add the trace
        """
        yield True

    # ------------------------------------------------------------ writes

    def add_graph(self, graph_hash: str, name: str, graph_bytes: bytes) -> str:
        """Store a canonical graph (deduplicated on its structural hash); returns the hash.

        Example (``st`` an open store)::

            st.add_graph("abc", "mlp", b"...")  # -> 'abc'
        """
        rec = schema.make_graph(graph_hash, name, graph_bytes)
        return self._add_unique(GRAPHS, "graphs", graph_hash, rec)

    def add_implementation(self, kind: str, name: str, backend: str, source_hash: str,
                           requirements: Mapping | None = None, payload: bytes | None = None
                           ) -> str:
        """Store a KERNEL or GRAPH_RECIPE; dedupe on (kind, name, backend, source_hash).

        Example (``st`` an open store)::

            st.add_implementation("KERNEL", "matmul", "numpy", "h1")  # -> 'matmul@numpy#...'
        """
        rec = schema.make_implementation(kind, name, backend, source_hash, requirements,
                                         payload)
        return self._add_unique(IMPLEMENTATIONS, "impls", rec["key"], rec)

    def environment_id(self) -> str:
        """The id of this machine's environment, recorded in the store on first use (once
        per process and store)."""
        hit = _ENV_IDS.get(self.url)
        if hit is None:
            hit = self.add_environment(sniff_environment())
            if self.write_failure is None:  # recorded: no need to try again
                _ENV_IDS[self.url] = hit
        return hit

    def add_environment(self, env: Mapping[str, Any]) -> str:
        """Store an environment (see `sniff_environment`); dedupe on its id; returns the id.

        Example (``st`` an open store)::

            st.add_environment(sniff_environment())  # -> 'env-3f2a...'
        """
        rec = json.loads(json.dumps(dict(env), default=str))  # JSON-able copy, tuples->lists
        rec["id"] = str(env.get("id") or environment_id(rec))
        return self._add_unique(ENVIRONMENTS, "envs", rec["id"], rec)

    def add_workload(self, graph_hash: str, axes: Mapping[str, int],
                     inputs: Iterable[Any] = ()) -> str:
        """Store concrete axes + input descriptors of a graph; dedupe; returns the key.

        Example (``st`` an open store)::

            st.add_workload("g1", {"N": 128}, [((128,), "float32")])  # -> 'N=128#...'
        """
        rec = schema.make_workload(graph_hash, axes, inputs)
        return self._add_unique(WORKLOADS, "workloads", rec["key"], rec)

    def _add_unique(self, table: str, index_attr: str, key: str, rec: dict) -> str:
        self._add_unique_rows([(table, index_attr, key, rec)])
        return key

    def _add_unique_rows(self, rows: list[tuple[str, str, str, dict]]) -> None:
        with self._tlock:
            idx = self._read()  # fast path: no lock, no query for those already there
            new = {(t, key): (t, attr, key, rec) for t, attr, key, rec in rows
                   if key not in getattr(idx, attr)}
            if new:
                self._best_effort(lambda: self._insert_unique(list(new.values())),
                                  lambda: None)

    def add_many(self, *, workloads: Iterable[tuple] = (),
                 implementations: Iterable[tuple] = ()) -> None:
        """`add_workload` for each tuple of its arguments in `workloads` and
        `add_implementation` for each in `implementations`, in one write (a kernel sweep
        adds ~150 of each: one write each was 0.75 s of an 18-layer prefill's 11 s sweep).

        Example (``st`` an open store)::

            st.add_many(workloads=[("g1", {"N": 4}, [((4,), "float32")])],
                        implementations=[("KERNEL", "exp", "numpy", "h1")])
        """
        made = [schema.make_workload(*w) for w in workloads]
        rows = [(WORKLOADS, "workloads", r["key"], r) for r in made]
        made = [schema.make_implementation(*i) for i in implementations]
        rows += [(IMPLEMENTATIONS, "impls", r["key"], r) for r in made]
        if rows:
            self._add_unique_rows(rows)

    def add_traces(self, traces: Iterable[Mapping[str, Any]]) -> list[int]:
        """Insert many traces in one write (one file write, or one transaction); returns
        their ids.

        Example (``st`` an open store)::

            st.add_traces([dict(graph_hash="g", impl="k", workload="w", env_id="e",
                                status="PASSED", median_s=1e-3)])  # -> [1]
        """
        records = [schema.make_trace(**t) for t in traces]  # validate before locking
        if not records:
            return []
        return self._best_effort(lambda: self._insert_traces(records), lambda: [])

    def add_trace(self, **fields: Any) -> int | None:
        """Insert one trace (fields as in `schema.make_trace`); returns its id (None when a
        ``best_effort`` store could not write it).

        Example (``st`` an open store)::

            st.add_trace(graph_hash="g", impl="k", workload="w", env_id="e",
                         status="TIMEOUT", log="killed after 10 s")  # -> 2
        """
        ids = self.add_traces([fields])
        return ids[0] if ids else None

    # ------------------------------------------------------------ reads

    def best(self, graph_hash: str, workload_key: str, env_id: str, *,
             tolerance: float | None = None) -> dict | None:
        """The PASSED trace with the smallest median, or None; with `tolerance`, only
        traces whose ``max_rel_err`` is known and ``<= tolerance`` count.

        Example (``st`` an open store)::

            st.best("g1", w, env_id, tolerance=1e-5)["median_s"]  # -> 0.0001
        """
        with self._tlock:
            candidates = self._read().passed.get((graph_hash, workload_key, env_id))
            if not candidates:
                return None
            if tolerance is None:
                return dict(candidates[0])
            for rec in candidates:
                err = rec["max_rel_err"]
                if err is not None and err <= tolerance:
                    return dict(rec)
            return None

    def measured(self, graph_hash: str, impl: str, workload_key: str, env_id: str
                 ) -> dict | None:
        """The latest trace (any status) of this implementation on this workload, or None.

        Example (``st`` an open store)::

            st.measured("g1", impl_key, w, env_id) is None  # -> False
        """
        with self._tlock:
            rec = self._read().measured.get((graph_hash, impl, workload_key, env_id))
            return None if rec is None else dict(rec)

    def traces(self, graph_hash: str | None = None, workload: str | None = None,
               env_id: str | None = None, impl: str | None = None,
               status: str | Status | None = None) -> list[dict]:
        """All traces matching every given filter, oldest first (copies).

        Example (``st`` an open store)::

            [t["status"] for t in st.traces(graph_hash="g1", status="PASSED")]  # -> ['PASSED']
        """
        if status is not None:
            status = Status(status).value
        with self._tlock:
            idx = self._read()
            if graph_hash is not None and workload is not None and env_id is not None:
                pool = idx.by_gwe.get((graph_hash, workload, env_id), [])
            elif graph_hash is not None:
                pool = idx.by_graph.get(graph_hash, [])
            else:
                pool = idx.traces
            return [dict(r) for r in pool
                    if (graph_hash is None or r["graph_hash"] == graph_hash)
                    and (workload is None or r["workload"] == workload)
                    and (env_id is None or r["env_id"] == env_id)
                    and (impl is None or r["impl"] == impl)
                    and (status is None or r["status"] == status)]

    def workloads_for(self, graph_hash: str, env_id: str) -> list[dict]:
        """Workload records of `graph_hash` that have traces on `env_id` (to find the
        nearest measured binding of a new shape).

        Example (``st`` an open store)::

            [w["axes"] for w in st.workloads_for("g1", env_id)]  # -> [{'N': 128}]
        """
        with self._tlock:
            idx = self._read()
            keys = idx.workloads_ge.get((graph_hash, env_id), {})
            return [self._workload_out(idx.workloads[k]) if k in idx.workloads
                    else {"key": k, "graph_hash": graph_hash, "axes": None, "inputs": None}
                    for k in keys]

    def workloads(self, graph_hash: str | None = None) -> list[dict]:
        """Every workload record (of `graph_hash`, if given), traced or not.

        Example (``st`` an open store)::

            [w["axes"] for w in st.workloads("g1")]  # -> [{'N': 128}]
        """
        with self._tlock:
            idx = self._read()
            keys = idx.workloads if graph_hash is None else idx.workloads_g.get(graph_hash, {})
            return [self._workload_out(idx.workloads[k]) for k in keys]

    @staticmethod
    def _workload_out(rec: dict) -> dict:
        out = dict(rec)
        out["axes"] = dict(rec["axes"])
        out["inputs"] = [(tuple(shape), dtype) for shape, dtype in rec["inputs"]]
        return out

    def get_graph(self, graph_hash: str) -> dict | None:
        """The graph record with ``graph_bytes`` decoded from base64, or None.

        Example (``st`` an open store)::

            st.get_graph("g1")["graph_bytes"]  # -> b'msgpack bytes'
        """
        with self._tlock:
            rec = self._read().graphs.get(graph_hash)
        if rec is None:
            return None
        out = dict(rec)
        out["graph_bytes"] = schema.b64decode(out.pop("graph_b64"))
        return out

    def get_implementation(self, key: str) -> dict | None:
        """The implementation record with ``payload`` decoded from base64, or None.

        Example (``st`` an open store)::

            st.get_implementation(impl_key)["backend"]  # -> 'numpy'
        """
        with self._tlock:
            rec = self._read().impls.get(key)
        if rec is None:
            return None
        out = json.loads(json.dumps(rec))  # deep copy: requirements is a nested dict
        out["payload"] = schema.b64decode(out.pop("payload_b64"))
        return out

    def implementations(self, kind: str | None = None, backend: str | None = None
                        ) -> list[dict]:
        """Implementation records (payload decoded), optionally filtered.

        Example (``st`` an open store)::

            [i["name"] for i in st.implementations(backend="numpy")]  # -> ['matmul']
        """
        with self._tlock:
            keys = [k for k, r in self._read().impls.items()
                    if (kind is None or r["kind"] == kind)
                    and (backend is None or r["backend"] == backend)]
        return [self.get_implementation(k) for k in keys]

    def get_environment(self, env_id: str) -> dict | None:
        """The environment record with this id, or None.

        Example (``st`` an open store)::

            st.get_environment(env_id)["id"] == env_id  # -> True
        """
        with self._tlock:
            rec = self._read().envs.get(env_id)
        return None if rec is None else json.loads(json.dumps(rec))

    def get_workload(self, key: str) -> dict | None:
        """The workload record (inputs as ``[(shape_tuple, dtype), ...]``), or None.

        Example (``st`` an open store)::

            st.get_workload(w)["axes"]  # -> {'N': 128}
        """
        with self._tlock:
            rec = self._read().workloads.get(key)
        return None if rec is None else self._workload_out(rec)

    def _counts(self, idx: StoreIndex) -> dict:
        by_status: dict[str, int] = {}
        for rec in idx.traces:
            by_status[rec["status"]] = by_status.get(rec["status"], 0) + 1
        return {"counts": {GRAPHS: len(idx.graphs), IMPLEMENTATIONS: len(idx.impls),
                           ENVIRONMENTS: len(idx.envs), WORKLOADS: len(idx.workloads),
                           schema.TRACES: len(idx.traces)},
                "pending": len(idx.pending), "traces_by_status": by_status}

    # ------------------------------------------------------------ whole-store copies

    def dump_records(self) -> dict[str, list[dict]]:
        """Every record of every table (`schema.ALL_TABLES`), in the store's order, as the
        file format has them (bytes base64-encoded in ``*_b64`` fields): what `load_records`
        of another store (any engine) takes. Copies.

        Example (``st`` an open store)::

            len(st.dump_records()["traces"]) == len(st)  # -> True
        """
        with self._tlock:
            idx = self._read()
            tables = {GRAPHS: list(idx.graphs.values()),
                      IMPLEMENTATIONS: list(idx.impls.values()),
                      ENVIRONMENTS: list(idx.envs.values()),
                      WORKLOADS: list(idx.workloads.values()), schema.TRACES: idx.traces,
                      PENDING: [r for _, r in sorted(idx.pending.values(),
                                                      key=lambda x: x[0])]}
            return json.loads(json.dumps(tables))

    @abc.abstractmethod
    def load_records(self, tables: Mapping[str, Iterable[Mapping[str, Any]]]) -> dict[str, int]:
        """Copy records (as `dump_records` gives them, keys and timestamps kept) into this
        store, which must hold none yet; one write. Returns how many records per table.

        Example (``dst`` an empty store)::

            dst.load_records(src.dump_records())  # -> {'canonical_graphs': 3, ...}
        """

    def _check_loadable(self, tables: Mapping[str, Iterable[Mapping[str, Any]]]
                        ) -> dict[str, list[dict]]:
        out = {t: [dict(r) for r in tables.get(t, ())] for t in schema.ALL_TABLES}
        unknown = set(tables) - set(schema.ALL_TABLES)
        if unknown:
            raise StoreError(f"cannot load tables {sorted(unknown)}; a store has "
                             f"{list(schema.ALL_TABLES)}")
        key_of = {GRAPHS: "hash", IMPLEMENTATIONS: "key", ENVIRONMENTS: "id",
                  WORKLOADS: "key", PENDING: "key"}
        for table, field in key_of.items():
            seen: set = set()
            for rec in out[table]:
                key = rec.get(field)
                if not isinstance(key, str) or not key:
                    raise StoreError(f"a {table} record has no {field!r}: {str(rec)[:120]}")
                if key in seen:
                    raise StoreError(f"two {table} records have {field} {key!r}")
                seen.add(key)
        for rec in out[WORKLOADS]:
            schema._require_str(rec.get("graph_hash"), "workload graph_hash")
        for table in (schema.TRACES, PENDING):
            need = (schema.TRACE_REQUIRED_FIELDS if table == schema.TRACES
                    else ("graph_hash", "workload", "impl", "env_id"))
            for rec in out[table]:
                if any(not isinstance(rec.get(f), str) for f in need):
                    raise StoreError(f"a {table} record lacks a required field: "
                                     f"{str(rec)[:120]}")
        return out

    def _require_empty(self) -> None:
        counts = self._counts(self._read())
        n = sum(counts["counts"].values()) + counts["pending"]
        if n:
            raise StoreError(f"benchmark store {self.path} is not empty ({n} records); "
                             "records are copied only into an empty store")

    # ------------------------------------------------------------ lifecycle

    @abc.abstractmethod
    def stats(self) -> dict:
        """Counts per table and per trace status, plus path, size and schema version."""

    @abc.abstractmethod
    def export(self, path: str | os.PathLike) -> str:
        """Write a consistent copy of the whole store as a TinyDB JSON file at `path`."""

    @abc.abstractmethod
    def close(self) -> None:
        """Drop the in-memory copy; later calls raise `StoreError`. Idempotent."""

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __len__(self) -> int:
        with self._tlock:
            return len(self._read().traces)

    def __repr__(self) -> str:
        return f"BenchmarkStore({self.path if self.engine == 'tinydb' else self.url!r})"


def as_store(store: BenchmarkStore | str | os.PathLike | None) -> BenchmarkStore:
    """`store` if it is one, else the store at that path or URL (None:
    `default_store_path()`).

    Example::

        as_store(None).path == default_store_path()  # -> True
    """
    return store if isinstance(store, BenchmarkStore) else BenchmarkStore(store)
