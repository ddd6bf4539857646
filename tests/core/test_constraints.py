"""Constraints on symbolic dims (`Spec(..., constraints=["N >= 16", "N % 8 == 0"])`): the
decisions they allow hold at every binding that satisfies them, the ops users write with them
trace and run, bindings that violate them are refused, and plain symbols are untouched."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import sympy
from hypothesis import given, settings
from hypothesis import strategies as st

import tgx
import tgx.numpy as tnp
from tgx.errors import BindingError, OptionError, SymbolicShapeError
from tgx.serialize import graph_from_bytes, graph_to_bytes
from tgx.transforms.evaluate import eval_graph_flat
from tgx.shapes import (
    ConstrainedSymbol, Spec, SymDim, as_dim, constrained_symbols, dim_div, dim_eq, dim_ge,
    eval_dim, hint_binding, sym,
)

N = sym("N")
C = sym("N", lower=16, multiple=8)   # N >= 16, N % 8 == 0


def satisfying(s, count=40):
    """The `count` least values `s` may take."""
    lower, m = getattr(s, "lower", 1), getattr(s, "multiple", 1)
    return [lower + m * i for i in range(count)]


# ---------------------------------------------------------------------------------------------
# the symbol


def test_constrained_symbol_identity_printing_pickling():
    assert isinstance(C, ConstrainedSymbol) and (C.lower, C.multiple) == (16, 8)
    assert C != N and hash(C) != hash(N) and str(C) == "N"
    assert sym("N", lower=10, multiple=8) is C          # the least satisfying value is kept
    assert sym("N", lower=1, multiple=1) is N and type(N) is sympy.Symbol
    back = pickle.loads(pickle.dumps(C))
    assert back == C and (back.lower, back.multiple) == (16, 8)
    assert pickle.loads(pickle.dumps(2 * C + 1)) == 2 * C + 1


@pytest.mark.parametrize("text, lower, multiple", [
    (["N >= 16"], 16, 1), (["N > 15"], 16, 1), (["16 <= N"], 16, 1), (["15 < N"], 16, 1),
    (["N % 8 == 0"], 8, 8), (["0 == N % 8"], 8, 8), (["N >= 10", "N % 8 == 0"], 16, 8),
    (["N % 4 == 0", "N % 6 == 0"], 12, 12), (["N >= 0"], 1, 1), ("2*N >= 7", 4, 1),
])
def test_supported_constraint_forms(text, lower, multiple):
    s = constrained_symbols(text)["N"]
    assert (getattr(s, "lower", 1), getattr(s, "multiple", 1)) == (lower, multiple)


@pytest.mark.parametrize("text", [
    "N <= 16", "N < 3", "N >= M", "N + M >= 2", "N % 8 == 1", "N % M == 0", "N != 3", "N",
    "N == 4", "N**2 >= 4", "__import__('os') >= 1", "N.__class__ >= 1", "N >= 1.5",
])
def test_unsupported_constraints_say_which_are(text):
    with pytest.raises(SymbolicShapeError, match="supported constraints"):
        constrained_symbols([text])


def test_spec_constraints_apply_to_the_names_it_mentions():
    x = Spec(("N", "2*N", 3), constraints=["N >= 16", "N % 8 == 0"])
    assert x.shape == (C, 2 * C, 3) and x.shape[0] is C
    with pytest.raises(SymbolicShapeError, match="M, which the shape"):
        Spec(("N",), constraints=["M >= 2"])


# ---------------------------------------------------------------------------------------------
# deciding: every decision holds at every satisfying binding


def _expr(n, parts):
    """c0 + c1*N + c2*floor(N/k) + c3*(N % k) + c4*ceiling(N/k), as SymDim arithmetic would
    build it."""
    c0, c1, c2, c3, c4, k = parts
    return as_dim(c0 + c1 * n + c2 * sympy.floor(n / k) + c3 * sympy.Mod(n, k)
                  + c4 * sympy.ceiling(n / k))


coef = st.integers(-3, 3)
exprs = st.tuples(st.integers(-40, 40), coef, coef, coef, coef, st.integers(1, 9))
constraints = st.tuples(st.integers(1, 40), st.integers(1, 12))


def _check_sound(n, a, b) -> int:
    """Each of a >= b, b >= a, a == b that tgx decides holds at every satisfying binding of
    `n` (an undecided one may be sympy missing a proof: allowed, never a wrong answer);
    returns how many were decided."""
    decided = 0
    for decide, holds, x, y in ((dim_ge, int.__ge__, a, b), (dim_ge, int.__ge__, b, a),
                                (dim_eq, int.__eq__, a, b)):
        try:
            answer = decide(x, y)
        except SymbolicShapeError:
            continue
        decided += 1
        for v in satisfying(n):
            assert holds(eval_dim(x, {n: v}), eval_dim(y, {n: v})) == answer, (x, y, n, v)
    return decided


@settings(max_examples=80)
@given(constraints, exprs, exprs)
def test_decisions_hold_for_every_satisfying_binding(cons, pa, pb):
    n = sym("N", *cons)
    _check_sound(n, _expr(n, pa), _expr(n, pb))


@settings(max_examples=80)
@given(constraints, exprs, st.integers(-2, 2))
def test_decisions_near_the_least_value_hold(cons, pa, delta):
    # b is a's value at N's least value, moved by delta: the comparisons a constraint decides
    # (or a wrong constraint would decide wrongly) sit right there
    n = sym("N", *cons)
    a = _expr(n, pa)
    _check_sound(n, a, eval_dim(a, {n: satisfying(n, 1)[0]}) + delta)


@given(constraints)
def test_bounds_and_divisibility_are_decided(cons):
    n = sym("N", *cons)
    lower, m = satisfying(n, 1)[0], getattr(n, "multiple", 1)
    assert dim_ge(n, lower) and not dim_ge(lower - 1, n)
    assert dim_eq(sympy.floor(n / m) * m, n) and as_dim(sympy.Mod(n, m)) == 0
    with pytest.raises(SymbolicShapeError):  # N = lower and N = lower + m both satisfy it
        dim_ge(n, lower + 1)


@given(constraints, exprs)
def test_canonical_forms_keep_their_values(cons, pa):
    n = sym("N", *cons)
    c0, c1, c2, c3, c4, k = pa
    raw = c0 + c1 * n + c2 * sympy.floor(n / k) + c3 * sympy.Mod(n, k) + c4 * sympy.ceiling(n / k)
    canon = as_dim(raw)
    for v in satisfying(n):
        assert eval_dim(canon, {n: v}) == int(raw.xreplace({n: v}))


def test_constraints_decide_what_plain_symbols_cannot():
    assert dim_ge(C - 8, 0) and dim_ge(C, 16) and not dim_ge(C, 24 + C)
    assert dim_eq(sympy.floor(C / 8) * 8, C) and as_dim(sympy.Mod(C, 8)) == 0
    assert as_dim(sympy.floor(C / 8)) == C / 8 and dim_div(C, 8, "t") == C / 8
    for plain in (lambda: dim_ge(N - 8, 0), lambda: dim_ge(N, 16),
                  lambda: dim_eq(sympy.floor(N / 8) * 8, N), lambda: dim_div(N, 8, "t")):
        with pytest.raises(SymbolicShapeError):
            plain()
    with pytest.raises(SymbolicShapeError, match="N >= 24"):   # still only what follows
        dim_ge(C, 24)


def test_plain_symbols_behave_as_before():
    n = SymDim(N)
    assert n >= 1 and n * 2 - n == n and str(n // 2) == "floor(N/2)"
    assert as_dim(sympy.floor(N / 8)) == sympy.floor(N / 8)
    assert as_dim(sympy.Mod(N, 8)) == sympy.Mod(N, 8)
    assert Spec(("N", 3)).shape == (N, 3) and hint_binding([Spec(("N",))]) == {"N": 64}
    with pytest.raises(SymbolicShapeError, match="N >= 16"):
        n >= 16  # noqa: B015


def test_hint_satisfies_the_constraint():
    assert hint_binding([Spec(("N",), constraints="N >= 100")]) == {"N": 100}
    assert hint_binding([Spec(("N",), constraints="N % 48 == 0")]) == {"N": 96}


# ---------------------------------------------------------------------------------------------
# ops users write, traced once and run at several satisfying sizes


def _branch(x):
    if x.shape[0] >= 16:
        return x * 2.0
    return x - 1.0


OPS = {
    "slice": (lambda x: x[: x.shape[0] - 8], lambda x: x[: x.shape[0] - 8]),
    "reshape": (lambda x: tnp.reshape(x, (x.shape[0] // 8, 8, 3)),
                lambda x: np.reshape(x, (x.shape[0] // 8, 8, 3))),
    "reshape_sum": (lambda x: tnp.sum(x.reshape(x.shape[0] // 8, -1), axis=1),
                    lambda x: np.sum(x.reshape(x.shape[0] // 8, -1), axis=1)),
    "branch": (_branch, lambda x: x * 2.0),
}


@pytest.mark.parametrize("op", OPS)
def test_ops_trace_under_constraints_and_run(op):
    fn, ref = OPS[op]
    spec = Spec(("N", 3), constraints=["N >= 16", "N % 8 == 0"])
    g = tgx.make_graph(fn)(spec)
    f = tgx.compile(fn, dynamic={"x": {0: "N"}}, constraints=["N >= 16", "N % 8 == 0"],
                    backends=["numpy"], policy="heuristic")
    for n in (16, 24, 40, 64):
        x = np.arange(n * 3, dtype=np.float32).reshape(n, 3)
        np.testing.assert_allclose(tgx.eval_graph(g, x), ref(x))
        np.testing.assert_allclose(f(x), ref(x))
    assert f.trace_count == 1


@pytest.mark.parametrize("op", ["slice", "reshape", "branch"])
def test_the_same_ops_are_refused_without_constraints(op):
    with pytest.raises(SymbolicShapeError):
        tgx.make_graph(OPS[op][0])(Spec(("N", 3)))


# ---------------------------------------------------------------------------------------------
# errors


@pytest.mark.parametrize("n, match", [(10, "N = 10, but N was declared with N >= 16, N % 8 == 0"),
                                      (20, "N = 20"), (8, "N = 8")])
def test_violating_bindings_are_refused(n, match):
    spec = Spec(("N", 3), constraints=["N >= 16", "N % 8 == 0"])
    g = tgx.make_graph(lambda x: x * 2.0)(spec)
    x = np.zeros((n, 3), np.float32)
    with pytest.raises(BindingError, match=f"argument x: axis 0 is {match}"):
        eval_graph_flat(g, [x], ["x"])
    f = tgx.compile(lambda x: x * 2.0, dynamic={"x": {0: "N"}},
                    constraints=["N >= 16", "N % 8 == 0"], backends=["numpy"],
                    policy="heuristic")
    with pytest.raises(BindingError, match=f"argument x: axis 0 is {match}"):
        f(x)                                     # the first call: before planning
    f(np.zeros((16, 3), np.float32))
    with pytest.raises(BindingError, match=f"argument x: axis 0 is {match}"):
        f(x)                                     # a planned signature: the runtime's fast path
    plan = f.lower(spec)
    with pytest.raises(BindingError, match=f"axis 0 is {match}"):
        plan.compiled.run_flat([x])


def test_conflicting_symbols_of_one_name_are_an_error():
    a = Spec(("N",), constraints="N >= 16")
    for b in (Spec(("N",)), Spec(("N",), constraints="N >= 8")):
        with pytest.raises(SymbolicShapeError, match=r"N is declared twice.*N >= 16 in x.*in y"):
            tgx.make_graph(lambda x, y: x + y)(a, b)
    g = tgx.make_graph(lambda x, y: x + y)(a, Spec(("N",), constraints=["N > 15"]))
    assert g.out_avals[0].shape == (sym("N", 16),)


def test_compile_constraints_must_name_a_dynamic_dim():
    with pytest.raises(OptionError, match="M"):
        tgx.compile(lambda x: x, dynamic={"x": {0: "N"}}, constraints=["M >= 2"])


def test_undecided_comparison_suggests_a_constraint():
    with pytest.raises(SymbolicShapeError, match=r"constraints=\[\"N >= 16\"\]"):
        tgx.make_graph(_branch)(Spec(("N", 3)))


def test_serialized_graph_drops_constraints_but_works():
    g = tgx.make_graph(OPS["reshape"][0])(Spec(("N", 3), constraints=["N % 8 == 0"]))
    back = graph_from_bytes(graph_to_bytes(g))
    assert back.in_avals[0].shape == (N, 3)                # documented: the constraint is gone
    x = np.arange(48, dtype=np.float32).reshape(16, 3)
    np.testing.assert_allclose(tgx.eval_graph(back, x), x.reshape(2, 8, 3))
