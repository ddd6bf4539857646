"""Convolution, transposed convolution, pooling and mode padding as composite primitives.

Layouts are torch's: input (N, C, *spatial), conv weight (O, C / groups, *kernel), transposed
conv weight (C, O / groups, *kernel). Every primitive works over any number of spatial dims;
`tgx.nn` exposes the 1-D / 2-D torch names over them.

Decompositions:
- `conv`: im2col. Pad, take one strided `slice` per kernel offset, stack them, then one
  grouped `dot_general` (groups as its batch dim). The batch dim N may be symbolic.
- `conv_transpose`: dilate the input with interior `pad` (stride - 1 zeros), pad or crop the
  edges, flip and regroup the weight, then `conv` with stride 1.
- `pool`: pad (-inf for max, 0 for avg), fold the strided window slices with `max` / `add`;
  avg divides by a count map built the same way from ones (count_include_pad, ceil_mode).
- `nn_pad`: constant → `pad`; reflect / replicate / circular → slices, `rev`, `concatenate`.
"""

from __future__ import annotations

import itertools

import numpy as np
import sympy

from ..core import Primitive
from ..errors import DTypeError, ShapeError
from ..shapes import (
    ShapedArray,
    as_dim,
    dim_div,
    dim_eq,
    dim_ge,
    dim_str,
    is_float,
    prod,
    shape_str,
)
from . import movement as M
from . import ops
from .linalg import dot_general_p


def _window_count(size, lo, hi, k, s, d, op):
    """Number of window positions along one padded axis: floor((size+lo+hi-d(k-1)-1)/s) + 1."""
    span = as_dim(size + lo + hi - d * (k - 1) - 1)
    if type(span) is int:
        if span < 0:
            raise ShapeError(f"{op}: kernel {k} (dilation {d}) is larger than the padded input "
                             f"({size + lo + hi})")
        return span // s + 1
    if s == 1:
        if not dim_ge(span, 0):
            raise ShapeError(f"{op}: kernel {k} may not fit the padded input {dim_str(size)}")
        return as_dim(span + 1)
    return as_dim(sympy.floor(span / s) + 1)


def _strided_windows(x, first_axis, kernel, stride, dilation, out):
    """For each kernel offset, `x` sliced to the window starts: (..., *out) along the spatial
    axes starting at `first_axis`."""
    a = ops._aval(x)
    for off in itertools.product(*[range(k) for k in kernel]):
        start, limit, strides = [0] * a.ndim, list(a.shape), [1] * a.ndim
        for i, (o, j) in enumerate(zip(out, off)):
            ax = first_axis + i
            start[ax] = j * dilation[i]
            limit[ax] = as_dim(start[ax] + (o - 1) * stride[i] + 1)
            strides[ax] = stride[i]
        yield M.slice_p.bind(x, start_indices=tuple(start), limit_indices=tuple(limit),
                             strides=None if all(s == 1 for s in strides) else tuple(strides))


def _pad_value(x, v):
    return np.asarray(v, dtype=ops._aval(x).dtype)


def _pad(x, first_axis, pads, value, interior=None):
    """`pad` on the axes from `first_axis` with (lo, hi) pairs (negative crops)."""
    a = ops._aval(x)
    n = len(pads)
    interior = interior or (0,) * n
    cfg = ((0, 0, 0),) * first_axis + tuple((int(lo), int(hi), int(it)) for (lo, hi), it
                                            in zip(pads, interior))
    cfg += ((0, 0, 0),) * (a.ndim - first_axis - n)
    if all(c == (0, 0, 0) for c in cfg):
        return x
    return M.pad_p.bind(x, _pad_value(x, value), padding_config=cfg)


# ---------------------------------------------------------------------------------------------
# conv(x, w[, b]; stride, padding=((lo, hi), ...), dilation, groups)
conv_p = Primitive("conv", family="conv")


def _conv_check(op, x: ShapedArray, w: ShapedArray, b, groups):
    n = w.ndim - 2
    if n < 1 or x.ndim != n + 2:
        raise ShapeError(f"{op}: input must be (N, C, *spatial) with the weight's {n} spatial "
                         f"dims, got input {x} and weight {w}")
    if not (is_float(x.dtype) and x.dtype == w.dtype):
        raise DTypeError(f"{op}: input and weight must share a floating dtype, got "
                         f"{x.str_short()} and {w.str_short()}")
    if b is not None and (b.ndim != 1 or b.dtype != x.dtype):
        raise ShapeError(f"{op}: bias must be 1-D of dtype {x.dtype}, got {b}")
    return n


