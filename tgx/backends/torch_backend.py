"""The PyTorch backend: kernels over `torch.Tensor` (CPU here, CUDA when tensors live there).

Semantics follow the NumPy references: half precision computes as torch does (its CPU and CUDA
kernels accumulate in float32), integer division truncates toward zero with x/0 = 0, gather
clamps indices. uint32 has little kernel coverage in torch, so every kernel declines it (the
planner then goes through NumPy or jax).
"""

from __future__ import annotations

import functools
import math

import numpy as np
import torch

from .. import primitives  # noqa: F401 - registers the atomic primitives
from ..core import PRIMITIVES
from ..devices import Device
from ..errors import DTypeError
from ..primitives import transfer  # noqa: F401 - registers copy_to
from ..primitives.linalg import free_axes
from ..primitives.movement import dynamic_window
from ..shapes import ShapedArray, bfloat16, uint32
from . import composites
from .base import Backend
from .numpy_library import visible_keys
from .registry import (
    Kernel, add_kernel, as_method, matmul_layout_reason, matmul_permutations, register_kernel,
)
from .torch_patterns import gelu_tanh_cpu

NAME = "torch"


def torch_dtype(dtype) -> torch.dtype:
    """The torch dtype of a NumPy dtype (bfloat16 included)."""
    dtype = np.dtype(dtype)
    if dtype == bfloat16:
        return torch.bfloat16
    return getattr(torch, dtype.name)


def _no_uint32(avals, params):
    if any(a.dtype == uint32 for a in avals) or params.get("new_dtype") == uint32 or params.get(
            "dtype") == uint32 or params.get("index_dtype") == uint32:
        return "torch has few uint32 kernels"
    return None


def _simple(name: str, fn, *, checker=_no_uint32, out_fn=None):
    fn.__name__ = fn.__qualname__ = f"torch_{name}"
    add_kernel(Kernel(name, NAME, fn, checker))
    if out_fn is not None:
        def out_kernel(*xs, out):
            out_fn(*xs, out=out)
            return out
        out_kernel.__name__ = out_kernel.__qualname__ = f"torch_{name}_out"
        add_kernel(Kernel(name, NAME, out_kernel, checker, "out", writes_out=True,
                          inplace_ok=True))


_UNARY = {"neg": torch.neg, "exp": torch.exp, "log": torch.log, "sin": torch.sin,
          "cos": torch.cos, "sqrt": torch.sqrt, "atan": torch.atan, "erf": torch.erf,
          "floor": torch.floor, "round": torch.round}
_BINARY = {"add": torch.add, "sub": torch.sub, "mul": torch.mul, "max": torch.maximum,
           "min": torch.minimum, "pow": torch.pow, "and": torch.bitwise_and,
           "or": torch.bitwise_or, "xor": torch.bitwise_xor, "shift_left": torch.bitwise_left_shift,
           "eq": torch.eq, "ne": torch.ne, "lt": torch.lt, "le": torch.le, "gt": torch.gt,
           "ge": torch.ge}
for _n, _f in _UNARY.items():
    _simple(_n, (lambda f: lambda x: f(x))(_f), out_fn=_f)
for _n, _f in _BINARY.items():
    _simple(_n, (lambda f: lambda x, y: f(x, y))(_f), out_fn=_f)


@register_kernel("not", NAME, checker=_no_uint32)
def torch_not(x):
    return torch.logical_not(x) if x.dtype == torch.bool else torch.bitwise_not(x)


@register_kernel("copy", NAME, checker=_no_uint32)
def torch_copy(x):
    return x.clone()


@register_kernel("div", NAME, checker=_no_uint32)
def torch_div(x, y):
    if x.dtype.is_floating_point:
        return torch.div(x, y)
    q = torch.div(x.abs(), torch.where(y == 0, torch.ones_like(y), y.abs()), rounding_mode="floor")
    return torch.sign(x) * torch.sign(y) * q


