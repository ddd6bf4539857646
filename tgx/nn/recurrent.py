"""Recurrent cells with torch.nn.RNNCell / LSTMCell / GRUCell weight layouts and argument
conventions, so torch weights copy over unchanged. Each binds one composite primitive
(tgx/primitives/rnn.py); `tgx.unroll` turns a cell into a DAG over time steps.

>>> import numpy as np
>>> x, h = np.ones((2, 3), np.float32), np.zeros((2, 4), np.float32)
>>> w_ih, w_hh = np.ones((4, 3), np.float32), np.ones((4, 4), np.float32)
>>> rnn_cell(x, h, w_ih, w_hh).shape
(2, 4)
"""

from __future__ import annotations

from .. import numpy as tnp
from .. import primitives as P
from ..primitives.ops import _as_operand, _aval, _promoted

__all__ = ["rnn_cell", "lstm_cell", "gru_cell"]


def _args(x, h, w_ih, w_hh, b_ih, b_hh, gates):
    (x, h, w_ih, w_hh), dtype, _ = _promoted(x, h, w_ih, w_hh)
    hid = tnp.shape(w_hh)[0]
    b_ih = tnp.zeros((hid,), dtype) if b_ih is None else tnp.astype(b_ih, dtype)
    b_hh = tnp.zeros((hid,), dtype) if b_hh is None else tnp.astype(b_hh, dtype)
    return [_as_operand(a) for a in (x, h, w_ih, w_hh, b_ih, b_hh)]


def _h0(x, w_hh, gates, h):
    if h is not None:
        return h
    hid = tnp.shape(w_hh)[1]
    return tnp.zeros(tuple(tnp.shape(x)[:-1]) + (hid,), _aval(x).dtype)


def rnn_cell(x, h, w_ih, w_hh, b_ih=None, b_hh=None, nonlinearity: str = "tanh"):
    """h' = act(x w_ih^T + b_ih + h w_hh^T + b_hh), act = tanh or relu (torch.nn.RNNCell)."""
    h = _h0(x, w_hh, 1, h)
    return P.rnn_cell_p.bind(*_args(x, h, w_ih, w_hh, b_ih, b_hh, 1), nonlinearity=nonlinearity)


def lstm_cell(x, hc, w_ih, w_hh, b_ih=None, b_hh=None):
    """(h', c') from x and (h, c) (torch.nn.LSTMCell; gates i, f, g, o). `hc=None` is zeros."""
    if hc is None:
        h = c = _h0(x, w_hh, 4, None)
    else:
        h, c = hc
    x, h, w_ih, w_hh, b_ih, b_hh = _args(x, h, w_ih, w_hh, b_ih, b_hh, 4)
    c = _as_operand(tnp.astype(c, _aval(h).dtype))
    h2, c2 = P.lstm_cell_p.bind(x, h, c, w_ih, w_hh, b_ih, b_hh)
    return h2, c2


def gru_cell(x, h, w_ih, w_hh, b_ih=None, b_hh=None):
    """h' = (1 - z) n + z h (torch.nn.GRUCell; gates r, z, n)."""
    h = _h0(x, w_hh, 3, h)
    return P.gru_cell_p.bind(*_args(x, h, w_ih, w_hh, b_ih, b_hh, 3))
