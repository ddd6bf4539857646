"""Convolution, pooling and padding with `torch.nn.functional` names, layouts and arguments.

All convolutions bind the one N-d `conv` primitive, transposed convolutions `conv_transpose`,
every pooling op the one `pool` primitive (parameterised by `reduction`), and `pad` the
`nn_pad` primitive. Unbatched inputs (C, *spatial) are accepted like torch.

>>> import numpy as np, tgx.nn as tnn
>>> x = np.ones((1, 2, 5, 5), np.float32)
>>> tnn.conv2d(x, np.ones((4, 2, 3, 3), np.float32), padding="same").shape
(1, 4, 5, 5)
>>> tnn.max_pool2d(x, 2, ceil_mode=True).shape
(1, 2, 3, 3)
"""

from __future__ import annotations

from .. import numpy as tnp
from ..errors import OptionError, Unsupported
from ..primitives import conv as Cv
from ..primitives.ops import _as_operand, _aval, _float_args

__all__ = ["conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d",
           "conv_transpose3d", "max_pool1d", "max_pool2d", "max_pool3d", "avg_pool1d",
           "avg_pool2d", "avg_pool3d", "pool", "pad"]


def _tuple(v, n, what):
    t = (v,) * n if isinstance(v, int) else tuple(int(e) for e in v)
    if len(t) != n:
        raise OptionError(f"{what} needs {n} values, got {v!r}")
    return t


def _batched(x, n, op):
    """(x with a batch axis, whether one was added)."""
    nd = _aval(x).ndim
    if nd == n + 1:
        return tnp.expand_dims(x, 0), True
    if nd != n + 2:
        raise OptionError(f"{op}: expected a {n + 1}-D (unbatched) or {n + 2}-D input, got "
                          f"{_aval(x)}")
    return x, False


def _unbatch(y, added):
    return tnp.squeeze(y, 0) if added else y


def _operands(input, weight, bias):
    args = [_as_operand(a) for a in _float_args(*[a for a in (input, weight, bias)
                                                  if a is not None])]
    return args


