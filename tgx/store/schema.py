"""The benchmark store's schema: table names, version, record constructors and validation.

Every record is a plain JSON-able dict so the file stays readable with any JSON tool.
Bytes fields are kept base64-encoded (fields ending in ``_b64``) because JSON has no bytes.
See docs/store.md for the full schema.
"""

from __future__ import annotations

import base64
import enum
import hashlib
import json
import time
from collections.abc import Iterable, Mapping
from typing import Any

from ..errors import TgxError

#: Bumped on any incompatible change of the on-disk layout; a newer file is refused.
SCHEMA_VERSION = 2
#: Versions `validate_document` migrates in memory (the next write stores the new version).
MIGRATABLE = (1,)

GRAPHS = "canonical_graphs"
IMPLEMENTATIONS = "implementations"
ENVIRONMENTS = "environments"
WORKLOADS = "workloads"
TRACES = "traces"
META = "meta"
#: Schema 2: (graph, workload, implementation, env) the "fastest" policy chose unmeasured.
PENDING = "pending"
#: The five data tables, in dependency order.
TABLES = (GRAPHS, IMPLEMENTATIONS, ENVIRONMENTS, WORKLOADS, TRACES)
#: Every table of the current schema (the data tables plus the pending flags).
ALL_TABLES = TABLES + (PENDING,)
#: The meta table holds a single record with this TinyDB document id.
META_ID = "1"


class StoreError(TgxError):
    """Base class of every error the benchmark store raises on purpose."""


class CorruptStoreError(StoreError):
    """The store file cannot be read as a store; `path` and `reason` say where and why."""

    def __init__(self, path: str, reason: str, moved_to: str | None = None):
        self.path, self.reason, self.moved_to = str(path), reason, moved_to
        where = (f"; the damaged file was moved aside to {moved_to}" if moved_to else
                 "; the file was left untouched - open with BenchmarkStore(path, recover=True) "
                 "to move it aside and start a fresh store")
        super().__init__(f"corrupt benchmark store {self.path}: {reason}{where}")


class StoreVersionError(StoreError):
    """The store file has a schema version this tgx cannot read (`version`, at `path`)."""

    def __init__(self, path: str, version: int):
        self.path, self.version = str(path), version
        self.newer = version > SCHEMA_VERSION
        super().__init__(
            f"benchmark store {self.path} has schema_version {version}, "
            f"{'newer' if self.newer else 'older'} than this tgx (schema_version "
            f"{SCHEMA_VERSION}); the file was left untouched")


class StoreWarning(UserWarning):
    """The benchmark store could not be used as asked; tgx went on without it."""


class Status(enum.StrEnum):
    """Outcome of one measurement; stored as its string value."""

    PASSED = "PASSED"
    INCORRECT_NUMERICAL = "INCORRECT_NUMERICAL"
    INCORRECT_SHAPE = "INCORRECT_SHAPE"
    RUNTIME_ERROR = "RUNTIME_ERROR"
    TIMEOUT = "TIMEOUT"


class ImplKind(enum.StrEnum):
    """What an implementation is: a single kernel or a recipe rewriting a whole graph."""

    KERNEL = "KERNEL"
    GRAPH_RECIPE = "GRAPH_RECIPE"


# --------------------------------------------------------------------------- helpers

def b64encode(data: bytes | None) -> str | None:
    """Bytes -> base64 text for JSON.

    >>> b64encode(b"\\x00\\x01")
    'AAE='
    """
    if data is None:
        return None
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise StoreError(f"expected bytes, got {type(data).__name__}")
    return base64.b64encode(bytes(data)).decode("ascii")


def b64decode(text: str | None) -> bytes | None:
    """Base64 text -> bytes (inverse of `b64encode`).

    >>> b64decode('AAE=')
    b'\\x00\\x01'
    """
    return None if text is None else base64.b64decode(text.encode("ascii"))


def short_hash(obj: Any, n: int = 16) -> str:
    """A stable hex digest of a JSON-able object (sorted keys), independent of the process.

    >>> short_hash({"b": 1, "a": 2}) == short_hash({"a": 2, "b": 1})
    True
    """
    text = json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:n]


def _enum_value(enum_cls: type[enum.Enum], value: Any, what: str) -> str:
    try:
        return enum_cls(value.value if isinstance(value, enum.Enum) else value).value
    except ValueError:
        allowed = ", ".join(m.value for m in enum_cls)
        raise StoreError(f"invalid {what} {value!r}; expected one of {allowed}") from None


def _require_str(value: Any, what: str) -> str:
    if not isinstance(value, str) or not value:
        raise StoreError(f"{what} must be a non-empty string, got {value!r}")
    return value


# --------------------------------------------------------------------------- keys

