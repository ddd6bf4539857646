"""The SQL store's schema as DDL (SQLAlchemy Core), its versioned migrations, and the mapping
between table rows and the store's records.

One `MetaData` serves SQLite and PostgreSQL. Tables, in foreign-key order:

* ``schema_version``: one row per applied migration (version, applied_at, description);
  the store's version is the largest.
* ``store_meta``: one row: ``generation``, +1 per write transaction. Every writer updates
  it first, so its row lock serialises writers and commit order is generation order: a
  process that cached generation G reloads rows with ``gen > G`` (traces: ``id >`` the last
  it read) and has everything, nothing twice.
* ``canonical_graphs``, ``implementations`` (``graph_id``: the graph it implements, where it
  is specific to one), ``environments``, ``workloads`` (keyed by graph, axes and inputs):
  each row has a ``recorded`` flag. A trace or pending flag may name a key whose record was
  never added (the profiler records traces under a function's name); the foreign key then
  points at a placeholder row (``recorded`` false) that the record fills when it comes.
  Placeholders are no records: the API, `dump_records` and counts skip them.
* ``benchmark_traces``: one measurement (status, latency median/min/spread/samples,
  speedup factor, max relative/absolute/ULP error, timestamp, log).
* ``pending``: the "fastest" policy's pending flags (schema 2).

Record fields with no column, and values whose type a column cannot hold exactly (NaN in
SQLite, an int where the file format has a float), are kept in the row's ``extra`` JSON,
so a store copied to SQL and back is equal to the original, record for record.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

from . import schema
from .schema import (
    ENVIRONMENTS,
    GRAPHS,
    IMPLEMENTATIONS,
    PENDING,
    TRACES,
    WORKLOADS,
    ImplKind,
    Status,
)

metadata = sa.MetaData()

_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")  # SQLite: a rowid alias
_FLOAT = sa.Double()
_JSON = sa.JSON(none_as_null=True)
_BYTES = sa.LargeBinary().with_variant(postgresql.BYTEA(), "postgresql")
_AUTO = {"sqlite_autoincrement": True}  # ids never reused after a delete


def _sql_list(values: Any) -> str:
    return ", ".join(f"'{v.value}'" for v in values)


def _id() -> sa.Column:
    return sa.Column("id", _ID, primary_key=True, autoincrement=True)


def _fk(name: str, target: str, nullable: bool = False) -> sa.Column:
    return sa.Column(name, _ID, sa.ForeignKey(f"{target}.id", ondelete="RESTRICT"),
                     nullable=nullable)


def _common() -> list[sa.Column]:
    return [sa.Column("recorded", sa.Boolean, nullable=False),
            sa.Column("extra", _JSON),
            sa.Column("gen", sa.BigInteger, nullable=False, index=True)]


schema_version = sa.Table(
    "schema_version", metadata,
    sa.Column("version", sa.Integer, primary_key=True, autoincrement=False),
    sa.Column("applied_at", _FLOAT, nullable=False),
    sa.Column("description", sa.Text, nullable=False))

store_meta = sa.Table(
    "store_meta", metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=False),
    sa.Column("generation", sa.BigInteger, nullable=False),
    sa.Column("created", _FLOAT, nullable=False),
    sa.CheckConstraint("id = 1", name="store_meta_one_row"))

canonical_graphs = sa.Table(
    "canonical_graphs", metadata, _id(),
    sa.Column("hash", sa.Text, nullable=False, unique=True),
    sa.Column("name", sa.Text),
    sa.Column("graph_bytes", _BYTES),
    sa.Column("equation", _JSON),
    sa.Column("created", _FLOAT),
    *_common(), **_AUTO)

implementations = sa.Table(
    "implementations", metadata, _id(),
    sa.Column("impl_key", sa.Text, nullable=False, unique=True),
    sa.Column("kind", sa.Text),
    sa.Column("name", sa.Text),
    sa.Column("backend", sa.Text),
    sa.Column("source_hash", sa.Text),
    sa.Column("requirements", _JSON),
    sa.Column("payload", _BYTES),
    _fk("graph_id", "canonical_graphs", nullable=True),
    sa.Column("created", _FLOAT),
    *_common(),
    sa.CheckConstraint(f"kind IS NULL OR kind IN ({_sql_list(ImplKind)})",
                       name="implementations_kind"),
    sa.Index("ix_implementations_kernel", "name", "backend", "source_hash"), **_AUTO)

environments = sa.Table(
    "environments", metadata, _id(),
    sa.Column("env_key", sa.Text, nullable=False, unique=True),
    sa.Column("cpu_model", sa.Text),
    sa.Column("cpu_cores", sa.Integer),
    sa.Column("memory_bytes", sa.BigInteger),
    sa.Column("gpus", _JSON),
    sa.Column("os", sa.Text),
    sa.Column("machine", sa.Text),
    sa.Column("platform", sa.Text),
    sa.Column("python", sa.Text),
    sa.Column("python_implementation", sa.Text),
    sa.Column("libraries", _JSON),
    *_common(), **_AUTO)

workloads = sa.Table(
    "workloads", metadata, _id(),
    sa.Column("workload_key", sa.Text, nullable=False, unique=True),
    _fk("graph_id", "canonical_graphs", nullable=True),
    sa.Column("axes", _JSON),
    sa.Column("inputs", _JSON),
    *_common(),
    sa.CheckConstraint("NOT recorded OR graph_id IS NOT NULL", name="workloads_graph"),
    sa.Index("ix_workloads_graph", "graph_id"), **_AUTO)

benchmark_traces = sa.Table(
    "benchmark_traces", metadata, _id(),
    _fk("graph_id", "canonical_graphs"),
    _fk("impl_id", "implementations"),
    _fk("workload_id", "workloads"),
    _fk("environment_id", "environments"),
    sa.Column("status", sa.Text, nullable=False),
    sa.Column("latency_median_s", _FLOAT),
    sa.Column("latency_min_s", _FLOAT),
    sa.Column("latency_spread", _FLOAT),
    sa.Column("latency_samples", sa.Integer),
    sa.Column("speedup_factor", _FLOAT),
    sa.Column("max_abs_err", _FLOAT),
    sa.Column("max_rel_err", _FLOAT),
    sa.Column("ulp_err", _FLOAT),
    sa.Column("timestamp", _FLOAT, nullable=False),
    sa.Column("log", sa.Text, nullable=False),
    sa.Column("extra", _JSON),
    sa.CheckConstraint(f"status IN ({_sql_list(Status)})",
                       name="benchmark_traces_status"),
    # the planner's queries: fastest PASSED per (graph, workload, env); latest per impl
    sa.Index("ix_traces_best", "graph_id", "workload_id", "environment_id", "status",
             "latency_median_s"),
    sa.Index("ix_traces_measured", "graph_id", "impl_id", "workload_id", "environment_id",
             "timestamp"),
    sa.Index("ix_traces_impl", "impl_id"),
    sa.Index("ix_traces_environment", "environment_id", "graph_id"), **_AUTO)

pending = sa.Table(
    "pending", metadata, _id(),
    sa.Column("pending_key", sa.Text, nullable=False, unique=True),
    _fk("graph_id", "canonical_graphs"),
    _fk("workload_id", "workloads"),
    _fk("impl_id", "implementations"),
    _fk("environment_id", "environments"),
    sa.Column("kernel", _JSON),
    sa.Column("equation", _JSON),
    sa.Column("graph_bytes", _BYTES),
    sa.Column("created", _FLOAT),
    sa.Column("extra", _JSON),
    sa.Column("gen", sa.BigInteger, nullable=False, index=True),
    sa.Index("ix_pending_environment", "environment_id"), **_AUTO)

#: store table -> SQL table (the parents in foreign-key order, then traces and pending)
SQL_TABLES = {GRAPHS: canonical_graphs, IMPLEMENTATIONS: implementations,
              ENVIRONMENTS: environments, WORKLOADS: workloads, TRACES: benchmark_traces,
              PENDING: pending}
PARENTS = (GRAPHS, IMPLEMENTATIONS, ENVIRONMENTS, WORKLOADS)
#: the key column of each parent table and of pending
KEY_COLUMN = {GRAPHS: "hash", IMPLEMENTATIONS: "impl_key", ENVIRONMENTS: "env_key",
              WORKLOADS: "workload_key", PENDING: "pending_key"}
#: the record field holding the key
KEY_FIELD = {GRAPHS: "hash", IMPLEMENTATIONS: "key", ENVIRONMENTS: "id",
             WORKLOADS: "key", PENDING: "key"}


# --------------------------------------------------------------------------- migrations

def _v1(conn: sa.Connection) -> None:
    for t in (store_meta, canonical_graphs, implementations, environments, workloads,
              benchmark_traces):
        t.create(conn)
    conn.execute(sa.insert(store_meta).values(id=1, generation=0, created=time.time()))


def _v2(conn: sa.Connection) -> None:
    pending.create(conn)


#: (version, what it adds, the step from the version before); a fresh store runs them all.
#: Never edit a released step: add the next one (and bump `schema.SCHEMA_VERSION`).
MIGRATIONS: tuple[tuple[int, str, Callable[[sa.Connection], None]], ...] = (
    (1, "graphs, implementations, environments, workloads, benchmark traces", _v1),
    (2, "pending flags of the fastest policy", _v2),
)
assert MIGRATIONS[-1][0] == schema.SCHEMA_VERSION


def migrate(conn: sa.Connection, current: int, target: int = schema.SCHEMA_VERSION) -> None:
    """Run the steps after `current` up to `target` in `conn`'s transaction, recording each
    in ``schema_version`` (`current` 0: a fresh database)."""
    if current == 0:
        schema_version.create(conn)
    for version, description, step in MIGRATIONS:
        if current < version <= target:
            step(conn)
            conn.execute(sa.insert(schema_version).values(
                version=version, applied_at=time.time(), description=description))


def tgx_tables() -> list[str]:
    return [t.name for t in metadata.sorted_tables]


# --------------------------------------------------------------------------- row <-> record

_MISSING = object()
_FLOAT_TAG = "$float"  # extra: {"field": {"$float": "nan"}} for what a column cannot hold


class _Field:
    """One record field stored in one column: `kind` says how (text, float, int, bool-free
    JSON, base64 bytes, a parent's key through a foreign key)."""

    def __init__(self, field: str, column: str, kind: str, *, optional: bool = False,
                 parent: str | None = None):
        self.field, self.column, self.kind = field, column, kind
        self.optional, self.parent = optional, parent


def _f(field: str, column: str | None = None, kind: str = "text", **kw: Any) -> _Field:
    return _Field(field, column or field, kind, **kw)


#: how each table's record fields map to columns; optional fields are absent from a record
#: when their column is NULL (a None value is then kept in ``extra``)
FIELDS: dict[str, tuple[_Field, ...]] = {
    GRAPHS: (_f("hash"), _f("name"), _f("graph_b64", "graph_bytes", "b64"),
             _f("created", kind="float"), _f("equation", kind="json", optional=True)),
    IMPLEMENTATIONS: (_f("key", "impl_key"), _f("kind"), _f("name"), _f("backend"),
                      _f("source_hash"), _f("requirements", kind="json"),
                      _f("payload_b64", "payload", "b64"), _f("created", kind="float"),
                      _f("graph_hash", "graph_id", "fk", optional=True, parent=GRAPHS)),
    ENVIRONMENTS: (_f("id", "env_key"),
                   *(_f(n, optional=True) for n in ("cpu_model",)),
                   _f("cpu_cores", kind="int", optional=True),
                   _f("memory_bytes", kind="int", optional=True),
                   _f("gpus", kind="json", optional=True),
                   *(_f(n, optional=True) for n in ("os", "machine", "platform", "python",
                                                    "python_implementation")),
                   _f("libraries", kind="json", optional=True)),
    WORKLOADS: (_f("key", "workload_key"), _f("graph_hash", "graph_id", "fk", parent=GRAPHS),
                _f("axes", kind="json"), _f("inputs", kind="json")),
    TRACES: (_f("graph_hash", "graph_id", "fk", parent=GRAPHS),
             _f("impl", "impl_id", "fk", parent=IMPLEMENTATIONS),
             _f("workload", "workload_id", "fk", parent=WORKLOADS),
             _f("env_id", "environment_id", "fk", parent=ENVIRONMENTS),
             _f("status"), _f("median_s", "latency_median_s", "float"),
             _f("min_s", "latency_min_s", "float"), _f("spread", "latency_spread", "float"),
             _f("samples", "latency_samples", "int"), _f("max_abs_err", kind="float"),
             _f("max_rel_err", kind="float"), _f("ulp_err", kind="float"),
             _f("speedup", "speedup_factor", "float"), _f("timestamp", kind="float"),
             _f("log")),
    PENDING: (_f("key", "pending_key"), _f("graph_hash", "graph_id", "fk", parent=GRAPHS),
              _f("workload", "workload_id", "fk", parent=WORKLOADS),
              _f("impl", "impl_id", "fk", parent=IMPLEMENTATIONS),
              _f("env_id", "environment_id", "fk", parent=ENVIRONMENTS),
              _f("kernel", kind="json"), _f("equation", kind="json"),
              _f("graph_b64", "graph_bytes", "b64"), _f("created", kind="float")),
}
_NOT_NULL = {(TRACES, "timestamp"): 0.0, (TRACES, "log"): ""}
#: the columns `trace_records` reads, in its order (the four keys first, extra last)
TRACE_COLUMNS = [f.column for f in FIELDS[TRACES]] + ["extra"]
assert [f.kind for f in FIELDS[TRACES][:4]] == ["fk"] * 4


def _fits(kind: str, value: Any, sqlite: bool) -> bool:
    """Whether `value` survives the column kind exactly (else it goes to ``extra``)."""
    if value is None:
        return True
    if kind in ("text", "fk", "b64"):
        return type(value) is str
    if kind == "float":
        return type(value) is float and (math.isfinite(value) or not sqlite)
    if kind == "int":
        return type(value) is int and -2**63 <= value < 2**63
    return kind == "json" and _json_exact(value)


def _json_exact(value: Any) -> bool:
    """JSON that PostgreSQL's json type and Python's json module agree on (no NaN)."""
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _json_exact(v) for k, v in value.items())
    if isinstance(value, list):
        return all(_json_exact(v) for v in value)
    return value is None or isinstance(value, str | int | bool)


