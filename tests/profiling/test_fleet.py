"""The profiling fleet (`tgx profile --ray`) on a local Ray instance: one per module, 2 CPUs.

A local sweep fills a store; a worker killed mid-job is retried and a kernel that crashes its
worker every time or hangs is recorded as failed (nothing lost, the sweep goes on); two
fleets on one PostgreSQL store measure each job once; and the issue's end-to-end check:
``tgx profile --ray`` fills a PostgreSQL store that ``tgx.compile(policy="fastest")`` in
another process then plans from. Skipped only where Ray (the fleet extra) is missing.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest

import tgx
import tgx.numpy as tnp
from tests.profiling import fleet_kernels
from tests.store.conftest import pg_url, postgres_server  # noqa: F401 - fixtures
from tgx.cli import main
from tgx.store import BenchmarkStore, schema

ray = pytest.importorskip("ray", reason="Ray is not installed (the fleet extra): "
                                        "pip install -e '.[fleet]'")

from tgx.profiling.fleet import FleetError, profile_fleet  # noqa: E402

# one Ray for the module: its tests stay on one xdist worker (pyproject: --dist loadgroup)
pytestmark = pytest.mark.xdist_group("ray")
ROOT = pathlib.Path(__file__).resolve().parents[2]
FAST = {"budget_s": 0.01, "progress": False}


@pytest.fixture(scope="module")
def local_ray(tmp_path_factory):
    """A local Ray of 2 CPUs whose workers also know the kernels of `fleet_kernels`."""
    marks = tmp_path_factory.mktemp("fleet-marks")
    path = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             object_store_memory=100 * 2**20, runtime_env={
                 "worker_process_setup_hook": "tests.profiling.fleet_kernels.register",
                 "env_vars": {"PYTHONPATH": path, fleet_kernels.MARKER_DIR: str(marks),
                              # the workers' libpq password file, written by a test
                              "PGPASSFILE": str(marks / "pgpass")}})
    try:
        yield marks
    finally:
        ray.shutdown()


def f(x):
    return tnp.exp(x) * 2.0


X = np.linspace(-1, 1, 256).astype(np.float32)


def _flag(st, variant_or_impl: str, n: int = 64) -> tuple[str, str, str]:
    """A pending flag for a ``neg`` kernel on a float32[n] (graph, workload, impl)."""
    eq = {"primitive": "neg", "params": {}, "inputs": [[[n], "float32"]], "axes": {"n": n}}
    g = f"g-neg-{n}"
    w = st.add_workload(g, {"n": n}, [((n,), "float32")])
    impl = (variant_or_impl if "@" in variant_or_impl
            else fleet_kernels.impl_key(variant_or_impl))
    variant = impl.partition("[")[2].partition("]")[0] or "default"
    label = impl.partition("@")[0]
    st.add_pending([schema.make_pending(g, w, impl, st.environment_id(), {
        "name": "neg", "backend": "numpy", "variant": variant, "label": label}, eq)])
    return g, w, impl


def test_a_local_sweep_fills_the_store_and_fills_speedup(local_ray, tmp_path):
    with BenchmarkStore(f"sqlite:///{tmp_path}/s.db") as st:
        tgx.compile(f, store=st, backends=["numpy"]).lower(X)
        flags = st.pending()
        assert len(flags) >= 4  # exp and mul, each with its variants
        sweep = profile_fleet(st, **FAST)
        assert len(sweep.records) == len(flags) and sweep.slots == 2
        assert {r["status"] for r in sweep.records} == {"PASSED"}
        assert st.pending() == []
        env = st.environment_id()
        for r in flags:
            t = st.measured(r["graph_hash"], r["impl"], r["workload"], env)
            assert t["status"] == "PASSED" and t["env_id"] == env
            # references first: every trace has its speedup against the NumPy reference
            assert t["speedup"] > 0
            if "[" not in r["impl"]:
                assert t["speedup"] == 1.0
        again = profile_fleet(st, **FAST)
        assert again.records == [] and len(st.traces()) == len(flags)


def test_a_killed_worker_is_retried_and_crashes_and_hangs_are_recorded(local_ray, tmp_path):
    with BenchmarkStore(tmp_path / "s.json") as st:
        jobs = [_flag(st, v) for v in ("fleet_crash", "fleet_flaky", "fleet_hang")]
        from tgx.backends.registry import kernels_for
        from tgx.planning.cost_model import kernel_name

        ref = next(k for k in kernels_for("neg", "numpy") if k.variant == "default")
        ref_key = schema.implementation_key("KERNEL", kernel_name(ref), "numpy",
                                            ref.source_hash)
        jobs.append(_flag(st, ref_key))
        sweep = profile_fleet(st, timeout_s=2, retries=1, **FAST)
        env = st.environment_id()
        status = {t["impl"]: t for t in st.traces()}
        assert len(st.traces()) == 4 and len(sweep.records) == 4  # nothing lost, once each
        crash, flaky, hang, good = (status[i] for _, _, i in jobs)
        assert flaky["status"] == "PASSED"  # its worker was SIGKILLed once: retried
        assert crash["status"] == "RUNTIME_ERROR" and "worker died" in crash["log"]
        assert "2 times" in crash["log"]
        assert hang["status"] == "TIMEOUT" and "timeout" in hang["log"]
        assert good["status"] == "PASSED" and good["speedup"] == 1.0
        assert flaky["speedup"] > 0 and all(t["env_id"] == env for t in status.values())
        assert st.pending() == []  # every flag has its trace


def test_two_fleets_on_one_postgresql_store_measure_each_job_once(local_ray, pg_url):  # noqa: F811
    with BenchmarkStore(pg_url) as st:
        tgx.compile(f, store=st, backends=["numpy"]).lower(X)
        tgx.compile(lambda x: tnp.tanh(x) - x, store=st, backends=["numpy"]).lower(X)
        n = len(st.pending())
    sweeps = []

    def fleet():
        with BenchmarkStore(pg_url) as mine:
            sweeps.append(profile_fleet(mine, **FAST))

    threads = [threading.Thread(target=fleet) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert len(sweeps) == 2
    with BenchmarkStore(pg_url) as st:
        traces = st.traces()
        triples = [(t["graph_hash"], t["workload"], t["impl"]) for t in traces]
        assert len(triples) == len(set(triples)) == n  # each job measured once, none lost
        assert st.pending() == []
    assert sum(len(s.records) for s in sweeps) == n


def test_fleet_workers_need_only_the_least_privilege_role_of_the_docs(
        local_ray, postgres_server, monkeypatch):  # noqa: F811
    import re

    import psycopg

    from tests.store.test_security import _doc_sql

    server, db = postgres_server, postgres_server.create_db()
    owner, worker = f"o_{db}", f"w_{db}"

    def named(sql: str) -> str:
        return (sql.replace("tgx_owner", owner).replace("tgx_worker", worker)
                .replace("DATABASE tgx", f"DATABASE {db}"))

    admin = named(_doc_sql("CREATE ROLE tgx_owner")).replace(
        f"CREATE DATABASE {db} OWNER {owner};", f"ALTER DATABASE {db} OWNER TO {owner};")
    server.sql(*[s for s in re.sub(r"--[^\n]*", "", admin).split(";") if s.strip()])
    with BenchmarkStore(server.url(db, owner, "owner-secret")) as st:
        tgx.compile(f, store=st, backends=["numpy"]).lower(X)  # schema, and pending flags
        n = len(st.pending())
    with psycopg.connect(host=server.root, port=server.port, dbname=db, user=owner,
                         password="owner-secret", autocommit=True) as conn:
        conn.execute(named(_doc_sql("GRANT CONNECT")))
    with BenchmarkStore(server.url(db, worker, "worker-secret")) as st:
        with pytest.raises(FleetError, match="without the password in the URL"):
            profile_fleet(st, **FAST)  # never a password in Ray's task arguments
    passfile = local_ray / "pgpass"  # the workers' PGPASSFILE (and the driver's, here)
    passfile.write_text(f"*:*:{db}:{worker}:worker-secret\n")
    passfile.chmod(0o600)
    monkeypatch.setenv("PGPASSFILE", str(passfile))
    with BenchmarkStore(server.url(db, worker)) as st:
        sweep = profile_fleet(st, **FAST)
        st.refresh()
        assert len(sweep.records) == n and {r["status"] for r in sweep.records} == {"PASSED"}
        assert len(st.traces()) == n and st.pending() == []
    server.drop_db(db)


COMPILE = textwrap.dedent('''
    import json, sys
    import numpy as np
    import tgx, tgx.numpy as tnp
    from tgx.planning.cost_model import CostModel
    from tgx.store import BenchmarkStore

    def f(x):
        return tnp.exp(x) * 2.0

    X = np.linspace(-1, 1, 256).astype(np.float32)
    url = sys.argv[1]
    plan = tgx.compile(f, store=url, policy="fastest", backends=["numpy"]).lower(X)
    np.testing.assert_allclose(plan(X), np.exp(X) * 2, rtol=1e-6)
    st = BenchmarkStore(url)
    cm = CostModel(st)
    rows = []
    for e, k, est in zip(plan.graph.eqns, plan.kernels, plan.estimates):
        if e.primitive.name == "copy_to":
            continue
        g, w = cm.keys(e, {})
        best = st.best(g, w, cm.env_id)
        rows.append({"source": est.source, "chosen": cm.impl_key(k),
                     "best": best and best["impl"], "pending": len(st.pending())})
    print(json.dumps(rows))
''')


def test_tgx_profile_ray_fills_a_postgresql_store_another_process_plans_from(
        local_ray, pg_url, tmp_path, capsys):  # noqa: F811
    script = tmp_path / "compile.py"
    script.write_text(COMPILE)

    def compile_elsewhere() -> list[dict]:
        r = subprocess.run([sys.executable, str(script), pg_url], capture_output=True,
                           text=True, timeout=240, cwd=ROOT)
        assert r.returncode == 0, r.stderr
        return json.loads(r.stdout.strip().splitlines()[-1])

    first = compile_elsewhere()  # nothing measured: the cost model, and pending flags
    assert {r["source"] for r in first} != {"measured"} and first[0]["pending"] >= 4
    assert main(["profile", "--ray", "--store", pg_url, "--budget", "0.01",
                 "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "fleet: 1 node, 2 jobs at once" in out and "PASSED" in out, out
    then = compile_elsewhere()
    assert then and all(r["source"] == "measured" for r in then), then
    assert all(r["chosen"] == r["best"] for r in then), then  # the measured fastest
    assert then[0]["pending"] == 0
