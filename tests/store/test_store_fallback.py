"""A broken benchmark store never breaks `tgx.compile`: corrupt, locked by another process,
read-only (file or directory), or written by a newer tgx, the default store is left byte for
byte as it was, compile plans with the heuristic policy and says so in one warning that names
the path and the fix; ``TGX_STORE=off`` and ``store=False`` plan without a store."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import warnings

import numpy as np
import pytest

import tgx
import tgx.numpy as tnp
from tgx.store import BenchmarkStore, StoreWarning, open_for_planning
from tgx.store import guard

X = np.linspace(-1, 1, 64, dtype=np.float32)


def f(x):
    return tnp.tanh(tnp.exp(x) * 2.0)


@pytest.fixture
def path(tmp_path, monkeypatch):
    """The default store's path ($TGX_STORE), in a directory of its own."""
    p = tmp_path / "store" / "store.json"
    p.parent.mkdir()
    monkeypatch.setenv("TGX_STORE", str(p))
    return p


def _healthy(path) -> bytes:
    with BenchmarkStore(path) as st:
        st.add_workload("g", {"N": 4}, [((4,), "float32")])
    return path.read_bytes()


def _compile_with_warnings(**kw):
    """(plan, result, StoreWarnings) of compiling and running `f` with the default store."""
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        fn = tgx.compile(f, backends=["numpy"], **kw)
        plan = fn.lower(X)
        y = fn(X)
    return plan, y, [w for w in rec if issubclass(w.category, StoreWarning)]


def _expected():
    return tgx.compile(f, backends=["numpy"], policy="heuristic")(X)


def _check_fallback(path, before: bytes, *words: str) -> None:
    plan, y, warned = _compile_with_warnings()
    np.testing.assert_array_equal(y, _expected())
    assert plan.policy.startswith("heuristic") and str(path) in plan.policy
    assert len(warned) == 1, [str(w.message) for w in warned]
    msg = str(warned[0].message)
    assert str(path) in msg and "Fix:" in msg, msg
    for word in words:
        assert word in msg, msg
    assert path.read_bytes() == before  # untouched, byte for byte
    assert sorted(os.listdir(path.parent)) in ([path.name], [path.name, path.name + ".lock"])


def test_corrupt_default_store(path):
    path.write_bytes(b'{"meta": {"1": {"schema_version": 2}}, "traces": {"1": ')  # truncated
    _check_fallback(path, path.read_bytes(), "corrupt", "tgx store recover")


def test_newer_schema_version(path):
    doc = json.loads(_healthy(path))
    doc["meta"]["1"]["schema_version"] = 99
    path.write_text(json.dumps(doc))
    _check_fallback(path, path.read_bytes(), "newer tgx", "schema_version 99", "upgrade")


def test_read_only_file(path):
    before = _healthy(path)
    os.chmod(path, stat.S_IRUSR | stat.S_IRGRP | stat.S_IROTH)
    try:
        _check_fallback(path, before, "read-only", "chmod u+w")
    finally:
        os.chmod(path, 0o644)


def test_read_only_directory(path):
    before = _healthy(path)
    os.chmod(path.parent, 0o555)
    try:
        _check_fallback(path, before, "read-only", str(path.parent))
    finally:
        os.chmod(path.parent, 0o755)


def test_store_locked_by_another_process(path, monkeypatch):
    before = _healthy(path)
    monkeypatch.setattr(guard, "LOCK_TIMEOUT_S", 0.3)
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import sys; from filelock import FileLock\n"
         f"lock = FileLock({str(path) + '.lock'!r}); lock.acquire()\n"
         "print('locked', flush=True); sys.stdin.read()"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        _check_fallback(path, before, "another process", ".lock")
    finally:
        holder.stdin.close()
        holder.wait(timeout=60)


def test_warns_once_per_store_and_problem(path):
    path.write_text("not json")
    _, _, first = _compile_with_warnings()
    _, _, again = _compile_with_warnings()
    assert len(first) == 1 and again == []


@pytest.mark.parametrize("how", ["env", "option"])
def test_off_plans_without_a_store_and_without_warnings(path, monkeypatch, tmp_path, how):
    monkeypatch.chdir(tmp_path)
    if how == "env":
        monkeypatch.setenv("TGX_STORE", "off")
        plan, y, warned = _compile_with_warnings()
    else:
        plan, y, warned = _compile_with_warnings(store=False)
    np.testing.assert_allclose(y, _expected(), rtol=1e-6)
    assert warned == [] and "heuristic" not in plan.policy  # FASTEST on the cost model alone
    assert not path.exists() and not (tmp_path / "off").exists()
    assert open_for_planning(None if how == "env" else False) == (None, None)


def test_off_refuses_to_name_a_default_path(monkeypatch):
    monkeypatch.setenv("TGX_STORE", "OFF")
    with pytest.raises(tgx.TgxError, match="turned off"):
        BenchmarkStore()


def test_a_store_failing_after_it_was_opened_warns_once_and_keeps_planning(path):
    before = _healthy(path)
    store, why = open_for_planning(None)
    assert why is None and store.best_effort
    os.chmod(path, 0o444)  # e.g. another user made it read-only while we plan
    try:
        with warnings.catch_warnings(record=True) as rec:
            warnings.simplefilter("always")
            assert store.add_workload("g2", {"N": 8}, [((8,), "float32")]).startswith("N=8#")
            assert store.add_traces([dict(graph_hash="g", impl="k", workload="w", env_id="e",
                                          status="PASSED", median_s=1.0)]) == []
            plan = tgx.compile(f, backends=["numpy"], store=store).lower(X)
        assert [str(w.message) for w in rec if issubclass(w.category, StoreWarning)] == [
            f"benchmark store {path}: a write failed (StoreError: benchmark store {path} "
            "cannot be written: the file is read-only); this process writes no more "
            "measurements or pending flags to it"]
        np.testing.assert_allclose(plan(X), _expected(), rtol=1e-6)
        assert path.read_bytes() == before
    finally:
        os.chmod(path, 0o644)


def test_a_normal_store_never_replaces_a_read_only_file(path):
    before = _healthy(path)
    os.chmod(path, 0o444)
    try:
        st = BenchmarkStore(path)  # reading is fine
        assert len(st.workloads()) == 1
        with pytest.raises(tgx.TgxError, match="read-only"):
            st.add_workload("g2", {"N": 8}, [((8,), "float32")])
        assert path.read_bytes() == before
    finally:
        os.chmod(path, 0o644)


def test_the_fix_named_for_a_corrupt_store_works(path, capsys):
    from tgx.cli import main

    path.write_text("{not json")
    _check_fallback(path, b"{not json", "tgx store recover")
    assert main(["store", "recover", "--store", str(path)]) == 0
    assert "moved the corrupt store" in capsys.readouterr().out
    plan, _, warned = _compile_with_warnings()
    assert warned == [] and not plan.policy.startswith("heuristic")
    assert [p for p in os.listdir(path.parent) if ".corrupt-" in p]
