"""One store interface, three engines: URLs, the SQL schema as real DDL, placeholders,
schema migrations, lossless copies between engines (`tgx store migrate`), the cache."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys

import pytest

from tgx.cli import main
from tgx.store import (
    SCHEMA_VERSION,
    BenchmarkStore,
    CorruptStoreError,
    StoreError,
    StoreVersionError,
    TinyDBStore,
    default_store_path,
    parse_target,
)
from tgx.store import schema

sa = pytest.importorskip("sqlalchemy", reason="the sql extra is not installed")
from tgx.store import sqlschema as q  # noqa: E402
from tgx.store.migrate import migrate_store  # noqa: E402
from tgx.store.sql import SQLStore  # noqa: E402


@pytest.fixture(params=["sqlite", "postgresql"])
def sql_url(request, tmp_path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/store.db"
    return request.getfixturevalue("pg_url")


def _trace(g="g1", impl="k1", w="w1", e="e1", status="PASSED", **kw):
    return dict(graph_hash=g, impl=impl, workload=w, env_id=e, status=status, **kw)


# --------------------------------------------------------------------------- URLs


def test_the_url_names_the_engine(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cases = {str(tmp_path / "a.json"): ("tinydb", str(tmp_path / "a.json")),
             "rel.json": ("tinydb", str(tmp_path / "rel.json")),
             "tinydb:///rel.json": ("tinydb", str(tmp_path / "rel.json")),
             f"tinydb:///{tmp_path}/abs.json": ("tinydb", str(tmp_path / "abs.json")),
             "sqlite:///rel.db": ("sqlite", str(tmp_path / "rel.db")),
             f"sqlite:///{tmp_path}/abs.db": ("sqlite", str(tmp_path / "abs.db")),
             "postgresql://u@host/db": ("postgresql", None),
             "postgres://u@host/db": ("postgresql", None)}
    for text, (engine, path) in cases.items():
        t = parse_target(text)
        assert (t.engine, t.path) == (engine, path), text
    assert isinstance(BenchmarkStore("tinydb:///rel.json"), TinyDBStore)
    st = BenchmarkStore("sqlite:///rel.db")
    assert isinstance(st, SQLStore) and isinstance(st, BenchmarkStore)
    assert st.path == str(tmp_path / "rel.db") and st.engine == "sqlite"
    assert os.path.exists(tmp_path / "rel.db")
    monkeypatch.setenv("TGX_STORE", "sqlite:///env.db")
    assert default_store_path() == "sqlite:///env.db"
    with BenchmarkStore() as env_store:
        assert env_store.engine == "sqlite" and env_store.path == str(tmp_path / "env.db")


def test_unknown_schemes_and_in_memory_stores_are_refused():
    with pytest.raises(StoreError, match="unknown benchmark store scheme 'mysql'"):
        BenchmarkStore("mysql://u:pw@h/db")
    with pytest.raises(StoreError, match="in-memory"):
        BenchmarkStore("sqlite://")
    with pytest.raises(StoreError, match="names a host"):
        BenchmarkStore("sqlite://host/x.db")


# --------------------------------------------------------------------------- the SQL schema


def test_the_sql_schema_is_ddl_with_foreign_keys_indexes_and_a_version(sql_url):
    st = BenchmarkStore(sql_url)
    g = st.add_graph("g1", "mlp", b"\x00")
    w = st.add_workload(g, {"N": 4}, [((4,), "float32")])
    st.add_trace(**_trace(g, "k1", w, "e1", median_s=1e-3))
    engine = sa.create_engine(parse_target(sql_url).url)
    insp = sa.inspect(engine)
    assert set(insp.get_table_names()) >= {
        "schema_version", "store_meta", "canonical_graphs", "implementations", "environments",
        "workloads", "benchmark_traces", "pending"}
    fks = {(fk["constrained_columns"][0], fk["referred_table"])
           for fk in insp.get_foreign_keys("benchmark_traces")}
    assert fks == {("graph_id", "canonical_graphs"), ("impl_id", "implementations"),
                   ("workload_id", "workloads"), ("environment_id", "environments")}
    assert ("graph_id", "canonical_graphs") in {
        (fk["constrained_columns"][0], fk["referred_table"])
        for fk in insp.get_foreign_keys("implementations")}
    indexes = {i["name"]: i["column_names"] for i in insp.get_indexes("benchmark_traces")}
    assert indexes["ix_traces_best"] == ["graph_id", "workload_id", "environment_id",
                                         "status", "latency_median_s"]
    cols = {c["name"] for c in insp.get_columns("benchmark_traces")}
    assert {"latency_median_s", "latency_min_s", "latency_spread", "latency_samples",
            "speedup_factor", "max_rel_err", "max_abs_err", "timestamp", "log"} <= cols
    with engine.begin() as conn:
        versions = conn.execute(sa.select(q.schema_version.c.version)).scalars().all()
        assert versions == list(range(1, SCHEMA_VERSION + 1))
        tid = conn.execute(sa.select(q.benchmark_traces.c.graph_id)).scalar_one()
    # the database itself refuses a dangling reference and an unknown status
    for bad in ({"graph_id": 999_999}, {"status": "FAST"}):
        row = dict(graph_id=tid, impl_id=1, workload_id=1, environment_id=1,
                   status="PASSED", timestamp=0.0, log="")
        row.update(bad)
        with engine.connect() as conn:
            if engine.dialect.name == "sqlite":  # SQLite checks foreign keys when asked to
                conn.exec_driver_sql("PRAGMA foreign_keys = ON")
                conn.commit()
            with pytest.raises(sa.exc.IntegrityError), conn.begin():
                conn.execute(sa.insert(q.benchmark_traces).values(**row))
    engine.dispose()


def test_keys_named_before_their_records_are_placeholders(store_url):
    st = BenchmarkStore(store_url)
    # the profiler records traces under names that have no record (a function's name)
    st.add_traces([_trace("numpy:exp", "mine:exp", "w-a", "e1", median_s=1.0),
                   _trace("g0", "mine:exp", "w-shared", "e1", median_s=2.0),
                   _trace("g1", "mine:exp", "w-shared", "e1", median_s=3.0)])
    assert st.workloads() == [] and st.implementations() == []
    assert st.stats()["counts"] == {"canonical_graphs": 0, "implementations": 0,
                                    "environments": 0, "workloads": 0, "traces": 3}
    assert [w["key"] for w in st.workloads_for("g0", "e1")] == ["w-shared"]
    assert st.workloads_for("g0", "e1")[0]["axes"] is None
    assert st.get_graph("numpy:exp") is None
    g = st.add_graph("g0", "later", b"x")  # the record comes later: now it is one
    assert st.get_graph(g)["name"] == "later"
    again = BenchmarkStore(store_url)
    assert again.get_graph("g0")["name"] == "later" and again.get_graph("g1") is None
    assert again.dump_records() == st.dump_records()
    assert [t["graph_hash"] for t in again.traces()] == ["numpy:exp", "g0", "g1"]


def test_add_many_writes_new_rows_at_once_on_every_engine(store_url):
    """A kernel sweep's workloads and kernels in one write: the same rows one call each
    would have written, duplicates (among them and in the store) once, and other
    processes see them."""
    st = BenchmarkStore(store_url)
    old = st.add_workload("g0", {"N": 2}, [((2,), "float32")])
    ws = [("g0", {"N": 2}, [((2,), "float32")]), ("g1", {"N": 4}, [((4, 3), "float32")]),
          ("g1", {"N": 4}, [((4, 3), "float32")])]
    ks = [("KERNEL", "exp", "numpy", "h1"), ("KERNEL", "exp", "torch", "h2")]
    st.add_many(workloads=ws, implementations=ks)
    want_w = {old, schema.make_workload(*ws[1])["key"]}
    want_k = {schema.make_implementation(*k)["key"] for k in ks}
    for view in (st, BenchmarkStore(store_url)):
        assert {w["key"] for w in view.workloads()} == want_w
        assert {i["key"] for i in view.implementations()} == want_k
        assert view.get_workload(schema.make_workload(*ws[1])["key"])["axes"] == {"N": 4}
    st.add_many()  # nothing to write
    assert len(BenchmarkStore(store_url).workloads()) == 2


def test_pending_flags_on_every_engine(store_url):
    st = BenchmarkStore(store_url)
    eq = {"primitive": "add", "params": {}, "inputs": [[[4], "float32"], [[4], "float32"]]}
    recs = [schema.make_pending("g-add", "w1", f"k{i}", "e1", {"name": "add",
                                "backend": "numpy", "variant": "", "label": "add"}, eq)
            for i in range(3)]
    assert st.add_pending(recs) == 3 and st.add_pending(recs) == 0
    other = BenchmarkStore(store_url, refresh_s=0)
    assert [r["impl"] for r in other.pending("e1")] == ["k0", "k1", "k2"]
    assert other.pending("e2") == []
    assert other.get_graph("g-add")["equation"] == eq  # the flagged graph outlives the flag
    assert other.clear_pending([recs[1]["key"], "nope"]) == 1
    st.refresh()
    assert [r["impl"] for r in st.pending()] == ["k0", "k2"]
    assert st.stats()["pending"] == 2


# --------------------------------------------------------------------------- migrations


def test_a_version_1_database_is_migrated_on_open(sql_url):
    engine = sa.create_engine(parse_target(sql_url).url)
    with engine.begin() as conn:  # what tgx's first SQL schema made: no pending table
        q.migrate(conn, 0, target=1)
        gid = conn.execute(sa.insert(q.canonical_graphs).values(
            hash="g1", name="old", graph_bytes=b"\x01", created=1.0, recorded=True, gen=0)
            .returning(q.canonical_graphs.c.id)).scalar_one()
        for table, col in ((q.implementations, "impl_key"), (q.workloads, "workload_key"),
                           (q.environments, "env_key")):
            conn.execute(sa.insert(table).values(**{col: "x"}, recorded=False, gen=0))
        conn.execute(sa.insert(q.benchmark_traces).values(
            graph_id=gid, impl_id=1, workload_id=1, environment_id=1, status="PASSED",
            latency_median_s=2e-3, timestamp=5.0, log="from v1"))
    assert "pending" not in sa.inspect(engine).get_table_names()
    st = BenchmarkStore(sql_url)
    assert st.migrated_from == 1 and st.stats()["schema_version"] == SCHEMA_VERSION
    assert st.best("g1", "x", "x")["log"] == "from v1"
    assert st.get_graph("g1")["graph_bytes"] == b"\x01"
    st.add_pending([schema.make_pending("g1", "x", "x", "x", {}, {})])  # the new table works
    with engine.begin() as conn:
        assert conn.execute(sa.select(q.schema_version.c.version)).scalars().all() == [1, 2]
    assert BenchmarkStore(sql_url).migrated_from is None
    engine.dispose()


def test_a_newer_schema_is_refused_and_left_untouched(sql_url):
    BenchmarkStore(sql_url).close()
    engine = sa.create_engine(parse_target(sql_url).url)
    with engine.begin() as conn:
        conn.execute(sa.insert(q.schema_version).values(
            version=SCHEMA_VERSION + 1, applied_at=0.0, description="from the future"))
    with pytest.raises(StoreVersionError, match=f"schema_version {SCHEMA_VERSION + 1}"):
        BenchmarkStore(sql_url)
    with engine.begin() as conn:
        assert conn.execute(sa.select(sa.func.max(q.schema_version.c.version))).scalar() \
            == SCHEMA_VERSION + 1
    engine.dispose()


def test_a_database_with_foreign_tables_is_not_taken_over(tmp_path):
    url = f"sqlite:///{tmp_path}/other.db"
    engine = sa.create_engine(parse_target(url).url)
    with engine.begin() as conn:
        conn.exec_driver_sql("CREATE TABLE workloads (id INTEGER PRIMARY KEY, x TEXT)")
    with pytest.raises(StoreError, match="not a tgx benchmark store"):
        BenchmarkStore(url)
    engine.dispose()


def test_a_file_that_is_no_sqlite_database_is_refused_then_recovered(tmp_path):
    path = tmp_path / "s.db"
    path.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(CorruptStoreError, match="not an SQLite database"):
        BenchmarkStore(f"sqlite:///{path}")
    assert path.read_bytes() == b"this is not sqlite" * 100
    with pytest.warns(RuntimeWarning, match="corrupt-"):
        st = BenchmarkStore(f"sqlite:///{path}", recover=True)
    assert open(st.recovered_from, "rb").read() == b"this is not sqlite" * 100
    st.add_trace(**_trace())
    assert len(BenchmarkStore(f"sqlite:///{path}")) == 1


def test_a_read_only_sqlite_file_is_read_but_never_written(tmp_path):
    path = tmp_path / "s.db"
    with BenchmarkStore(f"sqlite:///{path}") as st:
        st.add_trace(**_trace(median_s=1.0))
    os.chmod(path, stat.S_IRUSR | stat.S_IRGRP)
    try:
        st = BenchmarkStore(f"sqlite:///{path}")
        assert len(st) == 1
        with pytest.raises(StoreError, match="read-only"):
            st.add_trace(**_trace())
    finally:
        os.chmod(path, 0o644)


# --------------------------------------------------------------------------- copies


def _rich_store(st: BenchmarkStore) -> None:
    """Every kind of record, including what only a hand-edited or future file holds."""
    g = st.add_graph("g1", "attention", bytes(range(256)))
    st.add_implementation("KERNEL", "matmul", "torch", "s1", {"min_sm": 80, "x": [1, None]})
    st.add_implementation("GRAPH_RECIPE", "fused", "numpy+torch", "s2", None, b"\x00r")
    w = st.add_workload(g, {"N": 128, "B": 4}, [((4, 128), "float16")])
    st.add_environment({"cpu_model": "EPYC", "cpu_cores": 16, "memory_bytes": 2**40,
                        "gpus": [{"name": "H100"}], "libraries": {"numpy": "2.0"},
                        "os": None, "hostname": "lab-7"})
    st.add_environment({"id": "env-bare"})
    st.add_traces([
        _trace(g, "matmul@torch#x", w, "env-bare", median_s=1.5e-4, min_s=1.2e-4,
               spread=0.03, samples=50, max_abs_err=1e-6, max_rel_err=2e-7, ulp_err=3.0,
               speedup=1.7, timestamp=1700000000.5, log="ok\nline 2 \u2713"),
        _trace("numpy:exp", "mine:exp", "w-dangling", "env-bare", status="RUNTIME_ERROR",
               max_rel_err=float("inf"), log="Traceback ..."),
        _trace(g, "k", w, "env-bare", status="INCORRECT_NUMERICAL", max_rel_err=float("nan"))])
    st.add_pending([schema.make_pending("g-add", w, "k", "env-bare",
                                        {"name": "add", "backend": "numpy", "variant": "",
                                         "label": "add"},
                                        {"primitive": "add", "params": {"t": {"t": [1]}},
                                         "inputs": [[[4], "float32"]]}, b"\x00\x01")])


def _file_with_extras(path) -> dict:
    """A TinyDB file holding fields tgx does not know (a newer tgx's, or edited by hand)."""
    with BenchmarkStore(path) as st:
        _rich_store(st)
    doc = json.loads(path.read_text())
    doc["traces"]["1"]["note"] = {"by": "hand", "n": 1}
    doc["workloads"]["1"]["comment"] = "edited"
    doc["canonical_graphs"]["1"]["created"] = 7  # an int where tgx writes floats
    path.write_text(json.dumps(doc))
    with BenchmarkStore(path) as st:
        return st.dump_records()


def _same(a: dict, b: dict) -> bool:
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)  # NaN == NaN


