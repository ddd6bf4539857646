"""Pattern kernels at Gemma-3-270m's shapes: tgx's generated kernel against the op-by-op form
and the peers, per pattern, prefill (128 rows) and decode (1 row).

    flock /tmp/bench.lock .venv/bin/python bench/bench_kernels.py [--rounds 15]

Per pattern (`tgx.backends.numba_patterns`; d=640, MLP width 2048, RoPE on 4 heads of 256,
the LSTM / GRU cells of hidden size 640 after their GEMMs), contenders run interleaved
in one process, a seeded shuffled order per round (`round_orders`):

- `tgx pattern`: the compiled function, its one equation the pattern kernel (the compiled
  function's call overhead included: ~8 µs of argument handling, see bench_run_loop.py);
- `tgx kernel`: the pattern kernel called directly (what it costs inside a plan);
- `tgx op by op`: the same function compiled with `patterns=False` on NumPy (tgx's NumPy
  kernels, one instruction per op);
- `NumPy`: the expression written by hand in NumPy;
- `torch eager`, `jax.jit`: the expression in each library.

Prints the median per call, the spread (p90/median), and the ratios to `tgx op by op` and to
the best peer. `--patterns rope`: the numba kernel of the primitive `apply_rotary_emb` against
NumPy's (`tgx op by op` there is tgx's NumPy kernel). End to end, `bench_gemma.py` has rows
with patterns off.

`--torch`: torch's pattern kernels (`tgx.backends.torch_patterns`: the Gemma norms, the GeGLU
gate, Adam's step of one parameter), called directly (`tgx kernel`) and as a compiled
function on torch (`tgx pattern`), against tgx's torch plan without patterns (`tgx op by
op`) and the peers.

`--generated` (or `--patterns generated`): the same computations written as plain ops, each
one region of the fuse stage, run by the loops `tgx.backends.numba_codegen` generates from
the region's IR (`tgx generated`: serial; `tgx generated ‖`: the parallel loops, where the
region is large enough for them to be offered), against the same peers; and per region what
generating and compiling costs on the first call (an empty kernel cache) and on a later
process's first call (the kernel cache on disk: source and machine code loaded, nothing
compiled).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import numpy as np

import tgx
from tgx.core import Literal
from tgx.profiling.timing import round_orders
import tgx.nn as tnn
import tgx.numpy as tnp
from tgx.backends import numba_patterns as NP
from tgx.backends import get_backend

D, F, EPS = 640, 2048, 1e-6


def _np_rms(h, w):
    return h / np.sqrt(np.mean(h * h, -1, keepdims=True) + np.float32(EPS)) * w


def _np_gelu(a):
    c = np.float32(np.sqrt(2 / np.pi))
    return np.float32(0.5) * a * (1 + np.tanh(c * (a + np.float32(0.044715) * a * a * a)))


def patterns():
    """name -> (tgx function, NumPy, torch, jax functions, input shapes(rows))."""
    import jax
    import jax.numpy as jnp
    import torch

    def t_rms(h, w):
        return h * torch.rsqrt(h.square().mean(-1, keepdim=True) + EPS) * w

    def j_rms(h, w):
        return h * jax.lax.rsqrt(jnp.mean(h * h, -1, keepdims=True) + EPS) * w

    def t_sm(s, m, c):
        return torch.softmax(torch.where(m, s * c, float("-inf")), -1)

    def j_sm(s, m, c):
        return jax.nn.softmax(jnp.where(m, s * c, -jnp.inf), axis=-1)

    def n_sig(x):
        return np.float32(1) / (np.float32(1) + np.exp(-x))

    def rot(x, cat, neg):   # HF's rotate_half at head_dim 256
        return cat([neg(x[..., 128:]), x[..., :128]])

    def cell(chunks, sig, tanh, lstm):   # the cells after their GEMMs, as they decompose
        def f(xw, b_ih, hw, b_hh, s):
            if lstm:
                i, f_, g, o = chunks((xw + b_ih) + (hw + b_hh), 4)
                c2 = sig(f_) * s + sig(i) * tanh(g)
                return sig(o) * tanh(c2), c2
            (ir, iz, in_), (hr, hz, hn) = chunks(xw + b_ih, 3), chunks(hw + b_hh, 3)
            r, z = sig(ir + hr), sig(iz + hz)
            n = tanh(in_ + r * hn)
            return n + z * (s - n)
        return f

    def t_chunks(z, n):
        return torch.chunk(z, n, -1)

    def j_chunks(z, n):
        return jnp.split(z, n, -1)

    def n_chunks(z, n):
        return np.split(z, n, -1)

    def n_sm(s, m, c):
        z = np.where(m, s * c, np.float32(-np.inf))
        e = np.exp(z - z.max(-1, keepdims=True))
        return e / e.sum(-1, keepdims=True)

    return {
        "scaled_masked_softmax": (   # attention weights: 4 heads, causal mask (L, S)
            lambda s, m, c: tnn.softmax(tnp.where(m, s * c, -np.inf), axis=-1),
            n_sm, t_sm, j_sm,
            lambda r: [(4, r, 128 if r > 1 else 256), ("bool", r, 128 if r > 1 else 256),
                       ("scalar",)]),
        "rms_norm_1p": (
            lambda h, w: tnn.rms_norm(h, (D,), 1.0 + w, EPS),
            lambda h, w: _np_rms(h, 1 + w), lambda h, w: t_rms(h, 1 + w),
            lambda h, w: j_rms(h, 1 + w), lambda r: [(r, D), (D,)]),
        "residual_rms_norm_1p": (
            lambda x, h, w: x + tnn.rms_norm(h, (D,), 1.0 + w, EPS),
            lambda x, h, w: x + _np_rms(h, 1 + w), lambda x, h, w: x + t_rms(h, 1 + w),
            lambda x, h, w: x + j_rms(h, 1 + w), lambda r: [(r, D), (r, D), (D,)]),
        "gelu_tanh_gate": (
            lambda a, b: tnn.gelu(a, approximate="tanh") * b,
            lambda a, b: _np_gelu(a) * b,
            lambda a, b: torch.nn.functional.gelu(a, approximate="tanh") * b,
            lambda a, b: jax.nn.gelu(a, approximate=True) * b, lambda r: [(r, F), (r, F)]),
        "silu_gate": (
            lambda a, b: tnn.silu(a) * b, lambda a, b: a * n_sig(a) * b,
            lambda a, b: torch.nn.functional.silu(a) * b, lambda a, b: jax.nn.silu(a) * b,
            lambda r: [(r, F), (r, F)]),
        "rotary_emb": (   # RoPE written out, on q: 4 heads x rows x 256
            lambda x, c, s: x * c + tnn.rotate_half(x) * s,
            lambda x, c, s: x * c + rot(x, lambda a: np.concatenate(a, -1), np.negative) * s,
            lambda x, c, s: x * c + rot(x, lambda a: torch.cat(a, -1), torch.neg) * s,
            lambda x, c, s: x * c + rot(x, lambda a: jnp.concatenate(a, -1), jnp.negative) * s,
            lambda r: [(4, r, 256), (r, 256), (r, 256)]),
        "lstm_gates": (   # an LSTM cell of hidden size 640 after its GEMMs
            NP._lstm_pattern, cell(n_chunks, n_sig, np.tanh, True),
            cell(t_chunks, torch.sigmoid, torch.tanh, True),
            cell(j_chunks, jax.nn.sigmoid, jnp.tanh, True),
            lambda r: [(r, 4 * D), (4 * D,), (r, 4 * D), (4 * D,), (r, D)]),
        "gru_gates": (    # a GRU cell of hidden size 640 after its GEMMs
            NP._gru_pattern, cell(n_chunks, n_sig, np.tanh, False),
            cell(t_chunks, torch.sigmoid, torch.tanh, False),
            cell(j_chunks, jax.nn.sigmoid, jnp.tanh, False),
            lambda r: [(r, 3 * D), (3 * D,), (r, 3 * D), (3 * D,), (r, D)]),
    }


def draw_args(shapes, rows):
    rng = np.random.default_rng(0)

    def draw(s):
        if s[0] == "bool":          # a causal mask over the last positions
            r, n = s[1:]
            return np.tril(np.ones((r, n), bool), n - r)
        if s[0] == "scalar":
            return np.float32(0.0625)
        return rng.standard_normal(s).astype(np.float32)
    return [draw(s) for s in shapes(rows)]


def contenders(name, spec, rows):
    import torch

    fn, np_fn, _, _, shapes = spec
    args = draw_args(shapes, rows)
    on = tgx.compile(fn, backends=["numpy"], policy="heuristic")
    off = tgx.compile(fn, backends=["numpy"], policy="heuristic", patterns=False)
    plan = on.lower(*args)
    assert [k.name for k in plan.kernels] == [name], plan.kernels
    kernel = plan.kernels[0].bind(plan.graph.eqns[0].params)
    targs = [torch.from_numpy(np.asarray(a)) for a in args]
    out = _rows(lambda: kernel(*args), on, off, spec, args, targs)
    return _checked(name, out, np_fn, args)


def _rows(direct, on, off, spec, args, targs) -> dict:
    """The contenders of one pattern: the kernel called directly, the compiled function with
    and without patterns, and the peers."""
    import jax
    import jax.numpy as jnp

    _, np_fn, t_fn, j_fn, _ = spec
    jargs = [jnp.asarray(a) for a in args]
    jitted = jax.jit(j_fn)
    return {
        "tgx kernel": direct,
        "tgx pattern": lambda: on(*args),
        "tgx op by op": lambda: off(*args),
        "NumPy": lambda: np_fn(*args),
        "torch eager": lambda: t_fn(*targs),
        "jax.jit": lambda: jax.block_until_ready(jitted(*jargs)),
    }


def _checked(name, rows: dict, np_fn, args) -> dict:
    """`rows` after checking every row's result against `np_fn` in float64 (1e-4 of the
    result's scale)."""
    ref = _as_np(np_fn(*[a.astype(np.float64) for a in args]))
    for k, f in rows.items():
        got = _as_np(f())
        err = np.abs(got - ref).max() / np.abs(ref).max()
        assert err < 1e-4, f"{name} {k}: error {err:.1e}"
    return rows


