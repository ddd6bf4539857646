"""Copy a benchmark store to another engine or place: ``tgx store migrate SRC DST``.

Every record of every table is copied as it is (keys, timestamps, bytes, fields a newer tgx
added), in one write into an empty destination, and the copy is read back and compared
with the source before the command reports success.

>>> import os, tempfile
>>> d = tempfile.mkdtemp()
>>> with BenchmarkStore(os.path.join(d, "a.json")) as a:
...     _ = a.add_graph("g", "mlp", b"\\x00")
>>> migrate_store(os.path.join(d, "a.json"), os.path.join(d, "b.json"))["canonical_graphs"]
1
"""

from __future__ import annotations

import json
import os
from typing import Any

from .base import BenchmarkStore, _target
from .schema import ALL_TABLES, StoreError


def _canonical(tables: dict) -> str:
    # NaN != NaN: compare the JSON text (Python's json writes NaN as NaN)
    return json.dumps(tables, sort_keys=True, separators=(",", ":"))


def open_existing(target: Any, **kw: Any) -> BenchmarkStore:
    """The store at `target`, refusing to create a file store that does not exist."""
    t = _target(target)
    if t.path is not None and not os.path.exists(t.path):
        raise StoreError(f"no benchmark store at {t.display}")
    return BenchmarkStore(t, **kw)


def copy_store(src: BenchmarkStore, dst: BenchmarkStore) -> dict[str, int]:
    """Copy every record of `src` into `dst` (empty); returns records per table. Raises
    `StoreError` if `dst` is not empty or the copy reads back differently."""
    records = src.dump_records()
    counts = dst.load_records(records)
    if _canonical(dst.dump_records()) != _canonical(records):
        raise StoreError(f"the copy in {dst.url} differs from {src.url} after writing it")
    return counts


def migrate_store(src: Any, dst: Any) -> dict[str, int]:
    """Copy the store at `src` (path or URL; it must exist) into the empty store at `dst`
    (created if need be); returns records per table (`schema.ALL_TABLES`)."""
    s, d = _target(src), _target(dst)
    if s.url == d.url:
        raise StoreError(f"source and destination are the same store ({s.display})")
    with open_existing(s) as source, BenchmarkStore(d) as dest:
        return copy_store(source, dest)


__all__ = ["ALL_TABLES", "copy_store", "migrate_store", "open_existing"]
