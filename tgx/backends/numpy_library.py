"""NumPy kernels for the composite primitives models spend their time in, in the input dtype.

Every primitive's NumPy *reference* is also a NumPy kernel (numpy_backend.py), but the
references of composites are golden results: `linear`, `rms_norm`, attention and RoPE compute
in float64 and round once, so as kernels they convert every operand, weights included, to
float64 on every call (measured on the 18-layer Gemma decode: `linear@numpy` 108 ms of a 145
ms step, the GEMVs alone ~20 ms in float32). These kernels compute in the operands' own dtype
(float32 or float64; half precision is left to the reference), as a user writing NumPy by hand
would, and rank first (variant "library"); the selection still measures them against the
reference and the decomposition, and the profiler checks them against the golden result.

>>> import numpy as np
>>> from tgx.backends.registry import kernels_for
>>> sorted(k.variant for k in kernels_for("linear", "numpy") if k.variant in ("default", "library"))
['default', 'library']
>>> numpy_linear(np.ones((2, 3), np.float32), np.ones((4, 3), np.float32)).dtype
dtype('float32')
"""

from __future__ import annotations

import numpy as np

from ..primitives.activations import _GELU_A, _GELU_C, _log_softmax_ref, _softmax_ref
from ..primitives.elementwise import special
from .registry import Prepare, register_kernel

NAME = "numpy"
_EXACT = (np.dtype(np.float32), np.dtype(np.float64))


def _float_operands(avals, params):
    if not all(a.dtype in _EXACT for a in avals if a.dtype != np.bool_):
        return "computes in the operands' dtype: float32/float64 only (half goes through the " \
               "reference)"
    return None


#: a last axis up to this long is summed a column at a time: NumPy's reduction pays ~12 ns
#: a row for a sum ((256, 2) float32: 3.5 us a call), a ufunc over two columns ~0.5 us
SHORT_AXIS = 4
#: ... and its maximum or minimum, which NumPy takes at ~40 ns a row ((4096, 8) float32: 185
#: against 11 us by columns; (1024, 16): 84 against 13)
SHORT_EXTREMA_AXIS = 16


def short_last_axis(x, axes, longest: int = SHORT_AXIS) -> bool:
    """Whether `x` (float32/float64) is reduced over a last axis of 2 to `longest` with rows
    enough (16 per column after the first) for a ufunc per column to beat NumPy's loop."""
    if x.ndim < 2 or tuple(axes) != (x.ndim - 1,):
        return False
    n = x.shape[-1]
    return 2 <= n <= longest and x.size >= 16 * n * (n - 1) and x.dtype in _EXACT


def last_axis_reduce(ufunc, x, out=None):
    """`ufunc.reduce(x, axis=-1)` as a ufunc of columns, left to right (so a sum rounds as
    NumPy's own of fewer than 8 terms does), for a `short_last_axis`.

    >>> last_axis_reduce(np.add, np.float32([[1, 2, 3]])).tolist()
    [6.0]
    """
    r = ufunc(x[..., 0], x[..., 1], out=out)
    for i in range(2, x.shape[-1]):
        ufunc(r, x[..., i], out=r)
    return r


@register_kernel("softmax", NAME, checker=_float_operands, variant="library")
def numpy_softmax(x, *, axis):
    """The reference's softmax; over a short last axis (a classifier's few logits) with
    its reductions a column at a time."""
    if not short_last_axis(x, (axis,)):
        return _softmax_ref(x, axis=axis)
    e = np.exp(x - last_axis_reduce(np.maximum, x)[..., None])
    return e / last_axis_reduce(np.add, e)[..., None]


@register_kernel("log_softmax", NAME, checker=_float_operands, variant="library")
def numpy_log_softmax(x, *, axis):
    """The reference's log_softmax; over a short last axis as `numpy_softmax` (22 against
    6 us for (256, 2) float32 logits)."""
    if not short_last_axis(x, (axis,)):
        return _log_softmax_ref(x, axis=axis)
    s = x - last_axis_reduce(np.maximum, x)[..., None]
    return s - np.log(last_axis_reduce(np.add, np.exp(s)))[..., None]


@register_kernel("linear", NAME, checker=_float_operands, variant="library")
def numpy_linear(x, w, *b):
    y = np.matmul(x, w.T)
    if b:
        y += b[0]
    return y


def _held_transposed(w):
    """A weight (N, K) held as its contiguous transpose (K, N): converted once per bound
    weight (`Kernel.prepare`), in a copy of the weight's size."""
    return np.ascontiguousarray(w.T)


def _linear_held_t_ok(avals, params):
    if avals[1].ndim != 2:
        return f"weight must be 2-D, got {avals[1].str_short()}"
    return _float_operands(avals, params)