def _as_np(out):
    """One float64 array of a result or a tuple of results (a cell's (h', c'))."""
    outs = out if isinstance(out, (tuple, list)) else (out,)
    return np.stack([np.asarray(o, np.float64) for o in outs])


def rope_contenders(rows):
    """RoPE (`apply_rotary_emb`, a primitive) on Gemma's q: 4 heads x rows x 256."""
    import jax
    import jax.numpy as jnp
    import torch

    from tgx.backends.registry import kernels_for

    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, rows, 256)).astype(np.float32)
    cos, sin = (rng.standard_normal((rows, 256)).astype(np.float32) for _ in range(2))
    ks = {k.variant: k.fn for k in kernels_for("apply_rotary_emb", "numpy")}

    def rot(v, cat, neg):
        return cat([neg(v[..., 128:]), v[..., :128]])

    tx, tc, ts = (torch.from_numpy(a) for a in (x, cos, sin))
    jx, jc, js = (jnp.asarray(a) for a in (x, cos, sin))
    jitted = jax.jit(lambda v, c, s_: v * c + rot(v, lambda a: jnp.concatenate(a, -1),
                                                    jnp.negative) * s_)
    out = {
        "tgx kernel": lambda: ks["numba"](x, cos, sin),
        "tgx op by op": lambda: ks["library"](x, cos, sin),   # NumPy's kernel: 3 passes
        "NumPy": lambda: x * cos + rot(x, lambda a: np.concatenate(a, -1), np.negative) * sin,
        "torch eager": lambda: tx * tc + rot(tx, lambda a: torch.cat(a, -1), torch.neg) * ts,
        "jax.jit": lambda: jitted(jx, jc, js).block_until_ready(),
    }
    want = np.asarray(out["NumPy"](), np.float64)
    for k, f in out.items():
        assert np.abs(np.asarray(f(), np.float64) - want).max() < 1e-4, k
    return out


