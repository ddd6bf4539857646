"""Recurrent cells as composites, with torch.nn.RNNCell / LSTMCell / GRUCell conventions so
weights copy over unchanged: `w_ih` is (G*H, I), `w_hh` is (G*H, H), biases (G*H,), gates
stacked in torch's order (LSTM: i, f, g, o; GRU: r, z, n). `x` is (B, I) or unbatched (I,).
"""

from __future__ import annotations

import numpy as np

from ..core import Primitive
from ..errors import DTypeError, ShapeError
from ..shapes import ShapedArray, as_dim, dim_eq, is_float
from . import ops
from .activations import relu_p, sigmoid_p
from .elementwise import _lowp, special
from .linalg import dot_general_p
from .math import tanh_p
from .movement import slice_p

_GATES = {"rnn_cell": 1, "lstm_cell": 4, "gru_cell": 3}


def _check(name, x, h, w_ih, w_hh, b_ih, b_hh):
    g = _GATES[name]
    operands = (x, h, w_ih, w_hh, b_ih, b_hh)
    if len({a.dtype for a in operands}) != 1 or not is_float(x.dtype):
        raise DTypeError(f"{name} needs floating operands of one dtype, got "
                         f"{', '.join(a.str_short() for a in operands)}")
    hid = h.shape[-1] if h.ndim else None
    ok = (x.ndim in (1, 2) and h.ndim == x.ndim and w_ih.ndim == 2 and w_hh.ndim == 2
          and b_ih.ndim == 1 and b_hh.ndim == 1 and dim_eq(w_ih.shape[1], x.shape[-1])
          and dim_eq(w_hh.shape[1], hid) and dim_eq(w_ih.shape[0], g * hid)
          and dim_eq(w_hh.shape[0], g * hid) and dim_eq(b_ih.shape[0], g * hid)
          and dim_eq(b_hh.shape[0], g * hid) and (x.ndim == 1 or dim_eq(x.shape[0], h.shape[0])))
    if not ok:
        raise ShapeError(f"{name}: expected x (B, I), h (B, H), w_ih ({g}H, I), w_hh ({g}H, H), "
                         f"b_ih ({g}H,), b_hh ({g}H,); got "
                         f"{', '.join(a.str_short() for a in operands)}")
    return ShapedArray(h.shape, h.dtype)


def _np_sigmoid(x):
    return special().expit(x)


def _np_linear(x, w, b):
    return x @ w.T + b


def _linear(x, w, b):
    # x @ w.T as one dot_general contracting the last axis of x with axis 1 of w (no transpose)
    nd = ops.ndim(x)
    return ops.add(dot_general_p.bind(x, w, dimension_numbers=(((nd - 1,), (1,)), ((), ()))), b)


