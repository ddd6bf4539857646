"""A shared store is written by others: its rows never make tgx import or run code, and its
credentials never appear in messages, logs, records or output. The least-privilege role
of docs/store.md works as the page says, on a real PostgreSQL server."""

from __future__ import annotations

import json
import logging
import os
import pathlib
import re
import sys

import numpy as np
import pytest

from tgx.cli import main
from tgx.profiling import profile_many
from tgx.profiling.pending import flagged_jobs, pending_jobs, refused_record
from tgx.profiling.runner import REFUSED, profile, store_specs
from tgx.store import BenchmarkStore, StoreError, schema

DOC = pathlib.Path(__file__).resolve().parents[2] / "docs" / "store.md"


@pytest.fixture
def canary(tmp_path, monkeypatch):
    """A module whose import, and a function whose call, leave a mark; and os.system
    replaced by a recorder. A store row naming any of them must leave no mark."""
    marks = tmp_path / "marks"
    marks.mkdir()
    evil = tmp_path / "evil_tgx_canary.py"
    evil.write_text(f"import pathlib\npathlib.Path({str(marks / 'imported')!r}).touch()\n"
                    f"def run(*a):\n    pathlib.Path({str(marks / 'ran')!r}).touch()\n"
                    "    return a[0]\n")
    calls = []
    monkeypatch.setattr(os, "system", lambda *a: calls.append(a) or 0)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield {"file": f"{evil}:run", "module": "evil_tgx_canary:run", "marks": marks,
           "calls": calls}
    assert "evil_tgx_canary" not in sys.modules
    assert list(marks.iterdir()) == [] and calls == []


def _plant(st: BenchmarkStore, specs: dict) -> str:
    """Implementation rows whose requirements name code, the old `entry` convention."""
    w = st.add_workload("g-evil", {"N": 4}, [((4,), "float32")])
    for name, (entry, golden) in specs.items():
        st.add_implementation("KERNEL", name, "numpy", "h", requirements={
            "pending": True, "entry": entry, "golden": golden, "graph_hash": "g-evil",
            "workloads": [w]})
    return w


def test_a_planted_row_never_imports_or_runs_code(store_url, canary):
    st = BenchmarkStore(store_url)
    _plant(st, {"sys": ("os:system", None), "file": (canary["file"], "numpy:negative"),
                "module": ("numpy:negative", canary["module"]),
                "both": (canary["module"], "os:system")})
    jobs = pending_jobs(st, "env-test")
    # jobs are data: no function, no spec to resolve, only what to refuse
    assert len(jobs) == 4 and all("fn" not in j and "golden" not in j for j in jobs)
    recs = [refused_record(j, "env-test") for j in jobs]
    st.add_traces(recs)
    assert [r["status"] for r in recs] == ["RUNTIME_ERROR"] * 4
    assert all(r["log"].startswith(REFUSED) and "Nothing was imported or run" in r["log"]
               for r in recs)
    assert "'os:system'" in recs[0]["log"]
    # recorded as refused: the next sweep does not try again
    assert {t["log"].partition(" ")[0] for t in st.traces()} == {REFUSED}
    assert pending_jobs(st, "env-test") == []


def test_refused_also_in_a_child_process_and_through_the_cli(tmp_path, canary, monkeypatch,
                                                             capsys):
    url = f"sqlite:///{tmp_path}/s.db"
    with BenchmarkStore(url) as st:
        _plant(st, {"sys": ("os:system", None), "file": (canary["file"], None)})
        recs = [refused_record(j, "env-a") for j in pending_jobs(st, "env-a")]
        assert [r["log"][:len(REFUSED)] for r in recs] == [REFUSED] * 2
        # a spec the store holds, given as a job: refused too, also for a child process
        recs = profile_many([("os:system", (np.zeros(4, np.float32),))], store=st,
                            progress=False, isolate=True, timeout_s=5)
        assert recs[0]["log"].startswith(REFUSED)
        rec = profile("os:system", (np.zeros(4, np.float32),), store=st, graph_hash="g")
        assert rec["log"].startswith(REFUSED)
    monkeypatch.setenv("TGX_STORE", url)
    assert main(["profile", "--pending", "--no-progress"]) == 1  # this machine's env: again
    err = capsys.readouterr().err
    assert "RUNTIME_ERROR: refused: the benchmark store named code" in err, err
    assert main(["profile", "--pending", "--no-progress"]) == 0  # recorded: nothing left
    assert "nothing to profile" in capsys.readouterr().out


