"""tgx.grad / value_and_grad / vjp / jvp / jacrev / jacfwd / stop_gradient: against jax, with
pytrees, symbolic dims, compile, nesting, and the errors users meet."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tgx
import tgx.nn as tnn
import tgx.numpy as tnp
from tgx.transforms.evaluate import eval_graph

jax.config.update("jax_enable_x64", True)
TOL = {np.float32: dict(rtol=2e-5, atol=2e-6), np.float64: dict(rtol=1e-10, atol=1e-12)}


def _mlp_params(rng, dt):
    return {"layers": [{"w": rng.standard_normal((4, 8)).astype(dt) * 0.5,
                        "b": rng.standard_normal(8).astype(dt)},
                       {"w": rng.standard_normal((8, 3)).astype(dt) * 0.5,
                        "b": rng.standard_normal(3).astype(dt)}],
            "scale": np.asarray(1.5, dt)}


def _mlp_loss(np_):
    """The same loss written once for tnp and once for jnp (`np_` is the namespace)."""
    def loss(p, x, y):
        h = x
        for i, layer in enumerate(p["layers"]):
            h = h @ layer["w"] + layer["b"]
            if i == 0:
                h = np_.tanh(h) * p["scale"]
        z = h - np_.max(h, axis=-1, keepdims=True)
        logp = z - np_.log(np_.sum(np_.exp(z), axis=-1, keepdims=True))
        return -np_.mean(np_.sum(logp * y, axis=-1))
    return loss


def _tree_close(a, b, dt):
    la, lb = tgx.tree_flatten(a)[0], jax.tree_util.tree_leaves(b)
    assert len(la) == len(lb)
    for x, y in zip(la, lb):
        assert np.asarray(x).dtype == dt
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), **TOL[dt])


@pytest.mark.parametrize("dt", [np.float32, np.float64])
def test_grad_of_pytree_params_matches_jax(dt):
    rng = np.random.default_rng(0)
    p = _mlp_params(rng, dt)
    x = rng.standard_normal((5, 4)).astype(dt)
    y = np.eye(3, dtype=dt)[rng.integers(0, 3, 5)]
    g = tgx.grad(_mlp_loss(tnp))(p, x, y)
    gj = jax.grad(_mlp_loss(jnp))(jax.tree_util.tree_map(jnp.asarray, p), x, y)
    _tree_close(g, gj, dt)
    assert isinstance(g["layers"], list) and set(g) == {"layers", "scale"}


def test_value_and_grad_argnums_and_aux():
    rng = np.random.default_rng(1)
    w, b = rng.standard_normal((3, 2)), rng.standard_normal(2)
    x = rng.standard_normal((4, 3))

    def f(w, b, x):
        out = tnp.sum(tnp.sin(x @ w + b) ** 2)
        return out, {"mean": tnp.mean(x)}

    def fj(w, b, x):
        return jnp.sum(jnp.sin(x @ w + b) ** 2)

    (v, aux), (gw, gb) = tgx.value_and_grad(f, argnums=(0, 1), has_aux=True)(w, b, x)
    vj, (gwj, gbj) = jax.value_and_grad(fj, argnums=(0, 1))(w, b, x)
    np.testing.assert_allclose(v, vj, rtol=1e-12)
    np.testing.assert_allclose(aux["mean"], x.mean(), rtol=1e-12)
    np.testing.assert_allclose(gw, gwj, rtol=1e-10)
    np.testing.assert_allclose(gb, gbj, rtol=1e-10)
    gx, aux2 = tgx.grad(f, argnums=2, has_aux=True)(w, b, x)
    np.testing.assert_allclose(gx, jax.grad(fj, argnums=2)(w, b, x), rtol=1e-10)
    assert set(aux2) == {"mean"}


def test_unused_input_gets_zeros_and_integer_args_pass_through():
    def f(x, unused, idx):
        return tnp.sum(tnp.take(x, idx) * 2.0)

    x = np.arange(4.0)
    gx, gu = tgx.grad(f, argnums=(0, 1))(x, np.ones(3), np.array([0, 0, 3]))
    np.testing.assert_array_equal(gx, [4.0, 0.0, 0.0, 2.0])  # repeated index accumulates
    np.testing.assert_array_equal(gu, np.zeros(3))


@pytest.mark.parametrize("fn,d1,d2", [
    (lambda x: x * x * x, lambda x: 3 * x * x, lambda x: 6 * x),
    (lambda x: tnp.sin(x), np.cos, lambda x: -np.sin(x)),
    (lambda x: tnp.tanh(x), lambda x: 1 - np.tanh(x) ** 2,
     lambda x: -2 * np.tanh(x) * (1 - np.tanh(x) ** 2)),
    (lambda x: tnp.exp(x) / (1.0 + x * x), None, None),
])
def test_second_derivatives(fn, d1, d2):
    for x0 in (-1.3, 0.4, 2.0):
        x = np.float64(x0)
        g1 = tgx.grad(fn)(x)
        g2 = tgx.grad(tgx.grad(fn))(x)
        if d1 is None:  # against jax
            fj = lambda x: jnp.exp(x) / (1.0 + x * x)  # noqa: E731
            d1_, d2_ = jax.grad(fj)(x), jax.grad(jax.grad(fj))(x)
        else:
            d1_, d2_ = d1(x), d2(x)
        np.testing.assert_allclose(g1, d1_, rtol=1e-12)
        np.testing.assert_allclose(g2, d2_, rtol=1e-10)


def test_hessian_vector_product_by_jvp_of_grad():
    rng = np.random.default_rng(2)
    a = rng.standard_normal((4, 4))
    x, v = rng.standard_normal(4), rng.standard_normal(4)

    def f(np_):
        return lambda x: np_.sum(np_.tanh(x @ a) ** 2)

    _, hvp = tgx.jvp(tgx.grad(f(tnp)), (x,), (v,))
    _, hvp_j = jax.jvp(jax.grad(f(jnp)), (x,), (v,))
    np.testing.assert_allclose(hvp, hvp_j, rtol=1e-10)


def test_jvp_and_jacobians_match_jax():
    rng = np.random.default_rng(3)
    x = rng.standard_normal(3)
    t = rng.standard_normal(3)
    w = rng.standard_normal((3, 2))

    def f(np_):
        return lambda x: np_.exp(np_.sin(x) @ w)

    y, ty = tgx.jvp(f(tnp), (x,), (t,))
    yj, tyj = jax.jvp(f(jnp), (x,), (t,))
    np.testing.assert_allclose(y, yj, rtol=1e-12)
    np.testing.assert_allclose(ty, tyj, rtol=1e-10)
    np.testing.assert_allclose(tgx.jacrev(f(tnp))(x), jax.jacrev(f(jnp))(x), rtol=1e-10)
    np.testing.assert_allclose(tgx.jacfwd(f(tnp))(x), jax.jacfwd(f(jnp))(x), rtol=1e-10)


def test_stop_gradient():
    g = tgx.grad(lambda x: tnp.sum(x * tgx.stop_gradient(x * x)))(np.array([1.0, 2.0]))
    np.testing.assert_array_equal(g, [1.0, 4.0])
    gj = jax.grad(lambda x: jnp.sum(x * jax.lax.stop_gradient(x * x)))(np.array([1.0, 2.0]))
    np.testing.assert_array_equal(g, gj)


def test_gradient_graph_keeps_symbolic_dims():
    """One gradient graph for every batch size N, evaluated at several bindings."""
    rng = np.random.default_rng(4)
    w = rng.standard_normal((4, 3)).astype(np.float32)

    def loss(np_):
        return lambda w, x: np_.mean(np_.tanh(x @ w) ** 2)

    g = tgx.make_graph(tgx.grad(loss(tnp)))(tgx.Spec((4, 3), "float32"),
                                            tgx.Spec(("N", 4), "float32"))
    assert [str(a) for a in g.out_avals] == ["f32[4,3]"]
    assert any(str(v.aval).startswith("f32[N") for e in g.eqns for v in e.outvars)
    for n in (1, 5, 17):
        x = rng.standard_normal((n, 4)).astype(np.float32)
        out = eval_graph(g, w, x)
        # float32 against the float64 gradient: where tanh saturates, 1 - tanh loses digits,
        # so the tolerance is relative to the largest entry
        ref = jax.grad(loss(jnp))(w.astype(np.float64), x.astype(np.float64))
        np.testing.assert_allclose(out, ref, rtol=1e-5, atol=2e-6 * np.abs(ref).max())


def test_compiled_gradient_matches_eager_and_closes_over_traced_values():
    rng = np.random.default_rng(5)
    w = rng.standard_normal((6, 2)).astype(np.float32)
    x = rng.standard_normal((8, 6)).astype(np.float32)

    def step(w, x):
        # grad of a closure over x, a traced value of the enclosing compiled function
        return tgx.grad(lambda w: tnp.sum(tnn.gelu(x @ w)))(w)

    compiled = tgx.compile(step, policy="heuristic", backends=["numpy"])
    np.testing.assert_allclose(compiled(w, x), step(w, x), rtol=1e-5, atol=1e-6)
    ref = jax.grad(lambda w: jnp.sum(jax.nn.gelu(x @ w, approximate=False)))(w)
    np.testing.assert_allclose(compiled(w, x), ref, rtol=1e-4, atol=1e-5)


def test_compiled_training_step_updates_state_in_place():
    rng = np.random.default_rng(6)
    w = rng.standard_normal((3, 1)).astype(np.float32)
    x = rng.standard_normal((32, 3)).astype(np.float32)
    y = x @ np.array([[1.0], [-2.0], [0.5]], np.float32)

    def step(w, x, y):
        loss, g = tgx.value_and_grad(lambda w: tnp.mean((x @ w - y) ** 2))(w)
        return loss, w - 0.1 * g

    train = tgx.compile(step, state="w", policy="heuristic", backends=["numpy"])
    w_ref = w.copy()
    losses = []
    for _ in range(50):
        loss, w_new = train(w, x, y)
        assert w_new is w  # the caller's array holds the new weights
        g = 2 * x.T @ (x @ w_ref - y) / len(x)
        w_ref = w_ref - 0.1 * g
        losses.append(float(loss))
    np.testing.assert_allclose(w, w_ref, rtol=1e-4, atol=1e-5)
    assert losses[-1] < 1e-3 * losses[0]


# -- errors ----------------------------------------------------------------------------------


def test_grad_of_integer_input_is_an_error_naming_the_line():
    with pytest.raises(tgx.DTypeError, match=r"argument 0 \(x\) holds i64\[3\].*test_ad.py:\d+"):
        tgx.grad(lambda x: tnp.sum(x * 1.0))(np.arange(3))
    with pytest.raises(tgx.DTypeError, match=r"argument 0 \(p\['ids'\]\) holds i64"):
        tgx.grad(lambda p: tnp.sum(p["w"]))({"w": np.ones(2), "ids": np.arange(2)})


def test_grad_of_non_scalar_output_is_an_error():
    with pytest.raises(tgx.ShapeError, match=r"floating-point scalar, got f64\[3\]"):
        tgx.grad(lambda x: x * 2.0)(np.ones(3))


def test_grad_through_argmax_output_is_an_error():
    # argmax's result is an integer: there is nothing to differentiate (as jax.grad).
    with pytest.raises(tgx.DTypeError, match="floating-point scalar, got i64"):
        tgx.grad(lambda x: tnp.argmax(x))(np.ones(3))
    # argmax inside a float computation: no gradient flows through the index.
    g = tgx.grad(lambda x: tnp.take(x, tnp.argmax(x)) * 2.0)(np.array([1.0, 3.0, 2.0]))
    np.testing.assert_array_equal(g, [0.0, 2.0, 0.0])


def test_argnums_out_of_range():
    with pytest.raises(tgx.TgxError, match="argnums 2 out of range"):
        tgx.grad(lambda x, y: tnp.sum(x * y), argnums=2)(np.ones(2), np.ones(2))


def test_vjp_checks_cotangent_shapes():
    _, pull = tgx.vjp(lambda x: x * 2.0, np.ones(3))
    with pytest.raises(tgx.ShapeError, match=r"cotangent 0 is f64\[2\]"):
        pull(np.ones(2))


# -- properties ------------------------------------------------------------------------------

_dims = st.integers(1, 4)


@st.composite
def _broadcast_pair(draw):
    out = draw(st.lists(_dims, min_size=0, max_size=3))
    def operand():
        rank = draw(st.integers(0, len(out)))
        tail = out[len(out) - rank:]
        return tuple(1 if draw(st.booleans()) else d for d in tail)
    return operand(), operand()


@settings(max_examples=40, deadline=None)
@given(_broadcast_pair(), st.sampled_from(["add", "subtract", "multiply", "divide", "maximum",
                                           "power"]))
def test_broadcasting_binary_gradients_match_jax(shapes, op):
    rng = np.random.default_rng(7)
    a = rng.uniform(0.5, 2.0, shapes[0])
    b = rng.uniform(0.5, 2.0, shapes[1])
    ga = tgx.grad(lambda a, b: tnp.sum(getattr(tnp, op)(a, b) ** 2), argnums=(0, 1))(a, b)
    gj = jax.grad(lambda a, b: jnp.sum(getattr(jnp, op)(a, b) ** 2), argnums=(0, 1))(a, b)
    for x, y, s in zip(ga, gj, shapes):
        assert np.shape(x) == s
        np.testing.assert_allclose(x, y, rtol=1e-10, atol=1e-12)


@settings(max_examples=15, deadline=None)
@given(st.lists(_dims, min_size=1, max_size=4), st.data())
def test_reduction_and_movement_gradients_match_jax(shape, data):
    rng = np.random.default_rng(8)
    x = rng.standard_normal(shape)
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    perm = tuple(data.draw(st.permutations(range(len(shape)))))

    def f(np_):
        def fn(x):
            y = np_.transpose(x, perm) * np_.max(x, axis=axis, keepdims=True).sum()
            return np_.sum(np_.reshape(y, (-1,))[::2] ** 2) + np_.sum(np_.cumsum(x, axis=axis))
        return fn

    np.testing.assert_allclose(tgx.grad(f(tnp))(x), jax.grad(f(jnp))(x), rtol=1e-10,
                               atol=1e-12)


def test_custom_vjp_replaces_the_rule():
    @tgx.custom_vjp
    def scaled_sin(x, y):
        return tnp.sin(x) * y

    calls = []

    def fwd(x, y):
        calls.append("fwd")
        return scaled_sin(x, y), (x, y)

    def bwd(res, ct):
        x, y = res
        return (tnp.clip(ct * tnp.cos(x) * y, -1.0, 1.0), None)  # clipped; no gradient for y

    scaled_sin.defvjp(fwd, bwd)
    x, y = np.linspace(0.0, 1.0, 4), np.full(4, 2.0)
    np.testing.assert_allclose(scaled_sin(x, y), np.sin(x) * 2)  # outside grad: f itself
    assert calls == []
    gx, gy = tgx.grad(lambda x, y: tnp.sum(scaled_sin(x, y)), argnums=(0, 1))(x, y)
    np.testing.assert_allclose(gx, np.clip(2 * np.cos(x), -1, 1))
    np.testing.assert_array_equal(gy, np.zeros(4))
    compiled = tgx.compile(tgx.grad(lambda x, y: tnp.sum(scaled_sin(x, y))),
                           policy="heuristic", backends=["numpy"])
    np.testing.assert_allclose(compiled(x, y), np.clip(2 * np.cos(x), -1, 1))
    with pytest.raises(tgx.TgxError, match="tuple of 2 cotangents"):
        scaled_sin.defvjp(fwd, lambda res, ct: ct)
        tgx.grad(lambda x: tnp.sum(scaled_sin(x, y)))(x)


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_the_gradient_of_gelu_is_one_kernel_on_torch(approximate):
    """gelu's VJP is one `gelu_grad` equation, which torch runs as the kernel its own
    autograd runs (`aten.gelu_backward`) instead of differentiating gelu's decomposition
    step by step (23 kernels for the tanh form); the gradient matches jax's."""
    pytest.importorskip("torch")
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((6, 8)) * 3).astype(np.float32)
    loss = lambda x: tnp.sum(tnn.gelu(x, approximate=approximate) * x)
    g = tgx.compile(tgx.grad(loss), backends=["torch"], policy="heuristic")
    plan = g.lower(x)
    names = [plan.compiled.graph.eqns[e].primitive.name
             for ins in plan.compiled.instructions for e in ins.eqns]
    assert names.count("gelu_grad") == 1 and "tanh" not in names
    want = jax.grad(lambda x: jnp.sum(jax.nn.gelu(x, approximate=approximate == "tanh") * x))(x)
    np.testing.assert_allclose(g(x), want, **TOL[np.float32])


