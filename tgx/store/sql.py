"""`SQLStore`: the SQLite and PostgreSQL engines (SQLAlchemy Core; psycopg 3 for PostgreSQL).

The tables are in `tgx.store.sqlschema`. How this engine stays correct with many writers:

* every write is one transaction that first bumps ``store_meta.generation``: the row lock
  serialises writers (SQLite: ``BEGIN IMMEDIATE``), so the database's own transactions, not
  file locks, keep concurrent writers apart, and a writer killed mid-transaction leaves
  nothing behind (the database rolls it back);
* reads are answered from an in-process cache (`StoreIndex`, as the TinyDB engine's) that
  compares the cached generation with the database's (at most every `refresh_s`) and then
  loads only what changed: parent rows with ``gen`` above the cached generation, traces
  with ``id`` above the last one read, in one snapshot. Writers are serialised, so commit
  order is generation order and no row is skipped or read twice;
* a writer catches up inside its transaction (after the generation lock, everything
  committed before is visible), then dedupes against the fresh cache, as the TinyDB engine
  does inside its file lock.

Passwords never leave this module: messages name the URL without it (`url.redact`), and
driver errors are scrubbed of it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import time
import warnings
import weakref
from collections.abc import Iterator, Mapping
from typing import Any

import sqlalchemy as sa
from sqlalchemy import event

from . import sqlschema as q
from .base import BenchmarkStore, _target
from .db import atomic_write_json, move_aside, read_only_reason
from .index import StoreIndex
from .schema import (
    ALL_TABLES,
    GRAPHS,
    META,
    META_ID,
    PENDING,
    SCHEMA_VERSION,
    TRACES,
    CorruptStoreError,
    StoreError,
    StoreVersionError,
)
from .url import StoreTarget, scrub

#: seconds between generation checks when `refresh_s` is not given (a check is one query:
#: ~7 µs on SQLite, a round trip on PostgreSQL)
DEFAULT_REFRESH_S = {"sqlite": 0.0, "postgresql": 0.5}
#: seconds a best-effort store (the one compile plans with) waits before it tries to reach a
#: database again after a failed refresh, planning on its cache meanwhile
RETRY_AFTER_S = 30.0
#: PostgreSQL advisory lock key held while creating or migrating the schema
_SCHEMA_LOCK = 0x7467785F73746F  # "tgx_sto"
_CHUNK = 2000  # rows per INSERT statement group when copying a whole store


class StoreLockedError(StoreError, TimeoutError):
    """Another writer held the store longer than `lock_timeout` allowed."""


class _Txn:
    """A write transaction: its connection, generation and what to do after the commit."""

    def __init__(self, store: SQLStore, conn: sa.Connection, gen: int):
        self.store, self.conn, self.gen = store, conn, gen
        self.after: list = []
        self.new_ids: dict[str, dict[str, int]] = {t: {} for t in q.PARENTS}

    def parent_id(self, table: str, key: str) -> int:
        """The id of the row keyed `key` in parent `table`; a placeholder row if there is
        none yet."""
        rid = self.store._id_of[table].get(key)
        if rid is None:
            rid = self.new_ids[table].get(key)
        if rid is None:
            t = q.SQL_TABLES[table]
            rid = self.conn.execute(sa.insert(t).values(q.placeholder_row(table, key, self.gen))
                                    .returning(t.c.id)).scalar_one()
            self.new_ids[table][key] = rid
        return rid

    def committed(self) -> None:
        for table, ids in self.new_ids.items():
            for key, rid in ids.items():
                self.store._id_of[table][key] = rid
                self.store._key_of[table][rid] = key
        for fn in self.after:
            fn()


class SQLStore(BenchmarkStore):
    """A store in SQLite (``sqlite:///path.db``) or PostgreSQL (``postgresql://…``).

    `lock_timeout`: seconds a write waits for another writer (SQLite's busy timeout,
    PostgreSQL's ``lock_timeout``) and a connection may take. `refresh_s`: at most how old
    the cache may be before a query checks the database for other processes' writes
    (default `DEFAULT_REFRESH_S`; 0: every query); this process's own writes are seen at
    once. `recover` (SQLite): a file that is not an SQLite database is moved aside.
    """

    def __init__(self, path: Any = None, *, recover: bool = False,
                 lock_timeout: float = 120.0, best_effort: bool = False,
                 refresh_s: float | None = None):
        target = _target(path)
        if target.engine not in ("sqlite", "postgresql"):
            raise StoreError(f"{target.display} is not an SQL store")
        self.engine = target.engine
        self._init_common(target, best_effort)
        self._target: StoreTarget = target
        self.refresh_s = DEFAULT_REFRESH_S[self.engine] if refresh_s is None else refresh_s
        self.lock_timeout = lock_timeout
        #: the schema version the store had before this process migrated it, else None
        self.migrated_from: int | None = None
        self.schema_version = SCHEMA_VERSION
        self._sqlite = self.engine == "sqlite"
        self._checker: Any = None
        self._sa: sa.Engine | None = None
        with self._tlock:
            try:
                self._open()
            except CorruptStoreError as err:
                if not recover or not self._sqlite:
                    raise
                self._dispose()
                moved = move_aside(self.path)
                for suffix in ("-wal", "-shm"):  # the journal belongs to the moved file
                    with contextlib.suppress(FileNotFoundError):
                        os.replace(self.path + suffix, moved + suffix)
                self.recovered_from = moved
                warnings.warn(f"{err.reason}: moved the corrupt store {self.path} to "
                              f"{moved} and started a fresh one", RuntimeWarning, stacklevel=2)
                self._open()

    # ------------------------------------------------------------ connections

    def _open(self) -> None:
        if self._sqlite:
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
        self._sa = self._create_engine()
        # a forked child must not use the parent's connections: it opens its own
        me = weakref.ref(self)
        # (`is not None`: truth would be len(), a query, and raise for a closed store)
        os.register_at_fork(
            after_in_child=lambda: (s := me()) is not None and s._forget_connections())
        self._reset_cache()
        try:
            self._ensure_schema()
            with self._reading() as conn:
                self._load(conn, self._meta_generation(conn))
        except BaseException:
            self._dispose()
            raise
        self._checked = time.monotonic()
        self._retry_at = 0.0

    def _create_engine(self) -> sa.Engine:
        url = self._target.url
        if self._sqlite:
            engine = sa.create_engine(url, connect_args={"timeout": self.lock_timeout})
            event.listen(engine, "connect", self._sqlite_connect)
            event.listen(engine, "begin", _sqlite_begin)
            return engine
        engine = sa.create_engine(url, pool_pre_ping=True, connect_args={
            "connect_timeout": self._connect_timeout(), "application_name": "tgx"})
        ms = int(self.lock_timeout * 1000)

        def on_connect(dbapi_conn: Any, _record: Any) -> None:
            with dbapi_conn.cursor() as cur:
                cur.execute(f"SET lock_timeout = {ms}")
            dbapi_conn.commit()
        event.listen(engine, "connect", on_connect)
        return engine

    def _connect_timeout(self) -> int:
        return max(1, int(min(10.0, self.lock_timeout)))

    def _sqlite_connect(self, dbapi_conn: Any, _record: Any) -> None:
        dbapi_conn.isolation_level = None  # transactions are begun by `_sqlite_begin`
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA foreign_keys = ON")
        cur.execute(f"PRAGMA busy_timeout = {int(self.lock_timeout * 1000)}")
        with contextlib.suppress(Exception):  # a read-only file keeps its journal mode
            cur.execute("PRAGMA journal_mode = WAL")  # readers never block the writer
        cur.execute("PRAGMA synchronous = NORMAL")  # WAL + NORMAL: a crash loses nothing
        cur.close()

    @contextlib.contextmanager
    def _reading(self, what: str = "a read") -> Iterator[sa.Connection]:
        """A read-only snapshot of the database (one transaction)."""
        with self._errors(what), self._sa.connect() as conn:
            if not self._sqlite:
                conn = conn.execution_options(isolation_level="REPEATABLE READ")
            with conn.begin():
                yield conn

    @contextlib.contextmanager
    def _errors(self, what: str) -> Iterator[None]:
        """Driver errors as `StoreError`s that name the URL without its password."""
        try:
            yield
        except sa.exc.SQLAlchemyError as err:
            raise self._error(err, what) from None

    def _error(self, err: BaseException, what: str) -> StoreError:
        orig = getattr(err, "orig", None) or err
        text = str(orig).strip()
        if isinstance(err, sa.exc.StatementError) and orig is err:
            text = text.split("\n[SQL:", 1)[0]
        lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
        msg = scrub(" ".join(lines[:3]) if lines else type(orig).__name__,
                    self._target.password)
        if self._sqlite and "file is not a database" in msg:
            return CorruptStoreError(self.path, f"not an SQLite database ({msg})")
        sqlstate = getattr(orig, "sqlstate", None)
        if sqlstate == "55P03" or (self._sqlite and "database is locked" in msg):
            return StoreLockedError(
                f"benchmark store {self.url}: {what} waited over {self.lock_timeout:g} s "
                f"for another writer ({msg})")
        return StoreError(f"benchmark store {self.url}: {what} failed: "
                          f"{type(orig).__name__}: {msg}")

    def _forget_connections(self) -> None:
        self._checker = None
        if self._sa is not None:
            self._sa.dispose(close=False)

    def _dispose(self) -> None:
        if self._checker is not None:
            with contextlib.suppress(Exception):
                self._checker.close()
            self._checker = None
        if self._sa is not None:
            self._sa.dispose()

    # ------------------------------------------------------------ schema

    def _version(self, conn: sa.Connection) -> int | None:
        if not sa.inspect(conn).has_table("schema_version"):
            return None
        return conn.execute(sa.select(sa.func.max(q.schema_version.c.version))).scalar() or 0

    def _ensure_schema(self) -> None:
        with self._reading("opening the store") as conn:
            version = self._version(conn)
        if version == SCHEMA_VERSION:
            return
        if version is not None and version > SCHEMA_VERSION:
            raise StoreVersionError(self.url, version)
        self._check_writable()
        what = ("creating the schema" if version is None else
                f"migrating the schema from version {version} to {SCHEMA_VERSION} (a role "
                "that owns the tables must open it once)")
        with self._errors(what), self._sa.connect() as conn:
            with conn.execution_options(tgx_write=True).begin():
                if not self._sqlite:
                    conn.execute(sa.text("SELECT pg_advisory_xact_lock(:k)"),
                                 {"k": _SCHEMA_LOCK})
                version = self._version(conn)  # again, now that we hold the lock
                if version is None:
                    found = set(sa.inspect(conn).get_table_names()) & set(q.tgx_tables())
                    if found:
                        raise StoreError(f"{self.url} has tables {sorted(found)} but no "
                                         "schema_version: it is not a tgx benchmark store")
                    q.migrate(conn, 0)
                elif version > SCHEMA_VERSION:
                    raise StoreVersionError(self.url, version)
                elif version < SCHEMA_VERSION:
                    q.migrate(conn, version)
                    self.migrated_from = version

    def _check_writable(self) -> None:
        if self._sqlite:
            problem = read_only_reason(self.path)
            if problem:
                raise StoreError(f"benchmark store {self.path} cannot be written: {problem}")

    # ------------------------------------------------------------ the cache

    def _reset_cache(self) -> None:
        self._gen = -1  # the generation the cache holds
        self._last_trace = 0  # the largest trace id read
        self._id_of: dict[str, dict[str, int]] = {t: {} for t in q.PARENTS}
        self._key_of: dict[str, dict[int, str]] = {t: {} for t in q.PARENTS}
        self._idx = StoreIndex({})

    @staticmethod
    def _meta_generation(conn: sa.Connection) -> int:
        return conn.execute(sa.select(q.store_meta.c.generation)).scalar_one()

    def _load(self, conn: sa.Connection, gen: int) -> None:
        """Read what changed since the cached generation, up to `gen`, in `conn`'s
        snapshot (or, inside a write transaction, after the generation lock)."""
        full = self._gen < 0
        fresh: dict[str, list[dict]] = {}
        for table in q.PARENTS:
            t = q.SQL_TABLES[table]
            rows = conn.execute(sa.select(t).where(t.c.gen > self._gen).order_by(t.c.id))
            keys, ids, recs = self._key_of[table], self._id_of[table], []
            for row in rows.mappings():
                key = row[q.KEY_COLUMN[table]]
                keys[row["id"]], ids[key] = key, row["id"]
                if row["recorded"]:
                    recs.append(q.row_to_record(table, row, self._key_of))
            fresh[table] = recs
        rows = self._trace_rows(conn)
        traces = q.trace_records((r[1:] for r in rows), self._key_of)
        last = rows[-1][0] if rows else self._last_trace
        p = q.pending
        pend = [(row["id"], q.row_to_record(PENDING, row, self._key_of))
                for row in conn.execute(sa.select(p).order_by(p.c.id)).mappings()]
        if full:
            fresh[TRACES] = traces
            self._idx = StoreIndex(fresh, pend)
        else:
            for table in q.PARENTS:
                for rec in fresh[table]:
                    self._idx.add(table, rec)
            for rec in traces:
                self._idx.add(TRACES, rec)
            self._idx.pending = {r["key"]: (i, r) for i, r in pend}
        self._last_trace = last
        self._gen = gen

    def _trace_rows(self, conn: sa.Connection) -> list[tuple]:
        """``(id, *TRACE_COLUMNS)`` of the traces after the last one read, through the
        driver's own cursor: SQLAlchemy's per-row result processing was a third of opening a
        100k-trace store. `extra` comes back as JSON text (SQLite) or parsed (psycopg)."""
        t = q.benchmark_traces
        stmt = (sa.select(t.c.id, *(t.c[c] for c in q.TRACE_COLUMNS))
                .where(t.c.id > sa.bindparam("last")).order_by(t.c.id))
        compiled = stmt.compile(dialect=self._sa.dialect)
        params = compiled.construct_params({"last": self._last_trace})
        if compiled.positiontup:
            params = tuple(params[name] for name in compiled.positiontup)
        cur = conn.connection.dbapi_connection.cursor()
        try:
            cur.execute(str(compiled), params)
            rows = cur.fetchall()
        finally:
            cur.close()
        return [r if not isinstance(r[-1], str) else (*r[:-1], json.loads(r[-1]))
                for r in rows]

    def _read(self) -> StoreIndex:
        if self._closed:
            raise StoreError(f"benchmark store {self.url} is closed")
        now = time.monotonic()
        if now - self._checked < self.refresh_s or now < self._retry_at:
            return self._idx
        try:
            if self._current_generation() != self._gen:
                with self._reading() as conn:
                    self._load(conn, self._meta_generation(conn))
            self._checked = now
        except (StoreError, OSError) as err:
            if not self.best_effort or self._closed:
                raise
            self._give_up_writing(err, "re-read")  # plan on what was read before
            # a server that is down may take a connect timeout per try: not on every query
            self._retry_at = now + RETRY_AFTER_S
        return self._idx

    def _current_generation(self) -> int:
        """The database's generation, through a connection of its own in autocommit mode
        (one statement, no pool, no transaction: the cheapest check there is)."""
        try:
            if self._checker is None:
                cargs, cparams = self._sa.dialect.create_connect_args(self._sa.url)
                if self._sqlite:
                    cparams["timeout"] = self.lock_timeout
                else:
                    cparams.setdefault("connect_timeout", self._connect_timeout())
                    cparams.setdefault("application_name", "tgx")
                conn = self._sa.dialect.connect(*cargs, **cparams)
                if self._sqlite:
                    conn.isolation_level = None
                else:
                    conn.autocommit = True
                self._checker = conn
            cur = self._checker.cursor()
            try:
                cur.execute("SELECT generation FROM store_meta")
                return cur.fetchone()[0]
            finally:
                cur.close()
        except Exception as err:  # noqa: BLE001 - any driver error: drop the connection
            checker, self._checker = self._checker, None
            if checker is not None:
                with contextlib.suppress(Exception):
                    checker.close()
            raise self._error(err, "a read") from None

    @contextlib.contextmanager
    def claim(self, key: str) -> Iterator[bool]:
        """See `BenchmarkStore.claim`: on PostgreSQL ``pg_try_advisory_lock`` on a hash of
        `key`, held by a connection of its own (no table, no grant: any role may)."""
        if self._sqlite:
            yield True
            return
        lock = int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big", signed=True)
        with self._errors("a claim"):
            conn = self._sa.connect().execution_options(isolation_level="AUTOCOMMIT")
        try:
            with self._errors("a claim"):
                held = conn.execute(sa.text("SELECT pg_try_advisory_lock(:k)"),
                                    {"k": lock}).scalar()
            try:
                yield bool(held)
            finally:
                if held:
                    with self._errors("releasing a claim"):
                        conn.execute(sa.text("SELECT pg_advisory_unlock(:k)"), {"k": lock})
        finally:
            conn.close()

    # ------------------------------------------------------------ writes

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[_Txn]:
        """One write transaction, generation lock first, cache caught up inside it; the
        changes reach the cache only once committed."""
        if self._closed:
            raise StoreError(f"benchmark store {self.url} is closed")
        self._check_writable()
        with self._tlock:
            with self._errors("a write"), self._sa.connect() as conn:
                with conn.execution_options(tgx_write=True).begin():
                    m = q.store_meta
                    gen = conn.execute(sa.update(m).where(m.c.id == 1)
                                       .values(generation=m.c.generation + 1)
                                       .returning(m.c.generation)).scalar_one()
                    if gen - 1 != self._gen:
                        self._load(conn, gen - 1)
                    tx = _Txn(self, conn, gen)
                    yield tx
            self._gen = gen
            self._checked = time.monotonic()
            tx.committed()

    def _put(self, tx: _Txn, table: str, rec: dict) -> None:
        """Write a parent record (filling its placeholder row, if one was made)."""
        t = q.SQL_TABLES[table]
        key = rec[q.KEY_FIELD[table]]
        row = q.record_to_row(table, rec, tx.parent_id, self._sqlite)
        row.update(recorded=True, gen=tx.gen)
        rid = self._id_of[table].get(key) or tx.new_ids[table].get(key)
        if rid is not None:
            tx.conn.execute(sa.update(t).where(t.c.id == rid).values(**row))
        else:
            rid = tx.conn.execute(sa.insert(t).values(**row).returning(t.c.id)).scalar_one()
            tx.new_ids[table][key] = rid
        tx.after.append(lambda: self._idx.add(table, rec))

    def _insert_unique(self, rows: list[tuple[str, str, str, dict]]) -> None:
        with self._transaction() as tx:
            for table, _, key, rec in rows:
                if key not in self._idx.keys(table):  # another process may have added it
                    self._put(tx, table, rec)

    def _insert_traces(self, records: list[dict]) -> list[int]:
        with self._transaction() as tx:
            ids = self._insert_rows(tx, TRACES, records)

            def apply() -> None:
                for rec in records:
                    self._idx.add(TRACES, rec)
                self._last_trace = max(self._last_trace, *ids)
            tx.after.append(apply)
        return ids

    def _insert_rows(self, tx: _Txn, table: str, records: list[dict]) -> list[int]:
        t = q.SQL_TABLES[table]
        ids: list[int] = []
        for start in range(0, len(records), _CHUNK):
            rows = [q.record_to_row(table, r, tx.parent_id, self._sqlite)
                    for r in records[start:start + _CHUNK]]
            if table in q.PARENTS or table == PENDING:
                for row in rows:
                    row["gen"] = tx.gen
                    if table in q.PARENTS:
                        row["recorded"] = True
            ids += tx.conn.execute(
                sa.insert(t).returning(t.c.id, sort_by_parameter_order=True), rows
            ).scalars().all()
        return ids

    def _add_pending(self, fresh: dict[str, dict]) -> int:
        with self._transaction() as tx:
            new = [r for k, r in fresh.items() if k not in self._idx.pending]
            ids = self._insert_rows(tx, PENDING, new) if new else []
            for rec in self._flagged_graphs(new, self._idx.graphs).values():
                self._put(tx, GRAPHS, rec)

            def apply() -> None:
                for i, rec in zip(ids, new):
                    self._idx.add_pending(i, rec)
            tx.after.append(apply)
            return len(new)

    def _clear_pending(self, keys: list[str]) -> int:
        with self._transaction() as tx:
            gone = [k for k in keys if k in self._idx.pending]
            if gone:
                tx.conn.execute(sa.delete(q.pending).where(q.pending.c.pending_key.in_(gone)))

            def apply() -> None:
                for k in gone:
                    self._idx.pending.pop(k, None)
            tx.after.append(apply)
            return len(gone)

    def load_records(self, tables: Mapping[str, Any]) -> dict[str, int]:
        tables = self._check_loadable(tables)
        with self._transaction() as tx:
            if any(self._id_of[t] for t in q.PARENTS) or self._idx.traces or self._idx.pending:
                n = sum(len(v) for v in self._id_of.values()) + len(self._idx.traces)
                raise StoreError(f"benchmark store {self.url} is not empty ({n} records); "
                                 "records are copied only into an empty store")
            for table in q.PARENTS:
                ids = self._insert_rows(tx, table, tables[table])
                for rec, rid in zip(tables[table], ids):
                    tx.new_ids[table][rec[q.KEY_FIELD[table]]] = rid
            self._insert_rows(tx, TRACES, tables[TRACES])
            self._insert_rows(tx, PENDING, tables[PENDING])
            tx.after.append(self._reload)
        return {t: len(tables[t]) for t in ALL_TABLES}

    load_records.__doc__ = BenchmarkStore.load_records.__doc__

    def _reload(self) -> None:
        self._reset_cache()
        with self._reading() as conn:
            self._load(conn, self._meta_generation(conn))

    # ------------------------------------------------------------ whole store

    def stats(self) -> dict:
        """Counts per table and per trace status, plus URL, size and schema version.

        Example (``st`` an open store)::

            st.stats()["counts"]["traces"]  # -> 1
        """
        with self._tlock:
            idx = self._read()
            return {"path": self.path, "engine": self.engine, "url": self.url,
                    "schema_version": self.schema_version, "generation": self._gen,
                    "size_bytes": self._size(), **self._counts(idx)}

    def _size(self) -> int | None:
        if self._sqlite:
            return sum(os.path.getsize(self.path + s) for s in ("", "-wal")
                       if os.path.exists(self.path + s))
        try:
            with self._reading() as conn:
                return conn.execute(sa.text("SELECT pg_database_size(current_database())")
                                    ).scalar()
        except StoreError:
            return None

    def export(self, path: str | os.PathLike) -> str:
        """Write a consistent copy of the whole store to `path` as a TinyDB JSON file (the
        format in docs/store.md), which ``BenchmarkStore(path)`` opens.

        Example (``st`` an open store)::

            st.export("/tmp/backup.json")  # -> '/tmp/backup.json'
        """
        path = os.path.abspath(os.fspath(path))
        if self._sqlite and path == self.path:
            raise StoreError(f"cannot export the store {self.path} onto itself")
        with self._tlock:
            tables = self.dump_records()
            doc: dict[str, dict] = {t: {str(i): r for i, r in enumerate(tables[t], 1)}
                                    for t in ALL_TABLES}
            doc[META] = {META_ID: {"schema_version": SCHEMA_VERSION,
                                   "generation": self._gen, "created": time.time(),
                                   "exported_from": self.url}}
            atomic_write_json(path, doc)
        return path

    def close(self) -> None:
        """Close the connections and drop the cache; later calls raise `StoreError`.
        Idempotent."""
        with self._tlock:
            if not self._closed:
                self._closed = True
                self._dispose()
                self._idx = None


def _sqlite_begin(conn: sa.Connection) -> None:
    # BEGIN IMMEDIATE takes the write lock up front: two writers that both began reading
    # would otherwise deadlock on upgrading (SQLITE_BUSY without waiting).
    mode = "IMMEDIATE" if conn.get_execution_options().get("tgx_write") else "DEFERRED"
    conn.exec_driver_sql(f"BEGIN {mode}")


STORE_CLASS = SQLStore
__all__ = ["DEFAULT_REFRESH_S", "STORE_CLASS", "SQLStore", "StoreLockedError"]
