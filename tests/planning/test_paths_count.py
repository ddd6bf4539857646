"""`Paths.count()` with `max_transfers`: exact (it equals the enumeration), by dynamic
programming over the partial plans' keys — never by enumerating."""

from __future__ import annotations

import itertools
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tgx
import tgx.nn as tnn
import tgx.numpy as tnp
from ..graph import randgraph
from .test_paths import OPS, PlantedCosts, build
from tgx.explore import Paths
from tgx.planning.path_count import _count_key
from tgx.primitives.transfer import copy_to

S = tgx.Spec
NT = ["numpy", "torch"]
NTJ = ["numpy", "torch", "jax"]
CAP = 5000   # enumerate at most this many plans per check


class SwitchCosts(PlantedCosts):
    """With backend-switch penalties: they change costs (and the ranking's signature), never
    which plans exist."""

    def switch(self, src, dst, eqn=None, kernel=None, pool=None):
        return 3e-6


def enumerated(ps: Paths, cap: int = CAP) -> int:
    return sum(1 for _ in itertools.islice(ps, cap + 1))


def check_count(ps: Paths, cap: int = CAP) -> int:
    n = ps.count()
    e = enumerated(ps, cap)
    if e <= cap:
        assert n == e, (ps.max_transfers, n, e)
    else:
        assert n > cap
    return n


def completions_by_key(ps: Paths) -> dict:
    """Every partial plan's number of completions, by brute force, grouped by `_count_key`."""
    fronts: dict = {}
    sets: dict = {}
    seen: dict = {}

    def walk(s) -> int:
        if s.done:
            return 1
        total = 0
        for c in ps._choices(s):
            child = ps._apply(s, c)
            if child is not None:
                total += walk(child)
        seen.setdefault(_count_key(ps, s, fronts, sets), set()).add(total)
        return total

    walk(ps._start())
    return seen


# -- random graphs -----------------------------------------------------------------------------
small_ops = st.lists(st.tuples(st.sampled_from(OPS), st.integers(0, 5)), min_size=1, max_size=3)
graphs = st.one_of(
    small_ops.map(build),                                          # softmax, matmul, …
    st.lists(st.tuples(st.sampled_from(randgraph.OPS), st.integers(0, 50), st.integers(0, 50)),
             min_size=1, max_size=4).map(randgraph.build),     # every value an output
)


@settings(max_examples=25, deadline=None)
@given(graphs, st.sampled_from([["numpy"], NT, NTJ]), st.booleans(), st.booleans())
def test_count_equals_enumeration_with_max_transfers(g, backends, decompose, switch):
    costs = SwitchCosts() if switch else PlantedCosts()
    counts = []
    for mt in (0, 1, 2, None):
        ps = Paths(g, backends=backends, decompose=decompose, max_transfers=mt, cost_model=costs)
        counts.append(check_count(ps))
    assert counts[0] <= counts[1] <= counts[2] <= counts[3]
    if backends == ["numpy"]:  # nothing ever moves
        assert counts[0] == counts[3]


@settings(max_examples=15, deadline=None)
@given(small_ops.map(build), st.sampled_from([NT, NTJ]), st.integers(0, 3))
def test_equal_keys_have_equal_completions(g, backends, mt):
    ps = Paths(g, backends=backends, max_transfers=mt, cost_model=SwitchCosts())
    if Paths(g, backends=backends, cost_model=PlantedCosts()).count() > 3000:
        return  # the brute force below visits every partial plan
    for key, counts in completions_by_key(ps).items():
        assert len(counts) == 1, (key, counts)


# -- hand-made graphs: decompositions, pattern kernels, copies, shared outputs -----------------
def rms_norm_by_hand(x, w):
    ms = tnp.mean(x * x, axis=-1, keepdims=True)
    return x / tnp.sqrt(ms + 1e-6) * w


def shared_outputs(x):
    y = tnp.exp(x)
    return y, x, 2.0, y


def identity_decomposition(x):
    """`nn_pad` with no padding decomposes to its input: then the pad's output *is* `x` (one
    transfer moves both), as a kernel it is a value of its own."""
    from tgx.primitives.conv import nn_pad_p

    y = nn_pad_p.bind(x, pads=((0, 0), (0, 0)), mode="reflect", value=0.0)
    return tnp.exp(y) + x


