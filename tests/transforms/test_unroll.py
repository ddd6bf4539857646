import numpy as np
import pytest
import torch

import tgx
import tgx.numpy as tnp
from tgx.transforms.evaluate import eval_graph
from tgx.transforms.fuse import fuse
from tgx.transforms.simplify import simplify
from tgx.transforms.unroll import unroll

I, H, B = 5, 7, 3


def sigmoid(x):
    return 1.0 / (1.0 + tnp.exp(-x))


def tanh(x):
    return 2.0 * sigmoid(2.0 * x) - 1.0


def lstm_cell(w_ih, w_hh, b_ih, b_hh):
    def cell(carry, x):
        h, c = carry
        z = x @ tnp.transpose(w_ih) + b_ih + h @ tnp.transpose(w_hh) + b_hh
        i, f, g, o = (z[:, k * H:(k + 1) * H] for k in range(4))
        c = sigmoid(f) * c + sigmoid(i) * tanh(g)
        h = sigmoid(o) * tanh(c)
        return (h, c), h

    return cell


def gru_cell(w_ih, w_hh, b_ih, b_hh):
    def cell(h, x):
        gi = x @ tnp.transpose(w_ih) + b_ih
        gh = h @ tnp.transpose(w_hh) + b_hh
        r = sigmoid(gi[:, :H] + gh[:, :H])
        z = sigmoid(gi[:, H:2 * H] + gh[:, H:2 * H])
        n = tanh(gi[:, 2 * H:] + r * gh[:, 2 * H:])
        h = (1.0 - z) * n + z * h
        return h, h

    return cell


def _weights(module):
    return [getattr(module, f"{n}_l0").detach().numpy().astype(np.float32)
            for n in ("weight_ih", "weight_hh", "bias_ih", "bias_hh")]


def test_lstm_unrolled_16_steps_matches_torch():
    torch.manual_seed(0)
    lstm = torch.nn.LSTM(I, H)
    xs = np.random.default_rng(0).standard_normal((16, B, I)).astype(np.float32)
    h0 = np.random.default_rng(1).standard_normal((B, H)).astype(np.float32)
    c0 = np.random.default_rng(2).standard_normal((B, H)).astype(np.float32)
    step = unroll(lstm_cell(*_weights(lstm)), 16)
    spec = tgx.Spec(("B", H))
    g = tgx.make_graph(step)((spec, spec), tgx.Spec((16, "B", I)))
    tgx.check_graph(g)
    (h, c), ys = eval_graph(g, (h0, c0), xs)
    with torch.no_grad():
        ys_t, (h_t, c_t) = lstm(torch.from_numpy(xs), (torch.from_numpy(h0)[None],
                                                       torch.from_numpy(c0)[None]))
    np.testing.assert_allclose(ys, ys_t.numpy(), atol=2e-5)
    np.testing.assert_allclose(h, h_t[0].numpy(), atol=2e-5)
    np.testing.assert_allclose(c, c_t[0].numpy(), atol=2e-5)
    # eagerly, on NumPy arrays, too
    (h_e, _), ys_e = step((h0, c0), xs)
    np.testing.assert_allclose(ys_e, ys, atol=1e-6)


def test_gru_unrolled_matches_torch():
    torch.manual_seed(1)
    gru = torch.nn.GRU(I, H)
    xs = np.random.default_rng(3).standard_normal((12, B, I)).astype(np.float32)
    h0 = np.random.default_rng(4).standard_normal((B, H)).astype(np.float32)
    g = tgx.make_graph(unroll(gru_cell(*_weights(gru)), 12))(
        tgx.Spec((B, H)), tgx.Spec((12, B, I)))
    h, ys = eval_graph(g, h0, xs)
    with torch.no_grad():
        ys_t, h_t = gru(torch.from_numpy(xs), torch.from_numpy(h0)[None])
    np.testing.assert_allclose(ys, ys_t.numpy(), atol=2e-5)
    np.testing.assert_allclose(h, h_t[0].numpy(), atol=2e-5)


def test_graph_is_a_dag_of_step_copies():
    step = unroll(lambda c, x: (c * x["a"] + x["b"], {"y": c}), 4)
    g = tgx.make_graph(step)(tgx.Spec((2,)), {"a": tgx.Spec((4, 2)), "b": tgx.Spec((4, 2))})
    names = [e.primitive.name for e in g.eqns]
    assert names.count("mul") == 4 and names.count("add") == 4
    assert names[-1] == "concatenate"
    c, ys = eval_graph(g, np.ones(2, np.float32), {"a": np.full((4, 2), 2, np.float32),
                                                   "b": np.ones((4, 2), np.float32)})
    np.testing.assert_array_equal(c, [31, 31])
    np.testing.assert_array_equal(ys["y"][:, 0], [1, 3, 7, 15])


def test_wrong_time_axis_is_an_error():
    step = unroll(lambda c, x: (c + x, c), 4)
    with pytest.raises(tgx.ShapeError, match="leading time axis of size 4"):
        tgx.make_graph(step)(tgx.Spec((2,)), tgx.Spec((3, 2)))


def test_decompose_simplify_fuse_after_unrolling_keep_the_numbers():
    torch.manual_seed(2)
    lstm = torch.nn.LSTM(I, H)
    step = unroll(lstm_cell(*_weights(lstm)), 8)
    spec = tgx.Spec(("B", H))
    g = tgx.make_graph(step)((spec, spec), tgx.Spec((8, "B", I)))
    t = fuse(simplify(tgx.decompose(g)))
    tgx.check_graph(t)
    assert any(e.primitive.name == "fused" for e in t.eqns)
    assert len(t.eqns) < len(g.eqns)
    rng = np.random.default_rng(5)
    xs = rng.standard_normal((8, B, I)).astype(np.float32)
    carry = (rng.standard_normal((B, H)).astype(np.float32),) * 2
    (h1, c1), y1 = eval_graph(g, carry, xs)
    (h2, c2), y2 = eval_graph(t, carry, xs)
    np.testing.assert_allclose(y1, y2, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(c1, c2, rtol=1e-5, atol=1e-6)
