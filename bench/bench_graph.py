"""Graph identity and transform timings on a 1,000-equation graph (standalone).

    python bench/bench_graph.py
"""

from __future__ import annotations

import time
import warnings

import tgx
import tgx.numpy as tnp


def chain(x, w):
    """250 blocks of 4 equations; every 10th is a matmul with a transposed weight."""
    for i in range(250):
        if i % 10 == 0:
            x = (x @ tnp.transpose(w)) * 0.125 - x
        else:
            x = tnp.exp(x * 0.5 + x) - x
    return x


def best_of(fn, *args, repeat: int = 5) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn(*args)
        times.append(time.perf_counter() - t)
    return min(times)


def main() -> None:
    warnings.simplefilter("ignore", RuntimeWarning)  # the random inputs overflow exp; harmless
    g = tgx.make_graph(chain)(tgx.Spec(("N", 64)), tgx.Spec((64, 64)))
    print(f"graph: {len(g.eqns)} equations")
    rows = [
        ("structural_hash", best_of(tgx.structural_hash, g)),
        ("canonicalize", best_of(tgx.canonicalize, g)),
        ("find_pattern (a*0.5 + a)",
         best_of(tgx.find_pattern, g, lambda a: a * 0.5 + a, tgx.Spec(("N", "D")))),
        ("simplify", best_of(tgx.simplify, g, repeat=2)),
        ("fuse", best_of(tgx.fuse, g, repeat=2)),
        ("equivalent (g, simplify(g))",
         best_of(tgx.equivalent, g, tgx.simplify(g), repeat=1)),
    ]
    for name, t in rows:
        print(f"{name:32s} {t * 1e3:9.2f} ms")


if __name__ == "__main__":
    main()