@pytest.mark.parametrize("form", ["x @ w", "x @ w.T", "batched"])
def test_matmul_gradients_come_out_in_their_operands_layout(form):
    """A weight gradient is one product in the weight's layout, not a product transposed
    after (a transposed gradient costs every consumer a strided pass: the optimizer's)."""
    rng = np.random.default_rng(0)
    if form == "batched":
        x, w = rng.standard_normal((2, 5, 3)), rng.standard_normal((2, 3, 4))
        f = lambda x, w: tnp.sum(tnp.sin(x @ w))
        ref = lambda x, w: jnp.sum(jnp.sin(x @ w))
    else:
        x = rng.standard_normal((5, 3))
        w = rng.standard_normal((3, 4) if form == "x @ w" else (4, 3))
        f = (lambda x, w: tnp.sum(tnp.sin(x @ w))) if form == "x @ w" else \
            (lambda x, w: tnp.sum(tnp.sin(x @ w.T)))
        ref = (lambda x, w: jnp.sum(jnp.sin(x @ w))) if form == "x @ w" else \
            (lambda x, w: jnp.sum(jnp.sin(x @ w.T)))
    g = tgx.make_graph(tgx.grad(f, argnums=(0, 1)))(tgx.Spec(x.shape, "float64"),
                                                     tgx.Spec(w.shape, "float64"))
    s = tgx.simplify(g)   # what compile runs: folds the transpose of w.T's VJP too
    for graph in (g, s) if form != "x @ w.T" else (s,):
        names = [e.primitive.name for e in graph.eqns]
        assert "transpose" not in names[names.index("cos"):], graph
    want = jax.grad(ref, argnums=(0, 1))(x, w)
    for graph in (g, s):
        for got, exp in zip(eval_graph(graph, x, w), want):
            np.testing.assert_allclose(got, exp, rtol=1e-12)
