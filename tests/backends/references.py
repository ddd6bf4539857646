"""float64 NumPy references shared by the kernel tests of several modules."""

import numpy as np


def attention64(q, k, v, mask, scale, causal=False):
    """Scaled dot-product attention in float64 over (…, heads, rows, dim) operands, the
    key/value heads repeated for grouped queries, `mask` (rows, keys) booleans or None,
    `causal` the lower triangle; a row that may attend to no key is zeros."""
    q, k, v = (a.astype(np.float64) for a in (q, k, v))
    reps = q.shape[-3] // k.shape[-3]
    k, v = np.repeat(k, reps, axis=-3), np.repeat(v, reps, axis=-3)
    s = q @ np.swapaxes(k, -1, -2) * scale
    if causal:
        mask = np.tril(np.ones(s.shape[-2:], bool))
    if mask is not None:
        s = np.where(mask, s, -np.inf)
    top = np.max(s, axis=-1, keepdims=True)
    e = np.exp(s - np.where(np.isfinite(top), top, 0))
    den = e.sum(-1, keepdims=True)
    return (e / np.where(den > 0, den, 1)) @ v