def _conv(n, input, weight, bias, stride, padding, dilation, groups, op):
    args = _operands(input, weight, bias)
    x, added = _batched(args[0], n, op)
    stride, dilation = _tuple(stride, n, "stride"), _tuple(dilation, n, "dilation")
    kernel = _aval(args[1]).shape[2:]
    if padding == "valid":
        pads = ((0, 0),) * n
    elif padding == "same":
        if any(s != 1 for s in stride):
            raise OptionError(f"{op}: padding='same' is not supported for strided convolutions")
        pads = tuple((d * (k - 1) // 2, d * (k - 1) - d * (k - 1) // 2)
                     for d, k in zip(dilation, kernel))
    elif isinstance(padding, str):
        raise OptionError(f"{op}: padding must be 'valid', 'same', an int or a tuple, got "
                          f"{padding!r}")
    else:
        pads = tuple((p, p) for p in _tuple(padding, n, "padding"))
    y = Cv.conv_p.bind(x, *args[1:], stride=stride, padding=pads, dilation=dilation,
                       groups=int(groups))
    return _unbatch(y, added)


def conv1d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    """1-D convolution (cross-correlation): input (N, C, L), weight (O, C/groups, k)."""
    return _conv(1, input, weight, bias, stride, padding, dilation, groups, "conv1d")


def conv2d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    """2-D convolution: input (N, C, H, W), weight (O, C/groups, kh, kw); `padding` an int, a
    pair, 'valid' or 'same' (stride 1; the odd extra pad goes to the right, as in torch)."""
    return _conv(2, input, weight, bias, stride, padding, dilation, groups, "conv2d")


def conv3d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    return _conv(3, input, weight, bias, stride, padding, dilation, groups, "conv3d")


def _conv_t(n, input, weight, bias, stride, padding, output_padding, groups, dilation, op):
    args = _operands(input, weight, bias)
    x, added = _batched(args[0], n, op)
    y = Cv.conv_transpose_p.bind(
        x, *args[1:], stride=_tuple(stride, n, "stride"), padding=_tuple(padding, n, "padding"),
        output_padding=_tuple(output_padding, n, "output_padding"),
        dilation=_tuple(dilation, n, "dilation"), groups=int(groups))
    return _unbatch(y, added)


def conv_transpose1d(input, weight, bias=None, stride=1, padding=0, output_padding=0, groups=1,
                     dilation=1):
    """Transposed 1-D convolution: weight (C_in, C_out/groups, k)."""
    return _conv_t(1, input, weight, bias, stride, padding, output_padding, groups, dilation,
                   "conv_transpose1d")


def conv_transpose2d(input, weight, bias=None, stride=1, padding=0, output_padding=0, groups=1,
                     dilation=1):
    """Transposed 2-D convolution (the gradient of conv2d w.r.t. its input): weight (C_in,
    C_out/groups, kh, kw); output size (H-1)*stride - 2*padding + dilation*(k-1) +
    output_padding + 1."""
    return _conv_t(2, input, weight, bias, stride, padding, output_padding, groups, dilation,
                   "conv_transpose2d")


def conv_transpose3d(input, weight, bias=None, stride=1, padding=0, output_padding=0, groups=1,
                     dilation=1):
    return _conv_t(3, input, weight, bias, stride, padding, output_padding, groups, dilation,
                   "conv_transpose3d")


def pool(input, reduction, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False,
         count_include_pad=True, divisor_override=None):
    """The general pooling op over the last `len(kernel_size)` axes: `reduction` 'max' or
    'avg'; `stride` defaults to the kernel size; `count_include_pad` / `divisor_override`
    apply to 'avg'. Windows follow torch (padding at most half the kernel; with `ceil_mode` a
    last partial window must start inside the input or the left padding)."""
    n = len(kernel_size)
    (x,) = _float_args(input)
    kernel = _tuple(kernel_size, n, "kernel_size")
    return Cv.pool_p.bind(
        _as_operand(x), reduction=reduction, kernel_size=kernel,
        stride=kernel if stride is None or stride == () else _tuple(stride, n, "stride"),
        padding=_tuple(padding, n, "padding"), dilation=_tuple(dilation, n, "dilation"),
        ceil_mode=bool(ceil_mode), count_include_pad=bool(count_include_pad),
        divisor_override=None if divisor_override is None else int(divisor_override))


def _max_pool(n, input, kernel_size, stride, padding, dilation, ceil_mode, return_indices):
    if return_indices:
        raise Unsupported("max_pool: return_indices=True is not supported")
    return pool(input, "max", _tuple(kernel_size, n, "kernel_size"), stride, padding, dilation,
                ceil_mode)


def max_pool1d(input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False,
               return_indices=False):
    """Max over windows of the last axis (padding counts as -inf)."""
    return _max_pool(1, input, kernel_size, stride, padding, dilation, ceil_mode, return_indices)


def max_pool2d(input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False,
               return_indices=False):
    """Max over windows of the last two axes (padding counts as -inf)."""
    return _max_pool(2, input, kernel_size, stride, padding, dilation, ceil_mode, return_indices)


def max_pool3d(input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False,
               return_indices=False):
    return _max_pool(3, input, kernel_size, stride, padding, dilation, ceil_mode, return_indices)


def avg_pool1d(input, kernel_size, stride=None, padding=0, ceil_mode=False,
               count_include_pad=True):
    """Mean over windows of the last axis."""
    return pool(input, "avg", _tuple(kernel_size, 1, "kernel_size"), stride, padding, 1,
                ceil_mode, count_include_pad)


def avg_pool2d(input, kernel_size, stride=None, padding=0, ceil_mode=False,
               count_include_pad=True, divisor_override=None):
    """Mean over windows of the last two axes; the divisor counts the padding only when
    `count_include_pad` (never the part of a ceil_mode window beyond the padding)."""
    return pool(input, "avg", _tuple(kernel_size, 2, "kernel_size"), stride, padding, 1,
                ceil_mode, count_include_pad, divisor_override)


def avg_pool3d(input, kernel_size, stride=None, padding=0, ceil_mode=False,
               count_include_pad=True, divisor_override=None):
    return pool(input, "avg", _tuple(kernel_size, 3, "kernel_size"), stride, padding, 1,
                ceil_mode, count_include_pad, divisor_override)


def pad(input, pad, mode="constant", value=None):
    """torch's pad: `pad` lists (left, right) pairs from the *last* axis backwards; modes
    'constant' (negative pads crop), 'reflect' (mirror without the edge), 'replicate' (repeat
    the edge) and 'circular' (wrap around)."""
    pad = tuple(int(p) for p in pad)
    if len(pad) % 2:
        raise OptionError(f"pad: needs (left, right) pairs, got {pad}")
    x = _as_operand(input)
    nd = _aval(x).ndim
    if len(pad) // 2 > nd:
        raise OptionError(f"pad: {len(pad) // 2} padded axes for an input of rank {nd}")
    pads = [(0, 0)] * nd
    for i in range(len(pad) // 2):
        pads[nd - 1 - i] = (pad[2 * i], pad[2 * i + 1])
    if mode != "constant" and value:
        raise OptionError(f"pad: value is only used with mode='constant', got mode={mode!r}")
    return Cv.nn_pad_p.bind(x, pads=tuple(pads), mode=mode,
                            value=0.0 if value is None else float(value))
