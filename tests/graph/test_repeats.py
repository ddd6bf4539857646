"""`find_repeats` / `shorten`: a stack of identical layers found in a traced graph, and the
graph with fewer of them, checked against NumPy running the layers the shortened graph kept."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tgx
import tgx.numpy as tnp
from tgx.errors import OptionError
from tgx.graph.repeats import Repeats, find_repeats, shorten
from tgx.transforms.evaluate import eval_graph_flat
from tgx.tracing import tree_flatten

D = 6


def layer(w, x):
    return x + tnp.tanh(x @ w) * 0.5


def layer_np(w, x):
    return x + np.tanh(x @ w) * 0.5


def model(ws, x, states=None):
    """A prologue, the layers (each updating its own state buffer when `states` is given),
    an epilogue."""
    x = x * 2.0
    new = []
    for i, w in enumerate(ws):
        x = layer(w, x)
        if states is not None:
            new.append(states[i] * 0.9 + x.sum())
    y = tnp.exp(x).sum(axis=-1)
    return (y, new) if states is not None else y


def model_np(ws, x, states=None):
    x = x.astype(np.float64) * 2.0
    new = []
    for i, w in enumerate(ws):
        x = layer_np(w.astype(np.float64), x)
        if states is not None:
            new.append(states[i] * 0.9 + x.sum())
    y = np.exp(x).sum(axis=-1)
    return (y, new) if states is not None else y


def traced(n, stateful):
    specs = [[tgx.Spec((D, D))] * n, tgx.Spec(("B", D))]
    if stateful:
        specs.append([tgx.Spec((3,))] * n)
    return tgx.make_graph(model)(*specs)


@settings(max_examples=30, deadline=None)
@given(n=st.integers(3, 7), keep=st.integers(1, 3), stateful=st.booleans(),
       seed=st.integers(0, 2**16))
def test_a_shortened_stack_computes_the_model_with_the_layers_it_kept(n, keep, stateful, seed):
    g = traced(n, stateful)
    r = find_repeats(g)
    assert r is not None and r.count == n   # one layer per block, all of them
    keep = min(keep, n)
    short = shorten(g, r, keep)
    rng = np.random.default_rng(seed)
    ws = [rng.standard_normal((D, D)).astype(np.float32) * 0.3 for _ in range(n)]
    x = rng.standard_normal((4, D)).astype(np.float32)
    states = [rng.standard_normal(3).astype(np.float32) for _ in range(n)] if stateful else None
    args = tree_flatten((ws, x) + ((states,) if stateful else ()))[0]
    outs = eval_graph_flat(short.graph, [args[i] for i in short.invars])
    # the inputs kept: the first `keep` layers' weights (and states), and x
    assert short.invars[:keep] == tuple(range(keep))
    want = model_np(ws[:keep], x, states[:keep] if stateful else None)
    np.testing.assert_allclose(outs[0], want[0] if stateful else want, rtol=2e-5)
    if stateful:
        # state buffer j of the whole graph is input n+1+j and output 1+j: the kept ones pair
        pairs = short.pairs([(n + 1 + j, 1 + j) for j in range(n)])
        assert len(pairs) == keep
        for (i, o), j in zip(pairs, range(keep)):
            assert short.invars[i] == n + 1 + j and short.outvars[o] == 1 + j
            np.testing.assert_allclose(outs[o], want[1][j], rtol=2e-5)
    assert short.inputs(range(n)) == tuple(range(keep))   # weights, renumbered


def test_fewer_than_three_blocks_or_no_repetition_is_none():
    assert find_repeats(traced(2, False)) is None
    g = tgx.make_graph(lambda x: tnp.exp(tnp.tanh(x) @ x).sum())(tgx.Spec((4, 4)))
    assert find_repeats(g) is None


def test_an_epilogue_reading_an_early_layer_keeps_that_layer_out_of_the_run():
    def skip(ws, x):
        x = x * 2.0
        first = None
        for w in ws:
            x = layer(w, x)
            first = x if first is None else first
        return (x + first).sum()

    n = 6
    g = tgx.make_graph(skip)([tgx.Spec((D, D))] * n, tgx.Spec((4, D)))
    r = find_repeats(g)
    assert r is not None and r.count == n - 1  # layer 0 is read at the end: not in the run
    short = shorten(g, r, 2)
    rng = np.random.default_rng(0)
    ws = [rng.standard_normal((D, D)).astype(np.float32) * 0.3 for _ in range(n)]
    x = rng.standard_normal((4, D)).astype(np.float32)
    out = eval_graph_flat(short.graph, [([*ws, x])[i] for i in short.invars])[0]
    h = x.astype(np.float64) * 2
    first = layer_np(ws[0].astype(np.float64), h)
    h = layer_np(ws[2].astype(np.float64), layer_np(ws[1].astype(np.float64), first))
    np.testing.assert_allclose(out, (h + first).sum(), rtol=2e-5)


def test_a_layer_reading_two_layers_back_is_not_a_block_of_one():
    def two_back(ws, x):
        prev, x = x, x * 2.0
        for w in ws:
            prev, x = x, layer(w, x) + prev
        return x.sum()

    g = tgx.make_graph(two_back)([tgx.Spec((D, D))] * 6, tgx.Spec((4, D)))
    r = find_repeats(g)
    assert r is None or r.length > 4   # never one layer per block


def test_shorten_refuses_a_bad_count():
    r = find_repeats(traced(4, False))
    with pytest.raises(OptionError, match="keeps 1 to 4"):
        shorten(traced(4, False), r, 0)
    assert Repeats(2, 3, 4).block(1) is None and Repeats(2, 3, 4).block(5) == 1


# a block made of ops hypothesis picks: (name, tgx op, NumPy op) on (x, the block's weight)
OPS = [("add_w", lambda x, w: x + w[0], lambda x, w: x + w[0]),
       ("mul_tanh", lambda x, w: x * tnp.tanh(w[1]), lambda x, w: x * np.tanh(w[1])),
       ("matmul", lambda x, w: x @ w * 0.3, lambda x, w: x @ w * 0.3),
       ("sin", lambda x, w: tnp.sin(x), lambda x, w: np.sin(x)),
       ("norm", lambda x, w: x / tnp.sqrt((x * x).mean(axis=-1, keepdims=True) + 1.0),
        lambda x, w: x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + 1.0)),
       ("residual", lambda x, w: x + tnp.exp(-x * x), lambda x, w: x + np.exp(-x * x))]


@settings(max_examples=30, deadline=None)
@given(ops=st.permutations(range(len(OPS))).flatmap(
           lambda p: st.integers(1, 4).map(lambda k: sorted(p[:k], key=lambda i: i != 2)
                                           if 2 in p[:k] else [2, *p[:k - 1]])),
       n=st.integers(3, 6), keep=st.integers(1, 3), seed=st.integers(0, 2**16))
def test_any_stack_shortened_is_the_stack_with_fewer_blocks(ops, n, keep, seed):
    """Whatever a layer is made of (distinct ops, one of them reading the layer's weight):
    the run found covers all layers but perhaps one at an end (its phase may start inside a
    layer when the prologue ends as a layer does), and the shortened graph computes the
    model with the layers whose weights it kept, in order."""
    def net(ws, x):
        x = x * 1.5
        for w in ws:
            for i in ops:
                x = OPS[i][1](x, w)
        return (x * x).sum(axis=-1)

    def net_np(ws, x):
        x = x.astype(np.float64) * 1.5
        for w in ws:
            for i in ops:
                x = OPS[i][2](x, w.astype(np.float64))
        return (x * x).sum(axis=-1)

    g = tgx.make_graph(net)([tgx.Spec((D, D))] * n, tgx.Spec((4, D)))
    r = find_repeats(g)
    assert r is not None and n - 1 <= r.count <= n
    keep = min(keep, r.count)
    short = shorten(g, r, keep)
    rng = np.random.default_rng(seed)
    ws = [rng.standard_normal((D, D)).astype(np.float32) for _ in range(n)]
    x = rng.standard_normal((4, D)).astype(np.float32)
    out = eval_graph_flat(short.graph, [([*ws, x])[i] for i in short.invars])[0]
    kept = [ws[i] for i in short.invars if i < n]
    assert keep <= len(kept) <= n - r.count + keep + 1
    if keep < r.count:
        assert len(short.graph.eqns) < len(g.eqns)
    np.testing.assert_allclose(out, net_np(kept, x), rtol=1e-4, atol=1e-4)
