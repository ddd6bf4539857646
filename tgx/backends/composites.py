"""Dedicated kernels for composite primitives, registered by primitive *name* and only when
`tgx.core.PRIMITIVES` has that name (composite families land independently of the backends).

Each backend lists `(primitive name, kernel factory, checker)` triples here; params follow the
primitive's own conventions, and a checker declines any parameter it does not recognise.
"""

from __future__ import annotations

from .registry import _KERNELS, Kernel, add_kernel


def _known_params(allowed: set):
    def check(avals, params):
        extra = set(params) - allowed
        if extra:
            return f"kernel does not know params {sorted(extra)}"
        return None
    return check


def _torch_table():
    import torch
    import torch.nn.functional as F

    def softmax(x, *, axis):
        return torch.softmax(x, dim=axis)

    def log_softmax(x, *, axis):
        return torch.log_softmax(x, dim=axis)

    def logsumexp(x, *, axes, keepdims):
        return torch.logsumexp(x, dim=axes, keepdim=keepdims)

    def gelu(x, *, approximate):
        return F.gelu(x, approximate=approximate)

    def layer_norm(x, *wb, normalized_shape, eps, has_weight, has_bias):
        wb = list(wb)
        w = wb.pop(0) if has_weight else None
        b = wb.pop(0) if has_bias else None
        return F.layer_norm(x, tuple(normalized_shape), w, b, eps)

    def rms_norm(x, *w, normalized_shape, eps, has_weight):
        return F.rms_norm(x, tuple(normalized_shape), w[0] if has_weight else None, eps)

    def sdpa(q, k, v, *mask, has_mask, is_causal, scale, enable_gqa):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask[0] if has_mask else None,
                                              is_causal=is_causal, scale=scale,
                                              enable_gqa=enable_gqa)

    def sdpa_ok(avals, params):
        if params.get("has_mask") and params.get("is_causal"):
            return "torch takes a mask or is_causal, not both"
        return None

    def linear(x, w, *b):
        return F.linear(x, w, b[0] if b else None)

    def conv(x, w, *b, stride, padding, dilation, groups):
        n = w.ndim - 2
        fn = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}[n]
        if all(lo == hi for lo, hi in padding):
            pad = tuple(lo for lo, _ in padding)
        else:  # asymmetric: pad explicitly (F.pad lists the last axis first)
            x = F.pad(x, [p for lo_hi in reversed(padding) for p in lo_hi])
            pad = 0
        return fn(x, w, b[0] if b else None, tuple(stride), pad, tuple(dilation), groups)

    def conv_ok(avals, params):
        if not 1 <= avals[1].ndim - 2 <= 3:
            return "torch has conv1d/2d/3d only"
        if any(lo < 0 or hi < 0 for lo, hi in params["padding"]):
            return "negative padding (cropping)"
        return None

    return {
        "softmax": (softmax, {"axis"}), "log_softmax": (log_softmax, {"axis"}),
        "logsumexp": (logsumexp, {"axes", "keepdims"}), "relu": (torch.relu, set()),
        "sigmoid": (torch.sigmoid, set()), "tanh": (torch.tanh, set()), "silu": (F.silu, set()),
        "gelu": (gelu, {"approximate"}),
        "layer_norm": (layer_norm, {"normalized_shape", "eps", "has_weight", "has_bias"}),
        "rms_norm": (rms_norm, {"normalized_shape", "eps", "has_weight"}),
        "scaled_dot_product_attention": (
            sdpa, {"has_mask", "is_causal", "scale", "enable_gqa"}, sdpa_ok),
        "linear": (linear, set()),
        "conv": (conv, {"stride", "padding", "dilation", "groups"}, conv_ok),
    }


def _jax_table():
    import jax
    import jax.numpy as jnp

    def softmax(x, *, axis):
        return jax.nn.softmax(x, axis=axis)

    def log_softmax(x, *, axis):
        return jax.nn.log_softmax(x, axis=axis)

    def logsumexp(x, *, axes, keepdims):
        return jax.scipy.special.logsumexp(x, axis=axes, keepdims=keepdims)

    def gelu(x, *, approximate):
        return jax.nn.gelu(x, approximate=approximate == "tanh")

    def linear(x, w, *b):
        y = jnp.matmul(x, w.T)
        return y + b[0] if b else y

    def conv(x, w, *b, stride, padding, dilation, groups):
        n = w.ndim - 2
        y = jax.lax.conv_general_dilated(
            x, w, tuple(stride), tuple(tuple(p) for p in padding), rhs_dilation=tuple(dilation),
            feature_group_count=groups,
            preferred_element_type=jnp.float32 if x.dtype in (jnp.float16, jnp.bfloat16) else None)
        if b:
            y = y + b[0].reshape((-1,) + (1,) * n)
        return y.astype(x.dtype)

    return {
        "softmax": (softmax, {"axis"}), "log_softmax": (log_softmax, {"axis"}),
        "logsumexp": (logsumexp, {"axes", "keepdims"}), "relu": (jax.nn.relu, set()),
        "sigmoid": (jax.nn.sigmoid, set()), "tanh": (jnp.tanh, set()),
        "silu": (jax.nn.silu, set()), "gelu": (gelu, {"approximate"}),
        "linear": (linear, set()), "conv": (conv, {"stride", "padding", "dilation", "groups"}),
    }


def _both(a, b):
    def check(avals, params):
        return a(avals, params) or b(avals, params)
    return check


_TABLES = {"torch": _torch_table, "jax": _jax_table}


def register(backend: str, primitives: dict) -> list[str]:
    """Register the dedicated kernels of `backend` whose primitive exists; returns their names.

    The param names are guesses until the composite families settle: a kernel whose checker
    sees an unknown param declines, and the planner falls back to the decomposition.
    """
    done = []
    for name, (fn, allowed, *extra) in _TABLES[backend]().items():
        if name not in primitives or (name, backend) in _KERNELS:
            continue
        known = _known_params(allowed)
        checker = known if not extra else _both(known, extra[0])
        add_kernel(Kernel(name, backend, fn, checker, "library"))
        done.append(name)
    return done