@register_kernel("shift_right_logical", NAME, checker=_no_uint32)
def torch_shift_right_logical(x, y):
    bits = x.element_size() * 8
    if bits == 64:  # no uint64 arithmetic in torch: shift arithmetically, then mask the sign
        r = torch.bitwise_right_shift(x, y)
        mask = torch.where(y > 0, (torch.ones_like(x) << (64 - y).clamp(max=63)) - 1,
                           torch.full_like(x, -1))
        return torch.where(y >= 64, torch.zeros_like(x), r & mask)
    wide = x.to(torch.int64) & ((1 << bits) - 1)
    return torch.bitwise_right_shift(wide, y.to(torch.int64)).to(x.dtype)


#: integer views of the float dtypes, for `select_zero_cpu`'s bit masks
_BITS = {torch.float32: torch.int32, torch.float64: torch.int64}


def select_zero_cpu(pred, t, f, out=None):
    """`where(pred, t, f)` on the CPU where one branch is the scalar +0.0 (a ReLU's gradient,
    a mask), as the other branch's bits and-ed with the mask as integers (-1 where it is
    kept, 0 where not: +0.0's bits): exact for every value, inf and NaN included. torch's
    `where` takes ~107 µs for a (128, 512) float32 ReLU gradient with a random mask and this
    ~16 µs. None where it does not apply (the caller runs `where`)."""
    zero_f = f.numel() == 1 and f.dim() == 0
    other, scalar = (t, f) if zero_f else (f, t)
    ints = _BITS.get(other.dtype)
    if (ints is None or other.is_cuda or scalar.numel() != 1 or scalar.dim() != 0
            or pred.dtype != torch.bool or pred.shape != other.shape
            or other.numel() < 4096 or not other.is_contiguous() or not pred.is_contiguous()
            or (out is not None and (out.shape != other.shape or not out.is_contiguous()))):
        return None
    if scalar.view(ints).item() != 0:   # not +0.0 (-0.0 and others keep `where`)
        return None
    # keep `other` where pred (f is the zero) or where not (t is the zero): -1 or 0
    mask = pred.to(ints).neg_() if zero_f else pred.to(ints).sub_(1)
    res = out if out is not None else torch.empty_like(other)
    torch.bitwise_and(other.view(ints), mask, out=res.view(ints))
    return res


@register_kernel("select", NAME, checker=_no_uint32)
def torch_select(pred, t, f):
    r = select_zero_cpu(pred, t, f)
    return torch.where(pred, t, f) if r is None else r


@register_kernel("convert_element_type", NAME, checker=_no_uint32, returns_view=True)
def torch_convert(x, *, new_dtype, weak_type=False):
    dt = torch_dtype(new_dtype)
    if x.dtype == dt:
        return x
    if x.dtype.is_floating_point and not dt.is_floating_point and dt != torch.bool:
        return torch.trunc(x.to(torch.float64)).to(dt)
    if dt == torch.bfloat16 and not x.dtype.is_floating_point:
        return x.to(torch.float32).to(dt)
    return x.to(dt)


@register_kernel("dot_general", NAME, checker=_no_uint32)
def torch_dot_general(x, y, *, dimension_numbers):
    (lc, rc), (lb, rb) = dimension_numbers
    lf, rf = free_axes(x.ndim, lc, lb), free_axes(y.ndim, rc, rb)
    if x.dtype == torch.bool:
        raise DTypeError("bool dot_general")
    if not lb and lc == (x.ndim - 1,) and rc == (0,) and y.ndim == 2:  # (..., K) @ (K, N)
        return torch.matmul(x, y)
    if not lb and not lc and not rc:  # outer product
        return torch.tensordot(x, y, dims=0)
    if not lb:
        return torch.tensordot(x, y, dims=(list(lc), list(rc)))
    xt = x.permute(*lb, *lf, *lc)
    yt = y.permute(*rb, *rc, *rf)
    bshape = xt.shape[:len(lb)]
    lfs, rfs = xt.shape[len(lb):len(lb) + len(lf)], yt.shape[len(rb) + len(rc):]
    k = int(np.prod(xt.shape[len(lb) + len(lf):], dtype=np.int64))
    m, n = int(np.prod(lfs, dtype=np.int64)), int(np.prod(rfs, dtype=np.int64))
    out = torch.matmul(xt.reshape(*bshape, m, k), yt.reshape(*bshape, k, n))
    return out.reshape(*bshape, *lfs, *rfs)