@conv_p.def_shape
def _conv_shape(x, w, *b, stride, padding, dilation, groups):
    n = _conv_check("conv", x, w, b[0] if b else None, groups)
    if not dim_eq(as_dim(w.shape[1] * groups), x.shape[1]):
        raise ShapeError(f"conv: input has {dim_str(x.shape[1])} channels but weight {w} with "
                         f"groups={groups} expects {dim_str(as_dim(w.shape[1] * groups))}")
    dim_div(w.shape[0], groups, f"conv: out channels {dim_str(w.shape[0])} into {groups} groups")
    if b and not dim_eq(b[0].shape[0], w.shape[0]):
        raise ShapeError(f"conv: bias {b[0]} needs {dim_str(w.shape[0])} entries")
    out = tuple(_window_count(x.shape[2 + i], *padding[i], w.shape[2 + i], stride[i],
                              dilation[i], "conv") for i in range(n))
    return ShapedArray((x.shape[0], w.shape[0]) + out, x.dtype)


def _np_conv(x, w, stride, padding, dilation, groups):
    """Direct convolution in float64: a sum over kernel offsets of grouped channel mixes."""
    n = w.ndim - 2
    x = np.pad(x.astype(np.float64), [(0, 0), (0, 0)] + [tuple(p) for p in padding])
    N, C = x.shape[:2]
    O, k = w.shape[0], w.shape[2:]
    out_sp = [(x.shape[2 + i] - dilation[i] * (k[i] - 1) - 1) // stride[i] + 1 for i in range(n)]
    xg = x.reshape((N, groups, C // groups) + x.shape[2:])
    wg = w.astype(np.float64).reshape((groups, O // groups, C // groups) + tuple(k))
    out = np.zeros((N, groups, O // groups) + tuple(out_sp))
    for off in np.ndindex(*k):
        win = tuple(slice(off[i] * dilation[i], off[i] * dilation[i] + (out_sp[i] - 1) *
                          stride[i] + 1, stride[i]) for i in range(n))
        patch = xg[(slice(None),) * 3 + win]
        out += np.einsum("ngc...,goc->ngo...", patch, wg[(slice(None),) * 3 + off])
    return out.reshape((N, O) + tuple(out_sp))


@conv_p.def_impl
def _conv_impl(x, w, *b, stride, padding, dilation, groups):
    out = _np_conv(x, w, stride, padding, dilation, groups)
    if b:
        out = out + b[0].astype(np.float64).reshape((-1,) + (1,) * (w.ndim - 2))
    return out.astype(x.dtype)


@conv_p.def_decomposition
def _conv_decomp(x, w, *b, stride, padding, dilation, groups):
    dt = ops._aval(x).dtype
    x, w = ops.upcast_half(x), ops.upcast_half(w)
    xa, wa = ops._aval(x), ops._aval(w)
    n = wa.ndim - 2
    N, C, O, kernel = xa.shape[0], xa.shape[1], wa.shape[0], wa.shape[2:]
    x = _pad(x, 2, padding, 0)
    out = _conv_shape(xa, wa, stride=stride, padding=padding, dilation=dilation,
                      groups=groups).shape[2:]
    K = prod(kernel)
    cg, og = dim_div(C, groups, "conv"), dim_div(O, groups, "conv")
    windows = [ops.expand_dims(s, 2) for s in _strided_windows(x, 2, kernel, stride, dilation,
                                                              out)]
    cols = ops.concatenate(windows, axis=2) if len(windows) > 1 else windows[0]
    # (N, C, K, *out) -> (N, G, Cg*K, P): channels major, kernel offsets minor, as in w.
    cols = ops.reshape(cols, (N, groups, as_dim(cg * K), prod(out)))
    wm = ops.reshape(w, (groups, og, as_dim(cg * K)))
    y = dot_general_p.bind(wm, cols, dimension_numbers=(((2,), (2,)), ((0,), (1,))))
    y = ops.reshape(ops.transpose(y, (2, 0, 1, 3)), (N, O) + tuple(out))  # (G,Og,N,P)->(N,O,..)
    if b:
        y = ops.add(y, ops.reshape(ops.upcast_half(b[0]), (O,) + (1,) * n))
    return ops.astype(y, dt)


# ---------------------------------------------------------------------------------------------
# conv_transpose(x, w[, b]; stride, padding, output_padding, dilation, groups)
conv_transpose_p = Primitive("conv_transpose", family="conv")


@conv_transpose_p.def_shape
def _conv_t_shape(x, w, *b, stride, padding, output_padding, dilation, groups):
    n = _conv_check("conv_transpose", x, w, b[0] if b else None, groups)
    if not dim_eq(w.shape[0], x.shape[1]):
        raise ShapeError(f"conv_transpose: input has {dim_str(x.shape[1])} channels, weight "
                         f"{w} expects {dim_str(w.shape[0])} (weight is (C_in, C_out/groups, "
                         f"*kernel))")
    dim_div(x.shape[1], groups, f"conv_transpose: {dim_str(x.shape[1])} channels into "
                                f"{groups} groups")
    for i in range(n):
        if not (output_padding[i] < stride[i] or output_padding[i] < dilation[i]):
            raise ShapeError(f"conv_transpose: output_padding {output_padding} must be smaller "
                             f"than stride {stride} or dilation {dilation}")
    out = tuple(as_dim((x.shape[2 + i] - 1) * stride[i] - 2 * padding[i] + dilation[i] *
                       (w.shape[2 + i] - 1) + output_padding[i] + 1) for i in range(n))
    for d in out:
        if not dim_ge(d, 1):
            raise ShapeError(f"conv_transpose: output size {shape_str(out)} is not positive")
    O = as_dim(w.shape[1] * groups)
    if b and not dim_eq(b[0].shape[0], O):
        raise ShapeError(f"conv_transpose: bias {b[0]} needs {dim_str(O)} entries")
    return ShapedArray((x.shape[0], O) + out, x.dtype)


@conv_transpose_p.def_impl
def _conv_t_impl(x, w, *b, stride, padding, output_padding, dilation, groups):
    """Scatter form: every input pixel adds weight * value into a strided output window."""
    n = w.ndim - 2
    N, C = x.shape[:2]
    og, k = w.shape[1], w.shape[2:]
    full = [(x.shape[2 + i] - 1) * stride[i] + dilation[i] * (k[i] - 1) + 1 + output_padding[i]
            for i in range(n)]
    xg = x.astype(np.float64).reshape((N, groups, C // groups) + x.shape[2:])
    wg = w.astype(np.float64).reshape((groups, C // groups, og) + tuple(k))
    out = np.zeros((N, groups, og) + tuple(full))
    for off in np.ndindex(*k):
        win = tuple(slice(off[i] * dilation[i], off[i] * dilation[i] + (x.shape[2 + i] - 1) *
                          stride[i] + 1, stride[i]) for i in range(n))
        out[(slice(None),) * 3 + win] += np.einsum("ngc...,gco->ngo...", xg,
                                                   wg[(slice(None),) * 3 + off])
    crop = tuple(slice(padding[i], full[i] - padding[i]) for i in range(n))
    out = out.reshape((N, groups * og) + tuple(full))[(slice(None),) * 2 + crop]
    if b:
        out = out + b[0].astype(np.float64).reshape((-1,) + (1,) * n)
    return out.astype(x.dtype)


@conv_transpose_p.def_decomposition
def _conv_t_decomp(x, w, *b, stride, padding, output_padding, dilation, groups):
    wa = ops._aval(w)
    n = wa.ndim - 2
    cin, og, kernel = wa.shape[0], wa.shape[1], wa.shape[2:]
    cg = dim_div(cin, groups, "conv_transpose")
    edge = [dilation[i] * (kernel[i] - 1) - padding[i] for i in range(n)]
    x = _pad(x, 2, [(edge[i], edge[i] + output_padding[i]) for i in range(n)], 0,
             interior=tuple(s - 1 for s in stride))
    # (C_in, Og, *k) -> (G, Cg, Og, *k) -> (G, Og, Cg, *k) -> (O, Cg, *k), spatially flipped.
    w = ops.reshape(w, (groups, cg, og) + tuple(kernel))
    w = ops.transpose(w, (0, 2, 1) + tuple(range(3, n + 3)))
    w = ops.flip(ops.reshape(w, (as_dim(groups * og), cg) + tuple(kernel)),
                 axis=tuple(range(2, n + 2)))
    return conv_p.bind(x, w, *b, stride=(1,) * n, padding=((0, 0),) * n, dilation=dilation,
                       groups=groups)


# ---------------------------------------------------------------------------------------------
# pool(x; reduction="max"|"avg", kernel_size, stride, padding, dilation, ceil_mode,
#      count_include_pad, divisor_override) over the last len(kernel_size) axes.
pool_p = Primitive("pool", family="conv")


def _pool_sizes(L, k, s, p, d, ceil_mode):
    """(windows, extra right padding so every window fits), with torch's ceil_mode rule: the
    last window must start inside the input or the left padding."""
    if type(L) is not int:
        raise ShapeError(f"pool: spatial dims must be concrete, got {dim_str(L)}")
    span = L + 2 * p - d * (k - 1) - 1
    if span < 0:
        raise ShapeError(f"pool: kernel {k} (dilation {d}) is larger than the padded input "
                         f"({L + 2 * p})")
    o = (span + (s - 1 if ceil_mode else 0)) // s + 1
    if ceil_mode and (o - 1) * s >= L + p:
        o -= 1
    return o, (o - 1) * s + d * (k - 1) + 1 - (L + p)


@pool_p.def_shape
def _pool_shape(x, *, reduction, kernel_size, stride, padding, dilation, ceil_mode,
                count_include_pad, divisor_override):
    n = len(kernel_size)
    if reduction not in ("max", "avg"):
        raise ShapeError(f"pool: reduction must be 'max' or 'avg', got {reduction!r}")
    if x.ndim < n + 1:
        raise ShapeError(f"pool: a {n}-D pool needs input (N?, C, *spatial), got {x}")
    if not is_float(x.dtype):
        raise DTypeError(f"pool: expects a floating-point input, got {x.str_short()}")
    for k, p in zip(kernel_size, padding):
        if p > k // 2:
            raise ShapeError(f"pool: padding {padding} must be at most half the kernel "
                             f"{kernel_size}")
    out = tuple(_pool_sizes(x.shape[x.ndim - n + i], kernel_size[i], stride[i], padding[i],
                            dilation[i], ceil_mode)[0] for i in range(n))
    return x.update(shape=x.shape[:x.ndim - n] + out, weak_type=False)


@pool_p.def_impl
def _pool_impl(x, *, reduction, kernel_size, stride, padding, dilation, ceil_mode,
               count_include_pad, divisor_override):
    """Loop over output positions; each window is clipped to the input (torch's kernel)."""
    n = len(kernel_size)
    lead, sp = x.shape[:x.ndim - n], x.shape[x.ndim - n:]
    outs = [_pool_sizes(sp[i], kernel_size[i], stride[i], padding[i], dilation[i],
                        ceil_mode)[0] for i in range(n)]
    x64 = x.astype(np.float64)
    res = np.zeros(lead + tuple(outs))
    for pos in np.ndindex(*outs):
        idx, count_pad = [], 1
        for i, o in enumerate(pos):
            start = o * stride[i] - padding[i]
            taps = start + dilation[i] * np.arange(kernel_size[i])
            idx.append(taps[(taps >= 0) & (taps < sp[i])])
            count_pad *= min(start + kernel_size[i], sp[i] + padding[i]) - start
        win = x64[(Ellipsis,) + np.ix_(*idx)]
        win = win.reshape(lead + (-1,))
        if reduction == "max":
            res[(Ellipsis,) + pos] = win.max(-1)
        else:
            div = divisor_override or (count_pad if count_include_pad else win.shape[-1])
            res[(Ellipsis,) + pos] = win.sum(-1) / div
    return res.astype(x.dtype)


@pool_p.def_decomposition
def _pool_decomp(x, *, reduction, kernel_size, stride, padding, dilation, ceil_mode,
                 count_include_pad, divisor_override):
    a = ops._aval(x)
    n = len(kernel_size)
    first = a.ndim - n
    sizes = [_pool_sizes(a.shape[first + i], kernel_size[i], stride[i], padding[i],
                         dilation[i], ceil_mode) for i in range(n)]
    out = [o for o, _ in sizes]
    pads = [(padding[i], sizes[i][1]) for i in range(n)]
    xu = ops.upcast_half(x) if reduction == "avg" else x
    fill = -np.inf if reduction == "max" else 0
    windows = _strided_windows(_pad(xu, first, pads, fill), first, kernel_size, stride,
                               dilation, out)
    combine = ops.maximum if reduction == "max" else ops.add
    acc = next(windows)
    for w in windows:
        acc = combine(acc, w)
    if reduction == "max":
        return acc
    if divisor_override:
        return ops.astype(ops.divide(acc, float(divisor_override)), a.dtype)
    # Count map: 1 over the input (and over the padding when count_include_pad), 0 beyond.
    ones = ops.ones(a.shape[first:], ops._aval(xu).dtype)
    if count_include_pad:
        ones = _pad(ones, 0, [(p, p) for p in padding], 1)
        ones = _pad(ones, 0, [(0, hi - p) for p, hi in pads], 0)
    else:
        ones = _pad(ones, 0, pads, 0)
    counts = _strided_windows(ones, 0, kernel_size, stride, dilation, out)
    total = next(counts)
    for c in counts:
        total = ops.add(total, c)
    return ops.astype(ops.divide(acc, total), a.dtype)


# ---------------------------------------------------------------------------------------------
# nn_pad(x; pads=((lo, hi) per axis), mode, value): torch.nn.functional.pad
nn_pad_p = Primitive("nn_pad", family="conv")
PAD_MODES = ("constant", "reflect", "replicate", "circular")


@nn_pad_p.def_shape
def _nn_pad_shape(x, *, pads, mode, value):
    if mode not in PAD_MODES:
        raise ShapeError(f"pad: mode must be one of {PAD_MODES}, got {mode!r}")
    if len(pads) != x.ndim:
        raise ShapeError(f"pad: {len(pads)} (lo, hi) pairs for an input of rank {x.ndim}")
    out = []
    for d, (lo, hi) in zip(x.shape, pads):
        if mode != "constant" and (lo < 0 or hi < 0):
            raise ShapeError(f"pad: mode {mode!r} needs non-negative padding, got {pads}")
        limit = as_dim(d - 1) if mode == "reflect" else d
        if mode in ("reflect", "circular") and not (dim_ge(limit, lo) and dim_ge(limit, hi)):
            raise ShapeError(f"pad: {mode} padding {(lo, hi)} must be smaller than the "
                             f"dimension {dim_str(d)} of {x}")
        if mode == "replicate" and (lo or hi) and dim_eq(d, 0):
            raise ShapeError(f"pad: replicate needs a non-empty dimension, got {x}")
        size = as_dim(d + lo + hi)
        if not dim_ge(size, 0):
            raise ShapeError(f"pad: padding {pads} removes more than {x}")
        out.append(size)
    return x.update(shape=tuple(out), weak_type=False)


@nn_pad_p.def_impl
def _nn_pad_impl(x, *, pads, mode, value):
    if mode != "constant":
        np_mode = {"reflect": "reflect", "replicate": "edge", "circular": "wrap"}[mode]
        return np.pad(x, pads, mode=np_mode)
    y = np.pad(x, [(max(lo, 0), max(hi, 0)) for lo, hi in pads], constant_values=value)
    return y[tuple(slice(-lo if lo < 0 else 0, y.shape[i] + hi if hi < 0 else None)
                   for i, (lo, hi) in enumerate(pads))]


def _axis_slice(x, axis, start, limit):
    a = ops._aval(x)
    s, e = [0] * a.ndim, list(a.shape)
    s[axis], e[axis] = as_dim(start), as_dim(limit)
    return M.slice_p.bind(x, start_indices=tuple(s), limit_indices=tuple(e), strides=None)


def _edge(x, axis, i, n):
    """x[i] along `axis`, repeated n times."""
    e = _axis_slice(x, axis, i, i + 1)
    shape = list(ops._aval(e).shape)
    shape[axis] = n
    return ops.broadcast_to(e, tuple(shape))


@nn_pad_p.def_decomposition
def _nn_pad_decomp(x, *, pads, mode, value):
    if mode == "constant":
        return _pad(x, 0, pads, value)
    for axis, (lo, hi) in enumerate(pads):
        if not (lo or hi):
            continue
        d = ops._aval(x).shape[axis]
        parts = []
        if mode == "reflect":
            left = ops.flip(_axis_slice(x, axis, 1, lo + 1), axis) if lo else None
            right = ops.flip(_axis_slice(x, axis, d - 1 - hi, d - 1), axis) if hi else None
        elif mode == "circular":
            left = _axis_slice(x, axis, d - lo, d) if lo else None
            right = _axis_slice(x, axis, 0, hi) if hi else None
        else:  # replicate
            left = _edge(x, axis, 0, lo) if lo else None
            right = _edge(x, axis, as_dim(d - 1), hi) if hi else None
        parts = [p for p in (left, x, right) if p is not None]
        x = ops.concatenate(parts, axis=axis)
    return x


CONV = [conv_p, conv_transpose_p, pool_p, nn_pad_p]
