"""The profiling fleet: ``tgx profile --ray [ADDRESS]`` measures a store's pending and
unprofiled kernels on Ray workers.

The driver (this process) lists the jobs (`tgx.profiling.pending.pending_jobs`: data naming
registered kernels, never code) for the environment of every node of the cluster, and hands
each to a node of that environment, as many at once as the node has core sets (its CPUs //
`cores`). A worker takes a free core set of its node (a lock file per set, so two fleets on
one node never time on the same cores either), pins itself to it, resolves the kernel in its
own registry, measures it and returns (or writes) the trace. A job whose worker dies is
retried `retries` times, then recorded as RUNTIME_ERROR; one still running `timeout_s` after
it started is killed and recorded as TIMEOUT; the sweep goes on. (A job no worker started
within `startup_s` is left for the next sweep: not the kernel's doing.)

Where traces are written: a PostgreSQL store is written by the workers themselves, each
under its node's environment, a claim (`BenchmarkStore.claim`) held per job so two fleets
never measure one job twice and a killed worker's job goes back to the pool. A TinyDB or
SQLite store is a file other nodes cannot share: workers return their traces and the driver
writes them, in batches. Ray is imported only here, and only when a fleet runs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import os
import sys
import tempfile
import time
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

from tgx.errors import TgxError
from tgx.profiling.pending import (
    measure_job,
    pending_jobs,
    refused_record,
    resolve_kernel,
    settle_flags,
)
from tgx.profiling.progress import Progress
from tgx.profiling.speedup import fill_speedup, is_reference
from tgx.store import BenchmarkStore, Status, sniff_environment
from tgx.store.schema import TRACE_FIELDS

#: Seconds a job may wait for a worker to start it (a fresh process imports tgx); past it,
#: the job is left for the next sweep (not the kernel's doing: no trace).
STARTUP_S = 120.0
#: Traces the driver writes at once (TinyDB and SQLite stores).
BATCH = 20


class FleetError(TgxError):
    """The fleet could not run: Ray missing or unreachable, no node fits a job."""


@dataclasses.dataclass
class Sweep:
    """What a fleet did: the trace `records` (every status), harness failures `skipped`
    (messages), jobs another fleet had `claimed` or measured meanwhile, `stale` jobs (no
    such kernel on the worker), the `nodes` used {node id: env id}, `slots` (jobs at once)
    and `wall_s`."""

    records: list[dict]
    skipped: list[str]
    claimed: int
    stale: int
    nodes: dict[str, str]
    slots: int
    wall_s: float


def import_ray() -> Any:
    """Ray, or a `FleetError` saying how to install it (the ``fleet`` extra)."""
    try:
        import ray
    except ImportError as err:
        raise FleetError(f"the profiling fleet needs Ray ({err}): pip install "
                         "'tgx-trace[fleet]'") from None
    return ray


def profile_fleet(store: Any, *, address: str | None = None, cores: int = 1,
                  budget_s: float | None = None, timeout_s: float = 60.0, retries: int = 1,
                  startup_s: float = STARTUP_S, unprofiled: bool = True,
                  progress: bool | None = None,
                  on_error: Callable[[str], None] | None = None) -> Sweep:
    """Measure the store's pending (and, with `unprofiled`, unprofiled) kernels on Ray.

    `address`: a Ray cluster (``"auto"``, ``"ray://host:10001"``, ``"host:6379"``); None
    uses Ray as already initialised in this process, else starts a local one on this
    machine's cores. `cores`: the cores one timing gets (a Ray task's ``num_cpus``, and the
    core set it is pinned to). `budget_s`: timing budget per job; `timeout_s`, `retries`,
    `startup_s`: see the module doc. Failures of the harness (not of a kernel) go to
    `on_error` and leave the job for the next sweep.

    Example (a local Ray; ``st`` an open store with pending flags)::

        sweep = profile_fleet(st, cores=1, budget_s=0.05)
        print(summarize(sweep.records))
    """
    ray = import_ray()
    report = on_error or (lambda msg: print(f"tgx profile: {msg}", file=sys.stderr))
    started = not ray.is_initialized()
    t0 = time.perf_counter()
    if started:
        try:
            ray.init(address=address or None, include_dashboard=False, log_to_driver=False)
        except Exception as err:
            raise FleetError(f"cannot start or reach Ray{f' at {address}' if address else ''}"
                             f": {type(err).__name__}: {err}") from None
    try:
        return _Driver(ray, store, cores, budget_s, timeout_s, retries, startup_s,
                       unprofiled, progress, report).run(t0)
    finally:
        if started:
            ray.shutdown()


class _Driver:
    def __init__(self, ray, store, cores, budget_s, timeout_s, retries, startup_s,
                 unprofiled, progress, report):
        if cores < 1:
            raise FleetError(f"cores must be at least 1, got {cores}")
        self.ray, self.store, self.cores = ray, store, int(cores)
        self.budget_s, self.timeout_s, self.retries = budget_s, timeout_s, retries
        self.startup_s, self.unprofiled = startup_s, unprofiled
        self.progress, self.report = progress, report
        # workers write a PostgreSQL store themselves; other engines through the driver
        self.direct = getattr(store, "engine", "") == "postgresql"
        target = getattr(store, "_target", None)
        if self.direct and target is not None and target.password:
            # the workers get the URL without it: never a password in Ray's task arguments
            raise FleetError(f"{store.url}: a fleet's workers connect without the password "
                             "in the URL; give it in ~/.pgpass, PGPASSWORD or a service "
                             "file on every node instead (docs/store.md)")
        self.records: list[dict] = []
        self.skipped: list[str] = []
        self.claimed = 0
        self.stale: dict[str, list[str]] = {}  # env -> stale flag keys
        self.dead: set[str] = set()  # nodes gone during the sweep: given no more jobs
        self.batch: list[tuple[dict, list[str]]] = []

    # ---------------------------------------------------------------- nodes and jobs

    def _nodes(self) -> dict[str, dict]:
        """{node id: {"env": env record, "slots": n}} of the live nodes a job fits on."""
        ray = self.ray
        pin = ray.util.scheduling_strategies.NodeAffinitySchedulingStrategy
        nodes = [n for n in ray.nodes() if n.get("Alive")]
        fits = [n for n in nodes if n.get("Resources", {}).get("CPU", 0) >= self.cores]
        if not fits:
            raise FleetError(f"no Ray node has {self.cores} CPUs for a job (nodes: "
                             + ", ".join(f"{n.get('NodeManagerAddress')}: "
                                         f"{n.get('Resources', {}).get('CPU', 0):g} CPUs"
                                         for n in nodes) + "); give fewer --cores")
        probe = ray.remote(num_cpus=0, max_retries=1)(_probe)
        refs = {n["NodeID"]: probe.options(scheduling_strategy=pin(n["NodeID"], soft=False))
                .remote() for n in fits}
        out = {}
        for n in fits:
            try:
                env = ray.get(refs[n["NodeID"]], timeout=max(60.0, self.startup_s))
            except Exception as err:  # a node that cannot run tgx is left out
                self.report(f"node {n.get('NodeManagerAddress')} left out: it could not "
                            f"describe its environment ({type(err).__name__}: {err})")
                continue
            slots = int(n["Resources"]["CPU"]) // self.cores
            out[n["NodeID"]] = {"env": env, "slots": slots}
        if not out:
            raise FleetError("no Ray node could run tgx (is tgx installed on the nodes?)")
        return out

    def _units(self, envs: list[str]) -> list[dict]:
        """One unit per (job, environment) still to measure; refused jobs are recorded."""
        units = []
        refused = []
        for env in envs:
            for job in pending_jobs(self.store, env, unprofiled=self.unprofiled):
                if job.get("refuse"):
                    refused.append(refused_record(job, env))
                else:
                    units.append({"job": job, "env": env, "tries": 0})
        if refused:
            self.store.add_traces(refused)
            self.records += refused
        return units

    # ---------------------------------------------------------------- the sweep

    def run(self, t0: float) -> Sweep:
        ray = self.ray
        pin = ray.util.scheduling_strategies.NodeAffinitySchedulingStrategy
        nodes = self._nodes()
        for n in nodes.values():
            self.store.add_environment(n["env"])
        envs = list(dict.fromkeys(n["env"]["id"] for n in nodes.values()))
        queue = deque(self._units(envs))
        bar = Progress(len(queue) + len(self.records), enabled=self.progress)
        for r in self.records:
            bar.update(f"{r['impl']}: {r['status']} (refused)")
        # a job waits while the reference of its graph x workload x environment is still to
        # be measured in this sweep: its speedup is computed against it
        refs_left: dict[tuple, int] = {}
        for u in queue:
            if is_reference(u["job"]["impl"]):
                k = _gwe(u)
                refs_left[k] = refs_left.get(k, 0) + 1
        # a streaming task: it reports "started" first, so a job's timeout counts from when
        # it runs, not from when it waited for a worker process to start
        run = ray.remote(max_retries=0, num_returns="streaming")(_run_job)
        free = {nid: n["slots"] for nid, n in nodes.items()}
        running: dict[Any, dict] = {}
        url = self.store.url if self.direct else None
        try:
            while queue or running:
                for nid, n in nodes.items():
                    while free[nid] > 0 and nid not in self.dead:
                        unit = self._next(queue, n["env"]["id"], refs_left)
                        if unit is None:
                            break
                        free[nid] -= 1
                        unit.update(node=nid, t=time.monotonic(), started=None)
                        unit["tries"] += 1
                        gen = run.options(num_cpus=self.cores, scheduling_strategy=pin(
                            nid, soft=False)).remote(
                                unit["job"], n["env"]["id"], url, self.budget_s, self.cores)
                        running[gen] = unit
                if not running:
                    if queue:  # jobs for environments no live node has
                        for u in queue:
                            self.report(f"skipped {u['job']['label']}: no live node of "
                                        f"environment {u['env']}")
                        queue.clear()
                    break
                done, _ = ray.wait(list(running), num_returns=1, timeout=0.2)
                for gen in done:
                    unit = running[gen]
                    if self._step(ray, gen, unit, queue, refs_left, bar):
                        running.pop(gen)
                        free[unit["node"]] += 1
                now = time.monotonic()
                for gen, unit in list(running.items()):
                    late = (now - unit["started"] > self.timeout_s if unit["started"] else
                            now - unit["t"] > self.startup_s)
                    if not late:
                        continue
                    ray.cancel(gen, force=True)  # kills the worker process
                    running.pop(gen)
                    free[unit["node"]] += 1
                    if unit["started"]:
                        self._failed(unit, Status.TIMEOUT, f"killed after "
                                     f"{now - unit['started']:.1f} s (timeout "
                                     f"{self.timeout_s:g} s) on a Ray worker", refs_left, bar)
                    else:  # no worker took it: not the kernel's doing, left for later
                        self._skip(unit, f"no Ray worker started it within "
                                         f"{self.startup_s:g} s", refs_left, bar)
        finally:
            for ref in running:
                with contextlib.suppress(Exception):
                    ray.cancel(ref, force=True)
            self._flush()
            bar.close()
        self.store.refresh()
        for env in envs:
            settle_flags(self.store, env, self.stale.get(env, []))
        return Sweep(self.records, self.skipped, self.claimed,
                     sum(len(v) for v in self.stale.values()),
                     {nid: n["env"]["id"] for nid, n in nodes.items()},
                     sum(n["slots"] for n in nodes.values()), time.perf_counter() - t0)

    def _next(self, queue: deque, env: str, refs_left: dict) -> dict | None:
        for i, u in enumerate(queue):
            if u["env"] != env:
                continue
            if not is_reference(u["job"]["impl"]) and refs_left.get(_gwe(u)):
                continue
            if not self.direct and self.store.measured(
                    u["job"]["graph_hash"], u["job"]["impl"], u["job"]["workload"],
                    env) is not None:  # another fleet measured it meanwhile
                del queue[i]
                self.claimed += 1
                self._done_ref(u, refs_left)
                return self._next(queue, env, refs_left)
            del queue[i]
            return u
        return None

    def _done_ref(self, unit: dict, refs_left: dict) -> None:
        if is_reference(unit["job"]["impl"]) and refs_left.get(_gwe(unit)):
            refs_left[_gwe(unit)] -= 1

    def _step(self, ray, gen, unit, queue, refs_left, bar) -> bool:
        """Take the next item of a job's task; True when the job is over."""
        label = unit["job"]["label"]
        try:
            what, rec = ray.get(next(gen))
        except StopIteration:
            self._skip(unit, "its task ended without a result", refs_left, bar)
            return True
        except ray.exceptions.TaskCancelledError:
            return True
        except (ray.exceptions.WorkerCrashedError, ray.exceptions.NodeDiedError,
                ray.exceptions.ObjectLostError) as err:
            if isinstance(err, ray.exceptions.NodeDiedError):
                self.dead.add(unit["node"])  # not the kernel's doing: on another node
                unit["tries"] -= 1
            if unit["tries"] <= self.retries:
                queue.appendleft(unit)  # the worker died (a crash, or killed): again
                return True
            self._failed(unit, Status.RUNTIME_ERROR,
                         f"the Ray worker died while profiling it, {unit['tries']} times "
                         f"(a crash of the kernel, or the process was killed): "
                         f"{type(err).__name__}", refs_left, bar)
            return True
        except Exception as err:  # noqa: BLE001 - the harness failed, not the kernel
            lines = str(err).strip().splitlines()
            self._skip(unit, lines[-1] if lines else type(err).__name__, refs_left, bar)
            return True
        if what == "started":
            unit["started"] = time.monotonic()
            return False
        self._done_ref(unit, refs_left)
        if what == "stale":
            self.stale.setdefault(unit["env"], []).extend(unit["job"]["flags"])
            bar.update(f"{label}: no such kernel here")
        elif what == "claimed":
            self.claimed += 1
            bar.update(f"{label}: measured by another fleet")
        else:
            self.records.append(rec)
            if not self.direct:
                self.batch.append((rec, unit["job"]))
                if len(self.batch) >= BATCH:
                    self._flush()
            bar.update(f"{label}: {rec['status']}")
        return True

    def _skip(self, unit: dict, why: str, refs_left: dict, bar) -> None:
        """A harness failure: reported, nothing recorded, the job left for the next sweep."""
        self.skipped.append(f"skipped {unit['job']['label']}: {why}")
        self.report(self.skipped[-1])
        self._done_ref(unit, refs_left)
        bar.update(f"{unit['job']['label']} (skipped)")

    def _failed(self, unit: dict, status: Status, why: str, refs_left: dict, bar) -> None:
        """Record a job the fleet could not measure (TIMEOUT, worker died)."""
        job = unit["job"]
        rec = dict.fromkeys(TRACE_FIELDS)
        rec.update(graph_hash=job["graph_hash"], impl=job["impl"], workload=job["workload"],
                   env_id=unit["env"], timestamp=time.time(), status=status.value, log=why)
        self.records.append(rec)
        self.batch.append((rec, job))
        self._flush()
        self._done_ref(unit, refs_left)
        bar.update(f"{job['label']}: {status.value}")

    def _flush(self) -> None:
        """Write the traces the driver holds (with their workloads and implementations)."""
        if not self.batch:
            return
        batch, self.batch = self.batch, []
        for _, job in batch:
            _record_keys(self.store, job)
        recs = fill_speedup([r for r, _ in batch], self.store)
        self.store.add_traces(recs)
        flags = [k for _, job in batch for k in job["flags"]]
        self.store.clear_pending(flags)


