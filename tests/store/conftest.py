"""Fixtures for the store tests: a real PostgreSQL server, and `store_url`, a fresh store of
each engine (tinydb, sqlite, postgresql).

The server (`tests.store.pgserver`): ``initdb`` into a temporary directory, ``pg_ctl start``
on a Unix socket only, one per test session (per xdist worker), stopped at the end; under
root it runs as an unprivileged user. Each test that needs PostgreSQL gets a database of its
own. The superuser ``tgx`` connects without a password; every other role must give its
password, which the credential tests use. Without the PostgreSQL binaries (or the sql
extra), the postgresql cases are skipped with the reason.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.store.pgserver import PostgresServer, find_bin_dir


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    bin_dir = find_bin_dir()
    if bin_dir is None:
        pytest.skip("PostgreSQL binaries (initdb, pg_ctl, postgres) not found on PATH, in "
                    "/usr/local/bin or /usr/lib/postgresql/*/bin")
    try:
        import psycopg  # noqa: F401
        import sqlalchemy  # noqa: F401
    except ImportError as err:
        pytest.skip(f"the sql extra is not installed ({err}): pip install -e '.[sql]'")
    server = PostgresServer(bin_dir)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def pg_url(postgres_server: PostgresServer) -> Iterator[str]:
    """The URL of a new, empty PostgreSQL database (dropped after the test)."""
    name = postgres_server.create_db()
    yield postgres_server.url(name)
    postgres_server.drop_db(name)


ENGINES = ("tinydb", "sqlite", "postgresql")


@pytest.fixture(params=ENGINES)
def store_url(request, tmp_path) -> str:
    """A URL for a fresh store of each engine."""
    if request.param == "tinydb":
        return f"tinydb:///{tmp_path}/store.json"
    if request.param == "sqlite":
        pytest.importorskip("sqlalchemy", reason="the sql extra is not installed")
        return f"sqlite:///{tmp_path}/store.db"
    return request.getfixturevalue("pg_url")