def _matmul_ok(avals, params):
    if _no_uint32(avals, params) or avals[0].dtype.kind == "b":
        return "no uint32 / bool matmul"
    if not params["dimension_numbers"][0][0]:
        return "an outer product (nothing contracted)"
    return None


@functools.cache  # on every call: its cost is the hot loop's
def _out_layout(dimension_numbers, x_ndim: int, y_ndim: int) -> tuple:
    """How `torch_matmul_out` runs a dot_general: ("matmul", px, py) for a batched matmul of
    (possibly transposed) operands (`matmul_permutations`), else ("general", x's and y's
    permutations to (batch, free, contracted) and (batch, contracted, free), the batch,
    free-of-x and contracted counts)."""
    shape = ShapedArray((1,) * x_ndim, np.float32), ShapedArray((1,) * y_ndim, np.float32)
    if matmul_layout_reason(shape, {"dimension_numbers": dimension_numbers}) is None:
        return ("matmul", *matmul_permutations(dimension_numbers))
    (lc, rc), (lb, rb) = dimension_numbers
    lf, rf = free_axes(x_ndim, lc, lb), free_axes(y_ndim, rc, rb)
    return ("general", (*lb, *lf, *lc), (*rb, *rc, *rf), len(lb), len(lf), len(rc))


@register_kernel("dot_general", NAME, checker=_matmul_ok, variant="out", writes_out=True)
def torch_matmul_out(x, y, *, dimension_numbers, out):
    """A dot_general into the plan's buffer: `matmul(out=)`, with the operands' axes
    permuted and collapsed to (batch, M, K) @ (batch, K, N) where it is not a matmul
    already (a weight gradient contracting batch and sequence, an activation of rank 3
    against a weight). A GEMM writing a fresh 2 MiB result took 1150 µs where torch.compile's
    `mm(out=)` took 712 (bench_train's lm-large, `CostModel.fresh_output_s`)."""
    layout = _out_layout(dimension_numbers, x.ndim, y.ndim)
    if layout[0] == "matmul":
        _, px, py = layout
        torch.matmul(x if px is None else x.permute(px), y if py is None else y.permute(py),
                     out=out)
        return out
    _, px, py, nb, nf, nc = layout
    xt, yt = x.permute(px), y.permute(py)
    batch = xt.shape[:nb]
    m = math.prod(xt.shape[nb:nb + nf])
    k = math.prod(xt.shape[nb + nf:])
    n = math.prod(yt.shape[nb + nc:])
    flat = out.view(*batch, m, n) if out.is_contiguous() else None
    res = torch.matmul(xt.reshape(*batch, m, k), yt.reshape(*batch, k, n), out=flat)
    if flat is None:
        out.copy_(res.view(out.shape))
    return out


# bound, a view is the tensor's own method, written as such in the run function (`MethodCall`)
@register_kernel("reshape", NAME, returns_view=True,
                 specialize=as_method("reshape", "new_sizes"))
def torch_reshape(x, *, new_sizes):
    return x.reshape(new_sizes)


@register_kernel("broadcast_in_dim", NAME, returns_view=True)
def torch_broadcast_in_dim(x, *, shape, broadcast_dimensions):
    expanded = [1] * len(shape)
    for i, d in enumerate(broadcast_dimensions):
        expanded[d] = x.shape[i]
    return x.reshape(expanded).expand(shape)


@register_kernel("transpose", NAME, returns_view=True,
                 specialize=as_method("permute", "permutation"))
def torch_transpose(x, *, permutation):
    return x.permute(permutation)


@register_kernel("slice", NAME, returns_view=True)
def torch_slice(x, *, start_indices, limit_indices, strides=None):
    strides = strides or (1,) * x.ndim
    return x[tuple(slice(s, e, st) for s, e, st in zip(start_indices, limit_indices, strides))]


