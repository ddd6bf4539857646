"""tgx.decompose: full expansion, `level`, `only`, `keep`, source lines, input untouched."""

from __future__ import annotations

import numpy as np

import tgx
import tgx.nn as tnn
import tgx.numpy as tnp


def _names(g):
    return {e.primitive.name for e in g.eqns}


def _gelu_tanh(x):
    return tnn.gelu(x, approximate="tanh")


def _graph(fn=_gelu_tanh):
    return tgx.make_graph(fn)(tgx.Spec(("N", 4)))


def test_full_decomposition_is_atomic_and_matches():
    g = _graph()
    assert _names(g) == {"gelu"}
    flat = tgx.decompose(g)
    tgx.check_graph(flat)
    assert all(e.primitive.atomic for e in flat.eqns)
    x = np.linspace(-5, 5, 12, dtype=np.float32).reshape(3, 4)
    # 1 + tanh(.) cancels for x = -5: compare with an absolute tolerance there
    np.testing.assert_allclose(tgx.eval_graph(flat, x), tgx.eval_graph(g, x), rtol=1e-6,
                               atol=1e-6)


def test_level_expands_one_level_at_a_time():
    g = _graph()
    one = tgx.decompose(g, level=1)
    assert "gelu" not in _names(one) and "tanh" in _names(one)
    two = tgx.decompose(g, level=2)
    assert "tanh" not in _names(two) and {"expm1", "abs"} <= _names(two)
    three = tgx.decompose(g, level=3)
    assert all(e.primitive.atomic for e in three.eqns)
    assert _names(tgx.decompose(g, level=0)) == {"gelu"}


def test_only_and_keep():
    g = _graph()
    only = tgx.decompose(g, only=["gelu"])
    assert "gelu" not in _names(only) and "tanh" in _names(only)
    kept = tgx.decompose(g, keep=["tanh"])
    assert "tanh" in _names(kept) and "gelu" not in _names(kept)
    assert all(e.primitive.atomic for e in kept.eqns if e.primitive.name != "tanh")
    untouched = tgx.decompose(g, only=["softmax"])
    assert _names(untouched) == {"gelu"}


def test_decomposed_equations_keep_the_user_line():
    def f(x):
        return tnn.softmax(x, dim=-1)  # the line every decomposed equation must point at

    g = tgx.make_graph(f)(tgx.Spec(("N", 4)))
    line = g.eqns[0].source_info.line
    assert g.eqns[0].source_info.file.endswith("test_decompose.py")
    flat = tgx.decompose(g)
    assert len(flat.eqns) > 3
    for e in flat.eqns:
        assert e.source_info is not None and e.source_info.line == line, e


def test_input_graph_is_not_mutated():
    g = tgx.make_graph(lambda x: tnp.var(x, axis=0, ddof=1) + tnp.tanh(x))(tgx.Spec((5, 3)))
    before = str(g)
    tgx.decompose(g)
    tgx.decompose(g, level=1)
    assert str(g) == before


def test_multiple_results_decompose():
    def f(x, h, c, w_ih, w_hh, b_ih, b_hh):
        return tnn.lstm_cell(x, (h, c), w_ih, w_hh, b_ih, b_hh)

    specs = [tgx.Spec(("B", 3)), tgx.Spec(("B", 2)), tgx.Spec(("B", 2)), tgx.Spec((8, 3)),
             tgx.Spec((8, 2)), tgx.Spec((8,)), tgx.Spec((8,))]
    g = tgx.make_graph(f)(*specs)
    flat = tgx.decompose(g)
    assert all(e.primitive.atomic for e in flat.eqns)
    rng = np.random.default_rng(0)
    args = [rng.standard_normal((4,) + tuple(s.shape[1:]) if s.shape[0] == "B" or not isinstance(
        s.shape[0], int) else s.shape).astype(np.float32) for s in specs]
    for a, b in zip(tgx.eval_graph(flat, *args), tgx.eval_graph(g, *args)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
