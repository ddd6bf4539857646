"""The store `tgx.compile` plans with: a broken store never breaks a compile.

`open_for_planning(store)` turns the ``store=`` option into an open store, or into None with
one reason. A default (or given) store that is corrupt, held locked by another process,
read-only, or of another schema version is not used: one `StoreWarning` names the file, the
problem and the fix, the file is left as it is, and the pipeline falls back to the heuristic
policy (`tgx.pipeline.select`). ``store=False`` or ``TGX_STORE=off`` plan without a store
and without a warning.

>>> import os, tempfile
>>> path = os.path.join(tempfile.mkdtemp(), "s.json")
>>> with open(path, "w") as f:
...     _ = f.write("{not json")
>>> import warnings
>>> with warnings.catch_warnings(record=True) as w:
...     warnings.simplefilter("always")
...     store, why = open_for_planning(path)
>>> store is None, "invalid JSON" in why, open(path).read()
(True, True, '{not json')
>>> "tgx store recover" in str(w[0].message)
True
"""

from __future__ import annotations

import threading
import warnings
from typing import Any

from .base import BenchmarkStore
from .db import read_only_reason
from .url import OFF, default_store_path, parse_target, redact, store_disabled
from .schema import SCHEMA_VERSION, CorruptStoreError, StoreError, StoreVersionError, StoreWarning

#: seconds a compile waits for a store lock held by another process before planning without
#: the store (writers hold it for milliseconds; a profiler batch of a large store ~1 s)
LOCK_TIMEOUT_S = 5.0

_warned: set[tuple[str, str]] = set()  # (path, problem): warn once per process
#: SQL stores compile opened, by URL: one per process, its cache refreshed incrementally
#: (opening a 100k-trace store reads every row; a refresh reads what changed)
_OPEN: dict[str, BenchmarkStore] = {}
_open_lock = threading.Lock()
_warned_lock = threading.Lock()


def open_for_planning(store: Any) -> tuple[BenchmarkStore | None, str | None]:
    """``(store, None)`` to plan with; ``(None, None)`` without a store, as asked
    (``store=False``, ``store="off"``, or ``store=None`` under ``TGX_STORE=off``); or
    ``(None, why)`` when the store cannot be used, after one `StoreWarning` (per path and
    problem, per process) that names the path and the fix. `store`: a `BenchmarkStore`
    (used as it is), a path or URL, or None (`default_store_path()`). A URL is named without
    its password. An SQLite or PostgreSQL store is opened once per process and URL and
    reused by later compiles (its cache refreshed, not reloaded)."""
    if isinstance(store, BenchmarkStore):
        return store, None
    if store is False or (isinstance(store, str) and store.strip().lower() in OFF):
        return None, None
    if store is None and store_disabled():
        return None, None
    try:
        target = parse_target(store if store else default_store_path())
    except StoreError as err:
        where = redact(str(store)) if store else "$TGX_STORE"
        _warn_once(where, str(err), "give a file path or a tinydb://, sqlite:// or "
                                    "postgresql:// URL")
        return None, f"benchmark store {where} not used: {err}"
    path = target.display
    problem = read_only_reason(target.path) if target.path else None
    if problem is None:
        try:
            if target.engine != "tinydb":  # kept open: later compiles refresh, not reload
                with _open_lock:
                    store = _OPEN.get(target.url)
                    if store is None or store._closed:
                        store = _OPEN[target.url] = BenchmarkStore(
                            target, lock_timeout=LOCK_TIMEOUT_S, best_effort=True)
                return store, None
            return BenchmarkStore(target, lock_timeout=LOCK_TIMEOUT_S, best_effort=True), None
        except (StoreError, OSError) as err:
            problem, fix = _diagnose(err, path, target.engine)
    else:
        fix = (f"make it writable (chmod u+w {path} and its directory), or set TGX_STORE to "
               "a writable path")
    _warn_once(path, problem, fix)
    return None, f"benchmark store {path} not used: {problem}"


def _diagnose(err: BaseException, path: str, engine: str = "tinydb") -> tuple[str, str]:
    """(what is wrong, how to fix it) for an error opening the store at `path`."""
    if isinstance(err, CorruptStoreError) and engine == "sqlite":
        return (f"the file is corrupt ({err.reason})",
                f"open it once with tgx.BenchmarkStore('sqlite:///{path}', recover=True) (it "
                f"moves the file aside to {path}.corrupt-<time> and starts an empty store)")
    if isinstance(err, CorruptStoreError):
        return (f"the file is corrupt ({err.reason})",
                f"run `tgx store recover --store {path}` (it moves the file aside to "
                f"{path}.corrupt-<time> and starts an empty store)")
    if isinstance(err, StoreVersionError):
        if err.newer:
            return (f"a newer tgx wrote it (schema_version {err.version}, this tgx reads "
                    f"{SCHEMA_VERSION})",
                    "upgrade tgx (pip install -U tgx-trace), or set TGX_STORE to another file")
        return (f"its schema_version {err.version} is older than this tgx can migrate",
                "set TGX_STORE to another file (the old one stays as it is)")
    if engine != "tinydb" and isinstance(err, TimeoutError):
        return (f"another writer held it for over {LOCK_TIMEOUT_S:g} s",
                "let that process finish, or set TGX_STORE to another store")
    if engine == "postgresql":
        return (str(err).partition(": ")[2] or str(err),
                "check the URL, that the server is up, and the credentials (a ~/.pgpass or "
                "service file, PGPASSWORD; see docs/store.md), or set TGX_STORE to another "
                "store")
    if isinstance(err, TimeoutError):  # filelock.Timeout
        return (f"another process has held its lock {path}.lock for over {LOCK_TIMEOUT_S:g} s",
                "let that process (a `tgx profile` or `policy=\"explore\"` run?) finish, or "
                "set TGX_STORE to another file")
    if isinstance(err, OSError):
        return (f"it cannot be opened ({err.strerror or err})",
                "check the path and its permissions, or set TGX_STORE to another file")
    return str(err), "set TGX_STORE to another file"


def _warn_once(path: str, problem: str, fix: str) -> None:
    with _warned_lock:
        if (path, problem) in _warned:
            return
        _warned.add((path, problem))
    warnings.warn(f"benchmark store {path} not used: {problem}. Fix: {fix}. Until then "
                  "tgx.compile plans with the heuristic policy; the file is left as it is "
                  "(TGX_STORE=off plans without a store and without this warning).",
                  StoreWarning, stacklevel=3)
