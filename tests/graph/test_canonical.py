import numpy as np
from hypothesis import given
from hypothesis import strategies as st

import tgx
import tgx.numpy as tnp
from tgx.graph import canonicalize, structural_hash
from tgx.transforms.evaluate import eval_graph_flat

from .randgraph import build, inputs, steps
from .test_hashing import _shuffle_topologically, _swap_commutative

S = tgx.Spec(("N", 4))


def test_equal_graphs_print_identically():
    g1 = tgx.make_graph(lambda x, y: (tnp.exp(x) * tnp.sin(y), x - y))(S, S)
    g2 = tgx.make_graph(lambda a, b: (tnp.sin(b) * tnp.exp(a), a - b))(S, S)
    assert str(g1) != str(g2)
    assert str(canonicalize(g1)) == str(canonicalize(g2))


def test_canonicalize_keeps_the_function_and_does_not_mutate():
    c = np.arange(4, dtype=np.float32)
    g = tgx.make_graph(lambda x: tnp.sum(tnp.exp(x) + c, axis=1))(S)
    before = str(g)
    cg = canonicalize(g)
    assert str(g) == before
    tgx.check_graph(cg)
    x = np.random.default_rng(0).random((3, 4), dtype=np.float32)
    np.testing.assert_array_equal(eval_graph_flat(g, [x])[0], eval_graph_flat(cg, [x])[0])
    assert structural_hash(cg) == structural_hash(g)


@given(steps, st.integers(0, 100))
def test_canonical_text_is_invariant(prog, seed):
    g = build(prog)
    text = str(canonicalize(g))
    assert str(canonicalize(_shuffle_topologically(g, seed))) == text
    assert str(canonicalize(_swap_commutative(g))) == text
    cg = canonicalize(g)
    tgx.check_graph(cg)
    xs = inputs(g)
    for a, b in zip(eval_graph_flat(g, xs), eval_graph_flat(cg, xs)):
        np.testing.assert_array_equal(a, b)
