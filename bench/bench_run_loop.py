"""Run-loop floor: a 200-op elementwise chain on tiny arrays, tgx against hand-written NumPy.

    flock /tmp/bench.lock .venv/bin/python bench/bench_run_loop.py [--rounds 41]

The chain (add y, mul y, sin, neg, repeated) on (4, 16) float32 arrays is compiled with
`backends=["numpy"]`; at this size every kernel costs well under a microsecond, so the time
is the run loop's overhead plus NumPy's per-call cost. Contenders, run interleaved in one
process (a burst of load from other processes hits every contender alike):

- `tgx run_flat`: `CompiledGraph.run_flat` (the run loop alone, no pytree handling);
- `tgx call`: the `tgx.compile`d function (pytrees, signature cache, then `run_flat`);
- `hand out=`: a loop over the chain's NumPy ufuncs writing into one preallocated buffer
  (`np.add(buf, y, out=buf)`);
- `unrolled out=`: the same calls as straight-line code, no loop (generated once with
  `exec`): the floor for `out=` kernels, what the run loop would be with zero overhead;
- `hand`: the loop without `out=` (a fresh array per op).

Prints, per contender, the median time per call over the rounds, the spread (p90/median and
the interquartile range over the median), and the ratios to `hand out=`.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter

import numpy as np

import tgx
import tgx.numpy as tnp

N_OPS = 200
SHAPE = (4, 16)
# (tgx op, NumPy ufunc, takes y): bounded values whatever the length (sin folds them back)
OPS = ((lambda x, y: x + y, np.add, True), (lambda x, y: x * y, np.multiply, True),
       (lambda x, y: tnp.sin(x), np.sin, False), (lambda x, y: -x, np.negative, False))


def chain(x, y):
    for i in range(N_OPS):
        x = OPS[i % 4][0](x, y)
    return x


def hand_out(x, y, buf):
    """The chain into one preallocated buffer; the result is a fresh array (as tgx's are)."""
    np.add(x, y, out=buf)
    for i in range(1, N_OPS - 1):
        _, uf, binary = OPS[i % 4]
        if binary:
            uf(buf, y, out=buf)
        else:
            uf(buf, out=buf)
    _, uf, binary = OPS[(N_OPS - 1) % 4]
    return uf(buf, y) if binary else uf(buf)


def unrolled_out():
    """`hand_out` as straight-line code: `f(x, y, buf)` with one ufunc call per line."""
    lines = ["def f(x, y, buf):", "    add(x, y, out=buf)"]
    for i in range(1, N_OPS - 1):
        _, uf, binary = OPS[i % 4]
        lines.append(f"    {uf.__name__}(buf{', y' if binary else ''}, out=buf)")
    _, uf, binary = OPS[(N_OPS - 1) % 4]
    lines.append(f"    return {uf.__name__}(buf{', y' if binary else ''})")
    ns = {op[1].__name__: op[1] for op in OPS}
    exec("\n".join(lines), ns)
    return ns["f"]


def hand(x, y):
    for i in range(N_OPS):
        _, uf, binary = OPS[i % 4]
        x = uf(x, y) if binary else uf(x)
    return x


def _per_call(fn, n):
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t0) / n


def measure(fns: dict, rounds: int, sample_s: float = 0.004) -> dict:
    """Seconds per call of each thunk in each of `rounds` interleaved rounds."""
    reps = {}
    for k, f in fns.items():
        f()
        reps[k] = max(1, int(sample_s / _per_call(f, 20)))
    times: dict = {k: [] for k in fns}
    for _ in range(rounds):
        for k, f in fns.items():
            times[k].append(_per_call(f, reps[k]))
    return times


def bench_chain(rounds: int = 41):
    f = tgx.compile(chain, backends=["numpy"])
    rng = np.random.default_rng(0)
    x = rng.random(SHAPE, np.float32)
    y = rng.random(SHAPE, np.float32)
    buf = np.empty(SHAPE, np.float32)
    want = hand(x, y)
    np.testing.assert_allclose(f(x, y), want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(hand_out(x, y, buf), want, rtol=1e-5, atol=1e-6)
    flat = unrolled_out()
    np.testing.assert_allclose(flat(x, y, buf), want, rtol=1e-5, atol=1e-6)
    cg = f.lower(x, y).compiled
    args = [x, y]
    kinds = Counter(i.label for i in cg.instructions)
    print(f"chain of {N_OPS} elementwise ops on {SHAPE} float32, backends=['numpy']: "
          f"{len(cg)} instructions ({', '.join(f'{n} {k}' for k, n in sorted(kinds.items()))})")
    times = measure({"tgx run_flat": lambda: cg.run_flat(args), "tgx call": lambda: f(x, y),
                     "hand out=": lambda: hand_out(x, y, buf),
                     "unrolled out=": lambda: flat(x, y, buf), "hand": lambda: hand(x, y)},
                    rounds)
    med = {k: float(np.median(v)) for k, v in times.items()}
    floor = med["hand out="]
    print(f"  {'':15}{'median':>10} {'p90/med':>8} {'IQR/med':>8}  {'/hand out=':>10} "
          f"{'ns/op':>6}")
    for k, v in times.items():
        q25, q75, q90 = np.percentile(v, [25, 75, 90])
        print(f"  {k:<15}{med[k] * 1e6:8.1f}us {q90 / med[k]:8.2f} {(q75 - q25) / med[k]:8.2f}"
              f"  {med[k] / floor:9.2f}x {med[k] / N_OPS * 1e9:6.0f}")
    print(f"  ratio tgx run_flat / hand out= = {med['tgx run_flat'] / floor:.2f}x "
          f"(target <= 1.2x), / unrolled out= = "
          f"{med['tgx run_flat'] / med['unrolled out=']:.2f}x, {rounds} rounds")
    return med


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=41)
    a = ap.parse_args(argv)
    print(f"tgx {tgx.__version__}, numpy {np.__version__}, python {sys.version.split()[0]}")
    bench_chain(a.rounds)


if __name__ == "__main__":
    main()
