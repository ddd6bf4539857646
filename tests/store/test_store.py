"""Round trips, dedupe, lookups, corrupt files, schema versions and crash safety of the store."""

from __future__ import annotations

import json
import os

import pytest

from tgx.store import (
    SCHEMA_VERSION,
    BenchmarkStore,
    CorruptStoreError,
    Status,
    StoreError,
    StoreVersionError,
    default_store_path,
)
from tgx.store import db as store_db


@pytest.fixture
def path(tmp_path):
    return str(tmp_path / "store.json")


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def _trace(g="g1", impl="k1", w="w1", e="e1", status="PASSED", **kw):
    return dict(graph_hash=g, impl=impl, workload=w, env_id=e, status=status, **kw)


def _populated(path):
    st = BenchmarkStore(path)
    g = st.add_graph("g1", "mlp", b"\x93\x01\x02\xff")
    k = st.add_implementation("KERNEL", "matmul", "numpy", "src1")
    w = st.add_workload(g, {"N": 128}, [((128, 64), "float32")])
    e = st.add_environment({"cpu_model": "test cpu", "cpu_cores": 4})
    st.add_traces([_trace(g, k, w, e, median_s=1e-3 * (i + 1), log=f"t{i}") for i in range(5)])
    return st, (g, k, w, e)


# --------------------------------------------------------------------------- round trips

def test_every_table_round_trips(store_url):
    st = BenchmarkStore(store_url)
    graph_bytes = bytes(range(256))  # every byte value, incl. NUL: must survive JSON
    g = st.add_graph("hash-abc", "attention", graph_bytes)
    k = st.add_implementation("KERNEL", "matmul", "torch", "s1", {"min_sm": 80, "dtypes": ["f16"]})
    r = st.add_implementation("GRAPH_RECIPE", "fused_attn", "torch", "s2", None, b"\x00recipe")
    w = st.add_workload(g, {"N": 128, "B": 4}, [((4, 128), "float16"), ((128,), "int32")])
    env = {"cpu_model": "EPYC", "cpu_cores": 16, "gpus": [{"name": "H100"}],
           "libraries": {"numpy": "2.0"}}
    e = st.add_environment(env)
    full = _trace(g, k, w, e, median_s=1.5e-4, min_s=1.2e-4, spread=0.03, samples=50,
                  max_abs_err=1e-6, max_rel_err=2e-7, ulp_err=3.0, speedup=1.7,
                  timestamp=1700000000.5, log="ok\nline 2")
    tid = st.add_trace(**full)
    assert isinstance(tid, int)
    st.close()

    st = BenchmarkStore(store_url)  # a fresh instance reads everything back
    assert st.get_graph(g)["graph_bytes"] == graph_bytes
    assert st.get_graph(g)["name"] == "attention"
    impl = st.get_implementation(k)
    assert (impl["kind"], impl["name"], impl["backend"], impl["source_hash"]) == (
        "KERNEL", "matmul", "torch", "s1")
    assert impl["requirements"] == {"min_sm": 80, "dtypes": ["f16"]}
    assert impl["payload"] is None
    assert st.get_implementation(r)["payload"] == b"\x00recipe"
    assert st.get_implementation(r)["kind"] == "GRAPH_RECIPE"
    wl = st.get_workload(w)
    assert wl["axes"] == {"B": 4, "N": 128}
    assert wl["inputs"] == [((4, 128), "float16"), ((128,), "int32")]
    assert wl["graph_hash"] == g
    got_env = st.get_environment(e)
    assert {k_: got_env[k_] for k_ in env} == env
    [t] = st.traces()
    assert {f: t[f] for f in full} == full
    assert [i["key"] for i in st.implementations(kind="GRAPH_RECIPE")] == [r]


def test_bytes_are_base64_text_in_the_json_file(path):
    st = BenchmarkStore(path)
    st.add_graph("hash-abc", "attention", bytes(range(256)))
    raw = json.loads(_read(path))
    [grec] = raw["canonical_graphs"].values()
    assert isinstance(grec["graph_b64"], str)
    assert raw["meta"]["1"]["schema_version"] == SCHEMA_VERSION


