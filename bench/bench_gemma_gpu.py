"""The Gemma-3-270m-shaped decoder on a CUDA GPU: tgx's device plans against torch and JAX.

    python bench/bench_gemma_gpu.py [--layers 18] [--vocab 32768] [--phase both]
                                    [--rounds 5] [--skip ROW ...] [--precision highest]

The GPU twin of bench/bench_gemma.py (same model, phases, KV cache and shuffled-block timing;
its helpers are imported from there). Rows, all in this one process, on cuda:0:

- tgx plans compiled with `device="cuda:0"`: every backend (FASTEST; on a device the
  store's selection is CPU-only, so the plan is the heuristic one, and the row's note says
  so), `backends=["torch"]` and `["jax"]`. The KV cache is `state=`: host arrays that the
  plan copies to the device and back each call (the row "cache host<->device only" times
  that copy alone), or, in the row "cache on device", jax arrays on the GPU that the plan
  donates and returns updated, as jax.jit does;
- torch eager and torch.compile on CUDA tensors (cache updated in place) and jax.jit on the
  GPU (cache donated), each the reference model of examples/gemma3.py.

Every call ends with the device synchronized (the time is the whole step, not the launch).
`--precision highest` (the default) makes jax compute float32 products in float32, as torch
does by default: without it XLA takes TF32 on Hopper and the rows compare different
arithmetic. Logits are checked against NumPy's float64-accumulated reference.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")   # jax beside torch on one GPU
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "examples"))
import bench_gemma as B  # noqa: E402
import gemma3 as G  # noqa: E402

import tgx  # noqa: E402
from tgx.io import flatten_names, unflatten_names  # noqa: E402

DEVICE = "cuda:0"


def synced(out):
    """`out` once the device has finished computing it (torch or jax array)."""
    if hasattr(out, "block_until_ready"):
        return out.block_until_ready()
    import torch
    if DEVICE != "cpu":
        torch.cuda.synchronize()
    return out


def tgx_rows(cfg, params, phase, tokens, pos) -> list[B.Row]:
    def step(p, t, c, position):
        return G.gemma3_step(p, t, c, position, cfg)

    rows = []
    for name, backends, on_device in (("tgx FASTEST", None, False),
                                      ("tgx FASTEST, cache on device", None, True),
                                      ("tgx torch-only", ["torch"], False),
                                      ("tgx jax-only", ["jax"], False)):
        try:
            rows.append(tgx_row(name, step, params, tokens, pos, backends, on_device, cfg))
        except Exception as e:   # a failing row is reported, the others still run
            print(f"  {name}: FAILED {type(e).__name__}: {str(e)[:800]}")
    return rows


def tgx_row(name, step, params, tokens, pos, backends, on_device, cfg) -> B.Row:
    """One tgx plan on the device. `on_device`: the cache is passed as jax arrays on the GPU
    (state as JAX has it: the plan returns the new cache, the arrays passed in are donated),
    else as host arrays the plan copies to the device and back each call."""
    import jax

    cache = [B.filled_cache(cfg, params)]
    if on_device:
        dev = jax.devices()[0] if DEVICE != "cpu" else jax.devices("cpu")[0]
        cache = [jax.device_put(cache[0], dev)]
    t0 = time.perf_counter()
    f = tgx.compile(step, weights="p", state="c", device=DEVICE, backends=backends,
                    return_backend_arrays=True)
    plan = f.lower(params, tokens, cache[0], np.int32(pos))

    def call():
        logits, new = f(params, tokens, cache[0], np.int32(pos))
        if on_device:
            cache[0] = new
        return synced(logits)

    call()
    note = (f"compile+first call {time.perf_counter() - t0:.1f} s; {plan.summary()}; "
            f"{plan.policy}")
    return B.Row(name, call, single=False, note=note)


def cache_copy_row(cfg, params) -> B.Row:
    """What the tgx rows pay for keeping the cache on the host: the cache to the device and
    back, alone."""
    import torch

    cache = B.filled_cache(cfg, params)

    def round_trip():
        for c in cache:
            for v in c.values():
                v[...] = torch.from_numpy(v).to(DEVICE).cpu().numpy()
        return None

    return B.Row("cache host<->device only", round_trip, single=False, check=False)


def peer_rows(cfg, params, phase, tokens, pos, skip) -> list[B.Row]:
    import torch

    rows = []
    tp = unflatten_names({k: torch.from_numpy(v).to(DEVICE)
                          for k, v in flatten_names(params).items()})
    tt = torch.from_numpy(tokens).to(DEVICE)

    def device_cache():
        return [{k: torch.from_numpy(v).to(DEVICE) for k, v in c.items()}
                for c in B.filled_cache(cfg, params)]

    t_cache = device_cache()

    def torch_eager():
        with torch.no_grad():
            return synced(G.gemma3_reference(tp, tt, cfg, "torch", t_cache, pos)[0])

    rows.append(B.Row("torch eager (cuda)", torch_eager))
    if "torch.compile" not in skip:
        tc_cache = device_cache()
        compiled = torch.compile(lambda p, t, c: G.gemma3_reference(p, t, cfg, "torch", c, pos))

        def torch_compiled():
            with torch.no_grad():
                return synced(compiled(tp, tt, tc_cache)[0])

        rows.append(B.Row("torch.compile (cuda)", torch_compiled))
    import jax
    import jax.numpy as jnp

    gpu = jax.devices()[0]
    if gpu.platform != "gpu" and DEVICE != "cpu":
        print(f"  jax.jit: skipped (jax's default device is {gpu})")
        return rows
    jp = jax.device_put(params, gpu)
    jt = jax.device_put(tokens, gpu)
    j_cache = [jax.device_put(B.filled_cache(cfg, params), gpu)]
    jitted = jax.jit(lambda p, t, c, position: G.gemma3_reference(p, t, cfg, "jax", c, position),
                     donate_argnums=2)

    def jax_jit():
        logits, j_cache[0] = jitted(jp, jt, j_cache[0], jnp.int32(pos))
        return logits.block_until_ready()

    rows.append(B.Row("jax.jit (gpu)", jax_jit))
    return rows


def host(x) -> np.ndarray:
    return np.asarray(x.cpu() if hasattr(x, "cpu") else x)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    B.add_model_args(ap)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--calls", type=int, default=10, help="timed calls per block")
    ap.add_argument("--skip", nargs="*", default=[], help="peer rows to leave out: "
                    "torch.compile")
    ap.add_argument("--device", default="cuda:0", help="cuda:N (cpu: a smoke test of the script)")
    ap.add_argument("--precision", default="highest",
                    help="jax_default_matmul_precision ('default' lets XLA take TF32)")
    args = ap.parse_args(argv)
    global DEVICE
    DEVICE = args.device
    import jax
    import torch

    if DEVICE != "cpu" and not torch.cuda.is_available():
        print("bench_gemma_gpu: skipped, torch sees no CUDA device")   # `make bench` goes on
        return
    if args.precision != "default":
        jax.config.update("jax_default_matmul_precision", args.precision)
    cfg, phases = B.model_of(args)
    params = G.random_params(cfg)
    n = sum(v.size for v in flatten_names(params).values())
    name = torch.cuda.get_device_name(0) if DEVICE != "cpu" else "cpu"
    print(f"Gemma-3-270m-shaped on {name}: {cfg.num_hidden_layers} "
          f"layers, d={cfg.hidden_size}, vocab {cfg.vocab_size}, {n / 1e6:.0f}M float32 "
          f"weights; torch {torch.__version__}, jax {jax.__version__} on "
          f"{jax.devices()[0].platform}, jax matmul precision {args.precision}")
    for phase in phases:
        tokens, pos = B.phase_inputs(phase, cfg, np.random.default_rng(0))
        print(f"\n== {phase}: {len(tokens)} token(s) at position {pos}", flush=True)
        rows = tgx_rows(cfg, params, phase, tokens, pos)
        rows += peer_rows(cfg, params, phase, tokens, pos, set(args.skip))
        rows.append(cache_copy_row(cfg, params))
        ref = G.gemma3_reference(params, tokens, cfg, "numpy", B.filled_cache(cfg, params),
                                 pos)[0]
        for row in rows:
            if row.check:   # as bench_gemma's check, through the host
                out = host(row.call()).astype(np.float64)
                err = np.abs(out - ref).max() / np.abs(ref).max()
                print(f"  {row.name}: logits within {err:.1e} of NumPy's")
                if not err < 1e-3:
                    row.note += f" LOGITS DIFFER ({err:.1e})"
        B.time_rows(rows, args.rounds, args.calls)
        B.report(phase, rows)
        sys.stdout.flush()


if __name__ == "__main__":
    main()
