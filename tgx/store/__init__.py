"""The benchmark store: measured traces of graph implementations, safe for many writers.

``BenchmarkStore(target)`` opens a TinyDB file (a path), SQLite (``sqlite:///…``) or
PostgreSQL (``postgresql://…``); see docs/store.md.

>>> from tgx.store import BenchmarkStore, sniff_environment
"""

from tgx.store.base import BenchmarkStore, as_store
from tgx.store.db import TinyDBStore, atomic_write_json, move_aside, read_only_reason
from tgx.store.url import default_store_path, parse_target, redact, store_disabled
from tgx.store.guard import open_for_planning
from tgx.store.environment import environment_id, format_environment, sniff_environment
from tgx.store.schema import (
    SCHEMA_VERSION,
    TABLES,
    CorruptStoreError,
    ImplKind,
    Status,
    StoreError,
    StoreVersionError,
    StoreWarning,
)

__all__ = [
    "SCHEMA_VERSION", "TABLES", "BenchmarkStore", "CorruptStoreError", "ImplKind", "Status",
    "StoreError", "StoreVersionError", "StoreWarning", "TinyDBStore", "as_store",
    "atomic_write_json", "default_store_path", "environment_id", "format_environment",
    "move_aside", "open_for_planning", "parse_target", "read_only_reason", "redact",
    "sniff_environment", "store_disabled",
]