def test_dedupe_of_graphs_implementations_environments_workloads(store_url):
    st = BenchmarkStore(store_url)
    assert st.add_graph("g", "a", b"1") == st.add_graph("g", "a", b"1") == "g"
    k1 = st.add_implementation("KERNEL", "mm", "numpy", "s1")
    assert st.add_implementation("KERNEL", "mm", "numpy", "s1") == k1
    assert st.add_implementation("KERNEL", "mm", "numpy", "s2") != k1  # new source
    assert st.add_implementation("GRAPH_RECIPE", "mm", "numpy", "s1") != k1
    e1 = st.add_environment({"cpu_model": "x"})
    assert st.add_environment({"cpu_model": "x"}) == e1
    assert st.add_environment({"id": "explicit", "cpu_model": "y"}) == "explicit"
    w1 = st.add_workload("g", {"N": 1, "M": 2}, [((1, 2), "float32")])
    assert st.add_workload("g", {"M": 2, "N": 1}, [([1, 2], "float32")]) == w1
    assert st.add_workload("g", {"N": 1, "M": 2}, [((1, 2), "float64")]) != w1
    counts = st.stats()["counts"]
    assert counts == {"canonical_graphs": 1, "implementations": 3, "environments": 2,
                      "workloads": 2, "traces": 0}
    generation = st.stats()["generation"]
    st.add_graph("g", "a", b"1")  # a duplicate must not even rewrite the file
    assert st.stats()["generation"] == generation


def test_invalid_records_are_rejected_before_writing(store_url):
    st = BenchmarkStore(store_url)
    with pytest.raises(StoreError, match="status"):
        st.add_trace(**_trace(status="FAST"))
    with pytest.raises(StoreError, match="missing"):
        st.add_trace(graph_hash="g", impl="k", workload="w", status="PASSED")
    with pytest.raises(StoreError, match="unknown"):
        st.add_trace(**_trace(), latency=1.0)
    with pytest.raises(StoreError, match="kind"):
        st.add_implementation("LIBRARY", "mm", "numpy", "s")
    assert len(st) == 0


# --------------------------------------------------------------------------- lookups

def test_best_picks_fastest_passed_and_honours_tolerance(store_url):
    st = BenchmarkStore(store_url)
    st.add_traces([
        _trace(impl="wrong", status=Status.INCORRECT_NUMERICAL, median_s=1e-6, max_rel_err=1.0),
        _trace(impl="crash", status="RUNTIME_ERROR", log="boom"),
        _trace(impl="loose", median_s=1e-4, max_rel_err=1e-3),
        _trace(impl="exact", median_s=3e-4, max_rel_err=1e-7),
        _trace(impl="unknown_err", median_s=2e-4),
        _trace(impl="other_env", e="e2", median_s=1e-9, max_rel_err=0.0),
    ])
    assert st.best("g1", "w1", "e1")["impl"] == "loose"
    assert st.best("g1", "w1", "e1", tolerance=1e-5)["impl"] == "exact"
    assert st.best("g1", "w1", "e1", tolerance=1e-9) is None
    assert st.best("g1", "w1", "nope") is None
    assert st.best("g1", "w1", "e2")["impl"] == "other_env"
    # a later, faster trace takes over (index kept up to date on writes)
    st.add_trace(**_trace(impl="newer", median_s=5e-5, max_rel_err=1e-8))
    assert st.best("g1", "w1", "e1", tolerance=1e-5)["impl"] == "newer"
    # the returned dict is a copy: mutating it cannot corrupt the index
    st.best("g1", "w1", "e1")["median_s"] = 99.0
    assert st.best("g1", "w1", "e1")["median_s"] == 5e-5


