"""Benchmark of the benchmark store: insert throughput, open time and `best()` latency.

Run standalone:  python bench/bench_store.py [--traces 100000] [--batch 5000]
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tgx.store import BenchmarkStore


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
        rows = []
        for _ in range(min(batch, n_traces - done)):
            g, w, e = keys[rng.randrange(len(keys))]
            rows.append({
                "graph_hash": g, "workload": w, "env_id": e, "impl": rng.choice(impls),
                "status": "PASSED" if rng.random() < 0.9 else "RUNTIME_ERROR",
                "median_s": rng.uniform(1e-5, 1e-2), "min_s": 1e-5, "spread": 0.02,
                "samples": 30, "max_abs_err": 1e-6, "max_rel_err": rng.uniform(0, 1e-4),
                "ulp_err": 2.0, "log": ""})
        store.add_traces(rows)
        done += len(rows)
    return keys, n_traces / (time.perf_counter() - t0)


def main(argv: list[str] | None = None) -> None:
    """Print insert throughput, open time and µs per `best()` query."""
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--traces", type=int, default=100_000)
    ap.add_argument("--batch", type=int, default=5_000)
    ap.add_argument("--queries", type=int, default=100_000)
    args = ap.parse_args(argv)
    rng = random.Random(0)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "store.json")
        with BenchmarkStore(path) as store:
            keys, rate = populate(store, args.traces, args.batch, rng)
        size = os.path.getsize(path)
        print(f"insert: {args.traces} traces in batches of {args.batch}: {rate:,.0f} traces/s")

        t0 = time.perf_counter()
        store = BenchmarkStore(path)
        t_open = time.perf_counter() - t0
        print(f"open:   {t_open * 1e3:.0f} ms for {len(store)} traces ({size / 2**20:.1f} MiB)")

        qs = [keys[rng.randrange(len(keys))] for _ in range(args.queries)]
        t0 = time.perf_counter()
        hits = sum(store.best(g, w, e) is not None for g, w, e in qs)
        t_best = (time.perf_counter() - t0) / len(qs)
        print(f"best(): {t_best * 1e6:.2f} us/query ({hits}/{len(qs)} hits)")

        t0 = time.perf_counter()
        for g, w, e in qs:
            store.best(g, w, e, tolerance=5e-5)
        t_tol = (time.perf_counter() - t0) / len(qs)
        print(f"best(tolerance=5e-5): {t_tol * 1e6:.2f} us/query")

        t0 = time.perf_counter()
        store.add_trace(graph_hash=keys[0][0], workload=keys[0][1], env_id=keys[0][2],
                        impl="k-extra", status="PASSED", median_s=1e-6)
        print(f"one add_trace at {len(store)} traces: {(time.perf_counter() - t0) * 1e3:.0f} ms")
        store.close()


if __name__ == "__main__":
    main()
