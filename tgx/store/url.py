"""Where a benchmark store lives: a file path or a URL whose scheme names the engine.

===============================  ===========================================================
``/path/store.json``             TinyDB, one JSON file (a bare path: the default engine)
``tinydb:///rel.json``           TinyDB; three slashes: a relative path, four: absolute
``sqlite:////abs/store.db``      SQLite through SQLAlchemy (same slash rule)
``postgresql://user@host/db``    PostgreSQL through SQLAlchemy and psycopg 3
===============================  ===========================================================

Credentials: the password may be in the URL, in a libpq service or password file
(``?service=NAME``, ``~/.pg_service.conf``, ``~/.pgpass``) or in the environment
(``PGPASSWORD``); `redact` removes it from everything tgx prints or records.

>>> parse_target("sqlite:////tmp/s.db").engine, parse_target("/tmp/s.json").engine
('sqlite', 'tinydb')
>>> redact("postgresql://bench:s3cret@db.lab/tgx?sslmode=require")
'postgresql://bench:***@db.lab/tgx?sslmode=require'
"""

from __future__ import annotations

import os
import re
import urllib.parse
from dataclasses import dataclass

from .schema import StoreError

#: URL scheme -> engine
SCHEMES = {"tinydb": "tinydb", "sqlite": "sqlite", "postgresql": "postgresql",
           "postgres": "postgresql", "postgresql+psycopg": "postgresql"}
ENGINES = ("tinydb", "sqlite", "postgresql")
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
#: query parameters of a URL whose values are secrets
_SECRET_PARAMS = ("password", "sslpassword", "passfile_password")


#: ``$TGX_STORE`` values (any case) that turn the default store off
OFF = ("off", "none", "0", "false", "no")


def store_disabled() -> bool:
    """Whether ``$TGX_STORE`` turns the default store off (``TGX_STORE=off``).

    >>> store_disabled() == (os.environ.get("TGX_STORE", "").strip().lower() in OFF)
    True
    """
    return os.environ.get("TGX_STORE", "").strip().lower() in OFF


def default_store_path() -> str:
    """``$TGX_STORE`` (a path, made absolute, or a store URL, as it is), else
    ``$XDG_CACHE_HOME/tgx/store.json``, else ``~/.cache/tgx/store.json``. Raises
    `StoreError` when ``TGX_STORE=off`` turned the default store off.

    >>> default_store_path().endswith(".json") or "TGX_STORE" in os.environ
    True
    """
    explicit = os.environ.get("TGX_STORE")
    if store_disabled():
        raise StoreError(f"the default benchmark store is turned off (TGX_STORE={explicit}); "
                         "give a store path, or unset TGX_STORE")
    if explicit and explicit.strip():
        if is_url(explicit):
            return explicit.strip()
        return os.path.abspath(os.path.expanduser(explicit))
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(cache, "tgx", "store.json")


@dataclass(frozen=True)
class StoreTarget:
    """A parsed store location: `engine`, `path` (file engines: absolute), the full `url`
    (with any password: never print it) and `display` (the URL without the password)."""

    engine: str
    path: str | None
    url: str

    @property
    def display(self) -> str:
        return self.path if self.engine == "tinydb" else redact(self.url)

    @property
    def password(self) -> str | None:
        """The password in the URL, if any (to scrub it from driver messages)."""
        return _password(self.url)


def is_url(target: object) -> bool:
    """Whether `target` is a string with a URL scheme (``sqlite://…``), not a path.

    >>> is_url("postgresql:///tgx"), is_url("/tmp/s.json"), is_url("C:/x.json")
    (True, False, False)
    """
    return isinstance(target, str) and _SCHEME.match(target.strip()) is not None


def _file_path(rest: str, url: str) -> str:
    # SQLAlchemy's rule: scheme:///relative, scheme:////absolute (the host part is empty)
    if not rest.partition("?")[0]:
        raise StoreError(f"store URL {redact(url)!r} names no file (in-memory stores are "
                         "not supported: every process must see the same store)")
    if not rest.startswith("/"):
        raise StoreError(f"store URL {redact(url)!r} names a host; a file store is "
                         "'scheme:///relative/path' or 'scheme:////absolute/path'")
    path = urllib.parse.unquote(rest[1:].partition("?")[0])
    if not path:
        raise StoreError(f"store URL {redact(url)!r} names no file (in-memory stores are "
                         "not supported: every process must see the same store)")
    return os.path.abspath(os.path.expanduser(path))


def parse_target(target: str | os.PathLike) -> StoreTarget:
    """The engine and location of a store path or URL; raises `StoreError` for a scheme
    tgx has no engine for."""
    text = os.fspath(target).strip() if isinstance(target, str) else os.fspath(target)
    m = _SCHEME.match(text) if isinstance(text, str) else None
    if m is None:
        path = os.path.abspath(os.path.expanduser(text))
        return StoreTarget("tinydb", path, "tinydb:///" + path)
    scheme = m.group(1).lower()
    engine = SCHEMES.get(scheme)
    if engine is None:
        raise StoreError(f"unknown benchmark store scheme {scheme!r} in {redact(text)!r}; "
                         f"use a file path or one of {', '.join(s + '://' for s in SCHEMES)}")
    rest = text[m.end():]
    if engine == "postgresql":
        return StoreTarget(engine, None, "postgresql+psycopg://" + rest)
    path = _file_path(rest, text)
    query = rest.partition("?")[2]
    return StoreTarget(engine, path, f"{engine}:///{path}" + (f"?{query}" if query else ""))


def _password(url: str) -> str | None:
    parts = urllib.parse.urlsplit(url)
    if parts.password:
        return urllib.parse.unquote(parts.password)
    for key, value in urllib.parse.parse_qsl(parts.query):
        if key in _SECRET_PARAMS:
            return value
    return None


def redact(url: str) -> str:
    """`url` with any password (in the user part or the query) replaced by ``***``.

    >>> redact("postgresql:///tgx?user=w&password=pw")
    'postgresql:///tgx?user=w&password=***'
    """
    if not is_url(url):
        return url
    parts = urllib.parse.urlsplit(url)
    netloc = parts.netloc
    if "@" in netloc:
        userinfo, _, host = netloc.rpartition("@")
        user, colon, _ = userinfo.partition(":")
        netloc = f"{user}{':***' if colon else ''}@{host}"
    query = "&".join(f"{k}=***" if urllib.parse.unquote(k) in _SECRET_PARAMS else part
                     for part in parts.query.split("&") if part
                     for k in [part.partition("=")[0]])
    scheme = "postgresql" if parts.scheme == "postgresql+psycopg" else parts.scheme
    return (f"{scheme}://{netloc}{parts.path}" + (f"?{query}" if query else "")
            + (f"#{parts.fragment}" if parts.fragment else ""))


def scrub(text: str, *secrets: str | None) -> str:
    """`text` with every secret (a password) replaced by ``***``, and any URL in it
    redacted.

    >>> scrub('connection to "db" failed for pw=hunter2', "hunter2")
    'connection to "db" failed for pw=***'
    """
    for secret in secrets:
        if secret:
            text = text.replace(secret, "***")
    return re.sub(r"[A-Za-z][A-Za-z0-9+.-]*://\S+", lambda m: redact(m.group(0)), text)