def test_specs_the_user_gives_still_run(tmp_path):
    with BenchmarkStore(tmp_path / "s.json") as st:
        _plant(st, {"k": ("numpy:negative", None)})
        assert "numpy:negative" in store_specs(st)
        # the user's own job, naming other code: runs
        [rec] = profile_many([("numpy:positive", (np.ones(4, np.float32),),
                               {"golden": np.positive})], store=st, progress=False,
                             budget_s=0.01)
        assert rec["status"] == "PASSED"


def test_pending_flags_run_only_kernels_of_the_local_registry(tmp_path, canary):
    st = BenchmarkStore(tmp_path / "s.json")
    eq = {"primitive": "neg", "params": {}, "inputs": [[[4], "float32"]]}
    flags = [  # a kernel no registry has, one on a made-up backend, one with another source
        schema.make_pending("g", "w", "k1", "env-x", {"name": canary["module"],
                            "backend": "numpy", "variant": "", "label": "x"}, eq),
        schema.make_pending("g", "w", "k2", "env-x", {"name": "system", "backend": "os",
                            "variant": "", "label": "system"}, eq),
        schema.make_pending("g", "w", "neg@numpy#000000000000", "env-x",
                            {"name": "neg", "backend": "numpy", "variant": "",
                             "label": "neg"}, eq)]
    st.add_pending(flags)
    jobs, keys = flagged_jobs(st, "env-x")
    assert jobs == [] and sorted(keys) == sorted(f["key"] for f in flags)  # stale, cleared


# --------------------------------------------------------------------------- credentials


def _role(server, name: str, password: str, db: str) -> None:
    server.sql(f"CREATE ROLE {name} LOGIN PASSWORD '{password}'",
               f"GRANT ALL ON DATABASE {db} TO {name}",
               f"ALTER DATABASE {db} OWNER TO {name}")


@pytest.fixture
def owner(postgres_server, pg_url):
    """(server, database, role, password): a database owned by a role with a password."""
    db = pg_url.split("/")[3].split("?")[0]
    role, pw = f"own_{db}", f"Pw-{db}-9x!"
    _role(postgres_server, role, pw, db)
    return postgres_server, db, role, pw


def test_credentials_from_the_url_a_password_file_a_service_file_or_the_environment(
        owner, tmp_path, monkeypatch, caplog):
    server, db, role, pw = owner
    caplog.set_level(logging.DEBUG)
    logging.getLogger("sqlalchemy").setLevel(logging.DEBUG)
    quoted = pw.replace("!", "%21")
    with BenchmarkStore(server.url(db, role, quoted)) as st:
        st.add_trace(graph_hash="g", impl="k", workload="w", env_id=st.environment_id(),
                     status="PASSED", median_s=1.0)
        shown = [st.url, st.path, repr(st), json.dumps(st.stats()),
                 json.dumps(st.dump_records())]
        assert st.url.startswith(f"postgresql://{role}:***@")
    base = server.url(db, role)  # no password: libpq finds it
    monkeypatch.setenv("PGPASSWORD", pw)
    with BenchmarkStore(base) as st:
        assert len(st) == 1
    monkeypatch.delenv("PGPASSWORD")
    passfile = tmp_path / "pgpass"
    passfile.write_text(f"*:*:{db}:{role}:{pw}\n")
    passfile.chmod(0o600)
    monkeypatch.setenv("PGPASSFILE", str(passfile))
    with BenchmarkStore(base) as st:
        assert len(st) == 1
    monkeypatch.delenv("PGPASSFILE")
    services = tmp_path / "services"
    services.write_text(f"[tgxtest]\nhost={server.root}\nport={server.port}\ndbname={db}\n"
                        f"user={role}\npassword={pw}\n")
    monkeypatch.setenv("PGSERVICEFILE", str(services))
    with BenchmarkStore("postgresql:///?service=tgxtest") as st:
        assert len(st) == 1 and "Pw-" not in st.url
    logged = "\n".join(r.getMessage() for r in caplog.records)
    for text in shown + [logged]:
        assert pw not in text and quoted not in text