def test_measured_traces_filters_and_workloads_for(store_url):
    st = BenchmarkStore(store_url)
    wa = st.add_workload("g1", {"N": 64}, [((64,), "float32")])
    wb = st.add_workload("g1", {"N": 256}, [((256,), "float32")])
    st.add_traces([_trace(w=wa, impl="k1", median_s=2.0, timestamp=10),
                   _trace(w=wa, impl="k1", median_s=1.0, timestamp=20),
                   _trace(w=wb, impl="k2", status="TIMEOUT", timestamp=5),
                   _trace(g="g2", w="wx", impl="k1", median_s=1.0)])
    assert st.measured("g1", "k1", wa, "e1")["timestamp"] == 20
    assert st.measured("g1", "k2", wb, "e1")["status"] == "TIMEOUT"
    assert st.measured("g1", "k2", wa, "e1") is None
    assert len(st.traces()) == 4
    assert len(st.traces(graph_hash="g1")) == 3
    assert len(st.traces(graph_hash="g1", workload=wa, env_id="e1")) == 2
    assert len(st.traces(impl="k1")) == 3
    assert [t["impl"] for t in st.traces(status="TIMEOUT")] == ["k2"]
    assert st.traces(env_id="e2") == []
    assert [w["axes"] for w in st.workloads_for("g1", "e1")] == [{"N": 64}, {"N": 256}]
    assert st.workloads_for("g1", "e2") == []
    s = st.stats()
    assert s["counts"]["traces"] == 4
    assert s["traces_by_status"] == {"PASSED": 3, "TIMEOUT": 1}


def test_second_instance_sees_writes_of_the_first(store_url):
    a, (g, _k, w, e) = _populated(store_url)
    b = BenchmarkStore(store_url, refresh_s=0)  # check for other writers on every query
    assert b.best(g, w, e)["median_s"] == 1e-3
    a.add_trace(**_trace(g, "k-fast", w, e, median_s=1e-6))
    assert b.best(g, w, e)["impl"] == "k-fast"  # refreshed from the changed file
    b.add_trace(**_trace(g, "k-b", w, e, median_s=1.0))
    a.refresh()  # `a` checks on its own at most every refresh_s (PostgreSQL: 0.5 s)
    assert len(a.traces()) == len(b.traces()) == 7