@register_kernel("pad", NAME, checker=_no_uint32)
def torch_pad(x, v, *, padding_config):
    for ax, (_, _, interior) in enumerate(padding_config):
        if interior and x.shape[ax] > 0:
            n = x.shape[ax]
            shape = list(x.shape)
            shape[ax] = n + (n - 1) * interior
            out = torch.full(shape, 0, dtype=x.dtype, device=x.device)
            out.copy_(v.expand(shape))
            idx = [slice(None)] * x.ndim
            idx[ax] = slice(None, None, interior + 1)
            out[tuple(idx)] = x
            x = out
    shape = [x.shape[i] + max(lo, 0) + max(hi, 0) for i, (lo, hi, _) in enumerate(padding_config)]
    out = v.to(x.dtype).expand(shape).clone()
    dst = tuple(slice(max(lo, 0), max(lo, 0) + x.shape[i])
                for i, (lo, hi, _) in enumerate(padding_config))
    out[dst] = x
    crop = tuple(slice(-lo if lo < 0 else 0, out.shape[i] + hi if hi < 0 else None)
                 for i, (lo, hi, _) in enumerate(padding_config))
    return out[crop]


@register_kernel("concatenate", NAME, checker=_no_uint32)
def torch_concatenate(*xs, dimension):
    return torch.cat(xs, dim=dimension)


@register_kernel("gather", NAME, checker=_no_uint32)
def torch_gather(x, idx, *, axis):
    flat = idx.reshape(-1).clamp(0, x.shape[axis] - 1).to(torch.int64)
    out = torch.index_select(x, axis, flat)
    return out.reshape(x.shape[:axis] + idx.shape + x.shape[axis + 1:])


@register_kernel("scatter_add", NAME, checker=_no_uint32)
def torch_scatter_add(x, idx, updates, *, axis):
    flat = idx.reshape(-1).clamp(0, x.shape[axis] - 1).to(torch.int64)
    u = updates.reshape(x.shape[:axis] + (flat.shape[0],) + x.shape[axis + 1:])
    return x.index_add(axis, flat, u)


@register_kernel("dynamic_slice", NAME, checker=_no_uint32, returns_view=True)
def torch_dynamic_slice(x, *idx, slice_sizes):
    return x[dynamic_window(x.shape, slice_sizes, idx)]


@register_kernel("dynamic_update_slice", NAME, checker=_no_uint32)
def torch_dynamic_update_slice(x, update, *idx):
    out = x.clone()
    out[dynamic_window(x.shape, update.shape, idx)].copy_(update)
    return out


def torch_dynamic_update_slice_inplace(x, update, *idx):
    """Writes only the window, into `x` itself (a state buffer; see `tgx.compile(state=)`)."""
    x[dynamic_window(x.shape, update.shape, idx)].copy_(update)
    return x


@register_kernel("rev", NAME, returns_view=True)
def torch_rev(x, *, dimensions):
    return torch.flip(x, dimensions) if dimensions else x


@register_kernel("iota", NAME, checker=_no_uint32)
def torch_iota(*, dtype, shape, dimension):
    r = torch.arange(shape[dimension], dtype=torch_dtype(dtype))
    expanded = [1] * len(shape)
    expanded[dimension] = shape[dimension]
    return r.reshape(expanded).expand(shape)


@register_kernel("dim_as_value", NAME, checker=_no_uint32)
def torch_dim_as_value(*, expr, dtype):
    return torch.tensor(expr, dtype=torch_dtype(dtype))


def _half_acc(fn):
    def k(x, *, axes):
        if x.dtype in (torch.float16, torch.bfloat16):
            return fn(x.to(torch.float32), axes).to(x.dtype)
        return fn(x, axes)
    return k


def _reduce_sum(x, axes):
    return torch.sum(x, dim=axes, dtype=x.dtype) if axes else x.clone()


def _reduce_prod(x, axes):
    for a in sorted(axes, reverse=True):
        x = torch.prod(x, dim=a, dtype=x.dtype)
    return x


def _reduce_max(x, axes):
    return torch.amax(x, dim=axes) if axes else x.clone()


