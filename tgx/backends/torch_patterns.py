"""Pattern kernels of the torch backend: the RMSNorm family as one CUDA kernel on a GPU, one
torch expression elsewhere.

`rms_norm_1p`, `residual_rms_norm` and `residual_rms_norm_1p` (the patterns of
`tgx.backends.numba_patterns`: Gemma's `(1 + w)` norms and the residual add of a normalised
branch) on torch tensors. On CUDA float32 tensors they run `cuda/rms_norm.cu` — one block per
row, a warp-shuffle reduction, the residual add and the `1 + w` fused into the write —
built as a torch extension on first use (`torch.utils.cpp_extension`, cached by torch in its
extensions directory). Anywhere else (CPU tensors, other dtypes) they compute the same in one
torch expression. A test compiles the CUDA source with nvcc where there is no GPU; the `cuda`
tests run it against float64.

>>> import numpy as np
>>> SOURCE.name
'rms_norm.cu'
"""

from __future__ import annotations

import functools
import pathlib

from .numba_patterns import _float32, _same_shape, pattern_forms
from .registry import Kernel, LazyForms, add_kernel

NAME = "torch"
SOURCE = pathlib.Path(__file__).with_name("cuda") / "rms_norm.cu"
#: calls that ran the CUDA kernel (tests check that a GPU plan used it)
CUDA_CALLS = [0]


@functools.cache
def extension():
    """The CUDA kernel as a torch extension (compiled with nvcc on first use)."""
    from torch.utils.cpp_extension import load

    return load(name="tgx_rms_norm", sources=[str(SOURCE)],
                extra_cflags=["-DTGX_TORCH_EXTENSION", "-O3"],
                extra_cuda_cflags=["-DTGX_TORCH_EXTENSION", "-O3"], verbose=False)


def _norm(x, h, w, eps: float, plus: float):
    import torch

    if h.is_cuda and h.dtype == torch.float32 and w.dtype == torch.float32:
        CUDA_CALLS[0] += 1
        return extension().residual_rms_norm(h if x is None else x, h, w, float(eps),
                                             float(plus), x is not None)
    y = h * torch.rsqrt(h.square().mean(-1, keepdim=True) + eps) * (w + plus)
    return y if x is None else x + y


def rms_norm_1p(h, w, *, eps):
    """`rms_norm(h, 1 + w)` over the last axis."""
    return _norm(None, h, w, eps, 1.0)


def residual_rms_norm(x, h, w, *, eps):
    """`x + rms_norm(h, w)` over the last axis."""
    return _norm(x, h, w, eps, 0.0)


def residual_rms_norm_1p(x, h, w, *, eps):
    """`x + rms_norm(h, 1 + w)` over the last axis."""
    return _norm(x, h, w, eps, 1.0)


for _name, _fn, _checker in (("rms_norm_1p", rms_norm_1p, _float32),
                             ("residual_rms_norm", residual_rms_norm, _same_shape),
                             ("residual_rms_norm_1p", residual_rms_norm_1p, _same_shape)):
    _forms = LazyForms(functools.partial(pattern_forms, _name))
    add_kernel(Kernel(_name, NAME, _fn, _checker, "fused", pattern=_forms))