def test_migrate_round_trip_tinydb_sqlite_postgresql_tinydb(tmp_path, pg_url, capsys):
    src = tmp_path / "original.json"
    original = _file_with_extras(src)
    hops = [str(src), f"sqlite:///{tmp_path}/copy.db", pg_url, f"tinydb:///{tmp_path}/back.json"]
    for a, b in zip(hops, hops[1:]):
        assert main(["store", "migrate", a, b]) == 0
        out = capsys.readouterr().out
        assert out.startswith("copied ") and "3 traces" in out and "1 pending" in out
        with BenchmarkStore(b) as st:
            assert _same(st.dump_records(), original), b
    back = json.loads((tmp_path / "back.json").read_text())
    assert back["traces"]["1"]["note"] == {"by": "hand", "n": 1}
    assert back["canonical_graphs"]["1"]["created"] == 7
    with BenchmarkStore(str(tmp_path / "back.json")) as st:
        assert st.get_graph("g1")["graph_bytes"] == bytes(range(256))
        assert st.pending()[0]["graph_bytes"] == b"\x00\x01"
    # into a store that is not empty: refused, nothing written
    assert main(["store", "migrate", str(src), f"sqlite:///{tmp_path}/copy.db"]) == 1
    assert "not empty" in capsys.readouterr().err
    assert main(["store", "migrate", str(tmp_path / "missing.json"), str(tmp_path / "x.json")]) \
        == 1
    assert "no benchmark store at" in capsys.readouterr().err
    assert not (tmp_path / "x.json").exists()