def _reduce_min(x, axes):
    return torch.amin(x, dim=axes) if axes else x.clone()


def _no_uint32_or_bool_reduce(avals, params):
    return _no_uint32(avals, params)


for _n, _f in (("reduce_sum", _half_acc(_reduce_sum)), ("reduce_prod", _half_acc(_reduce_prod)),
               ("reduce_max", lambda x, *, axes: _reduce_max(x, axes)),
               ("reduce_min", lambda x, *, axes: _reduce_min(x, axes))):
    _simple(_n, _f)


def _bool_amax_ok(avals, params):
    return _no_uint32(avals, params)


@register_kernel("argmax", NAME, checker=_no_uint32)
def torch_argmax(x, *, axis, index_dtype):
    if x.dtype.is_floating_point:
        # NumPy: the first NaN is the maximum; torch.argmax agrees on CPU for NaN inputs
        nan = torch.isnan(x)
        if bool(nan.any()):
            return torch.argmax(nan.to(torch.uint8), dim=axis).to(torch_dtype(index_dtype))
    return torch.argmax(x if x.dtype != torch.bool else x.to(torch.uint8), dim=axis).to(
        torch_dtype(index_dtype))


@register_kernel("copy_to", NAME, returns_view=True)
def torch_copy_to(x, *, backend="torch", device="cpu"):
    return BACKEND.convert(x, device)


def rotary_into(x, cos, sin, out):
    """RoPE (`x * cos + rotate_half(x) * sin`) written into `out` (of the broadcast shape):
    `x * cos`, then each half's rotated term added in place: 3 torch calls where the
    decomposition (slices, neg, concatenate, muls, add) runs 7 (Gemma prefill's q and k:
    ~4 ms of 18 layers' 150)."""
    h = x.shape[-1] // 2
    torch.mul(x, cos, out=out)
    out[..., :h].addcmul_(x[..., h:], sin[..., :h], value=-1)
    out[..., h:].addcmul_(x[..., :h], sin[..., h:])
    return out


def trim_masked_keys(k, v, mask):
    """(k, v, mask) without the trailing keys that a boolean `mask` hides from every query:
    they get weight exp(-inf) = 0, so attention over the rest is the same. A KV cache of
    T_MAX positions holds fewer valid ones (Gemma's prefill: 128 of 256), which a shape
    cannot say (the position is a traced value): the kernel reads it from the mask (~10 µs
    for 128x256) and attends over half the keys. On the CPU only (reading the mask would
    make a GPU wait), and only where some key is visible (a fully masked row stays as the
    library computes it)."""
    if mask.dtype != torch.bool or mask.is_cuda or k.shape[-2] != mask.shape[-1]:
        return k, v, mask
    n = visible_keys(mask.numpy())   # a view of the CPU tensor
    if n is None:
        return k, v, mask
    return k[..., :n, :], v[..., :n, :], mask[..., :n]


def _same_shape(avals, params):  # aten.gelu_backward does not broadcast
    return None if avals[0].shape == avals[1].shape else "operands of different shapes"


