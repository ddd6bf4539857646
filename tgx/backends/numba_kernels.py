"""Kernels tgx generates with numba: GEMVs that stream weights (in float32, or held in a lower
precision) for decoding's products of a few rows, decode's RMSNorm and attention, and RoPE.

Decode is bound by streaming the weights once per token (Gemma-3-270m: ~480 MB of float32
per step). These kernels run `linear` (y = x @ w.T + b) with few rows of `x` as a parallel
loop over the output channels, each a dot product LLVM vectorizes:
- `numba` (float32): faster than NumPy's BLAS GEMV on the 2-core EPYC of 2026-11-23 (10.0
  vs 13.9 ms for 60 GEMVs of 2048x640; 31.5 vs 22.6 GB/s); as fast on the AMX Xeon of
  2026-11-27 (both ~21 GB/s);
- `numba-bf16` (lossy): the weight held in bfloat16 (converted once per bound weight, see
  `Prepare`), widened to float32 in registers: half the bytes (7.1 ms; error ~2e-3 of the
  output's scale);
- `numba-int8` (lossy): int8 with a float32 scale per output channel: a quarter of the
  bytes (3.2 ms; error ~1e-2 of the output's scale).
The lossy ones are chosen only under `tolerance=` (see `Kernel.lossy`). Two serial kernels
take the small per-token work between the GEMVs: RMSNorm over the last axis (one pass per
row, where NumPy makes five calls) and attention of a few query rows over a KV cache (one pass
over the keys per query head; grouped-query heads read their shared key/value head).

They are kernels of the NumPy backend, not a backend of their own: they read and write NumPy
arrays in host memory, so a plan mixes them with NumPy's kernels without a copy at any
boundary (docs/architecture.md, "Generated kernels"). numba is optional: without it nothing is
registered. Compiled code is cached on disk (`cache=True`), so a second process does not
compile again.

>>> import numpy as np
>>> x, w = np.ones((1, 8), np.float32), np.full((3, 8), 0.5, np.float32)
>>> linear_f32(x, w).tolist() if HAVE_NUMBA else [[4.0, 4.0, 4.0]]
[[4.0, 4.0, 4.0]]
"""

from __future__ import annotations

import importlib.util

import ml_dtypes
import numpy as np

from .numba_intrinsics import prefetch as make_prefetch
from .numpy_library import trim_masked_keys
from .registry import Prepare, register_kernel

HAVE_NUMBA = importlib.util.find_spec("numba") is not None
NAME = "numpy"
#: rows of `x` up to which a GEMV loop beats a BLAS GEMM (decode runs 1)
MAX_ROWS = 8
_BLOCK = 32  # output channels per parallel task
#: a lower-precision GEMV computes this many output channels per pass over `x` ...
_ROWS = 4
#: ... and prefetches the weight rows this far ahead (`numba_intrinsics.prefetch`): int8 rows
#: of 640 read from memory at 11.6 GB/s without, 22 GB/s with (the float32 GEMV streams at
#: ~21 GB/s with or without: the hardware prefetcher keeps enough of its lines in flight)
_AHEAD = 16
numba = None  # the module, imported on the first compile (the loops read `numba.prange`)
prefetch = None  # `numba_intrinsics.prefetch`, imported with numba


def _jit(fn, parallel: bool = True, fastmath: bool = True):
    """`fn` compiled by numba on its first call (so importing tgx does not import numba);
    `fastmath=False` where the loop must round as NumPy's ops do."""
    compiled = None

    def run(*args):
        nonlocal compiled
        if compiled is None:
            global numba, prefetch
            import numba

            prefetch = make_prefetch()

            # error_model="numpy": a division yields inf/nan as in NumPy, where numba's
            # default checks for zero and raises, a branch that stops LLVM vectorizing the
            # loop (the GeGLU gate: 1.0 ms scalar, 0.10 ms vectorized, 262k elements)
            compiled = numba.njit(parallel=parallel, fastmath=fastmath, cache=True,
                                  error_model="numpy")(fn)
        return compiled(*args)

    run.__name__ = run.__qualname__ = fn.__name__
    return run


