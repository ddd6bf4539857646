import numpy as np

import tgx
import tgx.numpy as tnp
from tgx.graph import Verdict, equivalent

S = tgx.Spec(("N",))
M = tgx.Spec(("N", "K"))


def test_structural():
    g1 = tgx.make_graph(lambda x, y: x * y + 1.0)(S, S)
    g2 = tgx.make_graph(lambda a, b: 1.0 + b * a)(S, S)
    v = equivalent(g1, g2)
    assert isinstance(v, Verdict) and v and v.method == "structural"


def test_sympy_proves_distributivity_and_log_rules():
    v = equivalent(tgx.make_graph(lambda a, b, c: (a + b) * c)(S, S, S),
                   tgx.make_graph(lambda a, b, c: a * c + b * c)(S, S, S))
    assert v.equivalent and v.method == "sympy"
    v = equivalent(tgx.make_graph(lambda a, b: tnp.log(a * b))(S, S),
                   tgx.make_graph(lambda a, b: tnp.log(a) + tnp.log(b))(S, S))
    assert v.equivalent and v.method == "sympy"


def test_numerical_for_non_elementwise_graphs():
    A, B, C = tgx.Spec(("N", "K")), tgx.Spec(("K", "M")), tgx.Spec(("M", 3))
    g1 = tgx.make_graph(lambda a, b, c: (a @ b) @ c)(A, B, C)
    g2 = tgx.make_graph(lambda a, b, c: a @ (b @ c))(A, B, C)
    v = equivalent(g1, g2)
    assert v.equivalent and v.method == "numerical" and v.max_error < 1e-9
    assert len(v.bindings) >= 2 and len({tuple(b.values()) for b in v.bindings}) >= 2
    g3 = tgx.make_graph(lambda x: tnp.sum(x * 2.0, axis=1))(M)
    g4 = tgx.make_graph(lambda x: 2.0 * tnp.sum(x, axis=1))(M)
    assert equivalent(g3, g4).method == "numerical" and equivalent(g3, g4)


def test_counterexample_when_not_equivalent():
    g1 = tgx.make_graph(lambda x, y: x + y)(S, S)
    g2 = tgx.make_graph(lambda x, y: x * y)(S, S)
    v = equivalent(g1, g2)
    assert not v and v.method == "numerical" and v.max_error > 0
    ce = v.counterexample
    x, y = ce["inputs"]
    np.testing.assert_allclose(ce["outputs1"][0], x.astype(np.float64) + y)
    np.testing.assert_allclose(ce["outputs2"][0], x.astype(np.float64) * y)


def test_subtle_difference_found_at_some_binding():
    # Equal on the first axis entry only: a shift by one along a symbolic axis.
    g1 = tgx.make_graph(lambda x: tnp.sum(x, axis=0))(M)
    g2 = tgx.make_graph(lambda x: tnp.sum(x[:1], axis=0) * 1.0)(M)
    assert not equivalent(g1, g2)


def test_signature_mismatch():
    g1 = tgx.make_graph(lambda x: x)(S)
    g2 = tgx.make_graph(lambda x, y: x)(S, S)
    v = equivalent(g1, g2)
    assert not v and "inputs" in v.reason
