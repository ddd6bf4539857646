"""The real workload: a Gemma-3-270m-shaped decoder, prefill and decode, tgx against every peer.

    .venv/bin/python bench/bench_gemma.py [--layers 18] [--vocab 32768] [--phase both]
                                          [--rounds 7] [--store PATH] [--skip ROW ...]
                                          [--patterns-off] [--floor]

The model is examples/gemma3.py (the HF architecture; its logits match `Gemma3ForCausalLM`,
tests/models). Both phases run the same step function with a KV cache kept as state: prefill
is P=128 tokens at position 0, decode one token at context 128 (the cache holds T_MAX=256
positions). Rows, all in this one process:

- tgx FASTEST after `policy="explore"` (store: --store, default a fresh temporary file), the
  same with `--tolerance` (default 2e-2 of the logits' scale: weights may be held in bf16 or
  int8 by generated GEMVs when the whole path stays within it), and tgx's NumPy-only (NumPy
  arrays: NumPy's kernels and tgx's numba ones), torch-only and jax-only plans
  (`backends=[b]`, policy "fastest"); with `--patterns-off`, FASTEST and NumPy-only with
  the patterns stage off (no pattern kernels: their effect end to end);
- hand-written NumPy, torch eager, torch.compile and jax.jit (the reference model of
  examples/gemma3.py written in each library, the cache updated in place / donated), and
  Hugging Face `Gemma3ForCausalLM` eager (its own DynamicCache, cropped back each call).

Rows are timed in shuffled blocks: each round visits every row (in a seeded shuffled order, so
that no row always follows the same one), warms it up with one call
after the switch of library, then times `--calls` calls. Printed per row: median, min and
spread (p90 / median) over all timed calls, and the ratio to the best single-library row
(every row but tgx FASTEST). Every row's logits are checked against NumPy's first.
`--floor` adds rows that run only the model's GEMMs (each weight times the phase's rows) in
NumPy, jax.jit and torch's bfloat16: the floor under each phase.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))
import gemma3 as G  # noqa: E402

import tgx  # noqa: E402
from tgx.profiling.timing import round_orders  # noqa: E402
from tgx.io import flatten_names, unflatten_names  # noqa: E402

PREFILL, CONTEXT, T_MAX = 128, 128, 256
BACKENDS = ("numpy", "torch", "jax")


@dataclasses.dataclass
class Row:
    name: str
    call: object               # () -> logits (any array type)
    single: bool = True        # one library (counts for "best single backend")
    times: list = dataclasses.field(default_factory=list)
    note: str = ""
    tolerance: float | None = None  # the row's logits may differ from NumPy's this much
    check: bool = True         # the row returns the logits (the GEMM floor rows do not)


def phase_inputs(phase: str, cfg, rng):
    """(tokens, pos) of one call: the prompt at 0, or one token after CONTEXT."""
    if phase == "prefill":
        return rng.integers(0, cfg.vocab_size, PREFILL), 0
    return rng.integers(0, cfg.vocab_size, 1), CONTEXT


_FILLED: dict = {}


def filled_cache(cfg, params):
    """A fresh copy of a cache holding CONTEXT positions (the prefill of a random prompt, in
    NumPy; computed once, as every row needs its own copy)."""
    key = (cfg, id(params))
    if key not in _FILLED:
        cache = G.empty_cache(cfg, T_MAX)
        tokens = np.random.default_rng(7).integers(0, cfg.vocab_size, CONTEXT)
        G.gemma3_reference(params, tokens, cfg, "numpy", cache, 0)
        _FILLED[key] = cache
    return [{k: v.copy() for k, v in c.items()} for c in _FILLED[key]]


def tgx_rows(cfg, params, phase, tokens, pos, store, tolerance=None,
             patterns_off=False) -> list[Row]:
    def step(p, t, c, position):
        return G.gemma3_step(p, t, c, position, cfg)

    rows = []
    configs = [("tgx FASTEST", dict(policy="fastest", backends=list(BACKENDS)), False)]
    if tolerance:
        configs.append((f"tgx FASTEST tol={tolerance:g}",
                        dict(policy="fastest", backends=list(BACKENDS), tolerance=tolerance),
                        False))
    configs += [(f"tgx {b}-only", dict(policy="fastest", backends=[b]), True) for b in BACKENDS]
    if patterns_off:   # the same without pattern kernels (tgx.register_kernel, the library)
        configs += [("tgx FASTEST no patterns",
                     dict(policy="fastest", backends=list(BACKENDS), patterns=False), False),
                    ("tgx numpy-only no patterns",
                     dict(policy="fastest", backends=["numpy"], patterns=False), False)]
    if store is not None:   # explore first: FASTEST then reads what it measured
        t0 = time.perf_counter()
        explorer = tgx.compile(step, weights="p", state="c", store=store, policy="explore",
                               backends=list(BACKENDS))
        explorer(params, tokens, filled_cache(cfg, params), np.int32(pos))
        print(f"  explore ({phase}): {time.perf_counter() - t0:.1f} s")
    for name, kw, single in configs:
        cache = filled_cache(cfg, params)
        t0 = time.perf_counter()
        f = tgx.compile(step, weights="p", state="c", store=store, **kw)
        f(params, tokens, cache, np.int32(pos))
        plan = f.lower(params, tokens, cache, np.int32(pos))
        note = f"compile+first call {time.perf_counter() - t0:.1f} s; {plan.summary()}"
        if plan.precision is not None:
            note += "\n    " + str(plan.precision).split("\n")[0]
            held = {}
            for _, form, _ in plan.precision.held:
                held[form] = held.get(form, 0) + 1
            note += "; held: " + ", ".join(f"{n} weights as {f}" for f, n in held.items())
        rows.append(Row(name, lambda f=f, c=cache: f(params, tokens, c, np.int32(pos))[0],
                        single, note=note, tolerance=kw.get("tolerance")))
    return rows


def peer_rows(cfg, params, phase, tokens, pos, skip) -> list[Row]:
    rows = []
    np_cache = filled_cache(cfg, params)
    rows.append(Row("NumPy (hand-written)", lambda: G.gemma3_reference(
        params, tokens, cfg, "numpy", np_cache, pos)[0]))
    import torch

    tp = unflatten_names({k: torch.from_numpy(v) for k, v in flatten_names(params).items()})
    tt = torch.from_numpy(tokens)
    t_cache = [{k: torch.from_numpy(v) for k, v in c.items()} for c in filled_cache(cfg, params)]

    def torch_eager():
        with torch.no_grad():
            return G.gemma3_reference(tp, tt, cfg, "torch", t_cache, pos)[0]

    rows.append(Row("torch eager", torch_eager))
    if "torch.compile" not in skip:
        tc_cache = [{k: torch.from_numpy(v) for k, v in c.items()}
                    for c in filled_cache(cfg, params)]
        compiled = torch.compile(lambda p, t, c: G.gemma3_reference(p, t, cfg, "torch", c, pos))

        def torch_compiled():
            with torch.no_grad():
                return compiled(tp, tt, tc_cache)[0]

        rows.append(Row("torch.compile", torch_compiled))
    import jax
    import jax.numpy as jnp

    jp = jax.tree_util.tree_map(jnp.asarray, params)
    jt = jnp.asarray(tokens)
    j_cache = [jax.tree_util.tree_map(jnp.asarray, filled_cache(cfg, params))]
    jitted = jax.jit(lambda p, t, c, position: G.gemma3_reference(p, t, cfg, "jax", c, position),
                     donate_argnums=2)

    def jax_jit():
        logits, j_cache[0] = jitted(jp, jt, j_cache[0], jnp.int32(pos))
        return logits.block_until_ready()

    rows.append(Row("jax.jit", jax_jit))
    if "hf" not in skip:
        rows.append(hf_row(cfg, params, tokens, pos))
    return rows


def hf_row(cfg, params, tokens, pos) -> Row:
    import torch
    import transformers

    config = G.hf_config(cfg, max_position_embeddings=T_MAX)
    with torch.device("meta"):
        model = transformers.Gemma3ForCausalLM(config)
    model.load_state_dict({k: torch.from_numpy(v) for k, v in flatten_names(params).items()},
                          strict=False, assign=True)
    model.tie_weights()
    model.model.rotary_emb = type(model.model.rotary_emb)(config)   # buffers off the meta device
    model.model.embed_tokens.embed_scale = torch.tensor(cfg.hidden_size ** 0.5)
    model.eval()
    past = transformers.DynamicCache(config=config)
    with torch.no_grad():
        if pos:
            ctx = np.random.default_rng(7).integers(0, cfg.vocab_size, pos)
            model(input_ids=torch.from_numpy(ctx)[None], past_key_values=past, use_cache=True)
    ids = torch.from_numpy(tokens)[None]

    def hf():
        with torch.no_grad():
            if pos:
                out = model(input_ids=ids, past_key_values=past, use_cache=True,
                            cache_position=torch.arange(pos, pos + len(tokens)))
                past.crop(-len(tokens))     # back to the context, for the next call
            else:
                out = model(input_ids=ids)
        return out.logits[0]

    return Row("HF transformers eager", hf)


def floor_rows(params, rows: int) -> list[Row]:
    """The model's GEMMs alone: every 2-D weight (the tied embedding as the head) times
    `rows` rows, once, in NumPy, jax.jit and torch's bfloat16 (oneDNN): the floor under a
    phase's time in each (not counted as a single library: they skip the rest of the
    model)."""
    import jax
    import torch

    ws = [w for w in flatten_names(params).values() if w.ndim == 2]
    rng = np.random.default_rng(1)
    xs = {k: rng.standard_normal((rows, k)).astype(np.float32) for k in {w.shape[1] for w in ws}}

    def numpy_gemms():
        for w in ws:
            xs[w.shape[1]] @ w.T

    jws, jxs = [jax.device_put(w) for w in ws], {k: jax.device_put(x) for k, x in xs.items()}
    jit_gemms = jax.jit(lambda xs, ws: [xs[w.shape[1]] @ w.T for w in ws])
    tws = [torch.from_numpy(w).bfloat16() for w in ws]
    txs = {k: torch.from_numpy(x) for k, x in xs.items()}

    def torch_bf16_gemms():
        for w in tws:
            torch.nn.functional.linear(txs[w.shape[1]].bfloat16(), w)

    return [Row("GEMMs only: NumPy", numpy_gemms, single=False, check=False),
            Row("GEMMs only: jax.jit",
                lambda: jax.block_until_ready(jit_gemms(jxs, jws)), single=False, check=False),
            Row("GEMMs only: torch bf16", torch_bf16_gemms, single=False, check=False)]


def time_rows(rows: list[Row], rounds: int, calls: int) -> None:
    """Shuffled blocks (`round_orders`): per round, each row gets one warm-up call then
    `calls` timed ones."""
    for order in round_orders(rows, rounds):
        for row in order:
            row.call()
            for _ in range(calls):
                t0 = time.perf_counter()
                row.call()
                row.times.append(time.perf_counter() - t0)


def check(rows: list[Row], ref) -> None:
    for row in (r for r in rows if r.check):
        out = np.asarray(row.call(), dtype=np.float64)
        err = np.abs(out - ref).max() / np.abs(ref).max()
        if not err < (row.tolerance or 1e-3):
            raise AssertionError(f"{row.name}: logits differ from NumPy's ({err:.1e})")


def report(phase: str, rows: list[Row]) -> None:
    med = {r.name: float(np.median(r.times)) for r in rows}
    best = min((r for r in rows if r.single), key=lambda r: med[r.name])
    print(f"\n{phase}: median of {len(rows[0].times)} calls per row, shuffled blocks; "
          f"ratio to the best single library ({best.name})")
    print(f"  {'row':24s} {'median ms':>10s} {'min ms':>8s} {'p90/med':>8s} {'ratio':>7s}")
    for r in sorted(rows, key=lambda r: med[r.name]):
        t = np.array(r.times)
        print(f"  {r.name:24s} {med[r.name] * 1e3:10.2f} {t.min() * 1e3:8.2f} "
              f"{np.percentile(t, 90) / med[r.name]:8.2f} {med[r.name] / med[best.name]:7.2f}x")
    for r in rows:
        if r.note:
            print(f"  {r.name}: {r.note}")


def add_model_args(ap: argparse.ArgumentParser) -> None:
    """The model's shape and phases (--layers, --vocab, --phase), shared with
    bench_gemma_gpu.py."""
    ap.add_argument("--layers", type=int, default=18)
    ap.add_argument("--vocab", type=int, default=32768)
    ap.add_argument("--phase", choices=["prefill", "decode", "both"], default="both")


def model_of(args) -> tuple:
    """(config, phases) that `add_model_args`' arguments ask for."""
    cfg = G.Config.gemma3_270m(vocab_size=args.vocab, num_hidden_layers=args.layers)
    return cfg, ["prefill", "decode"] if args.phase == "both" else [args.phase]


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_model_args(ap)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--calls", type=int, default=0, help="timed calls per block "
                    "(default: 2 for prefill, 5 for decode)")
    ap.add_argument("--store", help="benchmark store for explore/FASTEST (default: a fresh "
                    "temporary one)")
    ap.add_argument("--no-explore", action="store_true",
                    help="FASTEST without exploring first (whatever the store holds)")
    ap.add_argument("--tolerance", type=float, default=2e-2,
                    help="a FASTEST row with this tolerance on the logits (weights may be "
                         "held in bf16/int8); 0: no such row")
    ap.add_argument("--patterns-off", action="store_true",
                    help="rows with the patterns stage off too (pattern kernels on/off)")
    ap.add_argument("--skip", nargs="*", default=[], help="peer rows to leave out: "
                    "torch.compile, hf")
    ap.add_argument("--floor", action="store_true",
                    help="rows timing the model's GEMMs alone (NumPy, jax.jit, torch bf16)")
    args = ap.parse_args(argv)
    cfg, phases = model_of(args)
    t0 = time.perf_counter()
    params = G.random_params(cfg)
    n = sum(v.size for v in flatten_names(params).values())
    print(f"Gemma-3-270m-shaped: {cfg.num_hidden_layers} layers, d={cfg.hidden_size}, "
          f"vocab {cfg.vocab_size}, {n / 1e6:.0f}M float32 weights "
          f"({n * 4 / 2**20:.0f} MiB), made in {time.perf_counter() - t0:.1f} s; "
          f"{os.cpu_count()} CPUs")
    with tempfile.TemporaryDirectory() as tmp:
        store = tgx.BenchmarkStore(args.store or os.path.join(tmp, "store.json"))
        for phase in phases:
            rng = np.random.default_rng(0)
            tokens, pos = phase_inputs(phase, cfg, rng)
            print(f"\n== {phase}: {len(tokens)} token(s) at position {pos}")
            rows = tgx_rows(cfg, params, phase, tokens, pos,
                            None if args.no_explore else store, args.tolerance,
                            args.patterns_off)
            rows += peer_rows(cfg, params, phase, tokens, pos, set(args.skip))
            if args.floor:
                rows += floor_rows(params, len(tokens))
            ref = G.gemma3_reference(params, tokens, cfg, "numpy", filled_cache(cfg, params),
                                     pos)[0]
            check(rows, ref)
            calls = args.calls or (2 if phase == "prefill" else 5)
            time_rows(rows, args.rounds, calls)
            report(phase, rows)


if __name__ == "__main__":
    main()
