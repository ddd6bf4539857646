"""Training steps: tgx's compiled step against torch eager, torch.compile and jax.jit.

    flock /tmp/bench.lock .venv/bin/python bench/bench_train.py [--rounds 15]
        [--workloads mlp-small lm-small ...] [--explore-budget 60]
        [--skip torch.compile explore jax-state]

A step is the forward pass, the loss, its gradient and an Adam update (lr 1e-3, torch's
defaults otherwise) of every parameter, on one fixed batch. Workloads: the models of
examples/train_mlp.py and examples/train_lm.py, at the examples' sizes and a larger one:

- `mlp-small`: 2 -> 64 -> 2, batch 256 (train_mlp.py); `mlp-large`: 784 -> 512 -> 10,
  batch 128; both ReLU, cross-entropy;
- `lm-small`: the Gemma-shaped decoder of train_lm.py (d=64, 2 layers, 2 query / 1 key-value
  heads, vocabulary 20, sequence 16, batch 32); `lm-large`: d=256, 4 layers, 4 query / 1
  key-value heads of 64, MLP 1024, vocabulary 256, sequence 64, batch 8; cross-entropy on the
  copied half of the copy task.

Contenders, all in this one process, from the same initial weights and batch:

- `tgx FASTEST`: `tgx.compile(step, state=("params", "opt_state"))`, the default policy on a
  benchmark store fresh for each workload (so the cost model chooses), params and optimizer
  state updated in place;
- `tgx explored`: the same after `policy="explore"` with `--explore-budget` seconds has
  measured candidates into that store (`--skip explore` leaves it out);
- `tgx FASTEST js`, `tgx explored js`: the same called the JAX way, params, optimizer
  state and batch as jax arrays, the state donated (tgx's default for jax-array state: XLA
  writes the new state into the old buffers, the arrays passed in are deleted, the new ones
  come back), the loss blocked on as in the jax.jit row (`--skip jax-state`); whole plans
  are measured for the kind of arrays they are called with, so the explored row explores
  again on jax arrays (the kernels are measured already);
- `torch eager`: the model written in torch, autograd, `torch.optim.Adam` (its default
  single-tensor implementation on CPU);
- `torch.compile`: the loss function and `opt.step` each under `torch.compile` (inductor);
  skipped with the reason printed if it fails;
- `jax.jit`: one jitted function of `jax.value_and_grad` and a hand-written Adam (torch's
  formulas; optax is not a dependency), params and state donated.

Before timing, every contender's first two losses are checked against tgx's (the first is the
same model on the same weights: rtol 1e-4; the second follows one Adam update: rtol 1e-3).
Timing follows bench_kernels.py: rounds in shuffled order; per round and contender one
warm-up call, then a burst of calls sized to ~50 ms, timed as a whole. Printed: the median
per step over the rounds, the spread (p90/median) and the ratio to the best peer (not tgx),
with each contender's compile time, tgx's plan summary, and the 1-minute load average at
the end of the timing (other processes on the machine skew every figure).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import sys
import tempfile
import time
from collections.abc import Callable

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))
import train_lm as L  # noqa: E402
import train_mlp as M  # noqa: E402

import tgx  # noqa: E402
from tgx.profiling.timing import round_orders  # noqa: E402
from tgx import optim  # noqa: E402

LR = 1e-3
B1, B2, EPS = 0.9, 0.999, 1e-8


@dataclasses.dataclass
class Workload:
    """A model: `loss(params, *batch)` in tgx, and `reference(lib, params, *batch)`, the same
    loss written with `_Lib(lib)` for torch and jax."""

    name: str
    describe: str
    params: dict
    batch: tuple
    loss: Callable
    reference: Callable


@dataclasses.dataclass
class Contender:
    name: str
    step: Callable              # () -> loss, after the step's update
    compile_s: float = 0.0      # building it and its first call
    note: str = ""
    times: list = dataclasses.field(default_factory=list)


# ---------------------------------------------------------------------------------------------
# The models in torch and jax


class _Lib:
    """The few array functions the references need, for "torch" or "jax"."""

    def __init__(self, lib: str):
        self.torch = lib == "torch"
        if self.torch:
            import torch
            import torch.nn.functional as F
            self.xp, self.F = torch, F
        else:
            import jax
            import jax.numpy as jnp
            self.xp, self.nn = jnp, jax.nn

    def const(self, a: np.ndarray):
        return self.xp.from_numpy(a) if self.torch else self.xp.asarray(a)

    def perm(self, x, *axes):
        return x.permute(*axes) if self.torch else x.transpose(*axes)

    def cat(self, xs, axis):
        return self.xp.cat(xs, axis) if self.torch else self.xp.concatenate(xs, axis)

    def mean_last(self, x):
        return x.mean(-1, keepdim=True) if self.torch else x.mean(-1, keepdims=True)

    def softmax(self, x):
        return self.xp.softmax(x, -1) if self.torch else self.nn.softmax(x, -1)

    def gelu_tanh(self, x):
        return self.F.gelu(x, approximate="tanh") if self.torch else self.nn.gelu(x, True)

    def relu(self, x):
        return self.xp.relu(x) if self.torch else self.nn.relu(x)

    def repeat_heads(self, x, n):
        if n == 1:
            return x
        return x.repeat_interleave(n, 1) if self.torch else self.xp.repeat(x, n, axis=1)

    def cross_entropy(self, logits, targets):
        if self.torch:
            return self.F.cross_entropy(logits, targets)
        logp = self.nn.log_softmax(logits, -1)
        return -self.xp.take_along_axis(logp, targets[:, None], axis=1).mean()


def mlp_reference(o: _Lib, p, x, y):
    """train_mlp.loss_fn written with `o`'s library."""
    h = o.relu(x @ p["w1"] + p["b1"])
    return o.cross_entropy(h @ p["w2"] + p["b2"], y)


