"""The ``tgx`` command: --version, env, store list/stats/best/export/recover, profile
SCRIPT.py / --pending (exit status, labels), the FlashInfer-Bench export."""

import json
import os
import pathlib
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import tgx
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
    assert "exactly one of SCRIPT.py, --pending or --ray" in capsys.readouterr().err


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
    out, err = capsys.readouterr()
    assert rc == 1  # three jobs failed: each named, with why
    assert "3 of 4 jobs failed" in err
    for line in ("jobs_script.py:wrong: INCORRECT_NUMERICAL: ", "jobs_script.py:hang: TIMEOUT",
                 "jobs_script.py:crash: RUNTIME_ERROR: child process killed by signal SIGABRT"):
        assert line in err, err
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
    # a row naming code to import is refused, and recorded so (docs/store.md: a row is data)
    assert main(["profile", "--pending", "--store", str(path), "--budget", "0.05"]) == 1
    assert "RUNTIME_ERROR: refused: the benchmark store named code" in capsys.readouterr().err
    assert main(["profile", "--pending", "--store", str(path)]) == 0
    assert "nothing to profile" in capsys.readouterr().out


def test_version():
    r = _tgx("--version")
    assert r.returncode == 0 and r.stdout.startswith(f"tgx {tgx.__version__} ")
    assert "tgx-trace" in r.stdout


def test_profile_exits_1_naming_each_failed_job_and_why(capsys, tmp_path):
    script = tmp_path / "mixed.py"
    script.write_text(textwrap.dedent('''
        import numpy as np
        X = np.linspace(-1, 1, 16, dtype=np.float32)
        def ref(x): return x * 2.0
        def good(x): return x * np.float32(2.0)
        def wrong(x): return x + np.float32(1.0)
        def boom(x): raise ValueError("no kernel for this shape")
        JOBS = [(f, (X,), {"golden": ref}) for f in (good, wrong, boom)]
    '''))
    path = str(tmp_path / "s.json")
    assert main(["profile", str(script), "--store", path, "--budget", "0.01"]) == 1
    out, err = capsys.readouterr()
    assert "3 traces" in out and "2 of 3 jobs failed" in err
    assert "mixed.py:wrong: INCORRECT_NUMERICAL: " in err
    assert "mixed.py:boom: RUNTIME_ERROR: ValueError: no kernel for this shape" in err
    assert "good" not in err
    passing = tmp_path / "passing.py"
    passing.write_text(script.read_text().replace("for f in (good, wrong, boom)",
                                                  "for f in (good,)"))
    assert main(["profile", str(passing), "--store", path, "--budget", "0.01"]) == 0


X = np.random.default_rng(0).standard_normal((32, 784), np.float32)
W = np.random.default_rng(1).standard_normal((784, 128), np.float32)


@pytest.fixture
def flagged(tmp_path):
    """A store in which FASTEST flagged the kernels of ``x @ w`` (32x784 @ 784x128)."""
    path = str(tmp_path / "store.json")
    tgx.compile(lambda x, w: x @ w, backends=["numpy"], store=path).lower(X, W)
    return path


