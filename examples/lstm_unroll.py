"""An LSTM unrolled in time with `tgx.unroll`, checked against `torch.nn.LSTM`.

The cell is `tnn.lstm_cell` (torch.nn.LSTMCell's gate layout, so torch weights copy over);
`tgx.unroll(cell, steps)` turns it into a DAG of `steps` copies of the cell with the time axis
leading (jax.lax.scan semantics). The batch size stays symbolic.

Run: python examples/lstm_unroll.py
"""

from __future__ import annotations

import numpy as np

import tgx
import tgx.nn as tnn

STEPS, INPUT, HIDDEN = 16, 8, 32


def make_step(weights):
    def cell(carry, x_t):
        h, c = tnn.lstm_cell(x_t, carry, weights["w_ih"], weights["w_hh"], weights["b_ih"],
                             weights["b_hh"])
        return (h, c), h

    return tgx.unroll(cell, STEPS)


def main() -> None:
    import torch

    torch.manual_seed(0)
    lstm = torch.nn.LSTM(INPUT, HIDDEN)
    weights = {k: getattr(lstm, f"{k}_l0").detach().numpy() for k in ("weight_ih", "weight_hh",
                                                                      "bias_ih", "bias_hh")}
    weights = {"w_ih": weights["weight_ih"], "w_hh": weights["weight_hh"],
               "b_ih": weights["bias_ih"], "b_hh": weights["bias_hh"]}
    step = make_step(weights)
    carry_spec = (tgx.Spec(("B", HIDDEN)), tgx.Spec(("B", HIDDEN)))
    graph = tgx.make_graph(step)(carry_spec, tgx.Spec((STEPS, "B", INPUT)))
    flat = tgx.decompose(graph)
    print(f"LSTM unrolled over {STEPS} steps: {len(graph)} equations "
          f"({len(flat)} after decompose), outputs {graph.out_avals}")
    rng = np.random.default_rng(0)
    for batch in (1, 5):
        xs = rng.standard_normal((STEPS, batch, INPUT)).astype(np.float32)
        h0 = rng.standard_normal((batch, HIDDEN)).astype(np.float32)
        c0 = rng.standard_normal((batch, HIDDEN)).astype(np.float32)
        with torch.no_grad():
            ys_t, (h_t, c_t) = lstm(torch.from_numpy(xs), (torch.from_numpy(h0)[None],
                                                           torch.from_numpy(c0)[None]))
        for name, g in (("traced", graph), ("decomposed", flat)):
            (h, c), ys = tgx.eval_graph(g, (h0, c0), xs)
            err = max(np.abs(ys - ys_t.numpy()).max(), np.abs(h - h_t[0].numpy()).max(),
                      np.abs(c - c_t[0].numpy()).max())
            print(f"  B={batch}, {name:10s}: max |tgx - torch.nn.LSTM| = {err:.1e}")
            assert err < 1e-5, err


if __name__ == "__main__":
    main()