def _gwe(unit: dict) -> tuple:
    j = unit["job"]
    return (j["graph_hash"], j["workload"], unit["env"])


def _record_keys(store: Any, job: dict) -> None:
    """The workload and implementation records a job's trace names."""
    desc = job["equation"]
    inputs = [(tuple(d[0]), d[1]) for d in desc["inputs"] if not isinstance(d, dict)]
    store.add_workload(job["graph_hash"], desc.get("axes", {}), inputs)
    k = resolve_kernel(job)
    if k is not None:
        store.add_implementation("KERNEL", job["kernel"].get("label", k.label), k.backend,
                                 k.source_hash)


# -------------------------------------------------------------------- on a worker


def _probe() -> dict:
    """This node's environment (`sniff_environment`), on a Ray worker."""
    return sniff_environment()


_STORES: dict[str, Any] = {}


def _worker_store(url: str) -> Any:
    """The worker process's own connection to the store (kept between jobs)."""
    st = _STORES.get(url)
    if st is None:
        st = _STORES[url] = BenchmarkStore(url)
    return st


def _run_job(job: dict, env_id: str, url: str | None, budget_s: float | None,
             cores: int) -> Iterator[tuple[str, dict | None]]:
    """One job on a Ray worker (a streaming task): yields ("started", None), then
    ("measured", trace), ("stale", None) when no kernel here matches, or ("claimed", None)
    when another fleet has it. With `url` (a PostgreSQL store) the worker writes the trace
    itself, under a claim."""
    with contextlib.suppress(Exception):  # imports its backend: not part of the timeout
        resolve_kernel(job)
    yield "started", None
    yield _one_job(job, env_id, url, budget_s, cores)


