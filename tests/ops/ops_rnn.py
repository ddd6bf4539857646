"""Op-table entries for the recurrent cells against torch.nn.RNNCell / LSTMCell / GRUCell with
the same weights copied over."""

from __future__ import annotations

import numpy as np
import torch

import tgx.nn as tnn
from tgx.shapes import float32, float64

from .op_table import OpInfo, Sample, randn, register

F = (float32, float64)
TOL = {float32: (1e-5, 1e-5)}


def _torch_cell(cls, x, h, w_ih, w_hh, b_ih, b_hh, c=None, **kw):
    t = lambda a: torch.from_numpy(np.asarray(a).copy())  # noqa: E731
    cell = cls(w_ih.shape[1], w_hh.shape[1], dtype=t(x).dtype, **kw)
    with torch.no_grad():
        cell.weight_ih.copy_(t(w_ih))
        cell.weight_hh.copy_(t(w_hh))
        cell.bias_ih.copy_(t(b_ih))
        cell.bias_hh.copy_(t(b_hh))
        out = cell(t(x), (t(h), t(c)) if c is not None else t(h))
    return tuple(o.numpy() for o in out) if isinstance(out, tuple) else out.numpy()


def cell_samples(gates, lstm=False):
    def make(rng, dt):
        def one(batch, i=3, hid=4, name="", symbolic=True):
            bshape = (batch,) if batch else ()
            args = (randn(rng, bshape + (i,), dt), randn(rng, bshape + (hid,), dt))
            if lstm:
                args += (randn(rng, bshape + (hid,), dt),)
            args += (randn(rng, (gates * hid, i), dt, scale=0.5),
                     randn(rng, (gates * hid, hid), dt, scale=0.5),
                     randn(rng, (gates * hid,), dt), randn(rng, (gates * hid,), dt))
            sym = {0: {0: "B"}, 1: {0: "B"}}
            if lstm:
                sym[2] = {0: "B"}
            return Sample(args, symbolic=sym if batch and symbolic else {}, name=name)
        return [one(2), one(5, name="[B=5]"), one(0, name="[unbatched]"),
                one(3, i=6, hid=2, name="[I=6,H=2]", symbolic=False)]
    return make


def rnn_fn(nl):
    return lambda x, h, *w: tnn.rnn_cell(x, h, *w, nonlinearity=nl)


def rnn_ref(nl):
    return lambda x, h, *w: _torch_cell(torch.nn.RNNCell, x, h, *w, nonlinearity=nl)


def lstm_fn(x, h, c, *w):
    return tnn.lstm_cell(x, (h, c), *w)


def lstm_ref(x, h, c, *w):
    return _torch_cell(torch.nn.LSTMCell, x, h, *w, c=c)


def gru_ref(x, h, *w):
    return _torch_cell(torch.nn.GRUCell, x, h, *w)


register(
    OpInfo("tnn.rnn_cell[tanh]", rnn_fn("tanh"), rnn_ref("tanh"), cell_samples(1), dtypes=F,
           tol=TOL, decomposes=True),
    OpInfo("tnn.rnn_cell[relu]", rnn_fn("relu"), rnn_ref("relu"), cell_samples(1), dtypes=F,
           tol=TOL, decomposes=True),
    OpInfo("tnn.lstm_cell", lstm_fn, lstm_ref, cell_samples(4, lstm=True), dtypes=F, tol=TOL,
           decomposes=True),
    OpInfo("tnn.gru_cell", tnn.gru_cell, gru_ref, cell_samples(3), dtypes=F, tol=TOL,
           decomposes=True),
    OpInfo("tnn.lstm_cell[no bias, zero state]",
           lambda x, w_ih, w_hh: tnn.lstm_cell(x, None, w_ih, w_hh),
           lambda x, w_ih, w_hh: _torch_cell(
               torch.nn.LSTMCell, x, np.zeros((x.shape[0], w_hh.shape[1]), x.dtype), w_ih, w_hh,
               np.zeros(w_ih.shape[0], x.dtype), np.zeros(w_ih.shape[0], x.dtype),
               c=np.zeros((x.shape[0], w_hh.shape[1]), x.dtype)),
           lambda rng, dt: [Sample((randn(rng, (2, 3), dt), randn(rng, (8, 3), dt),
                                    randn(rng, (8, 2), dt)))], dtypes=F, tol=TOL,
           decomposes=True),
)