def _rope_tables(s: int, hd: int, base: float):
    """tgx's `rope_cos_sin(s, hd, base)` in NumPy: angles p * base**(-2i/hd), both halves."""
    inv = base ** (-np.arange(hd // 2, dtype=np.float64) * 2 / hd)
    ang = np.arange(s)[:, None] * inv[None, :]
    ang = np.concatenate([ang, ang], -1)
    return np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)


def lm_reference(o: _Lib, p, tokens, targets, cfg: L.Config):
    """train_lm.loss_fn written with `o`'s library."""
    b, s = tokens.shape
    hd, eps = cfg.head_dim, cfg.eps
    cos, sin = (o.const(t) for t in _rope_tables(s, hd, cfg.rope_base))
    mask = o.const(np.tril(np.ones((s, s), bool)))

    def rms(x, w):
        return x / o.xp.sqrt(o.mean_last(x * x) + eps) * (1 + w)

    def rope(x):
        rot = o.cat([-x[..., hd // 2:], x[..., :hd // 2]], -1)
        return x * cos + rot * sin

    def heads(x, w, n):
        return o.perm((x @ w.T).reshape(b, s, n, hd), 0, 2, 1, 3)

    x = p["embed"][tokens] * math.sqrt(cfg.d)
    for ly in p["layers"]:
        h = rms(x, ly["attn_norm"])
        q = rope(rms(heads(h, ly["q"], cfg.heads), ly["q_norm"]))
        k = rope(rms(heads(h, ly["k"], cfg.kv_heads), ly["k_norm"]))
        v = heads(h, ly["v"], cfg.kv_heads)
        k, v = (o.repeat_heads(t, cfg.heads // cfg.kv_heads) for t in (k, v))
        scores = q @ o.perm(k, 0, 1, 3, 2) * hd ** -0.5
        att = o.softmax(o.xp.where(mask, scores, -math.inf)) @ v
        att = o.perm(att, 0, 2, 1, 3).reshape(b, s, -1) @ ly["o"].T
        x = x + rms(att, ly["post_attn_norm"])
        h = rms(x, ly["mlp_norm"])
        h = o.gelu_tanh(h @ ly["gate"].T) * (h @ ly["up"].T)
        x = x + rms(h @ ly["down"].T, ly["post_mlp_norm"])
    logits = rms(x, p["norm"]) @ p["embed"].T
    return o.cross_entropy(logits[:, cfg.copy:].reshape(-1, cfg.vocab), targets.reshape(-1))


# ---------------------------------------------------------------------------------------------
# Workloads


def workloads() -> dict[str, Workload]:
    """The four workloads by name, their weights and batches drawn from one seeded stream."""
    rng = np.random.default_rng(0)
    out = {}
    x, y = M.rings(rng, M.BATCH)
    out["mlp-small"] = Workload("mlp-small", f"MLP 2-{M.HIDDEN}-2, batch {M.BATCH}",
                                M.init_params(rng), (x, y), M.loss_fn, mlp_reference)
    x = rng.standard_normal((128, 784)).astype(np.float32)
    out["mlp-large"] = Workload("mlp-large", "MLP 784-512-10, batch 128",
                                M.init_params(rng, (784, 512, 10)), (x, rng.integers(0, 10, 128)),
                                M.loss_fn, mlp_reference)
    for name, cfg, batch in (
            ("lm-small", L.Config(), L.BATCH),
            ("lm-large", L.Config(vocab=256, d=256, heads=4, kv_heads=1, head_dim=64, ffn=1024,
                                  layers=4, copy=32), 8)):
        out[name] = Workload(
            name, f"Gemma-shaped LM d={cfg.d}, {cfg.layers} layers, {cfg.heads}/{cfg.kv_heads} "
            f"heads of {cfg.head_dim}, MLP {cfg.ffn}, vocab {cfg.vocab}, seq {cfg.seq}, "
            f"batch {batch}",
            L.init_params(cfg), L.copy_batch(rng, batch, cfg),
            lambda p, t, y, cfg=cfg: L.loss_fn(p, t, y, cfg),
            lambda o, p, t, y, cfg=cfg: lm_reference(o, p, t, y, cfg))
    return out


def _copy(params: dict) -> dict:
    """A deep copy of a pytree of NumPy arrays (each contender updates its own)."""
    leaves, td = tgx.tree_flatten(params)
    return tgx.tree_unflatten(td, [np.array(a) for a in leaves])


# ---------------------------------------------------------------------------------------------
# Contenders


def _timed_build(name: str, make: Callable[[], Callable]) -> tuple[Contender, float]:
    """(the contender, its first loss), timing `make()` and the first step together."""
    t0 = time.perf_counter()
    step = make()
    first = step()
    return Contender(name, step, time.perf_counter() - t0), float(first)


def tgx_contender(w: Workload, name: str, jax_state: bool = False, **compile_kw):
    """tgx's step, compiled with `compile_kw`, params and Adam state as `state=`: the
    caller's NumPy arrays, updated in place, or with `jax_state` jax arrays (and a jax
    batch), donated to the step as `jax.jit(donate_argnums)` does, the new state coming
    back as new arrays."""
    opt = optim.adam(LR)
    params = tgx.aligned(w.params)   # a copy, which a JAX region reads in place
    state = opt.init(params)

    def train_step(p, s, *batch):
        loss, grads = tgx.value_and_grad(w.loss)(p, *batch)
        updates, s = opt.update(grads, s, p)
        return loss, (optim.apply_updates(p, updates), s)

    train = tgx.compile(train_step, state=("p", "s"), **compile_kw)
    if not jax_state:
        c, first = _timed_build(name, lambda: lambda: train(params, state, *w.batch)[0])
    else:
        import jax
        import jax.numpy as jnp

        carry = [tgx.tree_map(jnp.asarray, params), tgx.tree_map(jnp.asarray, state)]
        batch = [jnp.asarray(a) for a in w.batch]

        def step():   # as the jax.jit row: the loss blocks, the state is the last step's
            loss, (carry[0], carry[1]) = train(carry[0], carry[1], *batch)
            return jax.block_until_ready(loss)

        c, first = _timed_build(name, lambda: step)
        plan = train.lower(carry[0], carry[1], *batch)
        c.note = f"{plan.summary()}; traced {train.trace_count}x"
        return c, first
    plan = train.lower(params, state, *w.batch)
    c.note = f"{plan.summary()}; traced {train.trace_count}x"
    return c, first


def torch_contender(w: Workload, compiled: bool):
    """autograd and `torch.optim.Adam`; with `compiled`, the loss and `opt.step` under
    `torch.compile`."""
    import torch

    o = _Lib("torch")
    params = tgx.tree_map(lambda a: torch.from_numpy(a).requires_grad_(), _copy(w.params))
    batch = [torch.from_numpy(np.asarray(a)) for a in w.batch]
    opt = torch.optim.Adam(tgx.tree_flatten(params)[0], lr=LR)
    loss_fn = lambda p, *b: w.reference(o, p, *b)
    opt_step = opt.step
    if compiled:
        loss_fn, opt_step = torch.compile(loss_fn), torch.compile(opt.step)

    def step():
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(params, *batch)
        loss.backward()
        opt_step()
        return loss.detach()

    return _timed_build("torch.compile" if compiled else "torch eager", lambda: step)


def jax_contender(w: Workload):
    """`jax.jit` of value_and_grad and Adam (torch's formulas), params and state donated."""
    import jax
    import jax.numpy as jnp

    o = _Lib("jax")
    tm = jax.tree_util.tree_map
    loss_fn = lambda p, *b: w.reference(o, p, *b)

    def train_step(p, s, *batch):
        loss, g = jax.value_and_grad(loss_fn)(p, *batch)
        t, m, v = s
        t = t + 1
        m = tm(lambda m, g: m + (1 - B1) * (g - m), m, g)
        v = tm(lambda v, g: B2 * v + (1 - B2) * g * g, v, g)
        bc1, bc2 = -jnp.expm1(t * math.log(B1)), -jnp.expm1(t * math.log(B2))
        p = tm(lambda p, m, v: p - LR / bc1 * m / (jnp.sqrt(v) / jnp.sqrt(bc2) + EPS), p, m, v)
        return loss, p, (t, m, v)

    jitted = jax.jit(train_step, donate_argnums=(0, 1))
    params = tm(jnp.asarray, _copy(w.params))
    mu, nu = (tm(jnp.zeros_like, params) for _ in range(2))   # distinct buffers: donated
    carry = [params, (jnp.float32(0), mu, nu)]
    batch = [jnp.asarray(a) for a in w.batch]

    def step():   # a step reads the last one's donated outputs: blocking on the loss suffices
        loss, carry[0], carry[1] = jitted(carry[0], carry[1], *batch)
        return jax.block_until_ready(loss)

    return _timed_build("jax.jit", lambda: step)


def contenders(w: Workload, store, explore_budget: float | None, skip: set) -> list:
    """The contenders, each checked: its first two losses against tgx's."""
    built = [tgx_contender(w, "tgx FASTEST", store=store)]
    if "jax-state" not in skip:
        built.append(tgx_contender(w, "tgx FASTEST js", jax_state=True, store=store))
    if "explore" not in skip:
        t0 = time.perf_counter()
        tgx_contender(w, "tgx explore", store=store, policy="explore",
                      explore_budget=explore_budget)
        c, first = tgx_contender(w, "tgx explored", store=store)
        c.note += f"; explore and this rebuild took {time.perf_counter() - t0:.1f} s"
        built.append((c, first))
        if "jax-state" not in skip:   # explored again on jax arrays: plans are timed so
            t0 = time.perf_counter()
            tgx_contender(w, "tgx explore js", jax_state=True, store=store, policy="explore",
                          explore_budget=explore_budget)
            c, first = tgx_contender(w, "tgx explored js", jax_state=True, store=store)
            c.note += f"; explore on jax arrays and this rebuild took " \
                      f"{time.perf_counter() - t0:.1f} s"
            built.append((c, first))
    built.append(torch_contender(w, compiled=False))
    if "torch.compile" not in skip:
        try:
            built.append(torch_contender(w, compiled=True))
        except Exception as e:   # inductor needs a working C++ toolchain
            print(f"  torch.compile skipped: {type(e).__name__}: {str(e).splitlines()[0]}")
    built.append(jax_contender(w))
    tgx_losses = (built[0][1], float(built[0][0].step()))
    agree = []
    for c, first in built[1:]:
        losses = (first, float(c.step()))
        rel = [abs(a - b) / abs(b) for a, b in zip(losses, tgx_losses)]
        for i, (got, want, r, rtol) in enumerate(zip(losses, tgx_losses, rel, (1e-4, 1e-3))):
            if not r <= rtol:
                raise AssertionError(f"{w.name}: {c.name}'s loss at step {i + 1} is {got:.7g}, "
                                     f"tgx's {want:.7g} (rtol {rtol})")
        agree.append(f"{c.name} {rel[0]:.0e}/{rel[1]:.0e}")
    print(f"  {w.name}: relative difference of the losses of steps 1/2 to tgx's: "
          + ", ".join(agree))
    return [c for c, _ in built]


# ---------------------------------------------------------------------------------------------
# Timing and report


def measure(cs: list[Contender], rounds: int) -> None:
    """Rounds in shuffled order; per round and contender one warm-up call, then a burst of
    calls sized to ~50 ms, timed as a whole (its mean per call is the round's figure)."""
    for order in round_orders(cs, rounds):
        for c in order:
            c.step()
            t0 = time.perf_counter()
            c.step()
            one = time.perf_counter() - t0
            n = max(1, min(100, int(0.05 / max(one, 1e-7))))
            t0 = time.perf_counter()
            for _ in range(n):
                c.step()
            c.times.append((time.perf_counter() - t0) / n)


def report(w: Workload, cs: list[Contender], load: float) -> None:
    """The table of one workload, fastest first, and the contenders' notes."""
    med = {c.name: float(np.median(c.times)) for c in cs}
    best = min((c.name for c in cs if not c.name.startswith("tgx")), key=med.get)
    print(f"\n{w.name} ({w.describe}): median per step over {len(cs[0].times)} rounds; "
          f"ratio to the best peer ({best}); load average while timed {load:.2f}")
    print(f"  {'contender':16s} {'median ms':>10s} {'p90/med':>8s} {'/best peer':>10s} "
          f"{'compile s':>10s}")
    for c in sorted(cs, key=lambda c: med[c.name]):
        t = np.array(c.times)
        print(f"  {c.name:16s} {med[c.name] * 1e3:10.3f} {np.percentile(t, 90) / med[c.name]:8.2f} "
              f"{med[c.name] / med[best]:9.2f}x {c.compile_s:10.1f}")
    for c in cs:
        if c.note:
            print(f"  {c.name}: {c.note}")


def main(argv=None) -> None:
    all_workloads = workloads()
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--workloads", nargs="*", choices=list(all_workloads),
                    default=list(all_workloads))
    ap.add_argument("--explore-budget", type=float, default=60.0,
                    help="seconds `policy='explore'` may spend measuring, per workload")
    ap.add_argument("--skip", nargs="*", default=[],
                    choices=["explore", "torch.compile", "jax-state"])
    args = ap.parse_args(argv)
    print(f"{os.cpu_count()} CPUs; Adam lr {LR}; a fresh benchmark store per workload")
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.workloads:
            w = all_workloads[name]
            # fresh, so FASTEST sees no measurement that another workload's explore made
            store = tgx.BenchmarkStore(os.path.join(tmp, f"{name}.json"))
            cs = contenders(w, store, args.explore_budget, set(args.skip))
            measure(cs, args.rounds)
            report(w, cs, os.getloadavg()[0])


if __name__ == "__main__":
    main()
