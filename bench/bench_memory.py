"""Benchmark of the static memory planner (tgx.runtime.memory).

Prints planning time for 200 / 2,000 buffers, the cost of one ``resolve`` call, and the
workspace peak against the lower bound (largest live set) and the sum of intermediates
(no reuse) for synthetic schedules at two bindings of the dims.

Run: ``.venv/bin/python bench/bench_memory.py``
"""

from __future__ import annotations

import random
import sys
import time
from pathlib import Path

import sympy

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tgx.runtime.memory import BufferRequest, format_bytes, liveness, plan_memory  # noqa: E402

N = sympy.Symbol("N", integer=True, positive=True)  # sequence length
B = sympy.Symbol("B", integer=True, positive=True)  # batch


def _requests(ops, inputs, outputs, inplace=None):
    """BufferRequests from ``ops = [(out, nbytes, [inputs])]`` and input sizes."""
    life = liveness([([o], ins) for o, _, ins in ops], inputs, outputs)
    sizes = dict(inputs) | {o: nb for o, nb, _ in ops}
    inplace = inplace or {}
    return [BufferRequest(n, sizes[n], s, e, inplace_of=inplace.get(n))
            for n, (s, e) in life.items()]


def chain(n: int, nbytes=4 * N * 128):
    """``n`` equal-size elementwise ops, each reading the previous value."""
    ops = [(f"t{i}", nbytes, [f"t{i - 1}" if i else "x"]) for i in range(n)]
    return _requests(ops, {"x": nbytes}, [f"t{n - 1}"])


def transformer(layers: int, d: int = 256, heads: int = 4, inplace: bool = True):
    """Pre-norm transformer blocks: attention scores O(N^2), MLP 4x wide, residuals.

    Each layer has 14 buffers; elementwise ops declare ``inplace_of`` their first input.
    """
    act, wide, scores = 4 * B * N * d, 16 * B * N * d, 4 * B * heads * N * N
    ops, alias, cur = [], {}, "x"
    for layer in range(layers):
        p = f"l{layer}."

        def op(name, nbytes, ins, may_alias=False, p=p, cur=cur):
            ops.append((p + name, nbytes, [a if a == cur else p + a for a in ins]))
            if may_alias and inplace:
                alias[p + name] = ops[-1][2][0]

        op("ln1", act, [cur])
        op("q", act, ["ln1"])
        op("k", act, ["ln1"])
        op("v", act, ["ln1"])
        op("s", scores, ["q", "k"])
        op("p", scores, ["s"], True)  # softmax in place
        op("o", act, ["p", "v"])
        op("proj", act, ["o"])
        op("r1", act, ["proj", cur], True)
        op("ln2", act, ["r1"])
        op("up", wide, ["ln2"])
        op("gelu", wide, ["up"], True)
        op("down", act, ["gelu"])
        op("r2", act, ["down", "r1"], True)
        cur = p + "r2"
    return _requests(ops, {"x": act}, [cur], alias)


def random_dag(n: int, seed: int = 0):
    """Random ops reading 1-3 recent values, sizes polynomials in N and B."""
    rng = random.Random(seed)
    polys = [4 * N * 64, 4 * B * N * 32, 2 * N * N, 4 * B * N * 8 + 64, 1000]
    ops = []
    for i in range(n):
        k = rng.randint(1, 3)
        ins = sorted({f"t{max(0, i - rng.randint(1, 8))}" for _ in range(k)}) if i else ["x"]
        ops.append((f"t{i}", rng.choice(polys), [a if a != "t0" or i else "x" for a in ins]))
    return _requests(ops, {"x": 4 * N * 64}, [f"t{n - 1}"])


def _time(fn, repeat: int = 3) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def main() -> None:
    print("planning time (best of 3)")
    for name, make in [("chain", chain), ("transformer", lambda n: transformer(n // 14)),
                       ("random DAG", random_dag)]:
        for n in (200, 2000):
            reqs = make(n)
            t = _time(lambda reqs=reqs: plan_memory(reqs))
            plan = plan_memory(reqs)
            reps = 200
            t0 = time.perf_counter()
            for k in range(reps):  # a new binding each time: the generated code runs
                plan.resolve(**{s: 1000 + k for s in plan.symbols})
            cold = (time.perf_counter() - t0) / reps
            t0 = time.perf_counter()
            for _ in range(reps):  # the same binding again: the per-plan cache answers
                plan.resolve(**{s: 1000 for s in plan.symbols})
            warm = (time.perf_counter() - t0) / reps
            t_expr = _time(lambda reqs=reqs: plan_memory(reqs).offsets_expr, repeat=1)
            print(f"  {name:<12} {len(reqs):>5} buffers: plan {t * 1e3:6.1f} ms, resolve new "
                  f"dims {cold * 1e6:6.1f} us, cached {warm * 1e6:4.1f} us, "
                  f"plan + sympy offsets_expr {t_expr * 1e3:7.1f} ms")

    print("\npeak vs lower bound vs sum of intermediates")
    cases = [("chain of 200", chain(200)), ("transformer 12 layers", transformer(12)),
             ("transformer 12 layers, no in-place", transformer(12, inplace=False)),
             ("random DAG 500", random_dag(500))]
    bindings = ({"N": 64, "B": 1}, {"N": 4096, "B": 8})
    for name, reqs in cases:
        for hint in (None, bindings[1], bindings):
            plan = plan_memory(reqs, hint=hint)
            peak_txt = str(plan.peak_expr["cpu"])
            if len(peak_txt) > 90:
                peak_txt = peak_txt[:90] + "..."
            hint_txt = "default (all 64)" if hint is None else hint if isinstance(hint, dict) else (
                "best of " + " / ".join(str(h) for h in hint))
            print(f"  {name}, stacking order at hint {hint_txt}: peak {peak_txt}")
            for dims in bindings:
                dims = {k: v for k, v in dims.items() if k in plan.symbols}
                peak, lb = plan.peak(**dims)["cpu"], plan.lower_bound(**dims)["cpu"]
                total = plan.sum_of_intermediates(**dims)["cpu"]
                txt = ", ".join(f"{k}={v}" for k, v in dims.items())
                print(f"    {txt:<12} peak {format_bytes(peak):>10}  lower bound "
                      f"{format_bytes(lb):>10}  sum {format_bytes(total):>10}  "
                      f"peak/lb {peak / lb:5.3f}  sum/peak {total / peak:6.1f}")


if __name__ == "__main__":
    main()
