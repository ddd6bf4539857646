"""Exploring the paths of tanh and of RMSNorm: count them, rank them, measure the best few,
re-rank with the measurements, run the winner and check it against NumPy.

Run: python examples/explore_paths.py   (the store is $TGX_STORE, else a temporary file)
"""

from __future__ import annotations

import itertools
import os
import tempfile
import time

import numpy as np

import tgx
import tgx.nn as tnn
import tgx.numpy as tnp


def rms_norm_by_hand(x, w):
    """RMSNorm written from tgx.numpy ops: the rms_norm pattern kernel still finds it."""
    ms = tnp.mean(x * x, axis=-1, keepdims=True)
    return x / tnp.sqrt(ms + 1e-6) * w


def explore(name, fn, args, reference, store, backends=("numpy", "torch")):
    print(f"=== {name}")
    t0 = time.perf_counter()
    paths = tgx.paths(fn)(*args, backends=list(backends), store=store)
    n = paths.count()
    print(f"{n} paths (counted in {(time.perf_counter() - t0) * 1e3:.1f} ms)")
    top = list(itertools.islice(paths.ranked(), 5))
    for i, p in enumerate(top):
        print(f"--- predicted #{i + 1}")
        print(p.summary())
    for p in top[:3]:  # measure the top few; each becomes a GRAPH_RECIPE trace in the store
        rec = p.profile(*args, store=store, budget_s=0.02)
        print(f"profiled: {rec['status']}, median {rec['median_s'] * 1e6:.1f} µs, predicted "
              f"{p.cost * 1e6:.1f} µs")
    measured = paths.measured(store)  # re-rank by measurement
    best_s, best = measured[0]
    print(f"fastest measured: {best_s * 1e6:.1f} µs, {best!r}")
    out = best.run(*args)
    np.testing.assert_allclose(out, reference(*args), rtol=1e-4, atol=1e-5)
    print("best plan matches NumPy")
    return n


def main():
    path = os.environ.get("TGX_STORE") or os.path.join(tempfile.mkdtemp(), "store.json")
    store = tgx.BenchmarkStore(path)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((64, 256)).astype(np.float32)
    w = rng.standard_normal(256).astype(np.float32)

    explore("tanh", lambda x: tnp.tanh(x), (x,), np.tanh, store)

    def rms_ref(x, w):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-6) * w

    explore("rms_norm", lambda x, w: tnn.rms_norm(x, 256, w, eps=1e-6), (x, w), rms_ref, store)
    explore("rms_norm by hand", rms_norm_by_hand, (x, w), rms_ref, store)


if __name__ == "__main__":
    main()
