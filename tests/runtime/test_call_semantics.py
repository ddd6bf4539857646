"""What a compiled call gives back: results in the arguments' array type, never sharing memory
with the caller's arrays, and compiled functions that compose with other traced code."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import tgx
from tgx.backends import available_backends
import tgx.numpy as tnp

torch = pytest.importorskip("torch")
jnp = pytest.importorskip("jax.numpy")


@pytest.mark.parametrize("backend", ["numpy", "torch", "jax"])
def test_results_follow_the_argument_array_type(backend):
    f = tgx.compile(lambda x, y: (x * 2.0 + y, tnp.sum(x)), backends=[backend],
                    policy="heuristic")
    x, y = np.arange(3, dtype=np.float32), np.ones(3, np.float32)
    for wrap, kind in [(np.asarray, np.ndarray), (torch.from_numpy, torch.Tensor),
                       (jnp.asarray, type(jnp.ones(1)))]:
        a, s = f(wrap(x), wrap(y))
        assert isinstance(a, kind) and isinstance(s, kind), (backend, kind, type(a))
        np.testing.assert_allclose(np.asarray(a), x * 2 + 1)
        np.testing.assert_allclose(np.asarray(s), 3.0)


def test_torch_tensors_that_require_grad_get_a_warning():
    f = tgx.compile(lambda x: x * 2.0, backends=["numpy"], policy="heuristic")
    with pytest.warns(UserWarning, match="does not record torch autograd.*tgx.grad"):
        out = f(torch.ones(2, requires_grad=True))
    assert isinstance(out, torch.Tensor) and not out.requires_grad
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per function
        f(torch.ones(2, requires_grad=True))


@pytest.mark.parametrize("fn", [lambda x: x, lambda x: x.reshape(2, 3), lambda x: x[1:3],
                                lambda x: tnp.transpose(x.reshape(2, 3)),
                                lambda x: (x, x * 2.0)])
@pytest.mark.parametrize("policy", ["heuristic", "fastest"])
@pytest.mark.parametrize("backend", ["numpy", "torch", "jax"])
def test_results_never_share_memory_with_arguments(fn, policy, backend):
    if backend not in available_backends():
        pytest.skip(f"{backend} missing")
    x = np.arange(6, dtype=np.float32)
    out = tgx.compile(fn, backends=[backend], policy=policy, store=None)(x)
    for o in tgx.tree_flatten(out)[0]:
        assert not np.shares_memory(o, x)
    before = x.copy()
    for o in tgx.tree_flatten(out)[0]:
        if o.flags.writeable:  # results of JAX are read-only views of XLA's buffers
            o[...] = -1        # the caller's array is untouched
    np.testing.assert_array_equal(x, before)


def test_results_never_share_memory_with_closed_over_arrays():
    w = np.arange(4, dtype=np.float32)
    f = tgx.compile(lambda x: (w, x + 1.0), backends=["numpy"], policy="heuristic")
    out, _ = f(np.zeros(4, np.float32))
    out[...] = 7.0
    np.testing.assert_array_equal(w, np.arange(4))
    np.testing.assert_array_equal(f(np.zeros(4, np.float32))[0], np.arange(4))


def test_compiled_functions_inline_inside_traced_code():
    inner = tgx.compile(lambda x: tnp.exp(x) * 2.0, policy="heuristic", backends=["numpy"])
    outer = tgx.compile(lambda x: inner(x) + 1.0, policy="heuristic", backends=["numpy"])
    x = np.linspace(-1, 1, 5).astype(np.float32)
    # called concretely first: the fast path's guard for these arrays must turn tracers away
    np.testing.assert_allclose(inner(x), np.exp(x) * 2, rtol=1e-6)
    np.testing.assert_allclose(outer(x), np.exp(x) * 2 + 1, rtol=1e-6)
    g = tgx.make_graph(inner)(tgx.Spec(("N",), "float32"))
    assert str(g.out_avals[0]) == "f32[N]"
    np.testing.assert_allclose(tgx.grad(lambda x: tnp.sum(inner(x)))(x), 2 * np.exp(x),
                               rtol=1e-6)
    np.testing.assert_allclose(tgx.vmap(inner)(x.reshape(5, 1)), 2 * np.exp(x)[:, None],
                               rtol=1e-6)


def test_static_arguments_key_the_plans():
    f = tgx.compile(lambda x, axis, n: tnp.sum(x[:n], axis=axis),
                    static_argnames=("axis", "n"), policy="heuristic", backends=["numpy"])
    x = np.arange(12.0).reshape(4, 3)
    np.testing.assert_array_equal(f(x, 0, 2), x[:2].sum(0))
    np.testing.assert_array_equal(f(x, axis=1, n=3), x[:3].sum(1))
    np.testing.assert_array_equal(f(x, 1, 3), x[:3].sum(1))  # same values: same plan
    assert len(f._by_static) == 2
    g = tgx.compile(lambda x, axis: tnp.sum(x, axis=axis), static_argnums=1,
                    policy="heuristic", backends=["numpy"])
    np.testing.assert_array_equal(g(x, 1), x.sum(1))
    assert g.lower(x, 0).graph.eqns[0].params["axes"] == (0,)
    with pytest.raises(tgx.BindingError, match="static arguments must be hashable"):
        g(x, [1])


def test_a_traced_axis_says_to_mark_it_static():
    g = tgx.compile(lambda x, axis: tnp.sum(x, axis=axis), policy="heuristic",
                    backends=["numpy"])
    with pytest.raises(tgx.TracerControlFlowError,
                       match=r"axis must be a Python int.*static_argnames.*test_call_semantics"):
        g(np.ones((2, 3)), 1)


LENGTH_USES = {
    "zeros": lambda x, n: tnp.zeros(n) + x.sum(),
    "full": lambda x, n: tnp.full((n, 2), 1.0) + x.sum(),
    "arange": lambda x, n: tnp.arange(n) + x.sum(),
    "reshape": lambda x, n: x.reshape(n, -1),
    "slice": lambda x, n: x[:n],
}


@pytest.mark.parametrize("use", sorted(LENGTH_USES))
def test_a_traced_length_says_to_mark_it_static(use):
    fn = LENGTH_USES[use]
    g = tgx.compile(fn, policy="heuristic", backends=["numpy"])
    x = np.arange(12, dtype=np.float32).reshape(4, 3)
    with pytest.raises(tgx.TracerControlFlowError,
                       match=r"traced value i64\[\].*static_argnames.*test_call_semantics"):
        g(x, 2)
    static = tgx.compile(fn, policy="heuristic", backends=["numpy"], static_argnames=("n",))
    np.testing.assert_allclose(static(x, 2), fn(x, 2) if use in ("reshape", "slice") else
                               {"zeros": np.zeros(2) + 66.0, "full": np.full((2, 2), 67.0),
                                "arange": np.arange(2) + 66.0}[use])


def test_keyword_arguments_in_any_order_keep_their_options():
    f = tgx.compile(lambda a, b: (a * 2.0, b + 1.0), dynamic={"a": {0: "N"}},
                    policy="heuristic", backends=["numpy"])
    plan = f.lower(b=np.ones(5, np.float32), a=np.ones(3, np.float32))
    assert [str(v) for v in plan.graph.in_avals] == ["f32[N]", "f32[5]"]


def test_errors_name_arguments_by_parameter_and_key_path():
    f = tgx.compile(lambda params, x: x @ params["layers"][1]["w"], policy="heuristic",
                    backends=["numpy"])
    params = {"layers": [{"w": np.ones((3, 3))}, {"w": "oops"}]}
    with pytest.raises(tgx.DTypeError, match=r"params\['layers'\]\[1\]\['w'\]"):
        f(params, np.ones(3))
