"""`BenchmarkStore`: a TinyDB file of graphs, implementations, environments, workloads, traces.

Why not plain ``TinyDB(path)``: its JSONStorage rewrites the file in place (a crash leaves it
truncated), two processes writing at once corrupt it, and each process caches the next
document id, so two processes hand out the same ids. Here:

* a custom TinyDB `Storage` keeps the document in memory and writes it atomically
  (temp file in the same directory, flush, fsync, ``os.replace``, fsync of the directory);
* every read-modify-write holds a threading lock and a cross-process `filelock.FileLock`
  on ``<path>.lock``; inside the lock the file is re-read if its stat signature
  (inode, size, mtime, ctime) changed, and the TinyDB instance is rebuilt so its cached
  next ids are taken from the fresh document, i.e. ids are allocated inside the lock;
* TinyDB does the id allocation and table bookkeeping, while lookups go through an
  in-memory index (`_Index`) because a TinyDB query scans every document.

Readers need no file lock: ``os.replace`` makes every reader see a whole old or new file.
"""

from __future__ import annotations

import bisect
import contextlib
import json
import os
import tempfile
import threading
import time
import warnings
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, Self

from filelock import FileLock
from tinydb import TinyDB
from tinydb.storages import Storage

from tgx.store import schema
from tgx.store.environment import environment_id, sniff_environment
from tgx.store.schema import (
    ENVIRONMENTS,
    GRAPHS,
    IMPLEMENTATIONS,
    META,
    META_ID,
    PENDING,
    TABLES,
    TRACES,
    WORKLOADS,
    CorruptStoreError,
    Status,
    StoreError,
)

_PASSED = Status.PASSED.value


_ENV_IDS: dict[str, str] = {}  # store path -> this machine's environment id


#: ``$TGX_STORE`` values (any case) that turn the default store off
OFF = ("off", "none")


def store_disabled() -> bool:
    """Whether ``$TGX_STORE`` turns the default store off (``TGX_STORE=off``).

    >>> store_disabled() == (os.environ.get("TGX_STORE", "").strip().lower() in OFF)
    True
    """
    return os.environ.get("TGX_STORE", "").strip().lower() in OFF


def default_store_path() -> str:
    """``$TGX_STORE``, else ``$XDG_CACHE_HOME/tgx/store.json``, else ``~/.cache/tgx/store.json``.
    Raises `StoreError` when ``TGX_STORE=off`` turned the default store off.

    >>> default_store_path().endswith(".json") or "TGX_STORE" in os.environ
    True
    """
    explicit = os.environ.get("TGX_STORE")
    if store_disabled():
        raise StoreError(f"the default benchmark store is turned off (TGX_STORE={explicit}); "
                         "give a store path, or unset TGX_STORE")
    if explicit:
        return os.path.abspath(os.path.expanduser(explicit))
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(cache, "tgx", "store.json")


# --------------------------------------------------------------------------- file level

def _signature(st: os.stat_result) -> tuple:
    # os.replace gives every write a new inode, and the size grows with every insert, so
    # this changes on every write even when mtime granularity is coarse.
    return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def _parse(raw: bytes, path: str) -> dict:
    """Bytes of a store file -> validated document, or `CorruptStoreError` saying why."""
    if not raw:
        raise CorruptStoreError(path, "the file is empty (0 bytes; truncated by a crash?)")
    nul = raw.find(b"\x00")
    if nul >= 0:
        raise CorruptStoreError(path, f"the file contains NUL bytes from offset {nul} of "
                                      f"{len(raw)} (padded by a crash?)")
    try:
        doc = json.loads(raw)
    except UnicodeDecodeError as e:
        raise CorruptStoreError(path, f"the file is not UTF-8 text ({e.reason} at byte "
                                      f"{e.start})") from None
    except json.JSONDecodeError as e:
        hint = " (truncated?)" if e.pos >= len(raw.rstrip()) - 1 else ""
        raise CorruptStoreError(path, f"invalid JSON at line {e.lineno} column {e.colno}: "
                                      f"{e.msg}{hint}; file is {len(raw)} bytes") from None
    return schema.validate_document(doc, path)


def _load(path: str) -> tuple[dict, tuple]:
    with open(path, "rb") as f:
        st = os.fstat(f.fileno())  # stat of exactly the bytes we read
        raw = f.read()
    return _parse(raw, path), _signature(st)


