"""Several processes and threads writing one store at once, on every engine: nothing lost,
nothing doubled; a writer killed mid-write leaves the store consistent (SQL: the batch is
absent or whole; TinyDB: the old file, whole)."""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import signal
import time
from concurrent.futures import ThreadPoolExecutor

from tgx.store import BenchmarkStore, parse_target

N_PROCS, PER_PROC, BATCH = 8, 500, 50


def _rows(tag: str, start: int, n: int) -> list[dict]:
    return [{"graph_hash": f"g{i % 3}", "impl": f"k-{tag}", "workload": "w", "env_id": "e",
             "status": "PASSED", "median_s": 1e-6 * (i + 1), "log": f"{tag}:{i}"}
            for i in range(start, start + n)]


def _process_writer(url: str, tag: str, ready, start_evt) -> None:
    """Runs in a spawned process: report ready, wait for the start signal, write in batches."""
    store = BenchmarkStore(url)
    ready.put(tag)
    start_evt.wait()
    for start in range(0, PER_PROC, BATCH):
        store.add_traces(_rows(tag, start, BATCH))
        store.add_graph(f"shared-{start}", "dup", b"x")  # every process races on dedupe
    store.close()


def _check(url: str, tags: list[str], per_tag: int) -> None:
    with BenchmarkStore(url) as st:
        traces = st.traces()
        assert len(traces) == len(tags) * per_tag
        assert sorted(t["log"] for t in traces) == sorted(
            f"{tag}:{i}" for tag in tags for i in range(per_tag))
    target = parse_target(url)
    if target.engine == "tinydb":  # today's file: valid JSON, ids 1..n allocated once each
        with open(target.path, encoding="utf-8") as f:
            doc = json.load(f)
        assert sorted(map(int, doc["traces"])) == list(range(1, len(traces) + 1))


def test_many_processes_write_concurrently(store_url):
    BenchmarkStore(store_url).close()
    ctx = mp.get_context("spawn")
    start_evt, ready = ctx.Event(), ctx.Queue()
    tags = [f"p{i}" for i in range(N_PROCS)]
    procs = [ctx.Process(target=_process_writer, args=(store_url, t, ready, start_evt))
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
    _check(store_url, tags, PER_PROC)
    with BenchmarkStore(store_url) as st:
        assert len(st) == N_PROCS * PER_PROC == 4000
        assert st.stats()["counts"]["canonical_graphs"] == PER_PROC // BATCH
        assert st.best("g0", "w", "e")["median_s"] == 1e-6
    print(f"{parse_target(store_url).engine}: {N_PROCS} processes x {PER_PROC} traces: "
          f"{elapsed:.2f} s")


def test_threads_sharing_one_store_and_threads_with_their_own(store_url):
    shared = BenchmarkStore(store_url)

    def writer(tag: str, own: bool) -> None:
        store = BenchmarkStore(store_url) if own else shared
        for start in range(0, 200, 20):
            store.add_traces(_rows(tag, start, 20))
            store.best("g0", "w", "e")  # readers interleave with writers

    tags = [f"t{i}" for i in range(6)]
    with ThreadPoolExecutor(len(tags)) as pool:
        futures = [pool.submit(writer, t, i % 2 == 0) for i, t in enumerate(tags)]
        for fut in futures:
            fut.result()  # re-raises a writer thread's exception here
    _check(store_url, tags, 200)
    shared.refresh()
    assert len(shared) == 1200


# --------------------------------------------------------------------------- killed writers


def _stuck_writer(url: str, mid_write) -> None:
    """Runs in a spawned process: one whole batch, then a second batch that stops in the
    middle of its write (SQL: its INSERT sent, the transaction open; TinyDB: the new file
    half made, not yet renamed) and waits there to be killed."""
    store = BenchmarkStore(url)
    store.add_traces(_rows("whole", 0, 100))

    def stop_here(*_args, **_kw):
        mid_write.set()
        time.sleep(600)

    if store.engine == "tinydb":
        from tgx.store import db
        db.os.fsync = stop_here  # inside atomic_write_json, before os.replace
    else:
        import sqlalchemy as sa

        def after(conn, cursor, statement, *rest):
            if statement.startswith("INSERT INTO benchmark_traces"):
                stop_here()
        sa.event.listen(store._sa, "after_cursor_execute", after)
    store.add_traces(_rows("killed", 0, 1000) + [dict(_rows("killed", 0, 1)[0],
                                                      graph_hash="new-graph", impl="new-impl")])


def _endless_writer(url: str, started, name: str) -> None:
    store = BenchmarkStore(url)
    for n in range(10**6):
        store.add_traces(_rows(f"{name}b{n}", 0, BATCH))
        started.set()  # a first batch is in: the kill lands among later ones


def _kill(proc) -> None:
    os.kill(proc.pid, signal.SIGKILL)
    proc.join(timeout=60)
    assert proc.exitcode == -signal.SIGKILL


def _integrity(url: str) -> None:
    target = parse_target(url)
    if target.engine == "sqlite":
        import sqlite3

        with sqlite3.connect(target.path) as conn:
            assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)
            assert conn.execute("PRAGMA foreign_key_check").fetchall() == []


