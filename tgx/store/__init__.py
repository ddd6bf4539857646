"""The benchmark store: measured traces of graph implementations, safe for many writers.

>>> from tgx.store import BenchmarkStore, sniff_environment
"""

from tgx.store.db import (
    BenchmarkStore,
    as_store,
    atomic_write_json,
    default_store_path,
    move_aside,
    read_only_reason,
    store_disabled,
)
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
    "StoreError", "StoreVersionError", "StoreWarning", "as_store", "atomic_write_json",
    "default_store_path", "environment_id", "format_environment", "move_aside",
    "open_for_planning", "read_only_reason", "sniff_environment", "store_disabled",
]