def test_a_refused_login_names_no_password(owner, monkeypatch):
    server, db, role, pw = owner
    wrong = "Wrong-Pw-42"
    with pytest.raises(StoreError) as info:
        BenchmarkStore(server.url(db, role, wrong), lock_timeout=5)
    msg = str(info.value)
    assert "password authentication failed" in msg and role in msg
    assert wrong not in msg and pw not in msg and f"{role}:***@" in msg
    assert info.value.__cause__ is None and info.value.__suppress_context__
    monkeypatch.setenv("PGPASSWORD", wrong)
    with pytest.raises(StoreError) as info:
        BenchmarkStore(server.url(db, role), lock_timeout=5)
    assert wrong not in str(info.value)


# --------------------------------------------------------------------------- roles


def _doc_sql(marker: str) -> str:
    blocks = re.findall(r"^```sql\n(.*?)^```", DOC.read_text(), re.S | re.M)
    [block] = [b for b in blocks if marker in b]
    return block


def test_the_least_privilege_worker_role_of_the_docs(postgres_server, tmp_path):
    server = postgres_server
    db = server.create_db()
    owner, worker = f"o_{db}", f"w_{db}"

    def named(sql: str) -> str:
        return (sql.replace("tgx_owner", owner).replace("tgx_worker", worker)
                .replace("DATABASE tgx", f"DATABASE {db}"))

    admin = named(_doc_sql("CREATE ROLE tgx_owner"))
    admin = admin.replace(f"CREATE DATABASE {db} OWNER {owner};",
                          f"ALTER DATABASE {db} OWNER TO {owner};")
    admin = re.sub(r"--[^\n]*", "", admin)
    server.sql(*[s for s in admin.split(";") if s.strip()])
    owner_url = server.url(db, owner, "owner-secret")
    with BenchmarkStore(owner_url) as st:  # the owner creates the schema and some records
        st.add_graph("g-owner", "recorded by the owner", b"o")
        st.add_traces([dict(graph_hash="g-placeholder", impl="k", workload="w",
                            env_id="e", status="PASSED", median_s=1.0)])
    import psycopg

    with psycopg.connect(host=server.root, port=server.port, dbname=db, user=owner,
                         password="owner-secret", autocommit=True) as conn:
        conn.execute(named(_doc_sql("GRANT CONNECT")))

    with BenchmarkStore(server.url(db, worker, "worker-secret")) as st:
        env = st.environment_id()
        w = st.add_workload("g-worker", {"N": 2}, [((2,), "float32")])
        st.add_implementation("KERNEL", "neg", "numpy", "h")
        st.add_traces([dict(graph_hash="g-worker", impl="neg", workload=w, env_id=env,
                            status="PASSED", median_s=2.0)])
        st.add_graph("g-placeholder", "filled by a worker", b"w")  # a placeholder: allowed
        st.add_pending([schema.make_pending("g-worker", w, "neg", env, {}, {})])
        assert st.clear_pending([f"g-worker|{w}|neg|{env}"]) == 1
        assert len(st) == 2 and st.get_graph("g-placeholder")["name"] == "filled by a worker"

    def as_worker(sql: str) -> int:
        with psycopg.connect(host=server.root, port=server.port, dbname=db, user=worker,
                             password="worker-secret", autocommit=True) as conn:
            return conn.execute(sql).rowcount

    for sql in ("DELETE FROM benchmark_traces", "UPDATE benchmark_traces SET log = 'x'",
                "DROP TABLE benchmark_traces", "CREATE TABLE evil (x int)",
                "DELETE FROM canonical_graphs", "UPDATE store_meta SET created = 0",
                "INSERT INTO schema_version VALUES (99, 0, 'x')"):
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            as_worker(sql)
    # a record another machine wrote: the row policy hides it from the worker's UPDATE
    assert as_worker("UPDATE canonical_graphs SET name = 'x' WHERE hash = 'g-owner'") == 0
    with BenchmarkStore(owner_url) as st:
        assert st.get_graph("g-owner")["name"] == "recorded by the owner" and len(st) == 2
    server.drop_db(db)