def _one_job(job: dict, env_id: str, url: str | None, budget_s: float | None,
             cores: int) -> tuple[str, dict | None]:
    with _core_set(cores):
        if url is None:
            rec = measure_job(job, env_id, budget_s)
            return ("stale", None) if rec is None else ("measured", rec)
        st = _worker_store(url)
        key = f"{job['graph_hash']}|{job['workload']}|{job['impl']}|{env_id}"
        with st.claim(key) as mine:
            if not mine:
                return "claimed", None
            st.refresh()
            if st.measured(job["graph_hash"], job["impl"], job["workload"], env_id):
                return "claimed", None
            rec = measure_job(job, env_id, budget_s)
            if rec is None:
                return "stale", None
            _record_keys(st, job)
            st.add_trace(**fill_speedup([rec], st)[0])
        st.clear_pending(job["flags"])
        return "measured", rec


@contextlib.contextmanager
def _core_set(cores: int):
    """Hold a free set of `cores` of this node (a lock file per set, shared by every fleet
    on the node) and run pinned to it, thread pools capped to it."""
    mine = sorted(os.sched_getaffinity(0))
    sets = [mine[i:i + cores] for i in range(0, len(mine) - cores + 1, cores)] or [mine]
    lockdir = os.path.join(tempfile.gettempdir(), "tgx-fleet-cores")
    os.makedirs(lockdir, exist_ok=True)
    fd, chosen = None, None
    deadline = time.monotonic() + 60
    while fd is None:
        for s in sets:
            f = os.open(os.path.join(lockdir, f"cpu{s[0]}-{s[-1]}.lock"),
                        os.O_RDWR | os.O_CREAT, 0o666)
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                os.close(f)
                continue
            fd, chosen = f, s
            break
        if fd is None:
            if time.monotonic() > deadline:  # sets held by processes Ray does not know
                chosen = mine
                break
            time.sleep(0.05)
    try:
        os.sched_setaffinity(0, chosen)
        from threadpoolctl import threadpool_limits

        with threadpool_limits(limits=len(chosen)):
            yield chosen
    finally:
        os.sched_setaffinity(0, mine)
        if fd is not None:
            os.close(fd)  # releases the lock