@register_kernel("linear", NAME, checker=_linear_held_t_ok, variant="held-t", writes_out=True,
                 prepare=(Prepare(1, _held_transposed, "transposed"),))
def numpy_linear_held_t(x, wt, *b, out=None):
    """`linear` reading its weight held transposed, (K, N) in rows: OpenBLAS runs the plain
    product of row-major operands faster than the one with a transposed operand at the
    small sizes of a toy model (64x128 by 128x256: 31 against 34 us; by 256x128: 30 against
    36 us; 2026-11-24)."""
    y = np.matmul(x, wt, out=out)
    if b:
        y += b[0]
    return y


@register_kernel("matmul", NAME, checker=_float_operands, variant="library")
def numpy_matmul(a, b):
    return np.matmul(a, b)


@register_kernel("rms_norm", NAME, checker=_float_operands, variant="library")
def numpy_rms_norm(x, *w, normalized_shape, eps, has_weight):
    axes = tuple(range(x.ndim - len(normalized_shape), x.ndim))
    y = x * (1.0 / np.sqrt(np.mean(np.square(x), axis=axes, keepdims=True) + x.dtype.type(eps)))
    if has_weight:
        y *= w[0]
    return y


@register_kernel("apply_rotary_emb", NAME, checker=_float_operands, variant="library")
def numpy_apply_rotary_emb(x, cos, sin):
    h = x.shape[-1] // 2
    out = x * cos
    out[..., :h] -= x[..., h:] * sin[..., :h]
    out[..., h:] += x[..., :h] * sin[..., h:]
    return out


@register_kernel("gelu", NAME, checker=_float_operands, variant="library")
def numpy_gelu(x, *, approximate):
    t = x.dtype.type
    if approximate == "tanh":
        inner = np.tanh(t(_GELU_C) * (x + t(0.044715) * x * x * x))
    else:
        inner = special().erf(x * t(1 / np.sqrt(2.0)))
    return t(0.5) * x * (1 + inner)


def _same_shape_float(avals, params):
    if avals[0].shape != avals[1].shape:
        return "operands of different shapes (written in place: no broadcasting)"
    return _float_operands(avals, params)


@register_kernel("gelu_grad", NAME, checker=_same_shape_float, variant="library")
def numpy_gelu_grad(ct, x, *, approximate):
    """`ct * gelu'(x)` in three buffers, written in place (a fresh buffer per step paid a
    first-touch page fault per page: 6.3 ms for 512x1024 float32, 1.5 ms op by op)."""
    t = x.dtype.type
    x2 = x * x
    if approximate == "tanh":
        th = x2 * t(_GELU_C * _GELU_A)
        th += t(_GELU_C)
        th *= x
        np.tanh(th, out=th)
        np.minimum(x2, t(100.0), out=x2)      # as the decomposition: no overflow in x^2
        x2 *= t(1.5 * _GELU_A * _GELU_C)
        x2 += t(0.5 * _GELU_C)
        d = th * th
        np.subtract(t(1.0), d, out=d)
        d *= x
        d *= x2
        th += t(1.0)
        th *= t(0.5)
        d += th
    else:
        d = special().erf(x * t(1 / np.sqrt(2.0)))
        d += t(1.0)
        d *= t(0.5)
        x2 *= t(-0.5)
        np.exp(x2, out=x2)
        x2 *= t(1 / np.sqrt(2 * np.pi))
        x2 *= x
        d += x2
    d *= ct
    return d


def _sdpa_ok(avals, params):
    return _float_operands(avals[:3], params)


def visible_keys(mask) -> int | None:
    """How many leading keys a boolean `mask` (..., keys) leaves some query to see, where
    trimming the rest is worth it; None where it is not (fewer than 64 keys, fewer than 16
    hidden at the end, or none visible: a fully masked row stays as the library computes it).
    """
    s = mask.shape[-1]
    if s < 64:
        return None
    seen = np.flatnonzero(mask.reshape(-1, s).any(0))
    n = int(seen[-1]) + 1 if seen.size else s
    return None if n > s - 16 else n


def trim_masked_keys(k, v, mask):
    """(k, v, mask) without the trailing keys a boolean `mask` hides from every query: they
    get weight exp(-inf) = 0, so attention over the rest is the same. A KV cache holds fewer
    valid positions than its size (Gemma's decode: 129 of 256), which a shape cannot say (the
    position is a traced value); the mask says it (`visible_keys`;
    `torch_backend.trim_masked_keys` is torch's twin).

    >>> k = np.zeros((1, 80, 4), np.float32); m = np.zeros((2, 80), bool); m[:, :10] = True
    >>> [a.shape for a in trim_masked_keys(k, k, m)]
    [(1, 10, 4), (1, 10, 4), (2, 10)]
    """
    if mask.dtype != np.bool_ or k.shape[-2] != mask.shape[-1]:
        return k, v, mask
    n = visible_keys(mask)
    if n is None:
        return k, v, mask
    return k[..., :n, :], v[..., :n, :], mask[..., :n]