def test_load_records_refuses_a_store_that_is_not_empty(store_url, tmp_path):
    st = BenchmarkStore(store_url)
    st.add_trace(**_trace())
    with pytest.raises(StoreError, match="not empty"):
        st.load_records({"traces": [schema.make_trace(**_trace(impl="k2"))]})
    assert len(st) == 1
    with pytest.raises(StoreError, match="two canonical_graphs records"):
        BenchmarkStore(tmp_path / "fresh.json").load_records(
            {"canonical_graphs": [schema.make_graph("g", "a", None)] * 2})


def test_migrate_store_api(tmp_path):
    with BenchmarkStore(tmp_path / "a.json") as a:
        _rich_store(a)
        want = a.dump_records()
    counts = migrate_store(tmp_path / "a.json", f"sqlite:///{tmp_path}/b.db")
    assert counts == {t: len(want[t]) for t in schema.ALL_TABLES}
    with pytest.raises(StoreError, match="same store"):
        migrate_store(tmp_path / "a.json", f"tinydb:///{tmp_path}/a.json")


# --------------------------------------------------------------------------- the cache


def test_cached_queries_send_no_sql(sql_url):
    st = BenchmarkStore(sql_url, refresh_s=3600)
    g = st.add_graph("g", "x", b"")
    w = st.add_workload(g, {"N": 1}, [((1,), "float32")])
    st.add_traces([_trace(g, f"k{i}", w, "e", median_s=float(i + 1)) for i in range(50)])
    statements = []
    sa.event.listen(st._sa, "before_cursor_execute",
                    lambda *a, **k: statements.append(a[2]))
    for _ in range(1000):
        assert st.best(g, w, "e")["impl"] == "k0"
        st.measured(g, "k3", w, "e")
        st.workloads_for(g, "e")
    assert statements == []
    other = BenchmarkStore(sql_url)
    other.add_trace(**_trace(g, "faster", w, "e", median_s=0.5))
    assert st.best(g, w, "e")["impl"] == "k0"  # within refresh_s: the cached answer
    loaded = []
    read_rows = st._trace_rows
    st._trace_rows = lambda conn: loaded.append(read_rows(conn)) or loaded[-1]
    st.refresh()
    assert st.best(g, w, "e")["impl"] == "faster"
    # the refresh loaded the new row only (traces with a larger id), not the whole store
    assert [len(rows) for rows in loaded] == [1] and len(st) == 51


