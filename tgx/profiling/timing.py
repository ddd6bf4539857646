"""Micro-benchmarking: warm-up, repeats until the median is stable, device synchronisation."""

from __future__ import annotations

import random
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..backends import get_backend
from ..errors import TgxError

#: A call faster than this is timed in loops of k calls (timer resolution and the Python
#: overhead of the timing loop would dominate a single call).
BATCH_BELOW_S = 20e-6
#: Target duration of one batched sample.
BATCH_TARGET_S = 200e-6
MAX_BATCH = 100_000


def round_orders(items: Sequence, rounds: int, seed: int = 0) -> list[list]:
    """The order to visit `items` in, per round of an interleaved benchmark: round 0 in the
    given order, later ones shuffled (seeded: the same every run). A rotation would keep each
    item behind the same predecessor in every round, so one whose thread pools spin on after
    it returns (torch's OpenMP, oneDNN) would slow the same neighbour every time.

    >>> round_orders("abc", 3)
    [['a', 'b', 'c'], ['a', 'c', 'b'], ['c', 'b', 'a']]
    """
    rng = random.Random(seed)
    out = [list(items)]
    for _ in range(1, rounds):
        order = list(items)
        rng.shuffle(order)
        out.append(order)
    return out[:rounds]


@dataclass(frozen=True)
class Timing:
    """Result of `measure`: statistics over per-call times in seconds.

    `spread` is the inter-quartile range divided by the median; `samples` counts timed
    samples (each the mean of `batch` calls); `total_s` is the wall time spent measuring,
    warm-up included; `note` explains anything ignored (e.g. ``cold_l2`` on CPU).
    """

    median_s: float
    min_s: float
    spread: float
    samples: int
    total_s: float
    batch: int = 1
    note: str = ""


def sync_for(backend: str | None) -> Callable[[Any], None] | None:
    """The `sync` function that waits for `backend`'s asynchronous work, or None.

    `backend`: a backend name, optionally with a device (``"torch-cuda"``, ``"torch:cpu"``,
    ``"jax"``); ``"cuda"`` / ``"cuda:<i>"`` mean torch on that GPU. The backend object says
    what waiting means (`Backend.sync_fn`): nothing for NumPy and CPU torch,
    ``torch.cuda.synchronize()`` on a GPU, ``jax.block_until_ready`` for jax.

    >>> sync_for("numpy") is None
    True
    """
    if backend is None:
        return None
    spec = backend.lower()
    if spec == "cuda" or spec.startswith("cuda:"):
        name, device = "torch", spec
    else:
        name, _, device = spec.replace(":", "-", 1).partition("-")
    try:
        b = get_backend(name)
    except TgxError as e:
        raise TgxError(f"sync_for: {e}") from None
    return b.sync_fn({"": None, "cuda": "cuda:0"}.get(device, device))


def _l2_flusher() -> tuple[Callable[[], None] | None, str]:
    """A function that evicts the GPU L2 cache, or (None, why not)."""
    # Candidates on CUDA have imported torch already; importing it here would cost seconds.
    torch = sys.modules.get("torch")
    if torch is None:
        return None, "cold_l2 ignored: torch is not imported, so no CUDA work to flush for"
    if not torch.cuda.is_available():
        return None, "cold_l2 ignored: no CUDA device (CPU caches are not flushed)"
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    l2 = int(getattr(props, "L2_cache_size", 0) or 64 * 2**20)
    buf = torch.empty(2 * l2 // 4 + 1, dtype=torch.float32, device="cuda")

    def flush() -> None:
        buf.zero_()  # writes 2x L2 bytes, evicting everything the candidate cached
        torch.cuda.synchronize()

    return flush, ""


def _is_stable(samples: list[float], rel_tol: float) -> bool:
    """The median of the newest half agrees with the median of all samples."""
    recent = statistics.median(samples[len(samples) // 2:])
    overall = statistics.median(samples)
    return abs(recent - overall) <= rel_tol * overall


def measure(fn: Callable, args: Sequence[Any] = (), *,
            sync: Callable[[Any], None] | str | None = None,
            warmup: int = 3, min_repeats: int = 5, max_repeats: int = 1000,
            budget_s: float = 1.0, rel_tol: float = 0.02, cold_l2: bool = False,
            warmup_s: float = 0.0) -> Timing:
    """Time ``fn(*args)``: `warmup` calls (and more until `warmup_s` has passed), then
    samples until the median is stable. `warmup=0` is for a call known to be long, which
    the caller has just made: no calls are batched then.

    `warmup_s` lets thread pools settle: they outlive the call that started them (OpenBLAS
    workers spin ~0.1 s, torch's OpenMP pool, XLA's), so a function timed right after
    another's work would pay for it; after `warmup_s` of its own calls it pays only for its
    own pools.

    Sampling stops once there are at least `min_repeats` samples and the median of the
    newest half is within `rel_tol` of the running median, or after `max_repeats` samples,
    or when `budget_s` of sampling time is spent (always at least one sample). `sync` is
    called with each result to wait for asynchronous backends (a backend name picks
    `sync_for`'s).

    A call faster than 20 µs is timed in loops of k calls (k chosen so a sample lasts about
    200 µs, `sync` after the loop) and each sample is the loop time / k. With ``cold_l2=True``
    on a CUDA device the L2 cache is overwritten before every sample and batching is off;
    on CPU it is a no-op, explained in ``Timing.note``.

    >>> t = measure(lambda: sum(range(100)), budget_s=0.05)
    >>> t.median_s > 0 and t.samples >= 1
    True
    """
    args = tuple(args)
    if isinstance(sync, str):
        sync = sync_for(sync)
    start = time.perf_counter()
    notes = []
    flush, why = _l2_flusher() if cold_l2 else (None, "")
    if why:
        notes.append(why)

    def once() -> None:
        out = fn(*args)
        if sync is not None:
            sync(out)

    single = float("inf")
    n, until = 0, time.perf_counter() + warmup_s
    while n < warmup or time.perf_counter() < until:
        t0 = time.perf_counter()
        once()
        single = min(single, time.perf_counter() - t0)
        n += 1

    batch = 1
    if flush is None and single < BATCH_BELOW_S:
        batch = int(min(MAX_BATCH, max(2, BATCH_TARGET_S / max(single, 1e-8))))

    samples: list[float] = []
    timed_start = time.perf_counter()
    while len(samples) < max_repeats:
        if flush is not None:
            flush()
        if batch == 1:
            t0 = time.perf_counter()
            once()
            samples.append(time.perf_counter() - t0)
        else:
            t0 = time.perf_counter()
            for _ in range(batch - 1):
                fn(*args)
            once()  # sync only after the last call of the loop
            samples.append((time.perf_counter() - t0) / batch)
        if len(samples) >= min_repeats and _is_stable(samples, rel_tol):
            break
        if time.perf_counter() - timed_start >= budget_s:
            break

    q1, med, q3 = np.percentile(samples, [25, 50, 75])
    return Timing(median_s=float(med), min_s=float(min(samples)),
                  spread=float((q3 - q1) / med) if med > 0 else 0.0, samples=len(samples),
                  total_s=time.perf_counter() - start, batch=batch, note="; ".join(notes))


def timer_overhead(budget_s: float = 0.2) -> Timing:
    """`measure` applied to a no-op: the floor below which timings mean nothing."""
    return measure(lambda: None, budget_s=budget_s)