def test_export_default_path_and_context_manager(store_url, tmp_path, monkeypatch):
    st, _ = _populated(store_url)
    out = st.export(str(tmp_path / "backup.json"))
    with BenchmarkStore(out) as copy:  # a TinyDB file, whatever the engine exported
        assert copy.stats()["counts"] == st.stats()["counts"]
        assert copy.dump_records() == st.dump_records()
    with pytest.raises(StoreError, match="closed"):
        copy.traces()
    st.close()
    with pytest.raises(StoreError, match="closed"):
        st.best("g1", "w1", "e1")
    monkeypatch.setenv("TGX_STORE", str(tmp_path / "env.json"))
    assert default_store_path() == str(tmp_path / "env.json")
    monkeypatch.delenv("TGX_STORE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_store_path() == str(tmp_path / "xdg" / "tgx" / "store.json")
    with BenchmarkStore() as st2:
        assert st2.path == default_store_path() and os.path.exists(st2.path)


# --------------------------------------------------------------------------- corrupt files

def _corrupt_variants(valid: bytes) -> dict[str, bytes]:
    return {
        "empty": b"",
        "truncated": valid[: len(valid) // 2],
        "nul_padded": valid + b"\x00" * 4096,
        "all_nul": b"\x00" * len(valid),
        "garbage": b"\x89PNG\r\n\x1a\n\xff\xfe not a store",
        "json_list": b"[1, 2, 3]",
        "no_meta": b'{"traces": {}}',
        "table_not_object": json.dumps({"meta": {"1": {"schema_version": SCHEMA_VERSION}},
                                        "traces": [1, 2]}).encode(),
        "bad_record": json.dumps({"meta": {"1": {"schema_version": SCHEMA_VERSION}},
                                  "traces": {"1": {"status": "PASSED"}}}).encode(),
    }


@pytest.mark.parametrize("kind", list(_corrupt_variants(b"{}")))
def test_corrupt_file_is_refused_kept_and_recoverable(path, kind):
    st, _ = _populated(path)
    st.close()
    bad = _corrupt_variants(_read(path))[kind]
    with open(path, "wb") as f:
        f.write(bad)

    with pytest.raises(CorruptStoreError) as info:
        BenchmarkStore(path)
    assert path in str(info.value) and info.value.reason
    assert _read(path) == bad  # left untouched without recover=True

    with pytest.warns(RuntimeWarning, match="corrupt-"):
        fresh = BenchmarkStore(path, recover=True)
    moved = fresh.recovered_from
    assert moved.startswith(path + ".corrupt-")
    assert _read(moved) == bad  # the original bytes, preserved
    assert len(fresh) == 0
    fresh.add_trace(**_trace())
    assert len(BenchmarkStore(path)) == 1


def test_recovery_never_overwrites_an_earlier_corrupt_copy(path):
    moved = []
    for content in (b"first", b"second"):
        with open(path, "wb") as f:
            f.write(content)
        with pytest.warns(RuntimeWarning):
            moved.append(BenchmarkStore(path, recover=True).recovered_from)
    assert moved[0] != moved[1]
    assert [_read(m) for m in moved] == [b"first", b"second"]


def test_file_corrupted_while_open_raises_and_is_not_overwritten(path):
    st, (g, k, w, e) = _populated(path)
    with open(path, "wb") as f:
        f.write(b'{"meta": ')
    with pytest.raises(CorruptStoreError, match="invalid JSON"):
        st.add_trace(**_trace(g, k, w, e, median_s=1.0))
    assert _read(path) == b'{"meta": '


@pytest.mark.parametrize("recover", [False, True])
def test_newer_schema_version_is_refused_and_left_untouched(path, recover):
    doc = {"meta": {"1": {"schema_version": SCHEMA_VERSION + 1}}, "traces": {},
           "future_table": {"1": {"x": 1}}}
    with open(path, "w") as f:
        json.dump(doc, f)
    before = _read(path), os.stat(path).st_mtime_ns
    with pytest.raises(StoreVersionError, match="schema_version"):
        BenchmarkStore(path, recover=recover)
    assert (_read(path), os.stat(path).st_mtime_ns) == before
    assert not [p for p in os.listdir(os.path.dirname(path)) if ".corrupt-" in p]


# --------------------------------------------------------------------------- crash safety

def test_crash_between_temp_write_and_rename_loses_nothing(path, monkeypatch):
    st, (g, k, w, e) = _populated(path)
    before = _read(path)

    def crash(src, dst):
        raise OSError("simulated crash before rename")

    monkeypatch.setattr(store_db.os, "replace", crash)
    with pytest.raises(OSError, match="simulated crash"):
        st.add_traces([_trace(g, k, w, e, median_s=1e-9, log="lost") for _ in range(3)])
    monkeypatch.undo()

    assert _read(path) == before  # old state intact on disk
    assert not [p for p in os.listdir(os.path.dirname(path)) if p.endswith(".tmp")]
    assert len(BenchmarkStore(path)) == 5  # and loadable by anyone
    # the instance that failed does not keep phantom records in memory
    assert len(st) == 5 and st.best(g, w, e)["median_s"] == 1e-3
    st.add_trace(**_trace(g, k, w, e, median_s=2e-3))  # and can write again, ids intact
    assert len(BenchmarkStore(path)) == 6
    ids = list(json.loads(_read(path))["traces"])
    assert ids == [str(i) for i in range(1, 7)]


def test_a_left_over_temp_file_is_ignored(path):
    st, _ = _populated(path)
    with open(path + ".abc.tmp", "wb") as f:  # what a crash before os.replace leaves behind
        f.write(b'{"half": ')
    assert len(BenchmarkStore(path)) == 5
    st.add_trace(**_trace())
    assert len(BenchmarkStore(path)) == 6