# --------------------------------------------------------------------------- planning


def test_compile_measures_into_and_plans_from_a_sql_store(sql_url, monkeypatch):
    import numpy as np

    import tgx
    import tgx.numpy as tnp

    def f(x):
        return tnp.tanh(tnp.exp(x) * 2.0)

    x = np.linspace(-1, 1, 64, dtype=np.float32)
    monkeypatch.setenv("TGX_STORE", sql_url)  # $TGX_STORE takes the same URLs
    explored = tgx.compile(f, backends=["numpy"], policy="explore", explore_budget=5)
    np.testing.assert_allclose(explored(x), np.tanh(np.exp(x) * 2.0), rtol=1e-5)
    with BenchmarkStore(sql_url) as st:
        n = len(st)
        assert n > 0 and {t["status"] for t in st.traces()} == {"PASSED"}
    plan = tgx.compile(f, backends=["numpy"]).lower(x)
    assert not plan.policy.startswith("heuristic")


def test_a_best_effort_store_plans_on_its_cache_when_the_database_goes_away(tmp_path):
    from tgx.store import StoreWarning

    st = BenchmarkStore(f"sqlite:///{tmp_path}/s.db", best_effort=True)
    st.add_trace(**_trace(median_s=1.0))
    calls = []

    def gone():
        calls.append(1)
        raise StoreError("connection lost")

    st._current_generation = gone
    with pytest.warns(StoreWarning, match="connection lost"):
        assert st.best("g1", "w1", "e1")["median_s"] == 1.0
    for _ in range(100):  # no new attempt per query (each could wait a connect timeout)
        assert st.best("g1", "w1", "e1")["median_s"] == 1.0
    assert len(calls) == 1 and st.add_trace(**_trace()) is None  # and no more writes


