import numpy as np

import tgx
import tgx.numpy as tnp
from tgx.graph import Match, equivalent, find_pattern, replace_pattern
from tgx.transforms.evaluate import eval_graph_flat


def rms_norm(x, w, eps=1e-6):
    ms = tnp.mean(x * x, axis=-1, keepdims=True)
    return x / tnp.sqrt(ms + eps) * w


def mlp(params, x):
    h = rms_norm(x, params["g1"])
    h = tnp.maximum(h @ params["w1"], 0.0)
    h = rms_norm(h, params["g2"]) + x
    return tnp.exp(h @ params["w2"])


PARAMS = {"g1": tgx.Spec((16,)), "w1": tgx.Spec((16, 16)), "g2": tgx.Spec((16,)),
          "w2": tgx.Spec((16, 8))}
X = tgx.Spec(("B", 16))
PATTERN = (tgx.Spec(("N", "D")), tgx.Spec(("D",)))


def _model():
    return tgx.decompose(tgx.make_graph(mlp)(PARAMS, X))


def test_finds_rms_norm_written_by_hand_inside_a_model():
    g = _model()
    matches = find_pattern(g, rms_norm, *PATTERN)
    assert len(matches) == 2 and all(isinstance(m, Match) for m in matches)
    m1, m2 = matches
    assert m1.inputs[0] is g.invars[-1]  # x feeds the first norm
    assert m1.dims[tgx.shapes.sym("D")] == 16
    assert str(m1.dims[tgx.shapes.sym("N")]) == "B"
    assert set(m1.eqns).isdisjoint(m2.eqns)
    names = {g.eqns[i].primitive.name for i in m1.eqns}
    assert {"mul", "reduce_sum", "sqrt", "div"} <= names


def test_replace_rms_norm_keeps_the_function():
    g = _model()

    def fused_norm(x, w):  # an equivalent formula: x * rsqrt(...) written differently
        return x * (1.0 / tnp.sqrt(tnp.sum(x * x, axis=-1, keepdims=True) / 16.0 + 1e-6)) * w

    g2 = replace_pattern(g, rms_norm, fused_norm, *PATTERN)
    tgx.check_graph(g2)
    assert find_pattern(g2, rms_norm, *PATTERN) == []
    assert equivalent(g, g2, rtol=1e-5)


def test_commutativity_is_respected():
    S = tgx.Spec((4,))
    g = tgx.make_graph(lambda x, y, z: tnp.exp(z * (y + x)))(S, S, S)
    ms = find_pattern(g, lambda a, b, c: (a + b) * c, *[tgx.Spec(("N",))] * 3)
    assert len(ms) == 1
    assert ms[0].inputs[2] is g.invars[2]
    assert ms[0].outputs[0] is g.eqns[1].outvars[0]


def test_interior_value_used_outside_is_not_a_match():
    S = tgx.Spec((4,))
    def f(x, y, z):
        s = x + y
        return s * z, s

    g = tgx.make_graph(f)(S, S, S)
    assert find_pattern(g, lambda a, b, c: (a + b) * c, S, S, S) == []
    # ...but the sub-pattern whose output is shared still matches
    assert len(find_pattern(g, lambda a, b: a + b, S, S)) == 1


def test_literals_and_concrete_dims_must_match():
    S = tgx.Spec((4,))
    g = tgx.make_graph(lambda x: x * 2.0 + 1.0)(S)
    assert len(find_pattern(g, lambda a: a * 2.0, S)) == 1
    assert find_pattern(g, lambda a: a * 3.0, S) == []
    assert find_pattern(g, lambda a: a * 2.0, tgx.Spec((5,))) == []
    assert len(find_pattern(g, lambda a: a * 2.0, tgx.Spec(("N",)))) == 1


def test_symbolic_dims_bind_consistently():
    g = tgx.make_graph(lambda x, y: x + y)(tgx.Spec((3, 4)), tgx.Spec((3, 4)))
    same = (tgx.Spec(("N", "D")), tgx.Spec(("N", "D")))
    assert len(find_pattern(g, lambda a, b: a + b, *same)) == 1
    g2 = tgx.make_graph(lambda x, y: x + y)(tgx.Spec((4, 4)), tgx.Spec((4, 1)))
    assert find_pattern(g2, lambda a, b: a + b, *same) == []


def test_same_input_twice_must_be_the_same_value():
    S = tgx.Spec((4,))
    g = tgx.make_graph(lambda x, y: (x * x, x * y))(S, S)
    ms = find_pattern(g, lambda a: a * a, S)
    assert [m.eqns for m in ms] == [(0,)]


def test_add_mul_replacement_is_equivalent_everywhere():
    S = tgx.Spec(("N",))

    def model(x, y, z):
        return tnp.sin((x + y) * z) + (y + z) * x

    g = tgx.make_graph(model)(S, S, S)
    g2 = replace_pattern(g, lambda a, b, c: (a + b) * c, lambda a, b, c: a * c + b * c, S, S, S)
    assert sum(e.primitive.name == "mul" for e in g2.eqns) == 4
    assert equivalent(g, g2)
    xs = [np.linspace(1, 2, 5, dtype=np.float32)] * 3
    np.testing.assert_allclose(eval_graph_flat(g, xs)[0], eval_graph_flat(g2, xs)[0], rtol=1e-6)
