"""Symbolic dims seen from traced code: comparisons decided for every binding or refused
with the user's line, arithmetic that stays symbolic, dim expressions in Specs."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tgx
import tgx.numpy as tnp
from tgx.shapes import SymDim, sym

S = tgx.Spec(("N", 3), "float32")
HERE = "test_symbolic_dims.py"


def test_an_undecidable_shape_branch_is_an_error_not_a_guess():
    def f(x):
        if x.shape[0] == 4:  # True for N = 4 only: a plan for every N cannot take it
            return x * 2
        return x

    with pytest.raises(tgx.SymbolicShapeError, match=rf"N == 4.*{HERE}.*tnp.where"):
        tgx.make_graph(f)(S)
    with pytest.raises(tgx.SymbolicShapeError, match=rf"N >= 2.*{HERE}"):
        tgx.make_graph(lambda x: x * 2 if x.shape[0] >= 2 else x)(S)


def test_decidable_comparisons_are_answered():
    g = tgx.make_graph(lambda x: x * 2 if x.shape[0] >= 1 and x.shape[1] == 3 else x)(S)
    assert g.eqns[0].primitive.name == "mul"
    n = SymDim(sym("N"))
    assert (n + 1 > n) and (n * 2 != n) and not (n == 0) and (2 * n - n == n)


def test_range_over_a_symbolic_dim_names_the_line():
    with pytest.raises(tgx.SymbolicShapeError, match=rf"range bound.*N \(symbolic\).*{HERE}"):
        tgx.make_graph(lambda x: sum(x[i] for i in range(x.shape[0])))(S)


def test_slicing_with_dim_arithmetic_works_for_every_size():
    f = tgx.compile(lambda x: x[: x.shape[0] // 2] * 2 + x.shape[0],
                    dynamic={"x": {0: "N"}}, policy="heuristic", backends=["numpy"])
    for n in (1, 2, 5, 8):
        x = np.arange(n * 3, dtype=np.float32).reshape(n, 3)
        np.testing.assert_array_equal(f(x), x[: n // 2] * 2 + n)
    assert f.trace_count == 1


def test_dim_expressions_in_specs():
    g = tgx.make_graph(lambda x, y: tnp.concatenate([x, y]))(tgx.Spec(("2*N", 3)),
                                                          tgx.Spec(("N + 1", 3)))
    assert str(g.out_avals[0]) == "f32[3*N+1,3]"
    with pytest.raises(tgx.SymbolicShapeError, match="cannot read the dim"):
        tgx.Spec(("N +", 3))


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 3), st.integers(-3, 3), st.integers(1, 4))
def test_dim_comparisons_agree_with_every_binding_or_refuse(a, b, c):
    """a*N + b >= c*N: answered only when it holds (or fails) for every N >= 1."""
    n = SymDim(sym("N"))
    lhs, rhs = a * n + b if a else b, c * n
    truth = {a * v + b >= c * v for v in range(1, 200)}
    try:
        got = lhs >= rhs
    except tgx.SymbolicShapeError:
        assert len(truth) == 2
    else:
        assert truth == {got}
