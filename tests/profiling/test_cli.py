"""The ``tgx`` command: env, store stats/best/export, profile SCRIPT.py / --pending."""

import json
import subprocess
import sys
import textwrap

import pytest

from tgx.cli import main
from tgx.store import BenchmarkStore

JOBS_SCRIPT = textwrap.dedent('''
    import os
    import time

    import numpy as np

    X = np.linspace(-1, 1, 32, dtype=np.float32)

    def ref(x):
        return x * 2.0

    def good(x):
        return x * np.float32(2.0)

    def wrong(x):
        return x * np.float32(2.0) + np.float32(1e-2)

    def hang(x):
        time.sleep(1e6)

    def crash(x):
        os.abort()

    JOBS = [(f, (X,), {"golden": ref}) for f in (good, wrong, hang, crash)]
''')


def _tgx(*args, timeout=120):
    return subprocess.run([sys.executable, "-m", "tgx", *args], capture_output=True,
                          text=True, timeout=timeout)


def test_env_id_is_stable_across_processes():
    first, second = _tgx("env"), _tgx("env")
    assert first.returncode == 0, first.stderr
    line = first.stdout.splitlines()[0]
    assert line.startswith("environment env-") and len(line.split()[1]) == 20
    assert second.stdout.splitlines()[0] == line
    assert "numpy" in first.stdout


def test_bad_argument_exits_2_with_a_message():
    r = _tgx("store", "stats", "--bogus")
    assert r.returncode == 2
    assert "unrecognized arguments: --bogus" in r.stderr and "Traceback" not in r.stderr
    with pytest.raises(SystemExit) as exc:
        main(["profile", "--timeout", "-1", "x.py"])
    assert exc.value.code == 2


def test_profile_needs_a_script_or_pending(capsys, tmp_path):
    assert main(["profile", "--store", str(tmp_path / "s.json")]) == 2
    assert "exactly one of SCRIPT.py or --pending" in capsys.readouterr().err


def test_missing_store_and_script_fail_with_1_and_no_traceback(capsys, tmp_path):
    assert main(["store", "stats", "--store", str(tmp_path / "none.json")]) == 1
    err = capsys.readouterr().err
    assert "no benchmark store at" in err and "Traceback" not in err
    assert main(["profile", str(tmp_path / "missing.py"), "--store",
                 str(tmp_path / "s.json")]) == 1
    assert "no such script" in capsys.readouterr().err


def test_store_stats_best_export(capsys, tmp_path):
    path = tmp_path / "store.json"
    with BenchmarkStore(path) as st:
        w = st.add_workload("g1", {"N": 4}, [((4,), "float32")])
        st.add_traces([
            dict(graph_hash="g1", impl="slow", workload=w, env_id="env-x", status="PASSED",
                 median_s=2e-3, samples=9, spread=0.01, max_rel_err=0.0),
            dict(graph_hash="g1", impl="fast", workload=w, env_id="env-x", status="PASSED",
                 median_s=1e-3, samples=9, spread=0.01, max_rel_err=1e-7),
            dict(graph_hash="g1", impl="bad", workload=w, env_id="env-x",
                 status="RUNTIME_ERROR", log="boom")])
    assert main(["store", "stats", "--store", str(path)]) == 0
    out = capsys.readouterr().out
    assert "traces" in out and "RUNTIME_ERROR" in out and "bytes" in out
    counts = {tuple(ln.split()[:2]): ln.split()[-1] for ln in out.splitlines()}
    assert counts[("traces", "PASSED")] == "2" and counts[("traces", "RUNTIME_ERROR")] == "1"
    assert counts[("traces", "3")] == "3"  # the table count line: "traces  3"
    assert main(["store", "best", "--graph", "g1", "--env", "env-x", "--store", str(path)]) == 0
    out = capsys.readouterr().out
    assert "fast" in out and "1.000 ms" in out and "slow" not in out
    assert main(["store", "best", "--graph", "nope", "--env", "env-x",
                 "--store", str(path)]) == 1
    assert main(["store", "export", str(tmp_path / "out.json"), "--store", str(path)]) == 0
    doc = json.loads((tmp_path / "out.json").read_text())
    assert len(doc["traces"]) == 3


def test_profile_script_isolated_records_every_status(capsys, tmp_path):
    script = tmp_path / "jobs_script.py"
    script.write_text(JOBS_SCRIPT)
    path = tmp_path / "store.json"
    rc = main(["profile", str(script), "--store", str(path), "--isolate", "--timeout", "2",
               "--budget", "0.05"])
    out = capsys.readouterr().out
    assert rc == 0
    with BenchmarkStore(path) as st:
        statuses = {t["impl"].rpartition(":")[2]: t["status"] for t in st.traces()}
    assert statuses == {"good": "PASSED", "wrong": "INCORRECT_NUMERICAL", "hang": "TIMEOUT",
                        "crash": "RUNTIME_ERROR"}
    assert "4 traces" in out and "jobs_script.py:good" in out


def test_profile_pending(capsys, tmp_path):
    path = tmp_path / "store.json"
    with BenchmarkStore(path) as st:
        w = st.add_workload("g-neg", {"N": 16}, [((16,), "float32")])
        st.add_implementation("KERNEL", "neg", "numpy", "h", requirements={
            "pending": True, "entry": "numpy:negative", "golden": "numpy:negative",
            "graph_hash": "g-neg", "workloads": [w]})
    assert main(["profile", "--pending", "--store", str(path), "--budget", "0.05"]) == 0
    assert "PASSED 1" in capsys.readouterr().out
    assert main(["profile", "--pending", "--store", str(path)]) == 0
    assert "nothing to profile" in capsys.readouterr().out
