"""The copies an assignment implies are written once (`planning/transfers.py`); rebackend
inserts exactly them, and the selection's and the paths' incremental pricing of copies agrees
with their price, on random graphs and random assignments."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.graph import randgraph
from tgx.backends import available_backends, host_name
from tgx.explore import Paths
from tgx.lowering.rebackend import rebackend
from tgx.planning.candidates import Candidate, accepted_kernels
from tgx.planning.cost_model import CostModel
from tgx.planning.heuristic import decompose_unsupported
from tgx.planning.selection import Choice, _Selector
from tgx.planning.transfers import copies_seconds, copy_source, implied_copies

BACKENDS = available_backends()


def _random_assignment(g, seed):
    rnd = random.Random(seed)
    return [rnd.choice([b for b in BACKENDS if accepted_kernels(e, b)]) for e in g.eqns]


def test_copy_source_is_the_producer_once():
    assert copy_source(("numpy",), "numpy") is None
    assert copy_source(("jax", "numpy"), "torch") == "jax"
    assert copy_source(("jax", "torch"), "torch") is None


@settings(max_examples=40, deadline=None)
@given(prog=randgraph.steps, seed=st.integers(0, 2**16))
def test_rebackend_inserts_exactly_the_implied_copies(prog, seed):
    g = decompose_unsupported(randgraph.build(prog), BACKENDS)
    assign = _random_assignment(g, seed)
    copies = implied_copies(g, assign)
    bg = rebackend(g, assign)
    inserted = [(e.params["backend"], b) for e, b in zip(bg.eqns, bg.backends)
                if e.primitive.name == "copy_to"]
    assert sorted(dst for dst, _ in inserted) == sorted(c.dst for c in copies)
    assert all(dst == b for dst, b in inserted)
    assert all(c.src != c.dst for c in copies)


@settings(max_examples=40, deadline=None)
@given(prog=randgraph.steps, seed=st.integers(0, 2**16))
def test_selection_prices_the_implied_copies(prog, seed):
    g = decompose_unsupported(randgraph.build(prog), BACKENDS)
    assign = _random_assignment(g, seed)
    cm = CostModel()
    sel = _Selector(BACKENDS, cm, {})
    ks = [accepted_kernels(e, b)[0] for e, b in zip(g.eqns, assign)]
    opts = [{b: Choice(b, Candidate("kernel", b, k), cm.kernel(e, k, {}))}
            for e, b, k in zip(g.eqns, assign, ks)]
    sel.prepare(g, host_name(), 0, opts)
    _, transfer_and_switch = sel.total(assign)
    switches = sel.S(assign, range(len(assign)))
    assert transfer_and_switch - switches - sel.region_values(assign) == pytest.approx(
        copies_seconds(implied_copies(g, assign)), rel=1e-9, abs=1e-15)


def _random_plan(ps, rnd):
    """A plan reached by a random choice at every decision (no enumeration)."""
    st = ps._start()
    while not st.done:
        children = [c for c in (ps._apply(st, c) for c in ps._choices(st)) if c is not None]
        st = rnd.choice(children)
    return ps.plan_type(ps, st)


@pytest.mark.parametrize("seed", range(6))
def test_paths_price_the_implied_copies(seed):
    g = randgraph.build([("exp", 0, 0), ("add", 1, 2), ("dot", 3, 0), ("sin", 4, 1),
                         ("mul", 5, 3)])
    ps = Paths(g, backends=BACKENDS, decompose=False, patterns=False)
    plan = _random_plan(ps, random.Random(seed))
    a = plan.assignment()
    paid = sum(t[-1].seconds for s in plan.steps for t in s.transfers) + \
        sum(t[-1].seconds for t in plan.final_transfers)
    assert paid == pytest.approx(copies_seconds(implied_copies(a.graph, a.backends)),
                                 rel=1e-9, abs=1e-15)
    assert plan.ntransfers == len(implied_copies(a.graph, a.backends))