@register_kernel("scaled_dot_product_attention", NAME, checker=_sdpa_ok, variant="library")
def numpy_sdpa(q, k, v, *mask, has_mask, is_causal, scale, enable_gqa):
    """Grouped-query attention without repeating keys: the query heads that share a key/value
    head are stacked into one (reps * L, E) matrix, so each key/value head is one matmul."""
    m = mask[0] if has_mask else None
    if m is not None and not is_causal:
        k, v, m = trim_masked_keys(k, v, m)
    return sdpa_with(masked_softmax, q, k, v, m, is_causal, scale, enable_gqa)


#: keys up to this many elements are copied transposed before the product of the scores:
#: (2, 128, 32) by 64 keys of 32 took 12.9 us so against 15.4, 4 heads of 64x64 25.5 against
#: 31.8; from 32768 elements the copy costs more than it saves (a Gemma prefill's 128 keys
#: of 256: 210 against 186 us; 2026-11-24)
_SMALL_KEYS = 16384


def sdpa_with(softmax, q, k, v, m, is_causal, scale, enable_gqa):
    """`numpy_sdpa` with the attention weights computed by `softmax(scores, mask,
    is_causal, scale)` (which may overwrite the scores)."""
    # (the shapes were checked when traced: `_batch_shapes` on arrays took 5 us a call)
    reps = q.shape[-3] // k.shape[-3] if enable_gqa and q.ndim >= 3 and k.ndim >= 3 else 1
    L, S = q.shape[-2], k.shape[-2]
    kt = np.swapaxes(k, -1, -2)
    if k.size <= _SMALL_KEYS:   # copied into rows: OpenBLAS's plain product is the faster
        kt = np.ascontiguousarray(kt)
    if reps == 1:
        s = np.matmul(q, kt)
        return np.matmul(softmax(s, m, is_causal, scale), v)
    *batch, hq, _, E = q.shape
    hk = hq // reps
    s = np.matmul(q.reshape(*batch, hk, reps * L, E), kt)
    if m is not None and m.ndim >= 3:  # a head axis (1 or Hq) becomes (Hk, reps)
        hm = m.shape[-3]
        m = m.reshape(m.shape[:-3] + ((hk, reps) if hm != 1 else (1, 1)) + m.shape[-2:])
    p = softmax(s.reshape(*batch, hk, reps, L, S), m, is_causal, scale)
    return np.matmul(p.reshape(*batch, hk, reps * L, S), v).reshape(*batch, hq, L, E)


#: a row whose sum of exp(s - global max) is below this is computed again with its own
#: maximum (its terms may have underflowed); above it, every term that matters to float32 is
#: a normal number, for rows of up to 1e6 keys
_TINY_SUM = 1e-15


def masked_softmax(s, mask, is_causal, scale):
    """softmax(s * scale) over the last axis under a causal and/or given mask (bool: True
    attends; float: added); a row with every key masked gives zeros. `s` is overwritten.

    Shifted by the maximum of the whole array, not of each row: a reduction over short rows
    is slow in NumPy (16 of 62 us for 4x64x64 float32). Rows whose sum comes out tiny (a
    maximum far below the global one, or every key masked) are computed again with their own
    maximum; a NaN anywhere takes that path for every row."""
    s *= s.dtype.type(scale)
    L, S = s.shape[-2:]
    if is_causal:
        causal = np.tril(np.ones((L, S), bool))
        mask = (causal if mask is None else mask & causal if mask.dtype == np.bool_
                else np.where(causal, mask, -np.inf))
    if mask is not None:
        in_place = np.broadcast_shapes(mask.shape, s.shape) == s.shape
        if mask.dtype == np.bool_:
            if in_place:
                np.copyto(s, -np.inf, where=~mask)
            else:
                s = np.where(mask, s, -np.inf)
        elif in_place:
            s += mask.astype(s.dtype, copy=False)
        else:
            s = s + mask.astype(s.dtype)
    g = s.max() if s.size else 0.0
    if np.isfinite(g):
        e = s - g
        np.exp(e, out=e)
        den = e.sum(-1, keepdims=True)
        redo = (den < _TINY_SUM)[..., 0]
        if not redo.any():
            e /= den
            return e
    else:  # a NaN, or every score masked
        e, den = np.empty_like(s), None
        redo = np.ones(s.shape[:-1], bool)
    r = s[redo]
    mx = r.max(-1, keepdims=True)
    mx[~np.isfinite(mx)] = 0
    r = np.exp(r - mx)
    d = r.sum(-1, keepdims=True)
    d[d == 0] = 1
    e[redo] = r / d
    if den is not None:
        keep = ~redo
        e[keep] /= den[keep]
    return e
