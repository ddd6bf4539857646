"""`TinyDBStore`: the TinyDB engine, one JSON file of graphs, implementations, environments,
workloads, traces and pending flags (what ``BenchmarkStore(path)`` opens for a file path).

Why not plain ``TinyDB(path)``: its JSONStorage rewrites the file in place (a crash leaves it
truncated), two processes writing at once corrupt it, and each process caches the next
document id, so two processes hand out the same ids. Here:

* a custom TinyDB `Storage` keeps the document in memory and writes it atomically
  (temp file in the same directory, flush, fsync, ``os.replace``, fsync of the directory);
* every read-modify-write holds a threading lock and a cross-process `filelock.FileLock`
  on ``<path>.lock``; inside the lock the file is re-read if its stat signature
  (inode, size, mtime, ctime) changed, and the TinyDB instance is rebuilt so its cached
  next ids are taken from the fresh document, i.e. ids are allocated inside the lock;
* TinyDB does the id allocation and table bookkeeping, while lookups go through the
  in-memory `StoreIndex` because a TinyDB query scans every document.

Readers need no file lock: ``os.replace`` makes every reader see a whole old or new file.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import time
import warnings
from collections.abc import Iterator, Mapping
from typing import Any

from filelock import FileLock
from tinydb import TinyDB
from tinydb.storages import Storage

from tgx.store import schema
from tgx.store.base import BenchmarkStore, _target, as_store, engine_class
from tgx.store.index import StoreIndex
from tgx.store.schema import (
    ALL_TABLES,
    GRAPHS,
    META,
    META_ID,
    PENDING,
    TABLES,
    TRACES,
    CorruptStoreError,
    StoreError,
)
from tgx.store.url import OFF, default_store_path, store_disabled

__all__ = ["OFF", "BenchmarkStore", "TinyDBStore", "as_store", "atomic_write_json",
           "default_store_path", "engine_class", "move_aside", "read_only_reason",
           "store_disabled"]


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


# --------------------------------------------------------------------------- the store

def _index(doc: dict) -> StoreIndex:
    return StoreIndex({t: doc[t].values() for t in TABLES},
                      ((int(i), r) for i, r in doc.get(PENDING, {}).items()))


class TinyDBStore(BenchmarkStore):
    """The TinyDB engine: a store in one JSON file (``BenchmarkStore(path)``).

    A read-only file is never replaced: writes raise `StoreError`. `lock_timeout`: seconds
    a write waits for ``<path>.lock``. `refresh_s`: at most how old the cache may be
    before a query looks at the file again (default 0: every query, one ``os.stat``).
    """

    engine = "tinydb"

    def __init__(self, path: Any = None, *, recover: bool = False,
                 lock_timeout: float = 120.0, best_effort: bool = False,
                 refresh_s: float = 0.0):
        target = _target(path)
        if target.engine != "tinydb":
            raise StoreError(f"{target.display} is not a TinyDB store; open it with "
                             "BenchmarkStore(url)")
        self._init_common(target, best_effort)
        self.refresh_s = refresh_s
        self._checked = 0.0
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        # Short poll interval: writers hold the lock for milliseconds, 50 ms polls would
        # serialise many processes far below what the disk can do.
        self._flock = FileLock(self.path + ".lock", timeout=lock_timeout, poll_interval=0.002)
        self._storage = _AtomicJSONStorage(self.path)
        self._db: TinyDB | None = None
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
        self._idx = _index(doc)

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

    def _read(self) -> StoreIndex:
        if self.refresh_s:
            now = time.monotonic()
            if now - self._checked < self.refresh_s and self._idx is not None:
                return self._idx
            self._checked = now
        try:
            self._refresh_from_disk()
        except (StoreError, OSError) as err:
            if not self.best_effort or self._idx is None or self._closed:
                raise
            self._give_up_writing(err, "re-read")  # plan on what was read before
        return self._idx

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
                self._idx.add_pending(doc_id, stored[str(doc_id)])
            else:
                self._idx.add(table, stored[str(doc_id)])
        return ids

    # ------------------------------------------------------------ engine writes

    def _add_pending(self, fresh: dict[str, dict]) -> int:
        with self._writing():
            new = [r for k, r in fresh.items() if k not in self._idx.pending]
            if new:
                self._insert(PENDING, new)
            graphs = self._flagged_graphs(new, self._idx.graphs)
            if graphs:
                self._insert(GRAPHS, list(graphs.values()))
            return len(new)

    def _clear_pending(self, keys: list[str]) -> int:
        with self._writing():
            ids = [self._idx.pending[k][0] for k in keys if k in self._idx.pending]
            if ids:
                self._db.table(PENDING).remove(doc_ids=ids)
                for k in keys:
                    self._idx.pending.pop(k, None)
            return len(ids)

    def _insert_unique(self, rows: list[tuple[str, str, str, dict]]) -> None:
        with self._writing():  # check again: another process may have added them
            by_table: dict[str, list[dict]] = {}
            for table, index_attr, key, rec in rows:
                if key not in getattr(self._idx, index_attr):
                    by_table.setdefault(table, []).append(rec)
            for table, recs in by_table.items():
                self._insert(table, recs)

    def _insert_traces(self, records: list[dict]) -> list[int]:
        with self._tlock, self._writing():
            return self._insert(TRACES, records)

    # ------------------------------------------------------------ whole store

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
            return {"path": self.path, "engine": self.engine, "url": self.url,
                    "schema_version": meta["schema_version"],
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

    def dump_records(self) -> dict[str, list[dict]]:
        with self._tlock:
            self._read()
            doc = self._storage.doc
            return json.loads(json.dumps({t: list(doc[t].values()) for t in ALL_TABLES}))

    dump_records.__doc__ = BenchmarkStore.dump_records.__doc__

    def load_records(self, tables: Mapping[str, Any]) -> dict[str, int]:
        tables = self._check_loadable(tables)
        with self._tlock, self._writing():
            self._require_empty()
            doc = json.loads(json.dumps(self._storage.doc))  # meta kept
            for t in ALL_TABLES:
                doc[t] = {str(i): rec for i, rec in enumerate(tables[t], 1)}
            schema.validate_document(doc, self.path)
            self._storage.write(doc)
            self._install(doc, self._storage.sig)
        return {t: len(tables[t]) for t in ALL_TABLES}

    load_records.__doc__ = BenchmarkStore.load_records.__doc__

    def close(self) -> None:
        """Drop the in-memory copy; later calls raise `StoreError`. Idempotent."""
        with self._tlock:
            self._closed = True
            self._storage.doc = self._storage.sig = None
            self._idx = self._db = None


STORE_CLASS = TinyDBStore
