"""Pattern kernels: one kernel for a multi-equation *pattern* of atomic operations.

A pattern kernel is registered with `pattern=` (a `Graph`); `tgx.paths` finds every occurrence
with `tgx.find_pattern` in each graph it explores (the user's graph and every decomposition),
so the kernel applies to any model containing the pattern, including one written by hand
from `tgx.numpy` ops. The kernel gets the values bound to the pattern's inputs, in order.

RMSNorm over the last axis, `x * (1 / sqrt(mean(x²) + eps)) * w` (the form `rms_norm`
decomposes into) and `x / sqrt(mean(x*x) + eps) * w` (the common hand-written form), for
inputs of rank 2 and 3, on NumPy and PyTorch.

>>> from tgx.backends.registry import kernels_for
>>> sorted({k.backend for k in kernels_for("rms_norm_pattern", "numpy")})
['numpy']
"""

from __future__ import annotations

import numpy as np

from .. import numpy as tnp
from ..shapes import Spec, float32, float64
from ..tracing import make_graph
from .registry import Kernel, add_kernel

NAME = "rms_norm_pattern"


def _rsqrt_form(x, eps, w):
    ms = tnp.mean(tnp.square(x), axis=-1, keepdims=True)
    return tnp.multiply(tnp.multiply(x, tnp.divide(1, tnp.sqrt(tnp.add(ms, eps)))), w)


def _div_form(x, eps, w):
    ms = tnp.mean(tnp.multiply(x, x), axis=-1, keepdims=True)
    return tnp.multiply(tnp.divide(x, tnp.sqrt(tnp.add(ms, eps))), w)


def _checker(avals, params):
    x, eps, w = avals
    if x.dtype not in (float32, float64):
        return f"rms_norm pattern kernels take float32/float64, got {x.str_short()}"
    if w.dtype != x.dtype or eps.ndim != 0:
        return f"weight {w.str_short()} / eps {eps.str_short()} do not fit x {x.str_short()}"
    return None


def numpy_rms_norm(x, eps, w, **_):
    ms = np.mean(np.square(x), axis=-1, keepdims=True)
    return (x * (1 / np.sqrt(ms + eps.astype(x.dtype))) * w).astype(x.dtype, copy=False)


def torch_rms_norm(x, eps, w, **_):
    import torch

    return x * torch.rsqrt(x.square().mean(-1, keepdim=True) + eps.to(x.dtype)) * w


def _register() -> None:
    for form_name, form in (("rsqrt", _rsqrt_form), ("div", _div_form)):
        for rank in (2, 3):
            dims = ("B", "T", "D")[3 - rank:]
            pattern = make_graph(form)(Spec(dims), Spec(()), Spec(("D",)))
            for backend, fn in (("numpy", numpy_rms_norm), ("torch", torch_rms_norm)):
                add_kernel(Kernel(NAME, backend, fn, _checker, f"{form_name}{rank}d",
                                  pattern=pattern))


_register()
