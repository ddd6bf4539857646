"""JAX regions: the schedule keeps each connected group of JAX equations together, so it lowers
to one jax.jit call, and mixed plans still compute what the reference evaluator computes."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tgx
import tgx.numpy as tnp
from tgx.lowering.lower import lower
from tgx.lowering.rebackend import rebackend
from tgx.backends import backend_available
from tgx.planning.candidates import accepted_kernels

from ..graph import randgraph

pytestmark = pytest.mark.skipif(not backend_available("jax"), reason="jax not installed")


def _lowered(graph, assign):
    bg = rebackend(graph, assign)
    kernels = [accepted_kernels(e, b)[0] for e, b in zip(bg.eqns, bg.backends)]
    return bg, lower(bg, kernels)


def _jax_calls(cg) -> int:
    """jax calls doing work (transfers into jax are instructions on jax too)."""
    return sum(1 for ins in cg.instructions
               if ins.backend == "jax" and not ins.label.startswith("copy_to"))


def test_interleaved_jax_chain_is_one_region():
    # traced order alternates a jax chain (exp, sin, mul) with independent numpy work
    def f(x, y):
        a = tnp.exp(x)
        b = tnp.cos(y)
        c = tnp.sin(a)
        d = tnp.tanh(b)
        return c * 2.0, d + 1.0

    g = tgx.make_graph(f)(tgx.Spec((8,)), tgx.Spec((8,)))
    names = [e.primitive.name for e in g.eqns]
    assign = ["jax" if n in ("exp", "sin", "mul") else "numpy" for n in names]
    bg, cg = _lowered(g, assign)
    assert _jax_calls(cg) == 1, [i.label for i in cg.instructions]
    x, y = np.linspace(-1, 1, 8, dtype=np.float32), np.linspace(0, 2, 8, dtype=np.float32)
    got = cg.run_flat([x, y])
    np.testing.assert_allclose(got[0], np.sin(np.exp(x)) * 2, rtol=1e-6)
    np.testing.assert_allclose(got[1], np.tanh(np.cos(y)) + 1, rtol=1e-6)


def test_region_waits_for_the_host_work_it_depends_on():
    # jax → numpy → jax: the two jax parts cannot be one call (the numpy step sits between)
    def f(x):
        a = tnp.exp(x)
        b = tnp.cos(a)
        return tnp.sin(b) + a

    g = tgx.make_graph(f)(tgx.Spec((8,)))
    assign = ["numpy" if e.primitive.name == "cos" else "jax" for e in g.eqns]
    _, cg = _lowered(g, assign)
    assert _jax_calls(cg) == 2
    x = np.linspace(-1, 1, 8, dtype=np.float32)
    np.testing.assert_allclose(cg.run_flat([x])[0], np.sin(np.cos(np.exp(x))) + np.exp(x),
                               rtol=1e-6)


def _topological(bg) -> bool:
    defined = {v.id for v in (*bg.invars, *bg.constvars)}
    for e in bg.eqns:
        if any(getattr(a, "id", None) is not None and a.id not in defined for a in e.invars):
            return False
        defined.update(v.id for v in e.outvars)
    return True


@settings(max_examples=30, deadline=None)
@given(prog=randgraph.steps, seed=st.integers(0, 2**16))
def test_random_mixed_plans_are_exact_and_need_no_more_calls(prog, seed):
    g = randgraph.build(prog)
    rng = np.random.default_rng(seed)
    assign = [str(rng.choice(["numpy", "jax"])) for _ in g.eqns]
    bg, cg = _lowered(g, assign)
    assert _topological(bg)
    # never more jax calls than jax equations grouped in traced order would need
    runs, prev = 0, False
    for b in assign:
        runs += b == "jax" and not prev
        prev = b == "jax"
    assert _jax_calls(cg) <= runs
    xs = randgraph.inputs(g, seed)
    want = tgx.eval_graph(g, *xs)
    for got, ref in zip(cg.run_flat(xs), want):
        np.testing.assert_allclose(got, ref, rtol=2e-5, atol=2e-5)


def test_all_jax_graph_is_one_call():
    g = randgraph.build([("exp", 0, 0), ("add", 1, 2), ("dot", 3, 0), ("sin", 4, 1)])
    _, cg = _lowered(g, "jax")
    assert _jax_calls(cg) == 1
