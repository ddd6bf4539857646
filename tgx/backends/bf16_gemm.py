"""GEMMs with the weight held in bfloat16, run by oneDNN (through torch) on CPUs with AVX512-BF16.

Prefill multiplies many rows by every weight, so it is bound by the GEMMs' arithmetic, not
by the weight bytes that bound decode. On a CPU with the AVX512-BF16 dot-product instruction
(`vdpbf16ps`: pairs of bfloat16 products summed into float32), oneDNN's bfloat16 GEMM does
twice the float32 work per instruction: measured on the 2-core development CPU (AMD EPYC,
2026-11-24), `(128, 640) @ (640, 2048)` ran 0.81 ms in bfloat16 against 1.98 ms in float32
(413 against 169 GFLOP/s; NumPy's OpenBLAS 160 GFLOP/s).

The kernels here are NumPy-backend kernels, like the numba ones: they read and write NumPy
arrays, viewed as torch tensors without a copy, and hold the weight as bfloat16 bits
(`numba_kernels.to_bf16_bits`, converted once per bound weight: `Prepare`). The activations
are rounded to bfloat16 on the way in and the product comes back in bfloat16 (torch offers no
float32 output on the CPU), so each product carries a relative error of ~4e-3 of its scale
(float32 weights: ~1e-7). They are lossy (`Kernel.lossy`): offered only under `tolerance=`,
and kept only when the whole path's error stays within it (`tgx.precision`). They decline a
few rows (decode), where the GEMV loops of `numba_kernels` stream held weights faster, and a
CPU without bfloat16 support, where oneDNN would emulate it slowly.

>>> import numpy as np
>>> x, w = np.ones((16, 8), np.float32), np.full((3, 8), 0.5, np.float32)
>>> bool(np.allclose(linear_bf16(x, to_bf16_bits(w)), 4.0)) if available() else True
True
"""

from __future__ import annotations

import functools
import importlib.util

import numpy as np

from .numba_kernels import MAX_ROWS, _XWT, _rows, to_bf16_bits
from .registry import Prepare, register_kernel
from .torch_views import tensor_of

NAME = "numpy"
#: the error a product may carry, relative to its output's scale (the profiler checks it;
#: measured ~4e-3 on N(0, 1) operands of 640 terms)
LOSSY = 2e-2


@functools.cache
def available() -> bool:
    """Whether torch is installed and this CPU has bfloat16 dot products (AVX512-BF16 or
    AMX), which oneDNN uses natively. Read from /proc/cpuinfo, so that planning a NumPy plan
    does not import torch; elsewhere (no /proc) the kernels decline."""
    if importlib.util.find_spec("torch") is None:
        return False
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            flags = next((line.split(":", 1)[1].split() for line in f
                          if line.startswith("flags")), [])
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def _checker(avals, params):
    x, w = avals[0], avals[1]
    if any(a.dtype != np.float32 for a in avals):
        return f"float32 only, got {', '.join(a.str_short() for a in avals)}"
    if w.ndim != 2:
        return f"weight must be 2-D, got {w.str_short()}"
    m = _rows(avals)
    if m is not None and m <= MAX_ROWS:
        return (f"a GEMM for more than {MAX_ROWS} rows; x {x.str_short()} has {m}: the "
                f"numba GEMVs stream a held weight faster")
    if not available():
        return "needs torch with oneDNN bfloat16 support (AVX512-BF16) on this CPU"
    return None


def _dot_checker(avals, params):
    if params["dimension_numbers"] != _XWT or avals[0].ndim != 2:
        return "a dot_general contracting the last axes of (rows, K) and (N, K)"
    return _checker(avals, params)


def linear_bf16(x, w_bits, *b, out=None):
    """`x @ w.T (+ b)` in bfloat16 by oneDNN, `w` held as bfloat16 bits (`to_bf16_bits`),
    the result widened to float32 (into `out` when given)."""
    import torch

    k, n = x.shape[-1], w_bits.shape[0]
    xt = tensor_of(x.reshape(-1, k)).to(torch.bfloat16)
    wt = torch.from_numpy(w_bits.view(np.int16)).view(torch.bfloat16)
    y = torch.nn.functional.linear(xt, wt)
    if b:
        y = y.float().add_(tensor_of(np.asarray(b[0], np.float32)))
    if out is None:
        out = np.empty((*x.shape[:-1], n), np.float32)
    torch.from_numpy(out.reshape(-1, n)).copy_(y)
    return out


def dot_bf16(x, w_bits, *, dimension_numbers, out=None):
    """`x @ w.T` as a dot_general (see `linear_bf16`)."""
    return linear_bf16(x, w_bits, out=out)


_HELD = (Prepare(1, to_bf16_bits, "bf16", 0.5),)
# own_pool: oneDNN runs on torch's OpenMP pool, so BLAS is capped to one thread in a plan with
# these kernels (tgx.backends.threads)
register_kernel("linear", NAME, checker=_checker, variant="onednn-bf16", writes_out=True,
                lossy=LOSSY, own_pool=True, prepare=_HELD)(linear_bf16)
register_kernel("dot_general", NAME, checker=_dot_checker, variant="onednn-bf16",
                writes_out=True, lossy=LOSSY, own_pool=True, prepare=_HELD)(dot_bf16)
