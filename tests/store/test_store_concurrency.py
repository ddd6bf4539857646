"""Several processes and threads writing one store at once: nothing lost, nothing doubled."""

from __future__ import annotations

import json
import multiprocessing as mp
import time
from concurrent.futures import ThreadPoolExecutor

from tgx.store import BenchmarkStore

N_PROCS, PER_PROC, BATCH = 8, 500, 50


def _rows(tag: str, start: int, n: int) -> list[dict]:
    return [{"graph_hash": f"g{i % 3}", "impl": f"k-{tag}", "workload": "w", "env_id": "e",
             "status": "PASSED", "median_s": 1e-6 * (i + 1), "log": f"{tag}:{i}"}
            for i in range(start, start + n)]


def _process_writer(path: str, tag: str, ready, start_evt) -> None:
    """Runs in a spawned process: report ready, wait for the start signal, write in batches."""
    store = BenchmarkStore(path)
    ready.put(tag)
    start_evt.wait()
    for start in range(0, PER_PROC, BATCH):
        store.add_traces(_rows(tag, start, BATCH))
        store.add_graph(f"shared-{start}", "dup", b"x")  # every process races on dedupe
    store.close()


def _check_file(path: str, tags: list[str], per_tag: int) -> None:
    with open(path, encoding="utf-8") as f:
        doc = json.load(f)  # valid JSON, or this raises
    traces = list(doc["traces"].values())
    assert len(traces) == len(tags) * per_tag
    logs = sorted(t["log"] for t in traces)
    assert logs == sorted(f"{tag}:{i}" for tag in tags for i in range(per_tag))
    assert sorted(map(int, doc["traces"])) == list(range(1, len(traces) + 1))


def test_many_processes_write_concurrently(tmp_path):
    path = str(tmp_path / "store.json")
    BenchmarkStore(path).close()
    ctx = mp.get_context("spawn")
    start_evt, ready = ctx.Event(), ctx.Queue()
    tags = [f"p{i}" for i in range(N_PROCS)]
    procs = [ctx.Process(target=_process_writer, args=(path, t, ready, start_evt))
             for t in tags]
    for p in procs:
        p.start()
    for _ in tags:  # every child has imported tgx and opened the store: writes overlap
        ready.get(timeout=120)
    t0 = time.perf_counter()
    start_evt.set()
    for p in procs:
        p.join(timeout=120)
    elapsed = time.perf_counter() - t0
    assert [p.exitcode for p in procs] == [0] * N_PROCS
    _check_file(path, tags, PER_PROC)
    with BenchmarkStore(path) as st:
        assert len(st) == N_PROCS * PER_PROC == 4000
        assert st.stats()["counts"]["canonical_graphs"] == PER_PROC // BATCH
        assert st.best("g0", "w", "e")["median_s"] == 1e-6
    print(f"{N_PROCS} processes x {PER_PROC} traces: {elapsed:.2f} s")


def test_threads_sharing_one_store_and_threads_with_their_own(tmp_path):
    path = str(tmp_path / "store.json")
    shared = BenchmarkStore(path)

    def writer(tag: str, own: bool) -> None:
        store = BenchmarkStore(path) if own else shared
        for start in range(0, 200, 20):
            store.add_traces(_rows(tag, start, 20))
            store.best("g0", "w", "e")  # readers interleave with writers

    tags = [f"t{i}" for i in range(6)]
    with ThreadPoolExecutor(len(tags)) as pool:
        futures = [pool.submit(writer, t, i % 2 == 0) for i, t in enumerate(tags)]
        for fut in futures:
            fut.result()  # re-raises a writer thread's exception here
    _check_file(path, tags, 200)
    assert len(shared) == 1200