def test_a_writer_killed_mid_write_leaves_the_store_consistent(store_url):
    BenchmarkStore(store_url).close()
    ctx = mp.get_context("spawn")
    mid_write = ctx.Event()
    proc = ctx.Process(target=_stuck_writer, args=(store_url, mid_write))
    proc.start()
    assert mid_write.wait(timeout=120), "the writer never reached the middle of its write"
    _kill(proc)
    _integrity(store_url)
    with BenchmarkStore(store_url, lock_timeout=30) as st:  # its locks died with it
        assert len(st) == 100 and {t["log"].partition(":")[0] for t in st.traces()} == {"whole"}
        assert st.traces(graph_hash="new-graph") == []
        st.add_traces(_rows("after", 0, 10))
        st.add_graph("new-graph", "named by the killed batch", b"")
    with BenchmarkStore(store_url) as st:
        assert len(st) == 110 and st.get_graph("new-graph")["name"].startswith("named")
        assert st.dump_records()["traces"][-1]["log"] == "after:9"


def test_writers_killed_at_random_moments_leave_whole_batches(store_url):
    BenchmarkStore(store_url).close()
    ctx = mp.get_context("spawn")
    for delay in (0.05, 0.3):
        started = ctx.Event()
        proc = ctx.Process(target=_endless_writer, args=(store_url, started, f"d{delay}"))
        proc.start()
        assert started.wait(timeout=120)
        time.sleep(delay)
        _kill(proc)
    _integrity(store_url)
    with BenchmarkStore(store_url, lock_timeout=30) as st:
        batches: dict[str, int] = {}
        for t in st.traces():
            batches[t["log"].partition(":")[0]] = batches.get(t["log"].partition(":")[0], 0) + 1
        assert batches and set(batches.values()) == {BATCH}, batches  # no partial batch
        st.add_traces(_rows("after", 0, 1))  # and the store takes writes


def test_a_killed_reader_blocks_nobody(store_url):
    """A process killed while it reads (SQL: in a read transaction) holds no lock."""
    n = 2
    st = BenchmarkStore(store_url)
    st.add_traces(_rows("r", 0, n))
    ctx = mp.get_context("spawn")
    started = ctx.Event()
    proc = ctx.Process(target=_endless_reader, args=(store_url, started))
    proc.start()
    assert started.wait(timeout=120)
    time.sleep(0.1)
    _kill(proc)
    with BenchmarkStore(store_url, lock_timeout=30) as again:
        again.add_traces(_rows("w", 0, n))
        assert len(again) == 2 * n


def _endless_reader(url: str, started) -> None:
    store = BenchmarkStore(url, refresh_s=0)
    started.set()
    while True:
        store.refresh()
        store.best("g0", "w", "e")
