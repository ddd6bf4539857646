"""Tracing: pytrees, constants, operators, source lines and the errors users meet."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import tgx
import tgx.numpy as tnp
from tgx.errors import BindingError, DTypeError, ShapeError, TracerControlFlowError
from tgx.shapes import sym

THIS_FILE = __file__


def line_of(marker: str) -> int:
    with open(THIS_FILE) as f:
        for i, line in enumerate(f, 1):
            if marker in line and "line_of" not in line:
                return i
    raise AssertionError(marker)


def test_mlp_ir_prints_with_symbolic_batch():
    def mlp(p, x):
        h = tnp.maximum(x @ p["w1"] + p["b1"], 0.0)
        return h @ p["w2"]

    p = {"w1": np.ones((784, 128), np.float32), "b1": np.zeros(128, np.float32),
         "w2": np.ones((128, 10), np.float32)}
    g = tgx.make_graph(mlp)(p, tgx.Spec(("N", 784), "float32"))
    tgx.check_graph(g)
    assert str(g) == """\
{ lambda ; a:f32[128] b:f32[784,128] c:f32[128,10] d:f32[N,784]. let
    e:f32[N,128] = dot_general[dimension_numbers=(((1,), (0,)), ((), ()))] d b
    f:f32[N,128] = add e a
    g:f32[N,128] = max f 0.0:f32[]
    h:f32[N,10] = dot_general[dimension_numbers=(((1,), (0,)), ((), ()))] g c
  in (h) }"""


def test_closure_arrays_become_constants_once():
    w = np.arange(6, dtype=np.float32).reshape(2, 3)
    g = tgx.make_graph(lambda x: x @ w + x @ w)(tgx.Spec((4, 2)))
    assert len(g.constvars) == 1 and g.consts[0] is w
    assert str(g).startswith("{ lambda a:f32[2,3] ; b:f32[4,2]. let")
    x = np.ones((4, 2), np.float32)
    np.testing.assert_allclose(tgx.eval_graph(g, x), 2 * (x @ w))


def test_pytrees_in_and_out():
    @dataclasses.dataclass
    class State:
        h: object
        c: object

    tgx.register_pytree_node(State, lambda s: ((s.h, s.c), None), lambda _, ch: State(*ch))

    def f(state, xs, scale=None):
        return {"h": state.h * xs[0], "pair": (state.c + xs[1], None)}

    s = State(tgx.Spec((3,)), tgx.Spec((3,)))
    g = tgx.make_graph(f)(s, [tgx.Spec((3,)), tgx.Spec((3,))])
    out = tgx.eval_graph(g, State(np.full(3, 2, np.float32), np.ones(3, np.float32)),
                         [np.full(3, 3, np.float32), np.ones(3, np.float32)])
    assert set(out) == {"h", "pair"} and out["pair"][1] is None
    np.testing.assert_array_equal(out["h"], np.full(3, 6))
    np.testing.assert_array_equal(out["pair"][0], np.full(3, 2))


def test_python_scalar_arguments_are_weakly_typed():
    g = tgx.make_graph(lambda x, s: x * s)(tgx.Spec((2,), "float16"), 2.0)
    assert g.out_avals[0].dtype == np.float16
    assert g.invars[1].aval.weak_type


def test_operators_and_methods():
    def f(x, y):
        return [x + y, x - 1, 2 - x, x * y, x / 2, 3 / x, x // 2, x % 3, x ** 2, -x, abs(x),
                x < y, x <= y, x > y, x >= y, x == y, x != y, x @ y.T, x.T, x.reshape(-1),
                x.astype("int32"), x.sum(), x.mean(axis=0), x.max(axis=1), x.min(),
                x.shape[0] * x, x.ndim + x, x[0], x[:, 1:], x[None, ..., -1]]

    x = np.array([[1.5, -2.0, 3.0], [4.0, 5.0, -6.5]], np.float32)
    y = np.array([[0.5, 2.0, 3.0], [1.0, -5.0, 2.5]], np.float32)
    expected = f(x, y)
    g = tgx.make_graph(f)(tgx.Spec((2, 3)), tgx.Spec((2, 3)))
    got = tgx.eval_graph(g, x, y)
    for i, (a, e) in enumerate(zip(got, expected)):
        assert np.shape(a) == np.shape(e), i
        np.testing.assert_allclose(a, e, rtol=1e-6, err_msg=f"output {i}")


@pytest.mark.parametrize("code,what", [
    ("if x.sum() > 0: pass", "bool()"),
    ("bool(x)", "bool()"),
    ("int(x)", "int()"),
    ("float(x)", "float()"),
    ("while x[0] > 0: pass", "bool()"),
    ("np.asarray(x)", "np.asarray()"),
])
def test_control_flow_on_traced_values_names_user_line(code, what):
    ns = {"np": np}
    src = f"def f(x):\n    {code}  # MARK\n    return x\n"
    exec(compile(src, "user_model.py", "exec"), ns)
    with pytest.raises(TracerControlFlowError) as e:
        tgx.make_graph(ns["f"])(tgx.Spec((3,)))
    msg = str(e.value)
    assert what in msg and "user_model.py:2" in msg and "tnp.where" in msg or (
        "np.asarray" in msg and "user_model.py:2" in msg)


def test_every_equation_records_the_user_line():
    def f(x):
        y = tnp.exp(x)  # LINE-A
        return tnp.sum(y * 2.0)  # LINE-B

    g = tgx.make_graph(f)(tgx.Spec((3,)))
    lines = [e.source_info.line for e in g.eqns]
    assert lines == [line_of("LINE-A"), line_of("LINE-B"), line_of("LINE-B")]
    assert all(e.source_info.file == THIS_FILE for e in g.eqns)


def test_shape_errors_name_op_values_and_line():
    def f(a, b):
        return a @ b  # BAD-MATMUL

    with pytest.raises(ShapeError) as e:
        tgx.make_graph(f)(tgx.Spec((2, 3)), tgx.Spec((4, 5)))
    msg = str(e.value)
    assert "matmul" in msg and "(2, 3)" in msg and "(4, 5)" in msg

    def g(a, b):
        return tnp.add(a, b)  # BAD-ADD

    with pytest.raises(ShapeError) as e:
        tgx.make_graph(g)(tgx.Spec((2, 3)), tgx.Spec((4, 5)))
    msg = str(e.value)
    assert "add" in msg and "(2, 3)" in msg and f"test_tracing.py:{line_of('BAD-ADD')}" in msg


def test_dtype_errors_name_op_and_dtypes():
    with pytest.raises(DTypeError, match=r"dot_general.*bool"):
        tgx.make_graph(lambda a: tgx.primitives.dot_general_p.bind(
            a, a, dimension_numbers=(((0,), (0,)), ((), ()))))(tgx.Spec((2,), "bool"))


def test_binding_conflict_names_both_arguments():
    g = tgx.make_graph(lambda x, y: x + y)(tgx.Spec(("N",)), tgx.Spec(("N",)))
    with pytest.raises(BindingError, match=r"N = 3 from args\[0\], N = 4 from args\[1\]"):
        tgx.eval_graph(g, np.zeros(3, np.float32), np.zeros(4, np.float32))
    with pytest.raises(DTypeError, match=r"args\[0\].*float32.*float64"):
        tgx.eval_graph(g, np.zeros(3), np.zeros(3, np.float32))


def test_same_symbolic_graph_at_several_bindings():
    def f(x):
        return tnp.sum(tnp.exp(x[:, 1:]) * 2.0, axis=0) / x.shape[0]

    g = tgx.make_graph(f)(tgx.Spec(("N", "M")))
    assert g.out_avals[0].shape == (sym("M") - 1,)
    rng = np.random.default_rng(0)
    for n, m in [(1, 2), (3, 5), (17, 4)]:
        x = rng.standard_normal((n, m)).astype(np.float32)
        expected = (np.exp(x[:, 1:]) * 2).sum(0) / n
        np.testing.assert_allclose(tgx.eval_graph(g, x), expected, rtol=1e-5)


def test_check_graph_reports_bad_equation_with_neighbours():
    g = tgx.make_graph(lambda x: tnp.exp(x) + 1.0)(tgx.Spec((3,)))
    bad = g.replace(eqns=(g.eqns[1], g.eqns[0]))   # use before definition
    with pytest.raises(tgx.GraphCheckError, match="unbound variable"):
        tgx.check_graph(bad)


def test_eager_mode_runs_on_numpy():
    out = tnp.sum(tnp.exp(np.zeros(3, np.float32)))
    assert float(out) == 3.0


def test_leaked_tracer_is_an_error():
    leaked = []
    tgx.make_graph(lambda x: leaked.append(x) or x)(tgx.Spec((2,)))
    with pytest.raises(tgx.TgxError, match="leaked"):
        tgx.make_graph(lambda y: y + leaked[0])(tgx.Spec((2,)))
