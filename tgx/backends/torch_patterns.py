"""Pattern kernels of the torch backend: the RMSNorm family as one CUDA kernel on a GPU, three
passes of torch calls elsewhere; a GeGLU's gate (`gelu_tanh_gate`) in one buffer on the CPU;
Adam's and AdamW's update of one parameter as torch's fused Adam kernels. All write into the
plan's buffers (`writes_out`, `outs_into`).

`rms_norm_1p`, `residual_rms_norm` and `residual_rms_norm_1p` (the patterns of
`tgx.backends.numba_patterns`: Gemma's `(1 + w)` norms and the residual add of a normalised
branch) on torch tensors. On CUDA float32 tensors they run `cuda/rms_norm.cu` — one block per
row, a warp-shuffle reduction, the residual add and the `1 + w` fused into the write —
built as a torch extension on first use (`torch.utils.cpp_extension`, cached by torch in its
extensions directory). Anywhere else (CPU tensors, other dtypes) they compute the same with
torch calls: the mean square from one `vector_norm`, the residual add in `addcmul`. A test
compiles the CUDA source with nvcc where there is no GPU; the `cuda` tests run it against float64.

`adam_update` is the step `tgx.optim.adam` (amsgrad off) and `apply_updates` trace into, per
parameter: `m' = m + c1 (g - m)`, `v' = b2 v + c2 g²`, `p' = p + nss · m' / (sqrt(v') / bc2 +
eps)`, where `nss` (minus the bias-corrected step size) and `bc2` (the square root of the
second bias correction) are scalars the graph computes once for all parameters. torch's
`_fused_adam_` does it in one pass over p, g, m and v (1.3 ms for the 54 parameters of
bench_train's lm-large, against 8.8 ms for tgx's torch plan op by op), writing p', m' and v'
into the state buffers (`Kernel.outs_into`). It takes the step count and the learning rate,
not `nss` and `bc2`: the kernel recovers the count from `bc2` and the rate from `nss` and the
count, in float64, so that torch's bias corrections give back the graph's scalars to
float32's precision (tested against float64 at counts 1 to 30000). `adamw_update` is the
same for `tgx.optim.adamw`, whose update also subtracts `lr * weight_decay * p`
(`torch._fused_adamw_`).

>>> import numpy as np
>>> SOURCE.name
'rms_norm.cu'
"""

from __future__ import annotations

import functools
import math
import pathlib

import numpy as np

from .numba_patterns import (_float32, _same_shape, adam_checker, adam_forms, adam_pattern,
                             adamw_pattern, pattern_forms)
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


def _norm(x, h, w, eps: float, plus: float, out=None):
    import torch

    if h.is_cuda and h.dtype == torch.float32 and w.dtype == torch.float32:
        CUDA_CALLS[0] += 1
        y = extension().residual_rms_norm(h if x is None else x, h, w, float(eps),
                                          float(plus), x is not None)
        return y if out is None else out.copy_(y)
    # the mean square from one reduction (`vector_norm`, squared back on the (rows, 1)
    # result), the residual add fused into `addcmul`: 3 passes over h where square, mean,
    # two multiplies and an add made 5 (128x640, residual: 37.3 -> 28.8 µs)
    r = torch.linalg.vector_norm(h, dim=-1, keepdim=True)
    r = r.square_().mul_(1.0 / h.shape[-1]).add_(eps).rsqrt_()
    if x is None:
        return torch.mul(h, r, out=out).mul_(w + plus)
    return torch.addcmul(x, torch.mul(h, r), w + plus, out=out)


def rms_norm_1p(h, w, *, eps, out=None):
    """`rms_norm(h, 1 + w)` over the last axis (into `out` where given: the plan's buffer)."""
    return _norm(None, h, w, eps, 1.0, out)


def residual_rms_norm(x, h, w, *, eps, out=None):
    """`x + rms_norm(h, w)` over the last axis."""
    return _norm(x, h, w, eps, 0.0, out)


def residual_rms_norm_1p(x, h, w, *, eps, out=None):
    """`x + rms_norm(h, 1 + w)` over the last axis."""
    return _norm(x, h, w, eps, 1.0, out)


def gelu_tanh_cpu(x, gate=None, out=None):
    """`gelu(x, approximate="tanh")` (times `gate`) on the CPU as `x * sigmoid(2z)`, the same
    function as `0.5 x (1 + tanh z)`, in place in one buffer: torch's own CPU kernel for the
    tanh form took 206 us on a (128, 2048) float32 tensor, this 111 (erf's GELU: 50). Below
    ~32k elements its six calls cost more than they save (one row of 2048, gated: 11.8 us
    against 5.2), so small tensors keep torch's kernel. `out`: the buffer to write."""
    import torch

    if x.numel() < 32768:
        y = torch.ops.aten.gelu.out(x, approximate="tanh", out=out) if out is not None \
            else torch.nn.functional.gelu(x, approximate="tanh")
        return y if gate is None else y.mul_(gate)
    k = 2 * 0.7978845608028654   # 2 sqrt(2 / pi)
    z = torch.mul(x, x, out=out)
    z.mul_(0.044715 * k).add_(k).mul_(x)
    torch.sigmoid_(z)
    z.mul_(x)
    return z if gate is None else z.mul_(gate)