def measure(fns: dict, rounds: int) -> dict:
    """Per contender, the per-call times of rounds in shuffled order; each round one warm-up
    call and a burst of calls sized to ~20 ms."""
    names = list(fns)
    times: dict = {k: [] for k in names}
    for f in fns.values():
        f()
    for order in round_orders(names, rounds):
        for k in order:
            f = fns[k]
            f()
            t0 = time.perf_counter()
            f()
            one = time.perf_counter() - t0
            n = max(1, min(200, int(0.02 / max(one, 1e-7))))
            t0 = time.perf_counter()
            for _ in range(n):
                f()
            times[k].append((time.perf_counter() - t0) / n)
    return times


def report(title: str, times: dict) -> None:
    med = {k: float(np.median(v)) for k, v in times.items()}
    peers = [k for k in med if not k.startswith("tgx")]
    best = min(peers, key=med.get)
    print(f"\n{title}: median per call over {len(next(iter(times.values())))} rounds; ratios to "
          f"tgx op by op and to the best peer ({best})")
    print(f"  {'contender':14s} {'median µs':>10s} {'p90/med':>8s} {'/op-by-op':>10s} "
          f"{'/best peer':>10s}")
    for k in sorted(med, key=med.get):
        t = np.array(times[k])
        print(f"  {k:14s} {med[k] * 1e6:10.1f} {np.percentile(t, 90) / med[k]:8.2f} "
              f"{med[k] / med['tgx op by op']:9.2f}x {med[k] / med[best]:9.2f}x")