# -- composites with a dedicated torch kernel (registered only if the primitive exists) ------
def _composite_table():
    import torch.nn.functional as F

    def softmax(x, *, axis):
        return torch.softmax(x, dim=axis)

    def log_softmax(x, *, axis):
        return torch.log_softmax(x, dim=axis)

    def logsumexp(x, *, axes, keepdims):
        return torch.logsumexp(x, dim=axes, keepdim=keepdims)

    def gelu(x, *, approximate):
        if approximate == "tanh" and not x.is_cuda:
            return gelu_tanh_cpu(x)
        return F.gelu(x, approximate=approximate)

    def gelu_grad(ct, x, *, approximate):  # what torch's autograd runs for gelu
        return torch.ops.aten.gelu_backward(ct, x, approximate=approximate)

    def layer_norm(x, *wb, normalized_shape, eps, has_weight, has_bias):
        wb = list(wb)
        w = wb.pop(0) if has_weight else None
        b = wb.pop(0) if has_bias else None
        return F.layer_norm(x, tuple(normalized_shape), w, b, eps)

    def rms_norm(x, *w, normalized_shape, eps, has_weight):
        return F.rms_norm(x, tuple(normalized_shape), w[0] if has_weight else None, eps)

    def sdpa(q, k, v, *mask, has_mask, is_causal, scale, enable_gqa):
        m = mask[0] if has_mask else None
        if m is not None:
            k, v, m = trim_masked_keys(k, v, m)
        # torch's CPU fused kernel takes 4-D (batch, heads, L, E); other ranks go to the math
        # path (measured: one decode token, 4 heads over 256 keys: 0.08 ms 4-D, 0.4 ms 3-D)
        if q.ndim == k.ndim == v.ndim == 3:
            return F.scaled_dot_product_attention(
                q[None], k[None], v[None], attn_mask=m if m is None or m.ndim < 3 else m[None],
                is_causal=is_causal, scale=scale, enable_gqa=enable_gqa)[0]
        return F.scaled_dot_product_attention(q, k, v, attn_mask=m, is_causal=is_causal,
                                              scale=scale, enable_gqa=enable_gqa)

    def sdpa_ok(avals, params):
        if params.get("has_mask") and params.get("is_causal"):
            return "torch takes a mask or is_causal, not both"
        return None

    def linear(x, w, *b):
        return F.linear(x, w, b[0] if b else None)

    def rotary(x, cos, sin):
        out = torch.empty(torch.broadcast_shapes(x.shape, cos.shape, sin.shape), dtype=x.dtype,
                          device=x.device)
        return rotary_into(x, cos, sin, out)

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
        "gelu": (gelu, {"approximate"}), "gelu_grad": (gelu_grad, {"approximate"}, _same_shape),
        "layer_norm": (layer_norm, {"normalized_shape", "eps", "has_weight", "has_bias"}),
        "rms_norm": (rms_norm, {"normalized_shape", "eps", "has_weight"}),
        "scaled_dot_product_attention": (
            sdpa, {"has_mask", "is_causal", "scale", "enable_gqa"}, sdpa_ok),
        "linear": (linear, set()), "apply_rotary_emb": (rotary, set()),
        "conv": (conv, {"stride", "padding", "dilation", "groups"}, conv_ok),
    }


class TorchBackend(Backend):
    """PyTorch, on the CPU (sharing memory with NumPy) or a CUDA device."""

    name, library = NAME, "torch"
    writes_workspace = True
    prices_fresh_outputs = True
    # a 1-element add through torch ≈ 4 µs; ~10 GB/s; peak from a 512³ matmul
    cost = (4.0e-6, 10e9, 4e10)
    # torch.from_numpy shares memory; jax → torch through DLPack (measured, 64x256 float32)
    transfer_in = {"numpy": (1.5e-6, None), "jax": (6.0e-6, None)}
    # jax's thread pool slows a torch op right after it (~2.7 ms on the 2-core CPU)
    switch_in = {"jax": 2.7e-3}
    inplace = {"dynamic_update_slice": torch_dynamic_update_slice_inplace}

    def device_reason(self, device) -> str | None:
        dev = Device.parse(device)
        if dev.is_host:
            return None
        if not torch.cuda.is_available():
            build = "" if torch.version.cuda else ", a CPU-only build"
            return f"torch.cuda.is_available() is False (torch {torch.__version__}{build})"
        n = torch.cuda.device_count()
        if dev.index >= n:
            return f"torch sees {n} CUDA device(s), so there is no {dev}"
        return None

    def zero_copy_from_host(self, device: str) -> bool:
        return device == "cpu"

    def is_array(self, x) -> bool:
        return isinstance(x, torch.Tensor)

    def to_host(self, x):
        if x.device.type != "cpu":
            x = x.cpu()
        if x.requires_grad:
            x = x.detach()
        if x.dtype == torch.bfloat16:
            return x.view(torch.int16).numpy().view(bfloat16)
        return x.numpy()

    def host_view(self, x):
        if x.device.type != "cpu" or not x.is_contiguous() or x.requires_grad:
            return None
        return self.to_host(x)

    def from_host(self, x, device="cpu"):
        x = np.asarray(x)
        if not x.flags.writeable or not x.flags.c_contiguous:  # torch tensors are writable
            x = np.array(x, order="C")  # (np.ascontiguousarray made a 0-d array 1-d)
        if x.dtype == bfloat16:
            t = torch.from_numpy(x.view(np.int16)).view(torch.bfloat16)
        else:
            t = torch.from_numpy(x)
        return t if device == "cpu" else t.to(device)

    def from_foreign(self, x, device="cpu"):
        if not hasattr(x, "__dlpack__"):
            return None
        try:  # DLPack shares memory on one device (jax arrays)
            t = torch.from_dlpack(x)
        except Exception:  # dtypes DLPack cannot carry (bool on older stacks): via NumPy
            return None
        return t if str(t.device) == device else t.to(device)

    def move(self, x, device):
        return x if x.device == torch.device(device) else x.to(device)

    def empty(self, shape, dtype, like=None):
        dev = like.device if like is not None else "cpu"
        return torch.empty(shape, dtype=torch_dtype(dtype), device=dev)

    def sync_fn(self, device=None):
        on_gpu = (device is not None and not Device.parse(device).is_host) or (
            device is None and torch.cuda.is_initialized())
        return (lambda _result: torch.cuda.synchronize()) if on_gpu else None