def gelu_tanh_gate(a, b, out=None):
    """`gelu(a, approximate="tanh") * b` (a GeGLU's gate): in one buffer on the CPU
    (`gelu_tanh_cpu`: 135 us at (128, 2048) against 242 for `F.gelu` and a
    multiply), `F.gelu` on a GPU, where it is one fused kernel."""
    import torch
    import torch.nn.functional as F

    if a.is_cuda:
        return torch.mul(F.gelu(a, approximate="tanh"), b, out=out)
    return gelu_tanh_cpu(a, b, out)


for _name, _fn, _checker in (("rms_norm_1p", rms_norm_1p, _float32),
                             ("residual_rms_norm", residual_rms_norm, _same_shape),
                             ("residual_rms_norm_1p", residual_rms_norm_1p, _same_shape),
                             ("gelu_tanh_gate", gelu_tanh_gate, _same_shape)):
    _forms = LazyForms(functools.partial(pattern_forms, _name))
    # written into the plan's buffer: a fresh result costs a pass in a plan
    # (`CostModel.fresh_output_s`)
    add_kernel(Kernel(_name, NAME, _fn, _checker, "fused", writes_out=True, pattern=_forms))


def _fused_adam_args(nss: float, bc2: float, c1: float, b2: float, c2: float, eps: float,
                     dr: float = 0.0) -> dict | None:
    """`torch._fused_adam(w)_`'s scalars computing what `adam(w)_update` computes, or None
    where they cannot (constants that are not an Adam's: b2 + c2 != 1, weights outside
    [0, 1)). `dr`: AdamW's decay per step, `lr * weight_decay`."""
    beta1, beta2 = 1.0 - c1, 1.0 - c2
    if not (0 <= c1 < 1 and 0 < c2 < 1 and abs(b2 - beta2) <= 1e-7 and 0 < bc2 <= 1
            and eps >= 0 and math.isfinite(nss) and math.isfinite(dr)):
        return None
    # torch computes bc2 = sqrt(1 - beta2**t) and step size lr / (1 - beta1**t) from the
    # count t: t from bc2, then lr from that t, so both come back as the graph's
    sq = bc2 * bc2
    t = math.log1p(-sq) / math.log(beta2) if sq < 1 else math.inf
    t = float(np.float32(t))   # as the float32 step tensor holds it
    lr = -nss * (1.0 - beta1 ** t)
    if dr and not lr > 0:   # AdamW's decay is lr * weight_decay: a rate is needed
        return None
    return dict(lr=lr, beta1=beta1, beta2=beta2, weight_decay=dr / lr if dr else 0.0,
                eps=eps, amsgrad=False, maximize=False, step=t)


def _adam_step(p, g, m, v, scalars, dr, outs):
    import torch

    outs = outs or {}
    new = []
    for i, x in enumerate((p, m, v)):
        buf = outs.get(i)
        if buf is None:
            buf = x.clone(memory_format=torch.contiguous_format)
        elif buf.data_ptr() != x.data_ptr():
            buf.copy_(x)
        new.append(buf)
    P, M, V = new
    s = [float(x) for x in scalars]
    dr = float(dr) if dr is not None else 0.0
    if not g.is_contiguous():   # a transposed gradient (x.T @ dy, transposed): one copy,
        g = g.contiguous()      # where the formulas op by op made seven passes
    args = _fused_adam_args(*s, dr) if all(
        t.is_contiguous() for t in (P, M, V)) and g.device == P.device else None
    if args is not None:
        step = torch.tensor(args.pop("step"), dtype=torch.float32, device=P.device)
        fused = torch._fused_adamw_ if dr else torch._fused_adam_
        fused([P], [g], [M], [V], [], [step], **args)
        return P, M, V
    nss, bc2, c1, b2, c2, eps = s   # the formulas as they are, in place
    M.add_(g - M, alpha=c1)
    V.mul_(b2).addcmul_(g, g, value=c2)
    u = M / (V.sqrt().div_(bc2).add_(eps))
    u.mul_(nss)
    if dr:
        u.sub_(P, alpha=dr)
    P.add_(u)
    return P, M, V


def adam_update(p, g, m, v, nss, bc2, c1, b2, c2, eps, outs=None):
    """One Adam step of one parameter (see the module doc): `(p', m', v')`, written into
    `outs={position: tensor}` where given (the state buffers; one may be its own input)."""
    return _adam_step(p, g, m, v, (nss, bc2, c1, b2, c2, eps), None, outs)


def adamw_update(p, g, m, v, nss, bc2, c1, b2, c2, eps, dr, outs=None):
    """One AdamW step: `adam_update` with `- dr * p` (dr = lr * weight_decay) in the update
    (`torch._fused_adamw_`)."""
    return _adam_step(p, g, m, v, (nss, bc2, c1, b2, c2, eps), dr, outs)


add_kernel(Kernel("adam_update", NAME, adam_update, adam_checker, "fused",
                  pattern=LazyForms(functools.partial(adam_forms, adam_pattern, 6)),
                  outs_into=True))
add_kernel(Kernel("adamw_update", NAME, adamw_update, adam_checker, "fused",
                  pattern=LazyForms(functools.partial(adam_forms, adamw_pattern, 7)),
                  outs_into=True))