def test_compiles_share_one_open_sql_store_per_url(tmp_path):
    from tgx.store import open_for_planning

    url = f"sqlite:///{tmp_path}/s.db"
    first, _ = open_for_planning(url)
    assert open_for_planning(url)[0] is first and first.best_effort
    first.close()
    again, _ = open_for_planning(url)  # a closed one is opened anew
    assert again is not first and len(again) == 0


def test_an_unreachable_postgresql_store_warns_without_its_password(tmp_path, monkeypatch):
    import warnings

    from tgx.store import StoreWarning, open_for_planning
    from tgx.store import guard

    monkeypatch.setattr(guard, "LOCK_TIMEOUT_S", 1.0)
    url = f"postgresql://bench:Sup3r-s3cret@/tgx?host={tmp_path}&port=1"  # nobody there
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        store, why = open_for_planning(url)
    assert store is None and "Sup3r-s3cret" not in why and "bench:***@" in why
    [w] = [w for w in rec if issubclass(w.category, StoreWarning)]
    msg = str(w.message)
    assert "Sup3r-s3cret" not in msg and "bench:***@" in msg and ".pgpass" in msg, msg


def test_a_forked_child_drops_the_connections_of_every_store_open_or_closed(tmp_path):
    pytest.importorskip("sqlalchemy")
    code = f"""
import os, sys
from tgx.store import BenchmarkStore
empty = BenchmarkStore("sqlite:///{tmp_path}/a.db")   # no trace: len() == 0
empty.refresh()                                       # its generation checker connects
closed = BenchmarkStore("sqlite:///{tmp_path}/b.db")
closed.close()
pid = os.fork()
if pid == 0:
    os._exit(0 if empty._checker is None else 3)
_, status = os.waitpid(pid, 0)
sys.exit(os.waitstatus_to_exitcode(status))
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0 and "Exception ignored" not in r.stderr, r.stderr