def _chunks(z, n):
    """n equal slices of the last axis (the size may be symbolic)."""
    a = ops._aval(z)
    last = a.shape[-1]
    hid = as_dim(last // n if isinstance(last, int) else last / n)
    out = []
    for i in range(n):
        start, limit = [0] * a.ndim, list(a.shape)
        start[-1], limit[-1] = as_dim(i * hid), as_dim((i + 1) * hid)
        out.append(slice_p.bind(z, start_indices=tuple(start), limit_indices=tuple(limit),
                                strides=None))
    return out


# rnn_cell(x, h, w_ih, w_hh, b_ih, b_hh, nonlinearity) -> h'
rnn_cell_p = Primitive("rnn_cell", family="rnn")


@rnn_cell_p.def_shape
def _rnn_shape(x, h, w_ih, w_hh, b_ih, b_hh, *, nonlinearity):
    if nonlinearity not in ("tanh", "relu"):
        raise ShapeError(f"rnn_cell: nonlinearity must be 'tanh' or 'relu', got {nonlinearity!r}")
    return _check("rnn_cell", x, h, w_ih, w_hh, b_ih, b_hh)


@rnn_cell_p.def_impl
@_lowp
def _rnn_impl(x, h, w_ih, w_hh, b_ih, b_hh, *, nonlinearity):
    z = _np_linear(x, w_ih, b_ih) + _np_linear(h, w_hh, b_hh)
    return np.tanh(z) if nonlinearity == "tanh" else np.maximum(z, 0)


@rnn_cell_p.def_decomposition
def _rnn_decomp(x, h, w_ih, w_hh, b_ih, b_hh, *, nonlinearity):
    z = ops.add(_linear(x, w_ih, b_ih), _linear(h, w_hh, b_hh))
    return tanh_p.bind(z) if nonlinearity == "tanh" else relu_p.bind(z)


# lstm_cell(x, h, c, w_ih, w_hh, b_ih, b_hh) -> (h', c')
lstm_cell_p = Primitive("lstm_cell", multiple_results=True, family="rnn")


@lstm_cell_p.def_shape
def _lstm_shape(x, h, c, w_ih, w_hh, b_ih, b_hh):
    out = _check("lstm_cell", x, h, w_ih, w_hh, b_ih, b_hh)
    if c.dtype != h.dtype or len(c.shape) != len(h.shape) or not all(
            dim_eq(p, q) for p, q in zip(c.shape, h.shape)):
        raise ShapeError(f"lstm_cell: c must match h, got {c.str_short()} and {h.str_short()}")
    return [out, out]


def _lstm_np(x, h, c, w_ih, w_hh, b_ih, b_hh):
    z = _np_linear(x, w_ih, b_ih) + _np_linear(h, w_hh, b_hh)
    i, f, g, o = np.split(z, 4, axis=-1)
    c2 = _np_sigmoid(f) * c + _np_sigmoid(i) * np.tanh(g)
    return np.stack([_np_sigmoid(o) * np.tanh(c2), c2])


@lstm_cell_p.def_impl
def _lstm_impl(*args):
    out = _lowp(_lstm_np)(*args)
    return [out[0], out[1]]


@lstm_cell_p.def_decomposition
def _lstm_decomp(x, h, c, w_ih, w_hh, b_ih, b_hh):
    z = ops.add(_linear(x, w_ih, b_ih), _linear(h, w_hh, b_hh))
    i, f, g, o = _chunks(z, 4)
    c2 = ops.add(ops.multiply(sigmoid_p.bind(f), c),
                 ops.multiply(sigmoid_p.bind(i), tanh_p.bind(g)))
    return [ops.multiply(sigmoid_p.bind(o), tanh_p.bind(c2)), c2]


# gru_cell(x, h, w_ih, w_hh, b_ih, b_hh) -> h'
gru_cell_p = Primitive("gru_cell", family="rnn")


@gru_cell_p.def_shape
def _gru_shape(x, h, w_ih, w_hh, b_ih, b_hh):
    return _check("gru_cell", x, h, w_ih, w_hh, b_ih, b_hh)


@gru_cell_p.def_impl
@_lowp
def _gru_impl(x, h, w_ih, w_hh, b_ih, b_hh):
    ir, iz, in_ = np.split(_np_linear(x, w_ih, b_ih), 3, axis=-1)
    hr, hz, hn = np.split(_np_linear(h, w_hh, b_hh), 3, axis=-1)
    r, z = _np_sigmoid(ir + hr), _np_sigmoid(iz + hz)
    n = np.tanh(in_ + r * hn)
    return (1 - z) * n + z * h


@gru_cell_p.def_decomposition
def _gru_decomp(x, h, w_ih, w_hh, b_ih, b_hh):
    ir, iz, in_ = _chunks(_linear(x, w_ih, b_ih), 3)
    hr, hz, hn = _chunks(_linear(h, w_hh, b_hh), 3)
    r = sigmoid_p.bind(ops.add(ir, hr))
    z = sigmoid_p.bind(ops.add(iz, hz))
    n = tanh_p.bind(ops.add(in_, ops.multiply(r, hn)))
    # (1 - z) * n + z * h == n + z * (h - n)
    return ops.add(n, ops.multiply(z, ops.subtract(h, n)))


RNN = [rnn_cell_p, lstm_cell_p, gru_cell_p]
