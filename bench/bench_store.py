"""Benchmark of the benchmark store, per engine: insert rate (batched and one trace per
write), open time, and the planner's cached queries (`best()`, the nearest-workload list
`workloads_for()`), at each store size.

Run standalone:  python bench/bench_store.py [--engines tinydb,sqlite,postgresql]
                 [--sizes 10000,100000] [--batch 5000] [--pg-url URL]
                 [--fleet] [--fleet-budget 0.05]

`--fleet` adds the profiling fleet's throughput against the sequential profiler: the same
pending kernels (the "fastest" policy's flags for an elementwise chain and a matmul + relu
at three sizes, NumPy, torch and JAX kernels) measured by ``tgx profile --pending`` in one
process, and by `profile_fleet` on a local Ray with this machine's cores (one core per
timing), into an SQLite store (the driver writes) and a PostgreSQL store (the workers
write); `--fleet-only` skips the engine rows.

PostgreSQL: `--pg-url` names an empty database; without it a throw-away server is started
from the local PostgreSQL binaries (tests/store/pgserver.py), fsync on, as a real server
runs (skipped when there are none).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tgx.store import BenchmarkStore  # noqa: E402


def populate(store: BenchmarkStore, n_traces: int, batch: int, rng: random.Random
             ) -> tuple[list[tuple[str, str, str]], float]:
    """Fill `store` with `n_traces` traces over 50 graphs x 20 workloads x 10 impls.

    Returns the (graph, workload, env) keys and the insert throughput in traces/s.
    """
    env = store.add_environment({"cpu_model": "bench", "cpu_cores": 1})
    graphs = [store.add_graph(f"graph{g:03d}", f"g{g}", b"\x00" * 64) for g in range(50)]
    impls = [store.add_implementation("KERNEL", f"k{i}", "numpy", f"src{i}") for i in range(10)]
    keys = []
    for g in graphs:
        for n in range(20):
            w = store.add_workload(g, {"N": 2 ** (n % 12), "B": n}, [((n + 1, 64), "float32")])
            keys.append((g, w, env))
    t0 = time.perf_counter()
    done = 0
    while done < n_traces:
        store.add_traces(_rows(keys, impls, min(batch, n_traces - done), rng))
        done += min(batch, n_traces - done)
    return keys, n_traces / (time.perf_counter() - t0)


def _rows(keys: list, impls: list, n: int, rng: random.Random) -> list[dict]:
    rows = []
    for _ in range(n):
        g, w, e = keys[rng.randrange(len(keys))]
        rows.append({
            "graph_hash": g, "workload": w, "env_id": e, "impl": rng.choice(impls),
            "status": "PASSED" if rng.random() < 0.9 else "RUNTIME_ERROR",
            "median_s": rng.uniform(1e-5, 1e-2), "min_s": 1e-5, "spread": 0.02,
            "samples": 30, "max_abs_err": 1e-6, "max_rel_err": rng.uniform(0, 1e-4),
            "ulp_err": 2.0, "log": ""})
    return rows


def _per_call(fn, n: int) -> float:
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t0) / n


@contextlib.contextmanager
def _postgres(url: str | None) -> Iterator[object]:
    """Yields a factory of empty database URLs, or None without PostgreSQL."""
    if url:
        yield lambda: url
        return
    try:
        from tests.store.pgserver import PostgresServer, find_bin_dir
        bin_dir = find_bin_dir()
        if bin_dir is None:
            raise RuntimeError("no PostgreSQL binaries")
        server = PostgresServer(bin_dir, fsync=True)
    except Exception as err:  # noqa: BLE001 - the other engines still run
        print(f"postgresql: skipped ({err})")
        yield None
        return
    try:
        yield lambda: server.url(server.create_db())
    finally:
        server.stop()


def bench_engine(engine: str, make_url, size: int, batch: int, queries: int,
                 rng: random.Random) -> dict:
    """The figures of one engine at one store size."""
    url = make_url()
    with BenchmarkStore(url) as store:
        keys, rate = populate(store, size, batch, rng)
        impls = [i["key"] for i in store.implementations()]
        n_single = 20 if engine == "tinydb" else 200  # TinyDB rewrites the whole file
        t0 = time.perf_counter()
        for row in _rows(keys, impls, n_single, rng):
            store.add_trace(**row)
        single = n_single / (time.perf_counter() - t0)
    t0 = time.perf_counter()
    store = BenchmarkStore(url)
    t_open = time.perf_counter() - t0
    qs = [keys[rng.randrange(len(keys))] for _ in range(queries)]
    it = iter(qs * 2)
    t_best = _per_call(lambda: store.best(*next(it)), queries)
    t_tol = _per_call(lambda: store.best(*next(it), tolerance=5e-5), queries)
    g, _, e = keys[0]
    t_near = _per_call(lambda: store.workloads_for(g, e), queries // 10)
    fresh = BenchmarkStore(url, refresh_s=0)  # checks for other writers on every query
    it = iter(qs)
    t_best0 = _per_call(lambda: fresh.best(*next(it)), min(queries, 5000))
    out = {"engine": engine, "traces": len(store), "batched": rate, "single": single,
           "open_s": t_open, "best_us": t_best * 1e6, "best_tol_us": t_tol * 1e6,
           "near_us": t_near * 1e6, "best_checked_us": t_best0 * 1e6}
    store.close()
    fresh.close()
    return out


BACKENDS = ["numpy", "torch", "jax"]


def _flag_sweep(url: str, sizes: tuple = ((4096, 262144, 4194304), (16, 256, 1024))) -> int:
    """Pending flags of the "fastest" policy for an elementwise chain and a matmul + relu,
    each at three sizes, on NumPy, torch and JAX; how many."""
    import numpy as np

    import tgx
    import tgx.nn as tnn
    import tgx.numpy as tnp

    rng = np.random.default_rng(0)
    with BenchmarkStore(url) as st:
        for n in sizes[0]:
            x = rng.standard_normal(n).astype(np.float32)
            tgx.compile(lambda v: tnp.tanh(tnp.exp(v) * 2.0) - v, store=st,
                        backends=BACKENDS).lower(x)
        for m in sizes[1]:
            a = rng.standard_normal((m, 1024)).astype(np.float32)
            w = rng.standard_normal((1024, 1024)).astype(np.float32)
            tgx.compile(lambda u, v: tnn.relu(u @ v), store=st, backends=BACKENDS).lower(a, w)
        return len(st.pending())


WARMUP = ((64,), (4,))  # other shapes: no JAX compile cache is shared with the sweep


def bench_fleet(make_url, engine: str, budget: float) -> dict:
    """The same pending kernels profiled sequentially (``tgx profile --pending``, in a
    process of its own) and by a local Ray fleet. Warm: that process, or the fleet's
    workers, first profiled the same
    graphs at other shapes (imports of tgx, torch and JAX done; no compile cache shared);
    cold: a fresh Ray whose workers start during the sweep, as ``tgx profile --ray`` runs
    (plus Ray's own start, shown apart)."""
    import ray

    from tgx.profiling.fleet import profile_fleet

    def flags(sizes=None) -> tuple[str, int]:
        url = make_url()
        return url, _flag_sweep(url, *(() if sizes is None else (sizes,)))

    (seq_url, n), (warm_url, n_warm), (cold_url, n_cold) = flags(), flags(), flags()
    assert n == n_warm == n_cold
    # in a process of its own: this one's JAX compile cache holds the other engine's sweep
    code = ("import sys, time, contextlib, os; from tgx.cli import main\n"
            "with contextlib.redirect_stdout(open(os.devnull, 'w')):\n"
            "    for url in sys.argv[2:]:  # the last one timed\n"
            "        t0 = time.perf_counter()\n"
            "        main(['profile', '--pending', '--store', url, '--budget', sys.argv[1],\n"
            "              '--no-progress'])\n"
            "print(time.perf_counter() - t0)\n")
    r = subprocess.run([sys.executable, "-c", code, str(budget), flags(WARMUP)[0], seq_url],
                       capture_output=True, text=True, check=True)
    t_seq = float(r.stdout.strip().splitlines()[-1])
    wall = {}
    for url, warm in ((warm_url, True), (cold_url, False)):
        t0 = time.perf_counter()
        ray.init(include_dashboard=False, log_to_driver=False)  # this machine's cores
        t_init = time.perf_counter() - t0
        try:
            if warm:
                with BenchmarkStore(flags(WARMUP)[0]) as st:
                    profile_fleet(st, budget_s=budget, progress=False)
            with BenchmarkStore(url) as st:
                sweep = profile_fleet(st, budget_s=budget, progress=False)
                assert len(st.traces()) == n and st.pending() == []
                wall[warm] = sweep.wall_s
        finally:
            ray.shutdown()
    return {"engine": engine, "jobs": n, "seq_s": t_seq, "cold_s": wall[False],
            "warm_s": wall[True], "init_s": t_init, "slots": sweep.slots}


def main(argv: list[str] | None = None) -> None:
    """Print one row per engine and store size (and, with --fleet, the sweeps)."""
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--engines", default="tinydb,sqlite,postgresql")
    ap.add_argument("--sizes", default="10000,100000")
    ap.add_argument("--batch", type=int, default=5_000)
    ap.add_argument("--queries", type=int, default=100_000)
    ap.add_argument("--pg-url", help="an empty PostgreSQL database (default: a local one)")
    ap.add_argument("--fleet", action="store_true",
                    help="also the Ray fleet against the sequential profiler")
    ap.add_argument("--fleet-only", action="store_true", help="only the fleet figures")
    ap.add_argument("--fleet-budget", type=float, default=0.05,
                    help="timing budget per kernel in the sweeps (s)")
    args = ap.parse_args(argv)
    if args.fleet_only:
        args.fleet, args.sizes = True, ""
    engines = args.engines.split(",")
    sizes = [int(s) for s in args.sizes.split(",") if s]
    rows, fleet = [], []
    with tempfile.TemporaryDirectory() as tmp, \
            _postgres(args.pg_url if "postgresql" in engines else "-") as pg:
        counter = iter(range(10**6))
        makers = {"tinydb": lambda: os.path.join(tmp, f"s{next(counter)}.json"),
                  "sqlite": lambda: f"sqlite:///{tmp}/s{next(counter)}.db",
                  "postgresql": pg}
        for engine in engines:
            if makers.get(engine) is None:
                continue
            for size in sizes:
                r = bench_engine(engine, makers[engine], size, args.batch, args.queries,
                                 random.Random(0))
                rows.append(r)
                print(f"{engine:<10} {r['traces']:>7} traces: insert {r['batched']:>8,.0f}/s "
                      f"batched ({args.batch}), {r['single']:>6,.0f}/s single; open "
                      f"{r['open_s'] * 1e3:>6.0f} ms; best() {r['best_us']:.2f} us, "
                      f"tolerance {r['best_tol_us']:.2f} us, workloads_for "
                      f"{r['near_us']:.2f} us; best() checking every query "
                      f"{r['best_checked_us']:.1f} us", flush=True)
        if args.fleet:
            for engine in ("sqlite", "postgresql"):
                if engine in engines and makers.get(engine) is not None:
                    f = bench_fleet(makers[engine], engine, args.fleet_budget)
                    fleet.append(f)
                    print(f"{engine:<10} sweep of {f['jobs']} kernels: sequential "
                          f"{f['seq_s']:.1f} s; fleet on {f['slots']} core sets "
                          f"{f['warm_s']:.1f} s (warm workers), {f['cold_s']:.1f} s (workers "
                          f"starting) +{f['init_s']:.1f} s to start Ray", flush=True)
    if fleet:
        print()
        print("| store | kernels | sequential, warm | Ray fleet, warm workers | Ray fleet, "
              "workers starting | + Ray start |")
        print("|---|---:|---:|---:|---:|---:|")
        for f in fleet:
            j = f["jobs"]
            print(f"| {f['engine']} | {j} | {f['seq_s']:.1f} s ({j / f['seq_s']:.1f}/s) | "
                  f"{f['warm_s']:.1f} s ({j / f['warm_s']:.1f}/s, "
                  f"{f['seq_s'] / f['warm_s']:.2f}x) | {f['cold_s']:.1f} s "
                  f"({j / f['cold_s']:.1f}/s, {f['seq_s'] / f['cold_s']:.2f}x) | "
                  f"{f['init_s']:.1f} s |")
    if not rows:
        return
    print()
    print(f"| engine | traces | insert, batches of {args.batch} | insert, one per write | "
          "open | `best()` | `best(tolerance=)` | `workloads_for()` | `best()`, `refresh_s=0` |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['engine']} | {r['traces']:,} | {r['batched']:,.0f}/s | "
              f"{r['single']:,.0f}/s | {r['open_s'] * 1e3:,.0f} ms | {r['best_us']:.1f} µs | "
              f"{r['best_tol_us']:.1f} µs | {r['near_us']:.1f} µs | "
              f"{r['best_checked_us']:.1f} µs |")


if __name__ == "__main__":
    main()