HAND = {
    "softmax": (lambda x: tnn.softmax(tnp.exp(x), axis=-1), [S((4, 4))]),
    "rms_norm decomposed": (lambda x, w: tnn.rms_norm(x, 8, w, eps=1e-6), [S((2, 8)), S((8,))]),
    "rms_norm pattern": (rms_norm_by_hand, [S((2, 8)), S((8,))]),
    "copy_to": (lambda x: tnp.exp(copy_to(tnp.sin(x), backend="torch")) + x, [S((4,))]),
    "shared outputs": (shared_outputs, [S((4,))]),
    "residual": (lambda x, w: x + tnn.softmax(x @ w, axis=-1), [S((4, 4)), S((4, 4))]),
    "identity decomposition": (identity_decomposition, [S((4, 4))]),
}


@pytest.mark.parametrize("name", sorted(HAND))
@pytest.mark.parametrize("backends", [NT, NTJ], ids=["2 backends", "3 backends"])
def test_count_equals_enumeration_on_hand_made_graphs(name, backends):
    f, specs = HAND[name]
    g = tgx.make_graph(f)(*specs)
    for mt in (0, 1, 2, 3, None):
        ps = Paths(g, backends=backends, max_transfers=mt, cost_model=SwitchCosts())
        n = check_count(ps, cap=25000)
    if n <= 25000:  # every plan seen: a budget of the most transfers any plan makes is no limit
        most = max(s.ntransfers for s in ps._walk())
        assert Paths(g, backends=backends, max_transfers=most).count() == n
        assert Paths(g, backends=backends, max_transfers=most - 1).count() < n
    if name == "rms_norm pattern":
        ps = Paths(g, backends=backends, max_transfers=2, cost_model=PlantedCosts())
        assert ps.root.eqn_units[0].eqn.params["name"] == "rms_norm_pattern"
        assert any(s.option.kernel is not None and s.option.kernel.pattern is not None
                   for p in ps for s in p.steps)


def test_count_on_a_long_chain_needs_no_recursion():
    """Longer than the recursion limit, and checked against a closed form: a chain of negations
    costs one transfer per backend change (from and back to NumPy at the ends)."""
    n = sys.getrecursionlimit() + 200

    def chain(x):
        for _ in range(n):
            x = -x
        return x
    g = tgx.make_graph(chain)(S((4,)))
    for mt in (0, 1, 2, 3):
        ps = Paths(g, backends=NT, max_transfers=mt, decompose=False, patterns=False,
                   cost_model=PlantedCosts())
        per = {b: sum(o.backend == b for o in ps.root.eqn_units[0].options) for b in NT}
        ways = {("numpy", 0): 1}  # (backend holding the value, transfers) -> plans so far
        for _ in range(n):
            nxt: dict = {}
            for (held, t), w in ways.items():
                for b in NT:
                    t2 = t + (b != held)
                    if t2 <= mt:
                        nxt[b, t2] = nxt.get((b, t2), 0) + w * per[b]
            ways = nxt
        expected = sum(w for (held, t), w in ways.items() if t + (held != "numpy") <= mt)
        assert ps.count() == expected


def test_count_with_max_transfers_does_not_enumerate():
    """~40 equations, 3 backends, max_transfers=2: astronomically many plans, counted from a
    few thousand decisions."""
    layers = 12

    def mlp(x, *ws):
        h = x
        for i in range(layers):
            h = tnn.relu(h @ ws[2 * i] + ws[2 * i + 1])
        return tnn.softmax(h, axis=-1)
    specs = [S((4, 8))] + [S((8, 8)), S((8,))] * layers
    g = tgx.make_graph(mlp)(*specs)
    assert 35 <= len(g.eqns) <= 45
    ps = Paths(g, backends=NTJ, max_transfers=2, cost_model=SwitchCosts())
    applied = 0
    apply = ps._apply

    def counting_apply(*a):
        nonlocal applied
        applied += 1
        return apply(*a)
    ps._apply = counting_apply
    n = ps.count()
    assert n > 10**15
    assert applied < 10**5 and applied * 10**10 < n   # the work is bounded, not the count
    unlimited = Paths(g, backends=NTJ, cost_model=PlantedCosts()).count()
    zero = Paths(g, backends=NTJ, max_transfers=0, cost_model=PlantedCosts()).count()
    assert zero < n < unlimited
    # a budget above any plan's transfers: counted from the structure, no decision taken
    generous = Paths(g, backends=NTJ, max_transfers=10**6, cost_model=PlantedCosts())
    generous._apply = None
    assert generous.count() == unlimited
    # with no transfer, every kernel runs on NumPy: the NumPy-only space, counted structurally
    assert zero == Paths(g, backends=["numpy"], cost_model=PlantedCosts()).count()
