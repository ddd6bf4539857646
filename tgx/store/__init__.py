"""The benchmark store: measured traces of graph implementations, safe for many writers.

>>> from tgx.store import BenchmarkStore, sniff_environment
"""

from tgx.store.db import (
    BenchmarkStore,
    as_store,
    atomic_write_json,
    default_store_path,
    move_aside,
)
from tgx.store.environment import environment_id, format_environment, sniff_environment
from tgx.store.schema import (
    SCHEMA_VERSION,
    TABLES,
    CorruptStoreError,
    ImplKind,
    Status,
    StoreError,
    StoreVersionError,
)

__all__ = [
    "SCHEMA_VERSION", "TABLES", "BenchmarkStore", "CorruptStoreError", "ImplKind", "Status",
    "StoreError", "StoreVersionError", "as_store", "atomic_write_json", "default_store_path",
    "environment_id", "format_environment", "move_aside", "sniff_environment",
]
