"""A throw-away PostgreSQL server for tests and benchmarks: ``initdb`` into a temporary
directory, ``pg_ctl start`` on a Unix socket only (``listen_addresses=''``), stopped and
deleted by `PostgresServer.stop`.

PostgreSQL refuses to run as root, so under root the server runs as an unprivileged user
(``postgres`` if it exists, else ``nobody``) that owns the directory. The superuser ``tgx``
connects without a password (``trust``); every other role must give its password
(``scram-sha-256``).
"""

from __future__ import annotations

import atexit
import contextlib
import glob
import itertools
import os
import pwd
import shutil
import socket
import subprocess
import tempfile

SUPERUSER = "tgx"
_BINARIES = ("initdb", "pg_ctl", "postgres")


def find_bin_dir() -> str | None:
    """The directory of initdb, pg_ctl and postgres (their real one, symlinks followed):
    from $PATH, /usr/local/bin or the newest /usr/lib/postgresql/<version>/bin; or None."""
    found = shutil.which("initdb")
    candidates = [os.path.dirname(found)] if found else []
    candidates += ["/usr/local/bin", *sorted(glob.glob("/usr/lib/postgresql/*/bin"),
                                             reverse=True)]
    for d in candidates:
        if all(os.access(os.path.join(d, b), os.X_OK) for b in _BINARIES):
            return os.path.dirname(os.path.realpath(os.path.join(d, "initdb")))
    return None


def _server_user() -> pwd.struct_passwd | None:
    """Who runs the server: None (this user) unless we are root."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        with contextlib.suppress(KeyError):
            return pwd.getpwnam(name)
    raise RuntimeError("running as root and neither a 'postgres' nor a 'nobody' user exists "
                       "to run PostgreSQL as")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PostgresServer:
    """A running throw-away PostgreSQL server on a Unix socket."""

    def __init__(self, bin_dir: str, fsync: bool = False):
        self.bin_dir = bin_dir
        self.user = _server_user()
        self.root = tempfile.mkdtemp(prefix="tgx-pg-")  # short: socket paths max ~100 chars
        self.data = os.path.join(self.root, "data")
        self.log = os.path.join(self.root, "server.log")
        self.port = _free_port()
        self._dbs = itertools.count()
        if self.user is not None:
            os.chown(self.root, self.user.pw_uid, self.user.pw_gid)
        os.chmod(self.root, 0o700)
        self._run("initdb", "-D", self.data, "-U", SUPERUSER, "-A", "trust", "--no-sync",
                  "-E", "UTF8", "--locale=C")
        with open(os.path.join(self.data, "pg_hba.conf"), "w") as f:
            f.write(f"local all {SUPERUSER} trust\nlocal all all scram-sha-256\n")
        opts = f"-p {self.port} -k {self.root} -c listen_addresses='' -c max_connections=100"
        if not fsync:  # tests: durability against power loss is not what they check
            opts += " -c fsync=off -c synchronous_commit=off -c full_page_writes=off"
        self._run("pg_ctl", "-D", self.data, "-l", self.log, "-o", opts, "-w", "-t", "60",
                  "start")
        atexit.register(self.stop)  # also when the session ends without its finalizers

    def _run(self, tool: str, *args: str) -> None:
        kw = {}
        if self.user is not None:
            kw = {"user": self.user.pw_uid, "group": self.user.pw_gid, "extra_groups": []}
        proc = subprocess.run([os.path.join(self.bin_dir, tool), *args], capture_output=True,
                              text=True, timeout=120, cwd=self.root, **kw)
        if proc.returncode != 0:
            log = ""
            with contextlib.suppress(OSError), open(self.log) as f:
                log = f.read()[-2000:]
            raise RuntimeError(f"{tool} failed ({proc.returncode}): {proc.stderr[-2000:]}\n{log}")

    def url(self, db: str = "postgres", user: str = SUPERUSER, password: str | None = None
            ) -> str:
        cred = user if password is None else f"{user}:{password}"
        return f"postgresql://{cred}@/{db}?host={self.root}&port={self.port}"

    def sql(self, *statements: str, db: str = "postgres") -> list:
        """Run statements as the superuser (autocommit); the last one's rows, if any."""
        import psycopg

        with psycopg.connect(host=self.root, port=self.port, user=SUPERUSER, dbname=db,
                             autocommit=True) as conn:
            rows: list = []
            for stmt in statements:
                cur = conn.execute(stmt)
                rows = cur.fetchall() if cur.description else []
            return rows

    def create_db(self) -> str:
        name = f"t{os.getpid()}_{next(self._dbs)}"
        self.sql(f"CREATE DATABASE {name}")
        return name

    def drop_db(self, name: str) -> None:
        with contextlib.suppress(Exception):
            self.sql(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")

    def stop(self) -> None:
        if not os.path.isdir(self.root):
            return
        with contextlib.suppress(Exception):
            self._run("pg_ctl", "-D", self.data, "-m", "immediate", "-w", "stop")
        shutil.rmtree(self.root, ignore_errors=True)
