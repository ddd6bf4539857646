import numpy as np
from hypothesis import given

import tgx
import tgx.numpy as tnp
from tgx.graph import equivalent, structural_hash
from tgx.transforms.evaluate import eval_graph_flat
from tgx.transforms.fuse import fuse

from ..graph.randgraph import build, inputs, steps

S = tgx.Spec(("N", 4))


def prims(g):
    return [e.primitive.name for e in g.eqns]


def test_elementwise_chain_with_trailing_reduction_is_one_fused_equation():
    g = tgx.make_graph(lambda x, y: tnp.sum(tnp.exp(x) * y + x, axis=1))(S, S)
    f = fuse(g)
    assert prims(f) == ["fused"]
    body = f.eqns[0].params["graph"]
    assert [e.primitive.name for e in body.eqns] == ["exp", "mul", "add", "reduce_sum"]
    text = str(f)
    assert "fused[graph=" in text and "reduce_sum" in text
    x = np.random.default_rng(0).random((3, 4), dtype=np.float32)
    np.testing.assert_array_equal(eval_graph_flat(g, [x, x])[0], eval_graph_flat(f, [x, x])[0])


def test_regions_stop_at_non_elementwise_ops_and_keep_shared_outputs():
    def model(x, w):
        a = tnp.exp(x) * 2.0
        h = a @ w
        return tnp.sin(h) + 1.0, a

    g = tgx.make_graph(model)(S, tgx.Spec((4, 4)))
    f = fuse(g)
    assert prims(f) == ["fused", "dot_general", "fused"]
    assert len(f.eqns[0].outvars) == 1  # `a` feeds the matmul and is a graph output
    tgx.check_graph(f)
    assert equivalent(g, f)


def test_no_cycle_through_outside_equations():
    def model(x, w):
        a = tnp.exp(x)
        h = a @ w  # a -> dot -> b: a and b cannot be one region
        return a + h

    g = tgx.make_graph(model)(tgx.Spec((4, 4)), tgx.Spec((4, 4)))
    f = fuse(g)
    tgx.check_graph(f)
    assert equivalent(g, f)


def test_fused_has_a_structural_hash_and_decomposes_back():
    g = tgx.make_graph(lambda x: tnp.exp(x) * 2.0 + x)(S)
    f1, f2 = fuse(g), fuse(tgx.make_graph(lambda y: y + 2.0 * tnp.exp(y))(tgx.Spec(("B", 4))))
    assert structural_hash(f1) == structural_hash(f2) != structural_hash(g)
    d = tgx.decompose(f1)
    assert prims(d) == prims(g)
    assert equivalent(g, d).method == "structural"


@given(steps)
def test_fuse_preserves_semantics_on_random_graphs(prog):
    g = build(prog)
    f = fuse(g)
    tgx.check_graph(f)
    xs = inputs(g)
    with np.errstate(all="ignore"):
        for a, b in zip(eval_graph_flat(g, xs), eval_graph_flat(f, xs)):
            np.testing.assert_array_equal(a, b)
        assert equivalent(g, f, trials=2)