def _gemv_f32(x, w, out):
    m, k = x.shape
    n = w.shape[0]
    for blk in numba.prange((n + _BLOCK - 1) // _BLOCK):
        for j in range(blk * _BLOCK, min(n, (blk + 1) * _BLOCK)):
            for r in range(m):
                acc = np.float32(0.0)
                for i in range(k):
                    acc += x[r, i] * w[j, i]
                out[r, j] = acc


def _gemv_bf16(x, w, out):
    m, k = x.shape
    n = w.shape[0]
    flat = w.reshape(-1)
    for blk in numba.prange((n + _BLOCK - 1) // _BLOCK):
        bits = np.empty(k, np.uint32)
        row = bits.view(np.float32)  # a bfloat16 is the top half of a float32
        for j in range(blk * _BLOCK, min(n, (blk + 1) * _BLOCK)):
            ahead = (j + _AHEAD) * k
            if ahead + k <= flat.size:
                for c in range(0, k, 32):  # a cache line holds 32 bfloat16
                    prefetch(flat, ahead + c)
            for i in range(k):
                bits[i] = np.uint32(w[j, i]) << 16
            for r in range(m):
                acc = np.float32(0.0)
                for i in range(k):
                    acc += x[r, i] * row[i]
                out[r, j] = acc


def _gemv_int8(x, w, scale, out):
    m, k = x.shape
    n = w.shape[0]
    flat = w.reshape(-1)
    for blk in numba.prange((n + _BLOCK - 1) // _BLOCK):
        j, end = blk * _BLOCK, min(n, (blk + 1) * _BLOCK)
        while j + _ROWS <= end:
            ahead = (j + _AHEAD) * k
            if ahead + _ROWS * k <= flat.size:
                for c in range(0, _ROWS * k, 64):  # a cache line holds 64 int8
                    prefetch(flat, ahead + c)
            for r in range(m):
                acc = np.zeros(_ROWS, np.float32)
                for i in range(k):
                    xi = x[r, i]
                    for t in range(_ROWS):
                        acc[t] += xi * np.float32(w[j + t, i])
                for t in range(_ROWS):
                    out[r, j + t] = acc[t] * scale[j + t]
            j += _ROWS
        while j < end:  # the last channels of a block of another size
            for r in range(m):
                one = np.float32(0.0)
                for i in range(k):
                    one += x[r, i] * np.float32(w[j, i])
                out[r, j] = one * scale[j]
            j += 1


def _rms_rows(x, h, w, eps, plus, out):
    """out = [x +] h / sqrt(mean(h²) + eps) * (w + plus), per row (x of 0 rows: no add)."""
    rows, d = h.shape
    add = x.shape[0] == rows
    for r in range(rows):
        acc = np.float32(0.0)
        for i in range(d):
            acc += h[r, i] * h[r, i]
        inv = np.float32(1.0) / np.sqrt(acc / np.float32(d) + eps)
        for i in range(d):
            y = h[r, i] * inv * (w[i] + plus)
            out[r, i] = x[r, i] + y if add else y


def _rope(x, cos, sin, out):
    """x (B, S, D) * cos (S, D) + rotate_half(x) * sin, one pass (HF's rotate_half)."""
    b, n, d = x.shape
    h = d // 2
    for i in range(b):
        for t in range(n):
            for j in range(h):
                x1, x2 = x[i, t, j], x[i, t, j + h]
                out[i, t, j] = x1 * cos[t, j] - x2 * sin[t, j]
                out[i, t, j + h] = x2 * cos[t, j + h] + x1 * sin[t, j + h]


def _attend(q, k, v, mask, scale, out):
    """softmax(q k^T * scale, masked) v for few query rows; q (Hq, L, E), k/v (Hk, S, E),
    mask (L, S) bool; query head h reads key/value head h // (Hq // Hk)."""
    hq, rows, e = q.shape
    hk, n, _ = k.shape
    reps = hq // hk
    p = np.empty(n, np.float32)
    for h in range(hq):
        kh = h // reps
        for r in range(rows):
            top = -np.inf
            for j in range(n):
                if mask[r, j]:
                    acc = np.float32(0.0)
                    for i in range(e):
                        acc += q[h, r, i] * k[kh, j, i]
                    acc *= scale
                    p[j] = acc
                    if acc > top:
                        top = acc
            den = np.float32(0.0)
            for j in range(n):
                if mask[r, j]:
                    p[j] = np.exp(p[j] - top)
                    den += p[j]
                else:
                    p[j] = 0.0
            inv = np.float32(1.0) / den if den > 0 else np.float32(0.0)  # all masked: zeros
            for i in range(e):
                out[h, r, i] = 0.0
            for j in range(n):
                if p[j] != 0.0:
                    pj = p[j] * inv
                    for i in range(e):
                        out[h, r, i] += pj * v[kh, j, i]


gemv_f32, gemv_bf16, gemv_int8 = _jit(_gemv_f32), _jit(_gemv_bf16), _jit(_gemv_int8)
# small per-call work: serial (no thread pool to wake, nothing to fight BLAS over)
rms_rows = _jit(_rms_rows, parallel=False)
_NO_X = np.zeros((0, 0), np.float32)
attend = _jit(_attend, parallel=False)
rope_rows = _jit(_rope, parallel=False)


# -- holding weights in a lower precision (once per bound weight) ----------------------------

def to_bf16_bits(w: np.ndarray) -> np.ndarray:
    """`w` rounded to bfloat16 (nearest even), as its uint16 bit patterns.

    >>> to_bf16_bits(np.array([[1.0, -2.0]], np.float32)).tolist()
    [[16256, 49152]]
    """
    return np.ascontiguousarray(w, np.float32).astype(ml_dtypes.bfloat16).view(np.uint16)


def to_int8(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`w` (out, in) as int8 with one float32 scale per output channel (symmetric, the row's
    largest magnitude maps to 127): `w ≈ q * scale[:, None]`.

    >>> q, s = to_int8(np.array([[1.0, -0.5], [0.0, 0.0]], np.float32))
    >>> q.tolist(), s.tolist()
    ([[127, -64], [0, 0]], [0.007874015718698502, 1.0])
    """
    w = np.asarray(w, np.float32)
    peak = np.max(np.abs(w), axis=1)
    scale = np.where(peak > 0, peak / 127.0, 1.0).astype(np.float32)
    q = np.clip(np.rint(w / scale[:, None]), -127, 127).astype(np.int8)
    return q, scale


# -- linear kernels ------------------------------------------------------------------------

def _rows(avals) -> int | None:
    m = 1
    for d in avals[0].shape[:-1]:
        if type(d) is not int:
            return None
        m *= d
    return m


def _gemv_checker(avals, params):
    x, w = avals[0], avals[1]
    if x.dtype != np.float32 or any(a.dtype != np.float32 for a in avals):
        return f"float32 only, got {', '.join(a.str_short() for a in avals)}"
    if w.ndim != 2:
        return f"weight must be 2-D, got {w.str_short()}"
    m = _rows(avals)
    if m is None or m > MAX_ROWS:
        return (f"a GEMV loop for at most {MAX_ROWS} rows (decode); "
                f"x {x.str_short()} has {'symbolic' if m is None else m} rows: BLAS wins")
    return None


def _as_rows(x, out, n):
    """x as (rows, K) and the (rows, N) array to write (a view of `out` when given)."""
    x2 = np.ascontiguousarray(x.reshape(-1, x.shape[-1]))
    if out is None:
        return x2, np.empty((x2.shape[0], n), np.float32), None
    return x2, out.reshape(x2.shape[0], n), out


def _finish(y2, out, x, n, b):
    if b:
        y2 += b[0]
    return out if out is not None else y2.reshape(*x.shape[:-1], n)


def linear_f32(x, w, *b, out=None):
    """`x @ w.T (+ b)` by the generated float32 GEMV."""
    n = w.shape[0]
    x2, y2, out = _as_rows(x, out, n)
    gemv_f32(x2, np.ascontiguousarray(w), y2)
    return _finish(y2, out, x, n, b)


def linear_bf16(x, w_bits, *b, out=None):
    """`x @ w.T (+ b)` with `w` held as bfloat16 bits (`to_bf16_bits`)."""
    n = w_bits.shape[0]
    x2, y2, out = _as_rows(x, out, n)
    gemv_bf16(x2, np.ascontiguousarray(w_bits), y2)  # (the loop reads it flat, to prefetch)
    return _finish(y2, out, x, n, b)


def linear_int8(x, w_q, *b, out=None):
    """`x @ w.T (+ b)` with `w` held as int8 and per-channel scales (`to_int8`)."""
    q, scale = w_q
    n = q.shape[0]
    x2, y2, out = _as_rows(x, out, n)
    gemv_int8(x2, np.ascontiguousarray(q), scale, y2)
    return _finish(y2, out, x, n, b)


# `x @ w.T` written by hand (or `linear` decomposed) is a dot_general contracting the last
# axes of a (rows, K) and an (N, K) operand: the same GEMVs serve it.
_XWT = (((1,), (1,)), ((), ()))


def _dot_checker(avals, params):
    if params["dimension_numbers"] != _XWT or avals[0].ndim != 2:
        return "a dot_general contracting the last axes of (rows, K) and (N, K)"
    return _gemv_checker(avals, params)


def dot_f32(x, w, *, dimension_numbers, out=None):
    """`x @ w.T` as a dot_general (see `linear_f32`)."""
    return linear_f32(x, w, out=out)


def dot_bf16(x, w_bits, *, dimension_numbers, out=None):
    """`x @ w.T` with `w` held as bfloat16 bits (see `linear_bf16`)."""
    return linear_bf16(x, w_bits, out=out)


def dot_int8(x, w_q, *, dimension_numbers, out=None):
    """`x @ w.T` with `w` held as int8 and per-channel scales (see `linear_int8`)."""
    return linear_int8(x, w_q, out=out)


# -- RMSNorm and few-query attention (decode) ------------------------------------------------

def _rms_norm_checker(avals, params):
    x = avals[0]
    if any(a.dtype != np.float32 for a in avals):
        return f"float32 only, got {', '.join(a.str_short() for a in avals)}"
    if len(params["normalized_shape"]) != 1 or not params["has_weight"]:
        return "normalizes the last axis, with a weight"
    if x.ndim < 1:
        return "x must have an axis to normalize"
    return None


def rms_norm_last(h, w, eps, plus=0.0, x=None, out=None):
    """`[x +] rms_norm(h, w + plus)` over the last axis in one pass per row (float32): the
    loop of the `rms_norm` kernel and of the norm patterns (`numba_patterns`)."""
    d = h.shape[-1]
    h2 = np.ascontiguousarray(h.reshape(-1, d))
    x2 = _NO_X if x is None else np.ascontiguousarray(x.reshape(-1, d))
    y2 = np.empty_like(h2) if out is None else out.reshape(h2.shape)
    rms_rows(x2, h2, np.ascontiguousarray(w), np.float32(eps), np.float32(plus), y2)
    return y2.reshape(h.shape) if out is None else out


def rms_norm_f32(x, w, *, normalized_shape, eps, has_weight, out=None):
    """RMSNorm over the last axis with a weight, one pass per row (float32)."""
    return rms_norm_last(x, w, eps, out=out)


def _rope_checker(avals, params):
    x, cos, sin = avals
    if any(a.dtype != np.float32 for a in avals):
        return f"float32 only, got {', '.join(a.str_short() for a in avals)}"
    if x.ndim < 2 or cos.shape != x.shape[-2:] or sin.shape != x.shape[-2:]:
        return f"cos and sin of x's last two axes (S, D), got {cos.str_short()} for " \
               f"{x.str_short()}"
    return None


def rope_f32(x, cos, sin, out=None):
    """RoPE (`apply_rotary_emb`) in one pass over x, float32: per (S, D) tables."""
    n, d = x.shape[-2:]
    x3 = np.ascontiguousarray(x.reshape(-1, n, d))
    y = np.empty_like(x3) if out is None else out.reshape(x3.shape)
    rope_rows(x3, np.ascontiguousarray(cos), np.ascontiguousarray(sin), y)
    return y.reshape(x.shape) if out is None else out


def _attention_checker(avals, params):
    q, k, v = avals[:3]
    if any(a.dtype != np.float32 for a in (q, k, v)):
        return f"float32 only, got {q.str_short()}, {k.str_short()}, {v.str_short()}"
    if params["is_causal"]:
        return "no causal flag (decode passes its mask)"
    if q.ndim < 3 or k.ndim != q.ndim or v.ndim != q.ndim:
        return f"(…, heads, rows, dim) operands of one rank, got {q.str_short()}, " \
               f"{k.str_short()}"
    if any(d != 1 for a in (q, k, v) for d in a.shape[:-3]):
        return "batch dims of 1 only"
    rows, heads = q.shape[-2], q.shape[-3]
    if type(rows) is not int or rows > MAX_ROWS:
        return f"a loop for at most {MAX_ROWS} query rows (decode), got {rows}"
    if type(heads) is not int or type(k.shape[-3]) is not int or heads % k.shape[-3]:
        return "query heads must be a multiple of the key/value heads"
    if k.shape[-3] != heads and not params["enable_gqa"]:
        return "key/value heads differ from query heads without enable_gqa"
    if params["has_mask"]:
        m = avals[3]
        if m.dtype != np.bool_ or any(d != 1 for d in m.shape[:-2]):
            return f"a boolean (rows, keys) mask shared by all heads, got {m.str_short()}"
    return None


def attention_f32(q, k, v, *mask, has_mask, is_causal, scale, enable_gqa, out=None):
    """Scaled dot-product attention of a few query rows over a KV cache, key/value heads
    shared by groups of query heads, one pass over the keys per query head (float32)."""
    e = q.shape[-1]
    if has_mask and not is_causal:   # the cache's positions no query sees
        k, v, m0 = trim_masked_keys(k, v, mask[0])
        mask = (m0,)
    q3 = np.ascontiguousarray(q.reshape(q.shape[-3:]))
    k3 = np.ascontiguousarray(k.reshape(k.shape[-3:]))
    v3 = np.ascontiguousarray(v.reshape(v.shape[-3:]))
    rows, n = q3.shape[1], k3.shape[1]
    m = (np.ascontiguousarray(mask[0].reshape(mask[0].shape[-2:])) if has_mask
         else np.ones((rows, n), np.bool_))
    if m.shape != (rows, n):
        m = np.ascontiguousarray(np.broadcast_to(m, (rows, n)))
    y = np.empty_like(q3) if out is None else out.reshape(q3.shape)
    attend(q3, k3, v3, m, np.float32(scale if scale is not None else 1.0 / np.sqrt(e)), y)
    return y.reshape(q.shape) if out is None else out


# the GEMVs, each for `linear` and for `x @ w.T`: (variant, lossy, held form, kernels)
_GEMVS = (
    ("numba", None, (), linear_f32, dot_f32),
    ("numba-bf16", 1e-2, (Prepare(1, to_bf16_bits, "bf16", 0.5),), linear_bf16, dot_bf16),
    ("numba-int8", 4e-2, (Prepare(1, to_int8, "int8", 0.25),), linear_int8, dot_int8),
)

if HAVE_NUMBA:
    for _variant, _lossy, _prepare, _linear, _dot in _GEMVS:
        for _name, _checker, _fn in (("linear", _gemv_checker, _linear),
                                     ("dot_general", _dot_checker, _dot)):
            register_kernel(_name, NAME, checker=_checker, variant=_variant, writes_out=True,
                            lossy=_lossy, own_pool=True, prepare=_prepare)(_fn)
    register_kernel("rms_norm", NAME, checker=_rms_norm_checker, variant="numba",
                    writes_out=True)(rms_norm_f32)
    register_kernel("scaled_dot_product_attention", NAME, checker=_attention_checker,
                    variant="numba", writes_out=True)(attention_f32)
    register_kernel("apply_rotary_emb", NAME, checker=_rope_checker, variant="numba",
                    writes_out=True)(rope_f32)