#: generated-region rows: pattern name -> the region's name in the printout
GENERATED = {"residual_rms_norm_1p": "residual add + RMSNorm (1 + w)",
             "scaled_masked_softmax": "scaled masked softmax row",
             "gelu_tanh_gate": "GeGLU gate (tanh GELU)"}


def _region(fn, args):
    """The fuse stage's one region of `fn` (decomposed) and its inputs in operand order."""
    from tgx.planning.regions import fuse_regions

    from tgx.backends.region_ir import KEEP

    specs = [tgx.Spec(np.shape(a), np.asarray(a).dtype) for a in args]
    # decomposed as the selection's decomposition graphs are, one composite at a time: the
    # gate's `tanh` stays an equation (the loops write it as a rational function)
    g = fuse_regions(tgx.decompose(tgx.make_graph(fn)(*specs), keep=KEEP), ["numpy"])
    assert [e.primitive.name for e in g.eqns] == ["fused"], g
    (eqn,) = g.eqns
    by_id = {v.id: a for v, a in zip(g.invars, args)}
    return eqn, [by_id[v.id] for v in eqn.invars]


def generated_contenders(name, spec, rows):
    """The region's generated loops (serial; parallel where offered) against the op-by-op
    form and the peers."""
    import jax
    import jax.numpy as jnp
    import torch

    from tgx.backends import numba_codegen as C

    fn, np_fn, t_fn, j_fn, shapes = spec
    args = draw_args(shapes, rows)
    eqn, ordered = _region(fn, args)
    serial = C.generated_kernel(eqn).fn
    off = tgx.compile(fn, backends=["numpy"], policy="heuristic", patterns=False, fuse=False)
    targs = [torch.from_numpy(np.asarray(a)) for a in args]
    jargs = [jnp.asarray(a) for a in args]
    jitted = jax.jit(j_fn)
    out = {"tgx generated": lambda: serial(*ordered)}
    if C.parallel_checker([v.aval for v in eqn.invars], dict(eqn.params)) is None:
        par = C._generate(eqn.params["graph"])[1]
        out["tgx generated ‖"] = lambda: par(*ordered)
    out.update({
        "tgx op by op": lambda: off(*args),
        "NumPy": lambda: np_fn(*args),
        "torch eager": lambda: t_fn(*targs),
        "jax.jit": lambda: jax.block_until_ready(jitted(*jargs)),
    })
    return _checked(name, out, np_fn, args)


#: patterns with a torch kernel of their own (`tgx.backends.torch_patterns`)
TORCH_PATTERNS = ("rms_norm_1p", "residual_rms_norm_1p", "gelu_tanh_gate")


def adam_spec(shape=(F, D)):
    """Adam's step of one parameter of `shape` (`adam_update`, torch's and numba's kernels):
    the pattern, NumPy, torch and jax forms, and its inputs at step 10 (lr 1e-3, torch's
    defaults)."""
    import jax.numpy as jnp
    import torch

    c1, b2, c2, eps = 1 - 0.9, 0.999, 1 - 0.999, 1e-8   # literals, as in `optim.adam`'s graph

    def step(sqrt):
        def f(p, g, m, v, nss, bc2):
            m2 = m + c1 * (g - m)
            v2 = v * b2 + c2 * g * g
            return p + nss * (m2 / (sqrt(v2) / bc2 + eps)), m2, v2
        return f

    rng = np.random.default_rng(0)
    p, g, m = (rng.standard_normal(shape).astype(np.float32) for _ in range(3))
    v = np.abs(rng.standard_normal(shape)).astype(np.float32) * 1e-2
    t = np.float32(10)
    nss = np.float32(-1e-3 / -np.expm1(t * np.float32(np.log(0.9))))
    bc2 = np.sqrt(-np.expm1(t * np.float32(np.log(0.999))), dtype=np.float32)
    return (lambda *a: NP.adam_pattern(*a, c1, b2, c2, eps), step(np.sqrt),
            step(torch.sqrt), step(jnp.sqrt), [p, g, m, v, nss, bc2])