def _fsync_dir(directory: str) -> None:
    with contextlib.suppress(OSError):  # not every platform can fsync a directory
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def read_only_reason(path: str) -> str | None:
    """Why the store at `path` cannot be written, or None. A file or directory with no write
    permission bit counts as read-only even for root (who could write it anyway): a store
    marked read-only is never replaced behind its owner's back.

    >>> import tempfile
    >>> p = os.path.join(tempfile.mkdtemp(), "s.json"); open(p, "w").close()
    >>> os.chmod(p, 0o444); read_only_reason(p)
    'the file is read-only'
    """
    directory = os.path.dirname(path) or "."
    for target, what in ((path, "the file"), (directory, f"its directory {directory}")):
        try:
            mode = os.stat(target).st_mode
        except FileNotFoundError:
            continue
        except OSError as e:
            return f"{what} cannot be read ({e.strerror})"
        if not mode & 0o222 or not os.access(target, os.W_OK):
            return f"{what} is read-only"
    return None


def atomic_write_json(path: str, data: Any) -> os.stat_result:
    """Write `data` as JSON so that `path` is always either the old or the new whole file.

    >>> import tempfile, os
    >>> p = os.path.join(tempfile.mkdtemp(), "x.json")
    >>> _ = atomic_write_json(p, {"a": 1}); open(p).read()
    '{"a":1}'
    """
    text = json.dumps(data, separators=(",", ":"))  # dumps + one write beats json.dump
    directory = os.path.dirname(path) or "."
    fd, tmp = tempfile.mkstemp(prefix=os.path.basename(path) + ".", suffix=".tmp",
                               dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        try:
            mode = os.stat(path).st_mode & 0o777
        except FileNotFoundError:
            mode = 0o644
        os.chmod(tmp, mode)  # mkstemp creates 0600; keep the store's permissions
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    _fsync_dir(directory)
    return os.stat(path)


def move_aside(path: str) -> str:
    """Rename `path` to ``<path>.corrupt-<timestamp>[-n]`` without ever overwriting a file.

    >>> import tempfile, os
    >>> p = os.path.join(tempfile.mkdtemp(), "s.json"); open(p, "w").close()
    >>> ".corrupt-" in move_aside(p) and not os.path.exists(p)
    True
    """
    base = f"{path}.corrupt-{time.strftime('%Y%m%d-%H%M%S')}"
    for n in range(10_000):
        target = base if n == 0 else f"{base}-{n}"
        try:
            os.link(path, target)  # fails if target exists: no overwrite, ever
        except FileExistsError:
            continue
        except OSError:  # no hard links on this file system
            if os.path.exists(target):
                continue
            os.rename(path, target)
            return target
        os.unlink(path)
        return target
    raise StoreError(f"cannot find a free name to move {path} aside")


class _AtomicJSONStorage(Storage):
    """TinyDB storage holding the document in memory; `write` is atomic and lock-guarded.

    Reading from disk is done by `BenchmarkStore`, which knows when the file changed.
    """

    def __init__(self, path: str):
        self.path = path
        self.doc: dict | None = None
        self.sig: tuple | None = None
        self.writable = False  # only True inside BenchmarkStore._writing()

    def read(self) -> dict | None:
        return self.doc

    def write(self, data: dict) -> None:
        if not self.writable:
            raise StoreError("internal error: store written outside its lock")
        meta = data[META][META_ID]
        meta["generation"] = int(meta.get("generation", 0)) + 1
        self.sig = None  # until the write is known to have landed
        st = atomic_write_json(self.path, data)
        self.doc, self.sig = data, _signature(st)

    def close(self) -> None:
        pass


# --------------------------------------------------------------------------- index

def _median_key(rec: dict) -> float:
    return rec["median_s"]


class _Index:
    """In-memory lookup tables over the document; records are shared, never copied."""

    def __init__(self, doc: dict):
        self.graphs = {r["hash"]: r for r in doc[GRAPHS].values()}
        self.impls = {r["key"]: r for r in doc[IMPLEMENTATIONS].values()}
        self.envs = {r["id"]: r for r in doc[ENVIRONMENTS].values()}
        self.workloads = {r["key"]: r for r in doc[WORKLOADS].values()}
        self.pending = {r["key"]: (int(i), r) for i, r in doc.get(PENDING, {}).items()}
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
        for rec in doc[TRACES].values():
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


# --------------------------------------------------------------------------- the store

class BenchmarkStore:
    """A benchmark store on disk, safe for many processes and threads writing at once.

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

    `path` defaults to `default_store_path()`. A corrupt file raises `CorruptStoreError`
    and is left as it is; ``recover=True`` moves it to ``<path>.corrupt-<timestamp>``
    (see `recovered_from`) and starts a fresh store. A newer schema raises
    `StoreVersionError` and the file is never touched. A read-only file is never replaced:
    writes raise `StoreError`.

    ``best_effort=True`` (the store `tgx.compile` plans with, `open_for_planning`): a write
    that fails (lock held past `lock_timeout`, disk full, file turned read-only or corrupt)
    warns once with a `StoreWarning`, writes nothing more and returns what the write would
    have returned (keys, no ids); a failed re-read keeps the copy already in memory.
    """

    def __init__(self, path: str | os.PathLike | None = None, *, recover: bool = False,
                 lock_timeout: float = 120.0, best_effort: bool = False):
        self.path = os.path.abspath(os.fspath(path)) if path else default_store_path()
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        #: Where a corrupt file was moved by ``recover=True``, else None.
        self.recovered_from: str | None = None
        self.best_effort = best_effort
        #: With ``best_effort``: why writes stopped (the first failure), else None.
        self.write_failure: str | None = None
        self._tlock = threading.RLock()
        # Short poll interval: writers hold the lock for milliseconds, 50 ms polls would
        # serialise many processes far below what the disk can do.
        self._flock = FileLock(self.path + ".lock", timeout=lock_timeout, poll_interval=0.002)
        self._storage = _AtomicJSONStorage(self.path)
        self._db: TinyDB | None = None
        self._idx: _Index | None = None
        self._closed = False
        with self._tlock, self._flock:  # creation and recovery must not race
            try:
                self._refresh_from_disk(create=True)
            except CorruptStoreError as err:
                if not recover:
                    raise
                moved = move_aside(self.path)
                self.recovered_from = moved
                warnings.warn(f"{err.reason}: moved the corrupt store {self.path} to "
                              f"{moved} and started a fresh one", RuntimeWarning, stacklevel=2)
                self._refresh_from_disk(create=True)

    # ------------------------------------------------------------ consistency machinery

    def _install(self, doc: dict, sig: tuple | None) -> None:
        self._storage.doc, self._storage.sig = doc, sig
        # A fresh TinyDB drops the per-table cached next id and query caches, so ids are
        # recomputed from the document just read (inside the lock when writing).
        self._db = TinyDB(storage=lambda: self._storage)
        self._idx = _Index(doc)

    def _refresh_from_disk(self, create: bool = False) -> None:
        """Re-read the file if another process (or a failed write) changed it."""
        if self._closed:
            raise StoreError(f"benchmark store {self.path} is closed")
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            if create:  # only ever called with the file lock held
                doc = schema.empty_document()
                self._storage.writable = True
                try:
                    self._storage.write(doc)
                finally:
                    self._storage.writable = False
                self._install(doc, self._storage.sig)
                return
            if self._storage.doc is None:
                raise StoreError(f"benchmark store {self.path} disappeared") from None
            return  # deleted under us: keep the memory copy; the next write restores it
        if _signature(st) != self._storage.sig or self._storage.doc is None:
            doc, sig = _load(self.path)
            self._install(doc, sig)

    def _read(self) -> _Index:
        try:
            self._refresh_from_disk()
        except (StoreError, OSError) as err:
            if not self.best_effort or self._idx is None or self._closed:
                raise
            self._give_up_writing(err, "re-read")  # plan on what was read before
        return self._idx

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

    @contextlib.contextmanager
    def _writing(self) -> Iterator[TinyDB]:
        """Hold both locks, start from the newest file, and let TinyDB write through."""
        with self._tlock, self._flock:
            problem = read_only_reason(self.path)
            if problem:
                raise StoreError(f"benchmark store {self.path} cannot be written: {problem}")
            self._refresh_from_disk(create=True)
            self._storage.writable = True
            try:
                yield self._db
            except BaseException:
                # The memory copy may be ahead of the file (e.g. os.replace failed):
                # forget it, the next access re-reads what really is on disk.
                self._storage.doc = self._storage.sig = None
                raise
            finally:
                self._storage.writable = False

    def _insert(self, table: str, records: list[dict]) -> list[int]:
        """Insert records (inside `_writing`) and add the stored copies to the index."""
        ids = self._db.table(table).insert_multiple(records)
        stored = self._storage.doc[table]
        for doc_id in ids:
            if table == PENDING:
                rec = stored[str(doc_id)]
                self._idx.pending[rec["key"]] = (doc_id, rec)
            else:
                self._idx.add(table, stored[str(doc_id)])
        return ids

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

    def _add_pending(self, fresh: dict[str, dict]) -> int:
        with self._writing():
            new = [r for k, r in fresh.items() if k not in self._idx.pending]
            if new:
                self._insert(PENDING, new)
            # the flagged one-equation graphs, so their names and shapes outlive the flags
            graphs = {r["graph_hash"]: schema.make_graph(r["graph_hash"], eq["primitive"],
                                                         None, equation=eq)
                      for r in new if (eq := r.get("equation")) and eq.get("primitive")
                      and r["graph_hash"] not in self._idx.graphs}
            if graphs:
                self._insert(GRAPHS, list(graphs.values()))
            return len(new)

    def pending(self, env_id: str | None = None) -> list[dict]:
        """Pending records (bytes decoded into ``graph_bytes``), oldest first."""
        with self._tlock:
            recs = [r for _, r in sorted(self._read().pending.values(), key=lambda x: x[0])
                    if env_id is None or r["env_id"] == env_id]
            out = []
            for r in recs:
                r = dict(r)
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

    def _clear_pending(self, keys: list[str]) -> int:
        with self._writing():
            ids = [self._idx.pending[k][0] for k in keys if k in self._idx.pending]
            if ids:
                self._db.table(PENDING).remove(doc_ids=ids)
                for k in keys:
                    self._idx.pending.pop(k, None)
            return len(ids)

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
        per process and store path)."""
        hit = _ENV_IDS.get(self.path)
        if hit is None:
            hit = self.add_environment(sniff_environment())
            if self.write_failure is None:  # recorded: no need to try again
                _ENV_IDS[self.path] = hit
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
        with self._tlock:
            if key in getattr(self._read(), index_attr):  # fast path, no file lock
                return key
            return self._best_effort(lambda: self._insert_unique(table, index_attr, key, rec),
                                     lambda: key)

    def _insert_unique(self, table: str, index_attr: str, key: str, rec: dict) -> str:
        with self._writing():  # check again: another process may have added it
            if key not in getattr(self._idx, index_attr):
                self._insert(table, [rec])
        return key

    def add_traces(self, traces: Iterable[Mapping[str, Any]]) -> list[int]:
        """Insert many traces with one locked file write; returns their ids.

        Example (``st`` an open store)::

            st.add_traces([dict(graph_hash="g", impl="k", workload="w", env_id="e",
                                status="PASSED", median_s=1e-3)])  # -> [1]
        """
        records = [schema.make_trace(**t) for t in traces]  # validate before locking
        if not records:
            return []
        return self._best_effort(lambda: self._insert_traces(records), lambda: [])

    def _insert_traces(self, records: list[dict]) -> list[int]:
        with self._tlock, self._writing():
            return self._insert(TRACES, records)

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

    def stats(self) -> dict:
        """Counts per table and per trace status, plus path, size and schema version.

        Example (``st`` an open store)::

            st.stats()["counts"]["traces"]  # -> 1
        """
        with self._tlock:
            idx = self._read()
            meta = self._storage.doc[META][META_ID]
            by_status: dict[str, int] = {}
            for rec in idx.traces:
                by_status[rec["status"]] = by_status.get(rec["status"], 0) + 1
            size = self._storage.sig[1] if self._storage.sig else None
            return {"path": self.path, "schema_version": meta["schema_version"],
                    "generation": meta.get("generation", 0), "size_bytes": size,
                    "counts": {t: len(self._storage.doc[t]) for t in TABLES},
                    "pending": len(idx.pending),
                    "traces_by_status": by_status}

    def export(self, path: str | os.PathLike) -> str:
        """Write a consistent copy of the whole store (same JSON format) to `path`.

        Example (``st`` an open store)::

            st.export("/tmp/backup.json")  # -> '/tmp/backup.json'
        """
        path = os.path.abspath(os.fspath(path))
        if path == self.path:
            raise StoreError(f"cannot export the store {self.path} onto itself")
        with self._tlock:
            self._read()
            atomic_write_json(path, self._storage.doc)
        return path

    def close(self) -> None:
        """Drop the in-memory copy; later calls raise `StoreError`. Idempotent."""
        with self._tlock:
            self._closed = True
            self._storage.doc = self._storage.sig = None
            self._idx = self._db = None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __len__(self) -> int:
        with self._tlock:
            return len(self._read().traces)

    def __repr__(self) -> str:
        return f"BenchmarkStore({self.path!r})"


def as_store(store: BenchmarkStore | str | os.PathLike | None) -> BenchmarkStore:
    """`store` if it is one, else the store at that path (None: `default_store_path()`).

    Example::

        as_store(None).path == default_store_path()  # -> True
    """
    return store if isinstance(store, BenchmarkStore) else BenchmarkStore(store)