def implementation_key(kind: str, name: str, backend: str, source_hash: str) -> str:
    """The dedupe key of an implementation: ``<name>@<backend>#<hash of all four fields>``.

    >>> implementation_key("KERNEL", "matmul", "numpy", "abc")  # doctest: +ELLIPSIS
    'matmul@numpy#...'
    """
    kind = _enum_value(ImplKind, kind, "implementation kind")
    return f"{name}@{backend}#{short_hash([kind, name, backend, source_hash], 12)}"


def normalize_axes(axes: Mapping[str, int]) -> dict[str, int]:
    """Axes as a plain dict with sorted string keys and int values.

    >>> normalize_axes({"N": 128, "B": 2})
    {'B': 2, 'N': 128}
    """
    if not isinstance(axes, Mapping):
        raise StoreError(f"workload axes must be a mapping like {{'N': 128}}, got {axes!r}")
    return {str(k): int(axes[k]) for k in sorted(axes, key=str)}


def normalize_inputs(inputs: Iterable[Any]) -> list[list[Any]]:
    """Input descriptors ``[(shape, dtype), ...]`` as JSON lists ``[[[dims...], "dtype"], ...]``.

    >>> normalize_inputs([((2, 3), "float32")])
    [[[2, 3], 'float32']]
    """
    out = []
    for item in inputs or ():
        try:
            shape, dtype = item
        except (TypeError, ValueError):
            raise StoreError(f"input descriptor must be (shape, dtype), got {item!r}") from None
        out.append([[int(d) for d in shape], str(dtype)])
    return out


def workload_key(graph_hash: str, axes: Mapping[str, int], inputs: Iterable[Any]) -> str:
    """The dedupe key of a workload: readable axes plus a hash of everything.

    >>> workload_key("g1", {"N": 128}, [((128,), "float32")])  # doctest: +ELLIPSIS
    'N=128#...'
    """
    ax = normalize_axes(axes)
    ins = normalize_inputs(inputs)
    readable = ",".join(f"{k}={v}" for k, v in ax.items()) or "-"
    return f"{readable}#{short_hash([graph_hash, ax, ins], 12)}"


# --------------------------------------------------------------------------- records

def make_graph(graph_hash: str, name: str, graph_bytes: bytes | None,
               created: float | None = None, equation: Mapping[str, Any] | None = None
               ) -> dict:
    """A `canonical_graphs` record; the serialized graph is stored base64-encoded. A
    one-equation graph flagged pending is recorded without bytes but with its `equation`
    (as in `make_pending`), so its name and shapes outlive the flag.

    >>> make_graph("h", "mlp", b"\\x81")["graph_b64"]
    'gQ=='
    """
    rec = {"hash": _require_str(graph_hash, "graph hash"), "name": str(name),
           "graph_b64": b64encode(graph_bytes),
           "created": time.time() if created is None else float(created)}
    if equation is not None:
        rec["equation"] = dict(equation)
    return rec


def make_implementation(kind: str, name: str, backend: str, source_hash: str,
                        requirements: Mapping | None = None, payload: bytes | None = None
                        ) -> dict:
    """An `implementations` record (payload bytes, for graph recipes, base64-encoded).

    >>> make_implementation("KERNEL", "add", "numpy", "s1")["kind"]
    'KERNEL'
    """
    kind = _enum_value(ImplKind, kind, "implementation kind")
    for value, what in ((name, "name"), (backend, "backend"), (source_hash, "source_hash")):
        _require_str(value, f"implementation {what}")
    return {"key": implementation_key(kind, name, backend, source_hash), "kind": kind,
            "name": name, "backend": backend, "source_hash": source_hash,
            "requirements": dict(requirements or {}), "payload_b64": b64encode(payload),
            "created": time.time()}


def make_workload(graph_hash: str, axes: Mapping[str, int], inputs: Iterable[Any]) -> dict:
    """A `workloads` record: concrete axes and input descriptors of one graph.

    >>> make_workload("g", {"N": 4}, [((4,), "float32")])["axes"]
    {'N': 4}
    """
    inputs = list(inputs or ())
    return {"key": workload_key(graph_hash, axes, inputs),
            "graph_hash": _require_str(graph_hash, "graph hash"),
            "axes": normalize_axes(axes), "inputs": normalize_inputs(inputs)}


_TRACE_REQUIRED = ("graph_hash", "impl", "workload", "env_id", "status")
#: The fields every trace record has a value for.
TRACE_REQUIRED_FIELDS = _TRACE_REQUIRED
_TRACE_FLOATS = ("median_s", "min_s", "spread", "max_abs_err", "max_rel_err", "ulp_err",
                 "speedup")
