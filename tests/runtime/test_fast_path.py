"""The per-call fast path of `tgx.compile` and donation of jax-array state.

A call whose arguments have the structure, leaf types, dtypes and static dims of an earlier
call is checked and flattened by one generated function (`jit._FastCall`); any difference
takes the slow path, which finds or makes the plan as before. Every result here is checked
against NumPy (or jax) computing the same thing, never against tgx itself.
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict, namedtuple

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tgx
import tgx.numpy as tnp
from tgx import optim

Pair = namedtuple("Pair", "a b")


@dataclasses.dataclass
class Box:
    w: object
    b: object


def _total(tree):
    """Sum of every leaf times its position + 1 (so that swapped leaves give another
    number), as tgx and as NumPy."""
    leaves, _ = tgx.tree_flatten(tree)
    return sum((i + 1) * tnp.sum(x) for i, x in enumerate(leaves))


def _np_total(tree):
    leaves, _ = tgx.tree_flatten(tree)
    return sum((i + 1) * float(np.sum(x)) for i, x in enumerate(leaves))


def test_a_second_call_takes_the_fast_path_and_gives_the_right_answer():
    f = tgx.compile(lambda p, x: (p["w"] @ x + p["b"], x * 2.0), backends=["numpy"],
                    policy="heuristic")
    rng = np.random.default_rng(0)
    p = {"w": rng.standard_normal((3, 4)).astype(np.float32),
         "b": rng.standard_normal(3).astype(np.float32)}
    for _ in range(3):
        x = rng.standard_normal(4).astype(np.float32)
        y, z = f(p, x)
        np.testing.assert_allclose(y, p["w"] @ x + p["b"], rtol=1e-5)
        np.testing.assert_allclose(z, x * 2)
    assert f.trace_count == 1 and len(f._guards) == 1


@pytest.mark.parametrize("change", ["shape", "dtype", "structure", "keys", "leaf type",
                                    "container type", "python scalar"])
def test_a_call_that_differs_takes_the_slow_path(change):
    f = tgx.compile(lambda t: _total(t), backends=["numpy"], policy="heuristic")
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    first = {"a": a, "b": [a + 1, a + 2]}
    assert float(f(first)) == pytest.approx(_np_total(first))
    other = {
        "shape": {"a": a[:1], "b": [a + 1, a + 2]},
        "dtype": {"a": a.astype(np.float64), "b": [a + 1, a + 2]},
        "structure": {"a": a, "b": [a + 1, a + 2, a + 3]},
        "keys": {"a": a, "c": [a + 1, a + 2]},
        "leaf type": {"a": a, "b": [a + 1, 2.5]},
        "container type": {"a": a, "b": (a + 1, a + 2)},
        "python scalar": {"a": a, "b": [a + 1, 3]},
    }[change]
    assert float(f(other)) == pytest.approx(_np_total(other), rel=1e-6)
    assert f.trace_count == 2
    # and the first signature still runs, on its own plan, with new values
    again = {"a": a * 3, "b": [a - 1, a]}
    assert float(f(again)) == pytest.approx(_np_total(again))
    assert f.trace_count == 2


@pytest.mark.parametrize("change", ["shape", "dtype", "weak type", "numpy"])
def test_a_jax_array_call_that_differs_takes_the_slow_path(change):
    """The guard checks a jax array by its aval (shape, dtype, weak type at once)."""
    jnp = pytest.importorskip("jax.numpy")
    f = tgx.compile(lambda t: _total(t), backends=["numpy", "jax"], policy="heuristic")
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    first = [jnp.asarray(a), jnp.asarray(a + 1)]
    assert float(f(first)) == pytest.approx(_np_total([a, a + 1]))
    assert float(f([jnp.asarray(a * 2), jnp.asarray(a)])) == pytest.approx(_np_total([a * 2, a]))
    assert f.trace_count == 1 and len(f._guards) == 1
    other = {
        "shape": [jnp.asarray(a[:1]), jnp.asarray(a + 1)],
        "dtype": [jnp.asarray(a, dtype=jnp.int32), jnp.asarray(a + 1)],
        "weak type": [jnp.asarray(a), jnp.broadcast_to(jnp.asarray(2.0), (2, 3))],
        "numpy": [a, jnp.asarray(a + 1)],
    }[change]
    want = _np_total([np.asarray(x) for x in other])
    assert float(f(other)) == pytest.approx(want, rel=1e-6)
    assert f.trace_count == 2 or change in ("weak type", "numpy")  # same avals: no retrace
    assert len(f._guards) == 2


def test_every_kind_of_container_is_checked_by_the_guard():
    f = tgx.compile(lambda t: _total(t), backends=["numpy"], policy="heuristic")
    x = np.ones(2, np.float32)
    tree = (OrderedDict([("z", x), ("a", 2 * x)]), Pair(x, None), Box(3 * x, 4 * x), [x], 7.0)
    assert float(f(tree)) == pytest.approx(_np_total(tree))
    assert len(f._guards) == 1
    # OrderedDict order matters (its keys are its structure), dict order does not
    swapped = (OrderedDict([("a", 2 * x), ("z", x)]),) + tree[1:]
    assert float(f(swapped)) == pytest.approx(_np_total(swapped))
    assert f.trace_count == 2
    assert float(f(tree)) == pytest.approx(_np_total(tree)) and f.trace_count == 2
    # a named tuple with a leaf where None was: a new structure
    other = (tree[0], Pair(x, x)) + tree[2:]
    assert float(f(other)) == pytest.approx(_np_total(other)) and f.trace_count == 3


def test_dynamic_dims_share_one_guard_and_the_run_checks_them():
    f = tgx.compile(lambda x, y: x * y, backends=["numpy"], policy="heuristic",
                    dynamic={"x": {0: "N"}, "y": {0: "N"}})
    for n in (3, 5, 3):
        x = np.arange(n * 2, dtype=np.float32).reshape(n, 2)
        np.testing.assert_array_equal(f(x, x + 1), x * (x + 1))
    assert f.trace_count == 1 and len(f._guards) == 1
    with pytest.raises(tgx.BindingError):   # N bound twice with two values
        f(np.ones((3, 2), np.float32), np.ones((4, 2), np.float32))
    x = np.ones((3, 3), np.float32)      # a static dim differs: a new signature
    np.testing.assert_array_equal(f(x, 2 * x), 2 * x)
    assert f.trace_count == 2


def test_errors_still_name_the_argument_by_its_key_path():
    f = tgx.compile(lambda p: p["w"] * 2.0, backends=["numpy"], policy="heuristic")
    f({"w": np.ones(3, np.float32)})
    with pytest.raises(tgx.DTypeError, match=r"p\['w'\]"):
        f({"w": "not an array"})


def test_results_keep_their_structure_and_type():
    f = tgx.compile(lambda x: {"b": (x, [x + 1.0]), "a": None, "c": Pair(x * 2.0, x)},
                    backends=["numpy"], policy="heuristic")
    x = np.ones(2, np.float32)
    for _ in range(2):
        out = f(x)
        assert list(out) == ["a", "b", "c"] and out["a"] is None
        assert type(out["b"]) is tuple and type(out["b"][1]) is list and type(out["c"]) is Pair
        np.testing.assert_array_equal(out["b"][1][0], x + 1)
        np.testing.assert_array_equal(out["c"].a, x * 2)


_leaf = st.sampled_from([(2,), (3,), (2, 2)]).map(lambda s: np.ones(s, np.float32))
_trees = st.recursive(
    _leaf, lambda kids: st.one_of(
        st.lists(kids, min_size=1, max_size=3),
        st.tuples(kids, kids),
        st.dictionaries(st.sampled_from("abc"), kids, min_size=1, max_size=3)),
    max_leaves=6)


@settings(max_examples=30, deadline=None)
@given(st.lists(_trees, min_size=2, max_size=4))
def test_any_sequence_of_pytrees_gives_the_right_answers(trees):
    f = tgx.compile(lambda t: _total(t), backends=["numpy"], policy="heuristic")
    for t in trees + trees[::-1]:
        leaves, _ = tgx.tree_flatten(t)
        scaled = tgx.tree_unflatten(tgx.tree_flatten(t)[1],
                                    [x * (k + 2) for k, x in enumerate(leaves)])
        assert float(f(scaled)) == pytest.approx(_np_total(scaled), rel=1e-6)


# -- donation of jax-array state ------------------------------------------------------------

jax = pytest.importorskip("jax")
jnp = jax.numpy


def _adam_step(loss_fn):
    opt = optim.adam(1e-2)

    def step(p, s, x, y):
        loss, g = tgx.value_and_grad(loss_fn)(p, x, y)
        u, s = opt.update(g, s, p)
        return loss, (optim.apply_updates(p, u), s)

    return opt, step


def _mse(p, x, y):
    return tnp.mean((x @ p["w"] + p["b"] - y) ** 2)


def _reference_adam(p, x, y, steps, lr=1e-2, b1=0.9, b2=0.999, eps=1e-8):
    """Adam (torch's formulas) on the same model, in float64 NumPy: the losses and params."""
    p = {k: v.astype(np.float64) for k, v in p.items()}
    m = {k: np.zeros_like(v) for k, v in p.items()}
    v = {k: np.zeros_like(v) for k, v in p.items()}
    losses = []
    for t in range(1, steps + 1):
        r = x @ p["w"] + p["b"] - y
        losses.append(float(np.mean(r ** 2)))
        g = {"w": x.T @ (2 * r / r.size), "b": (2 * r / r.size).sum(0)}
        for k in p:
            m[k] = b1 * m[k] + (1 - b1) * g[k]
            v[k] = b2 * v[k] + (1 - b2) * g[k] ** 2
            p[k] = p[k] - lr * (m[k] / (1 - b1 ** t)) / (np.sqrt(v[k] / (1 - b2 ** t)) + eps)
    return losses, p


def _problem():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((16, 3)).astype(np.float32)
    y = rng.standard_normal((16, 2)).astype(np.float32)
    p = {"w": rng.standard_normal((3, 2)).astype(np.float32), "b": np.zeros(2, np.float32)}
    return p, x, y


@pytest.mark.parametrize("donate", [True, False])
def test_jax_state_is_donated_on_a_jax_plan_and_the_steps_are_right(donate):
    p0, x, y = _problem()
    want_losses, want_p = _reference_adam(p0, x.astype(np.float64), y.astype(np.float64), 5)
    opt, step = _adam_step(_mse)
    f = tgx.compile(step, state=("p", "s"), backends=["jax"], policy="heuristic",
                    donate=donate)
    p = tgx.tree_map(jnp.asarray, p0)
    s = tgx.tree_map(jnp.asarray, opt.init(p0))
    xs, ys = jnp.asarray(x), jnp.asarray(y)
    for t in range(5):
        old = tgx.tree_flatten((p, s))[0]
        loss, (p, s) = f(p, s, xs, ys)
        assert isinstance(loss, jax.Array) and isinstance(p["w"], jax.Array)
        assert float(loss) == pytest.approx(want_losses[t], rel=1e-5)
        # donated: XLA took the buffers, as jax.jit(donate_argnums) does; else untouched
        assert all(a.is_deleted() == donate for a in old)
        assert not xs.is_deleted() and not ys.is_deleted()   # not state: never donated
    for k in want_p:
        np.testing.assert_allclose(np.asarray(p[k]), want_p[k], rtol=1e-4, atol=1e-5)
    assert f.trace_count == 1


def test_a_donated_array_passed_again_is_named():
    opt, step = _adam_step(_mse)
    p0, x, y = _problem()
    f = tgx.compile(step, state=("p", "s"), backends=["jax"], policy="heuristic")
    p, s = tgx.tree_map(jnp.asarray, p0), tgx.tree_map(jnp.asarray, opt.init(p0))
    f(p, s, x, y)
    with pytest.raises(tgx.BindingError, match=r"argument p\['b'\]: .* donated to an earlier"):
        f(p, s, x, y)


def test_numpy_state_on_a_jax_plan_is_written_in_place_over_several_steps():
    p0, x, y = _problem()
    want_losses, want_p = _reference_adam(p0, x.astype(np.float64), y.astype(np.float64), 4)
    opt, step = _adam_step(_mse)
    f = tgx.compile(step, state=("p", "s"), backends=["jax"], policy="heuristic")
    p = tgx.aligned(p0)       # aligned: the region reads them in place, through an alias
    s = opt.init(p)
    w = p["w"]
    for t in range(4):
        loss, (p2, s2) = f(p, s, x, y)
        assert p2["w"] is w and all(a is b for a, b in zip(tgx.tree_flatten(s2)[0],
                                                           tgx.tree_flatten(s)[0]))
        assert float(loss) == pytest.approx(want_losses[t], rel=1e-5)
    for k in want_p:
        np.testing.assert_allclose(p[k], want_p[k], rtol=1e-4, atol=1e-5)
    # the caller changes its arrays between calls: the next step reads the new values
    p["w"][...] = p0["w"]
    p["b"][...] = p0["b"]
    s_fresh = opt.init(p0)
    for leaf, fresh in zip(tgx.tree_flatten(s)[0], tgx.tree_flatten(s_fresh)[0]):
        leaf[...] = fresh
    loss, _ = f(p, s, x, y)
    assert float(loss) == pytest.approx(want_losses[0], rel=1e-5)


def test_numpy_arguments_passed_again_are_read_afresh():
    f = tgx.compile(lambda x, w: x @ w, backends=["jax"], policy="heuristic")
    x = tgx.aligned(np.ones((4, 3), np.float32))
    w = tgx.aligned(np.arange(6, dtype=np.float32).reshape(3, 2))
    for k in range(4):   # from the second call on, x and w go in as aliases
        x[...] = k
        np.testing.assert_allclose(f(x, w), x @ w)


def test_torch_state_is_unchanged_in_behaviour():
    torch = pytest.importorskip("torch")
    p0, x, y = _problem()
    want_losses, want_p = _reference_adam(p0, x.astype(np.float64), y.astype(np.float64), 3)
    opt, step = _adam_step(_mse)
    f = tgx.compile(step, state=("p", "s"), backends=["torch"], policy="heuristic",
                    return_backend_arrays=True)
    p = tgx.tree_map(lambda a: torch.from_numpy(a.copy()), p0)
    s = tgx.tree_map(lambda a: torch.from_numpy(np.array(a)), opt.init(p0))
    w = p["w"]
    for t in range(3):
        loss, (p2, s2) = f(p, s, torch.from_numpy(x), torch.from_numpy(y))
        assert p2["w"] is w                     # written in place, the same tensor back
        assert float(loss) == pytest.approx(want_losses[t], rel=1e-5)
    np.testing.assert_allclose(p["w"].numpy(), want_p["w"], rtol=1e-4, atol=1e-5)


def test_the_same_jax_array_as_two_state_leaves_is_not_donated_twice():
    f = tgx.compile(lambda a, b: (a.sum(), (a + 1.0, b * 2.0)), state=("a", "b"),
                    backends=["jax"], policy="heuristic")
    z = jnp.ones(3, jnp.float32)
    _, (a, b) = f(z, z)
    np.testing.assert_allclose(np.asarray(a), 2.0)
    np.testing.assert_allclose(np.asarray(b), 2.0)


def test_the_jax_alias_of_a_numpy_argument_is_uncommitted_as_the_argument_is():
    """jax.jit keys its cache on whether an argument is committed to a device: an alias that
    is, in place of a NumPy argument, recompiled the region (0.4 s a 2-layer Gemma)."""
    jb = pytest.importorskip("tgx.backends.jax_backend")
    x = tgx.aligned(np.arange(64, dtype=np.float32))
    alias = jb.BACKEND.host_alias(x)
    if alias is None:
        pytest.skip("jax copies host arrays here: no alias")
    assert not alias.committed
    assert alias.unsafe_buffer_pointer() == x.ctypes.data


def test_numpy_state_made_read_only_after_the_first_call_is_named():
    """The fast call decides once which state is the caller's NumPy array, and still checks
    each such array per call: one made read-only later is refused, naming it."""
    f = tgx.compile(lambda s, x: (x.sum(), {"m": s["m"] + x}), state="s", backends=["numpy"],
                    policy="heuristic")
    s = {"m": np.zeros(3, np.float32)}
    x = np.ones(3, np.float32)
    f(s, x)
    f(s, x)
    np.testing.assert_allclose(s["m"], 2.0)
    s["m"].flags.writeable = False
    with pytest.raises(tgx.BindingError, match=r"state s\['m'\]: .*read-only"):
        f(s, x)
    np.testing.assert_allclose(s["m"], 2.0)      # untouched by the refused call


def test_jax_and_numpy_state_leaves_mixed_in_one_call():
    """Each state leaf keeps its own contract on the fast path: the NumPy one is written in
    place and returned as the same array, the jax one comes back as a new array."""
    f = tgx.compile(lambda a, b: (a.sum(), (a + 1.0, b * 2.0)), state=("a", "b"),
                    backends=["jax"], policy="heuristic")
    a = tgx.aligned(np.zeros(4, np.float32))
    b = jnp.ones(4, jnp.float32)
    for t in range(1, 4):
        _, (a2, b) = f(a, b)
        assert a2 is a and isinstance(b, jax.Array)
        np.testing.assert_allclose(a, float(t))
        np.testing.assert_allclose(np.asarray(b), 2.0 ** t)