def kernel_contenders(name, spec, rows, backend="torch"):
    """A pattern kernel of `backend` (torch's, or numba's loops on NumPy) against tgx's plan
    on that backend op by op and the peers."""
    import torch

    fn, np_fn, _, _, shapes = spec
    args = shapes if isinstance(shapes, list) else draw_args(shapes, rows)
    on = tgx.compile(fn, backends=[backend], policy="heuristic")
    off = tgx.compile(fn, backends=[backend], policy="heuristic", patterns=False)
    plan = on.lower(*args)
    (i, k), = [(i, k) for i, k in enumerate(plan.graph.kernels) if k is not None
               and k.name == name]
    kernel = k.bind(plan.graph.eqns[i].params)
    convert = get_backend(backend).convert
    own = [convert(np.array(a)) for a in args]
    # the pattern's inputs the function holds as literals (Adam's constants) come last
    lits = [convert(np.asarray(a.val, np.float32)) for a in plan.graph.eqns[i].invars
            if isinstance(a, Literal)]
    if name == "adam_update":   # in place into its own copies of p, m, v, as in a plan
        def direct():   # (later calls step on from the last one's state)
            return kernel(*own, *lits, outs={0: own[0], 1: own[2], 2: own[3]})
    else:
        def direct():
            return kernel(*own, *lits)
    targs = [torch.from_numpy(np.array(a)) for a in args]
    return _checked(name, _rows(direct, on, off, spec, args, targs), np_fn, args)


def compile_cost(spec, rows) -> tuple[float, float]:
    """Seconds of the first call of the region's serial loops with an empty kernel cache
    (generate, write, compile) and with the cache on disk (as a second process: load)."""
    from tgx.backends import numba_codegen as C

    fn, _, _, _, shapes = spec
    args = draw_args(shapes, rows)
    eqn, ordered = _region(fn, args)
    old, saved = C._KERNELS, os.environ.get("TGX_KERNEL_CACHE")
    try:
        with tempfile.TemporaryDirectory() as d:
            os.environ["TGX_KERNEL_CACHE"] = d
            times = []
            for _ in range(2):
                C._KERNELS = {}
                t0 = time.perf_counter()
                C.generated_kernel(eqn).fn(*ordered)
                times.append(time.perf_counter() - t0)
    finally:
        C._KERNELS = old
        if saved is None:
            os.environ.pop("TGX_KERNEL_CACHE", None)
        else:
            os.environ["TGX_KERNEL_CACHE"] = saved
    return times[0], times[1]


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--patterns", nargs="*", help="only these patterns ('generated': the "
                                                   "generated-region rows)")
    ap.add_argument("--generated", action="store_true", help="only the generated regions")
    ap.add_argument("--torch", action="store_true", help="only torch's pattern kernels "
                    "(the op-by-op rows: tgx's torch plan without patterns)")
    args = ap.parse_args(argv)
    if args.generated or (args.patterns and "generated" in args.patterns):
        main_generated(args.rounds)
        return
    if args.torch:
        main_torch(args.rounds)
        return
    for name, spec in patterns().items():
        if args.patterns and name not in args.patterns:
            continue
        for phase, rows in (("prefill", 128), ("decode", 1)):
            fns = contenders(name, spec, rows)
            report(f"{name}, {phase} ({rows} row{'s' if rows > 1 else ''})",
                   measure(fns, args.rounds))
    if not args.patterns or "adam_update" in args.patterns:
        for shape in ((F, D), (64, 2)):
            report(f"adam_update (numba), one {shape} parameter",
                   measure(kernel_contenders("adam_update", adam_spec(shape), 0, "numpy"),
                           args.rounds))
    if not args.patterns or "rope" in args.patterns:
        for phase, rows in (("prefill", 128), ("decode", 1)):
            times = measure(rope_contenders(rows), args.rounds)
            report(f"apply_rotary_emb (a primitive: numba kernel against NumPy's), {phase} "
                   f"(4 heads x {rows} x 256)", times)


def main_torch(rounds: int) -> None:
    specs = patterns()
    for name in TORCH_PATTERNS:
        for phase, rows in (("prefill", 128), ("decode", 1)):
            fns = kernel_contenders(name, specs[name], rows)
            report(f"torch kernel: {name}, {phase} ({rows} row{'s' if rows > 1 else ''})",
                   measure(fns, rounds))
    fns = kernel_contenders("adam_update", adam_spec(), 0)
    report(f"torch kernel: adam_update, one ({F}, {D}) parameter", measure(fns, rounds))


def main_generated(rounds: int) -> None:
    specs = patterns()
    for name, title in GENERATED.items():
        for phase, rows in (("prefill", 128), ("decode", 1)):
            cold, warm = compile_cost(specs[name], rows)
            fns = generated_contenders(name, specs[name], rows)
            report(f"generated loops: {title}, {phase} ({rows} row{'s' if rows > 1 else ''})"
                   f"; first call {cold * 1e3:.0f} ms with an empty kernel cache, "
                   f"{warm * 1e3:.0f} ms with it on disk", measure(fns, rounds))


if __name__ == "__main__":
    main()