def _tag(value: Any) -> Any:
    """A value for ``extra``: non-finite floats become ``{"$float": "nan"}`` (JSON has none)."""
    if isinstance(value, float) and not math.isfinite(value):
        return {_FLOAT_TAG: repr(value)}
    if isinstance(value, dict):
        return {k: _tag(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_tag(v) for v in value]
    return value


def _untag(value: Any) -> Any:
    if isinstance(value, dict):
        if len(value) == 1 and _FLOAT_TAG in value:
            return float(value[_FLOAT_TAG])
        return {k: _untag(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_untag(v) for v in value]
    return value


def record_to_row(table: str, rec: Mapping[str, Any], parent_id: Callable[[str, str], int],
                  sqlite: bool) -> dict:
    """The column values of `rec` (a record of store table `table`); `parent_id(table, key)`
    gives (or creates) the id of a parent row."""
    row: dict[str, Any] = {}
    extra: dict[str, Any] = {}
    known = set()
    for f in FIELDS[table]:
        known.add(f.field)
        value = rec.get(f.field, _MISSING)
        if value is _MISSING:
            if not f.optional:
                extra[f.field] = {"$absent": True}
            row[f.column] = None
            continue
        if f.optional and value is None:
            extra[f.field] = None
            row[f.column] = None
            continue
        if not _fits(f.kind, value, sqlite):
            extra[f.field] = _tag(value)
            value = None
        if value is None:
            row[f.column] = None
        elif f.kind == "fk":
            row[f.column] = parent_id(f.parent, value)
        elif f.kind == "b64":
            row[f.column] = schema.b64decode(value)
        else:
            row[f.column] = value
    for k, v in rec.items():
        if k not in known:
            extra[k] = _tag(v)
    for (t, col), default in _NOT_NULL.items():
        if t == table and row.get(col) is None:
            row[col] = default  # the real value, if any, is in extra
    fk_missing = [f for f in FIELDS[table] if f.kind == "fk" and not f.optional
                  and row[f.column] is None]
    for f in fk_missing:  # a required key that is no string: keep it, point at its text
        row[f.column] = parent_id(f.parent, str(rec.get(f.field)))
    row["extra"] = extra or None
    return row


def row_to_record(table: str, row: Mapping[str, Any], key_of: Mapping[str, Mapping[int, str]]
                  ) -> dict:
    """The record a row holds (`key_of[parent][id]`: the key of a parent row)."""
    rec: dict[str, Any] = {}
    for f in FIELDS[table]:
        value = row[f.column]
        if value is None:
            if f.optional:
                continue
            rec[f.field] = None
        elif f.kind == "fk":
            rec[f.field] = key_of[f.parent][value]
        elif f.kind == "b64":
            rec[f.field] = schema.b64encode(bytes(value))
        else:
            rec[f.field] = value
    extra = row["extra"]
    if extra:
        for k, v in extra.items():
            if isinstance(v, dict) and v.get("$absent") is True and len(v) == 1:
                rec.pop(k, None)
            else:
                rec[k] = _untag(v)
    return rec


def trace_records(rows: Any, key_of: Mapping[str, Mapping[int, str]]) -> list[dict]:
    """`row_to_record` for many ``benchmark_traces`` rows selected as `TRACE_COLUMNS` (the
    planner's store has 100k of them: this is the bulk of opening one)."""
    fields = FIELDS[TRACES]
    names = [f.field for f in fields]
    graphs, impls = key_of[GRAPHS], key_of[IMPLEMENTATIONS]
    workloads, envs = key_of[WORKLOADS], key_of[ENVIRONMENTS]
    out = []
    for row in rows:
        rec = dict(zip(names, row))
        rec["graph_hash"], rec["impl"] = graphs[row[0]], impls[row[1]]
        rec["workload"], rec["env_id"] = workloads[row[2]], envs[row[3]]
        extra = row[-1]
        if extra:
            for k, v in extra.items():
                if isinstance(v, dict) and v.get("$absent") is True and len(v) == 1:
                    rec.pop(k, None)
                else:
                    rec[k] = _untag(v)
        out.append(rec)
    return out


def placeholder_row(table: str, key: str, gen: int) -> dict:
    """A row for a key named before its record (``recorded`` false)."""
    row = {c.name: None for c in SQL_TABLES[table].columns if c.name != "id"}
    row.update({KEY_COLUMN[table]: key, "recorded": False, "gen": gen})
    return row


def column_names(table: str) -> list[str]:
    return [c.name for c in SQL_TABLES[table].columns]