BACKEND = TorchBackend()


def _register_composites() -> None:
    composites.register(NAME, _composite_table(), PRIMITIVES)


_register_composites()


def _linear_out_ok(avals, params):
    x, w = avals[:2]
    if w.ndim != 2 or any(a.dtype != x.dtype for a in avals) or x.dtype.kind != "f":
        return "float operands of one dtype and a 2-D weight"
    return None


@register_kernel("linear", NAME, checker=_linear_out_ok, variant="out", writes_out=True)
def torch_linear_out(x, w, *b, out):
    """`F.linear` into the plan's buffer: `matmul(x, w.T, out=)` (+ the bias in place)."""
    torch.matmul(x, w.t(), out=out)
    if b:
        out.add_(b[0])
    return out


# -- out= forms of kernels whose results are large in training steps: a result written into
# the plan's buffer instead of fresh memory (`CostModel.fresh_output_s`) ----------------------
def _float_only(avals, params):
    if any(not np.issubdtype(a.dtype, np.floating) and a.dtype != bfloat16 for a in avals):
        return "float operands only"
    return None


def _select_ok(avals, params):
    return _no_uint32(avals, params) or (
        None if avals[1].dtype == avals[2].dtype else "branches of one dtype")


@register_kernel("div", NAME, checker=_float_only, variant="out", writes_out=True,
                 inplace_ok=True)
def torch_div_out(x, y, *, out):
    return torch.div(x, y, out=out)


@register_kernel("select", NAME, checker=_select_ok, variant="out", writes_out=True)
def torch_select_out(pred, t, f, *, out):
    r = select_zero_cpu(pred, t, f, out)
    return torch.where(pred, t, f, out=out) if r is None else r


@register_kernel("gelu", NAME, checker=_float_only, variant="out", writes_out=True)
def torch_gelu_out(x, *, approximate, out):
    if approximate == "tanh" and not x.is_cuda:
        return gelu_tanh_cpu(x, out=out)
    return torch.ops.aten.gelu.out(x, approximate=approximate, out=out)


def _same_shape_float(avals, params):
    return _same_shape(avals, params) or _float_only(avals, params)


@register_kernel("gelu_grad", NAME, checker=_same_shape_float, variant="out", writes_out=True)
def torch_gelu_grad_out(ct, x, *, approximate, out):
    return torch.ops.aten.gelu_backward.grad_input(ct, x, approximate=approximate,
                                                   grad_input=out)


@register_kernel("apply_rotary_emb", NAME, checker=_float_only, variant="out",
                 writes_out=True)
def torch_rotary_out(x, cos, sin, *, out):
    """RoPE into the plan's buffer (`rotary_into`)."""
    return rotary_into(x, cos, sin, out)