def test_store_list_names_graphs_traces_and_pending_work(flagged, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")  # the progress bar is cut to the terminal's width
    assert main(["store", "list", "--store", flagged]) == 0
    out = capsys.readouterr().out
    assert "pending: " in out and "tgx profile --pending" in out
    assert "dot_general f32[32,784]@f32[784,128]  dot_general" in out
    assert main(["profile", "--pending", "--store", flagged, "--budget", "0.01",
                 "--progress"]) == 0
    err = capsys.readouterr().err
    # progress labels say what ran, not a closure's qualified name
    assert "dot_general f32[32,784]@f32[784,128] on dot_general" in err
    assert "<locals>" not in err
    assert main(["store", "list", "--store", flagged]) == 0
    out = capsys.readouterr().out
    row = next(ln for ln in out.splitlines() if ln.startswith("dot_general f32[32,784]@"))
    assert "PASSED" in row and "dot_general" in row.split("PASSED")[1]  # fastest kernel
    assert "pending:" not in out


def test_export_flashinfer_bench_layout(flagged, tmp_path, capsys):
    assert main(["profile", "--pending", "--store", flagged, "--budget", "0.01"]) == 0
    out_dir = tmp_path / "fib"
    assert main(["store", "export", str(out_dir), "--format", "flashinfer-bench",
                 "--store", flagged]) == 0
    assert "FlashInfer-Bench layout" in capsys.readouterr().out
    assert sorted(p.name for p in out_dir.iterdir()) == [
        "definitions", "solutions", "tgx-store.json", "traces", "workloads"]
    defs = {d["name"]: d for d in map(_load, out_dir.glob("definitions/*/*.json"))}
    sols = {s["name"]: s for s in map(_load, out_dir.glob("solutions/tgx/*/*/*.json"))}
    workloads = [json.loads(ln) for p in out_dir.glob("workloads/*/*.jsonl")
                 for ln in p.read_text().splitlines()]
    traces = [json.loads(ln) for p in out_dir.glob("traces/tgx/*/*.jsonl")
              for ln in p.read_text().splitlines()]
    assert defs and sols and workloads and traces
    for d in defs.values():
        assert {"name", "op_type", "axes", "inputs", "outputs", "reference"} <= set(d)
        assert pathlib.Path(out_dir, "definitions", d["op_type"], d["name"] + ".json").exists()
    for s in sols.values():
        assert s["definition"] in defs and s["author"] == "tgx"
        assert s["spec"]["entry_point"] == "main.py::run" and s["sources"][0]["path"] == "main.py"
    for w in workloads:
        assert w["definition"] in defs and w["solution"] is None and w["evaluation"] is None
    for t in traces:
        assert t["definition"] in defs and t["solution"] in sols
        ev = t["evaluation"]
        assert ev["status"] in ("PASSED", "INCORRECT_NUMERICAL", "INCORRECT_SHAPE",
                                "RUNTIME_ERROR", "TIMEOUT") and ev["timestamp"].endswith("Z")
        assert set(ev["environment"]) == {"hardware", "libs"}
        if ev["status"] == "PASSED":
            assert ev["performance"]["latency_ms"] > 0
            assert ev["correctness"]["max_relative_error"] is not None
    # the matmul's definition: shapes by axis, outputs, and a reference that runs
    (mm,) = [d for d in defs.values() if d["op_type"] == "dot_general"]
    axes = mm["axes"]
    assert [[axes[a]["value"] for a in mm["inputs"][x]["shape"]] for x in ("x0", "x1")] == [
        [32, 784], [784, 128]]
    assert [axes[a]["value"] for a in mm["outputs"]["y"]["shape"]] == [32, 128]
    ns: dict = {}
    exec(mm["reference"], ns)
    np.testing.assert_allclose(ns["run"](X.astype(np.float64), W.astype(np.float64)), X @ W,
                               rtol=1e-4, atol=1e-4)
    raw = _load(out_dir / "tgx-store.json")
    assert len(raw["traces"]) == len(traces)
    assert main(["store", "export", str(tmp_path / "raw.json"), "--store", flagged]) == 0
    assert _load(tmp_path / "raw.json")["traces"] == raw["traces"]


def _load(path):
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def test_store_commands_under_tgx_store_off(monkeypatch, capsys):
    monkeypatch.setenv("TGX_STORE", "off")
    assert main(["store", "stats"]) == 1
    err = capsys.readouterr().err
    assert "turned off" in err and "--store PATH" in err and "Traceback" not in err
    assert not os.path.exists("off")


def test_every_command_and_option_is_in_the_docs_table():
    from tgx.cli import build_parser

    doc = (pathlib.Path(__file__).resolve().parents[2] / "docs" / "profiling.md").read_text()
    table = doc.split("## The `tgx` command", 1)[1].split("\n\n`--store`", 1)[0]
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    for name, cmd in sub.choices.items():
        inner = [a for a in cmd._actions if a.dest == "store_command"]
        actions = inner[0].choices.items() if inner else [("", cmd)]
        for action, p in actions:
            words = f"`tgx {name} {action}".rstrip()
            assert words in table, words
            for opt in p._actions:
                flags = [f for f in opt.option_strings if f.startswith("--")
                         and f not in ("--help", "--debug", "--no-progress", "--progress")]
                for flag in flags:
                    assert flag in table or flag in doc, (words, flag)
    assert "`tgx --version`" in table


def test_store_commands_take_store_urls(tmp_path, capsys, monkeypatch):
    pytest.importorskip("sqlalchemy")
    url = f"sqlite:///{tmp_path / 's.db'}"
    BenchmarkStore(url).close()
    assert main(["store", "stats", "--store", url]) == 0
    assert "schema" in capsys.readouterr().out
    monkeypatch.setenv("TGX_STORE", url)
    assert main(["store", "list"]) == 0
    assert "0 traces" in capsys.readouterr().out
    assert main(["store", "stats", "--store", f"sqlite:///{tmp_path / 'none.db'}"]) != 0
    assert "no benchmark store" in capsys.readouterr().err


def test_the_fleet_imports_ray_only_when_it_runs(tmp_path, monkeypatch, capsys):
    code = ("import sys, tgx, tgx.cli, tgx.profiling.fleet; "
            "assert 'ray' not in sys.modules, 'ray imported'")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    monkeypatch.setitem(sys.modules, "ray", None)  # as if Ray were not installed
    assert main(["profile", "--ray", "--store", str(tmp_path / "s.json")]) == 1
    err = capsys.readouterr().err
    assert "the profiling fleet needs Ray" in err and "tgx-trace[fleet]" in err, err
    assert main(["profile", "--ray", "--pending", "--store", str(tmp_path / "s.json")]) == 2
    assert "give neither SCRIPT.py nor --pending" in capsys.readouterr().err