#: Every field a trace record carries (missing optional ones are stored as None).
TRACE_FIELDS = _TRACE_REQUIRED + _TRACE_FLOATS + ("samples", "timestamp", "log")


def make_trace(**fields: Any) -> dict:
    """A validated `traces` record. Required: graph_hash, impl, workload, env_id, status.

    >>> t = make_trace(graph_hash="g", impl="k", workload="w", env_id="e",
    ...                status="PASSED", median_s=1e-3)
    >>> t["status"], t["median_s"], t["max_rel_err"]
    ('PASSED', 0.001, None)
    """
    unknown = set(fields) - set(TRACE_FIELDS)
    if unknown:
        raise StoreError(f"unknown trace fields {sorted(unknown)}; known: {list(TRACE_FIELDS)}")
    missing = [f for f in _TRACE_REQUIRED if fields.get(f) is None]
    if missing:
        raise StoreError(f"trace is missing required fields {missing}")
    rec: dict[str, Any] = {f: _require_str(fields[f], f) for f in _TRACE_REQUIRED[:-1]}
    rec["status"] = _enum_value(Status, fields["status"], "trace status")
    for f in _TRACE_FLOATS:
        v = fields.get(f)
        rec[f] = None if v is None else float(v)
    samples = fields.get("samples")
    rec["samples"] = None if samples is None else int(samples)
    ts = fields.get("timestamp")
    rec["timestamp"] = time.time() if ts is None else float(ts)
    log = fields.get("log")
    rec["log"] = "" if log is None else str(log)
    return rec


def empty_document() -> dict:
    """A fresh store document: the meta record plus five empty tables.

    >>> sorted(empty_document())[:2]
    ['canonical_graphs', 'environments']
    """
    doc: dict[str, dict] = {t: {} for t in ALL_TABLES}
    doc[META] = {META_ID: {"schema_version": SCHEMA_VERSION, "generation": 0,
                           "created": time.time()}}
    return doc


def validate_document(doc: Any, path: str) -> dict:
    """Check the structure of a loaded store document; return it or raise.

    Raises `CorruptStoreError` for a wrong structure and `StoreVersionError` for a
    schema version other than `SCHEMA_VERSION`. Missing data tables are added empty.

    >>> validate_document(empty_document(), "x.json")[META][META_ID]["schema_version"]
    2
    """
    if not isinstance(doc, dict):
        raise CorruptStoreError(path, f"top level is a JSON {type(doc).__name__}, not an object")
    meta = doc.get(META)
    if not isinstance(meta, dict) or not isinstance(meta.get(META_ID), dict):
        raise CorruptStoreError(path, f"missing the '{META}' record with schema_version")
    version = meta[META_ID].get("schema_version")
    if not isinstance(version, int) or isinstance(version, bool):
        raise CorruptStoreError(path, f"schema_version is {version!r}, not an integer")
    if version in MIGRATABLE:  # 1 -> 2: add the empty pending table, keep everything else
        meta[META_ID]["schema_version"] = SCHEMA_VERSION
        meta[META_ID]["migrated_from"] = version
        version = SCHEMA_VERSION
    if version != SCHEMA_VERSION:
        raise StoreVersionError(path, version)
    for name in ALL_TABLES:
        table = doc.setdefault(name, {})
        if not isinstance(table, dict):
            raise CorruptStoreError(path, f"table '{name}' is a {type(table).__name__}, "
                                          "not an object of records")
        for doc_id, rec in table.items():
            if not doc_id.isdigit() or not isinstance(rec, dict):
                raise CorruptStoreError(path, f"table '{name}' has a malformed record "
                                              f"{doc_id!r}: {str(rec)[:80]}")
    for rec in doc[TRACES].values():
        if any(rec.get(f) is None for f in _TRACE_REQUIRED):
            raise CorruptStoreError(path, f"trace record lacks a required field: {str(rec)[:120]}")
    return doc


def pending_key(graph_hash: str, workload: str, impl: str, env_id: str) -> str:
    """The dedupe key of a pending flag.

    >>> pending_key("g", "w", "k", "e")
    'g|w|k|e'
    """
    return f"{graph_hash}|{workload}|{impl}|{env_id}"


def make_pending(graph_hash: str, workload: str, impl: str, env_id: str,
                 kernel: Mapping[str, Any], equation: Mapping[str, Any],
                 graph_bytes: bytes | None = None) -> dict:
    """A pending record: what to profile (see docs/store.md, table `pending`)."""
    return {"key": pending_key(graph_hash, workload, impl, env_id), "graph_hash": graph_hash,
            "workload": workload, "impl": impl, "env_id": env_id, "kernel": dict(kernel),
            "equation": dict(equation), "graph_b64": b64encode(graph_bytes),
            "created": time.time()}
