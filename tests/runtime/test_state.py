"""State buffers: `tgx.compile(state=...)` updates the caller's arrays (a KV cache) in place."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import tgx
import tgx.lax as lax
import tgx.nn as tnn
import tgx.numpy as tnp
from tgx.backends import available_backends

BACKENDS = [pytest.param(b, marks=pytest.mark.skipif(b not in available_backends(),
                                                     reason=f"{b} missing"))
            for b in ("numpy", "torch", "jax")]
T_MAX, D = 32, 16


def attention_step(x, cache, pos, w):
    """One decode step of single-head attention with a KV cache of shape (T_MAX, D)."""
    q, k, v = x @ w["q"], x @ w["k"], x @ w["v"]
    keys = lax.dynamic_update_slice(cache["k"], k[None], (pos, 0))
    values = lax.dynamic_update_slice(cache["v"], v[None], (pos, 0))
    scores = (keys @ q) / np.float32(np.sqrt(D))
    mask = tnp.arange(keys.shape[0]) <= pos
    p = tnn.softmax(tnp.where(mask, scores, np.float32(-1e30)), dim=-1)
    return p @ values, {"k": keys, "v": values}


def weights(seed=0):
    rng = np.random.default_rng(seed)
    return {n: (rng.standard_normal((D, D)) / 4).astype(np.float32) for n in "qkv"}


def numpy_decode(xs, w):
    """Independent reference: a plain NumPy loop over the prefix."""
    ks, vs, ys = [], [], []
    for x in xs:
        ks.append(x @ w["k"])
        vs.append(x @ w["v"])
        s = np.stack(ks) @ (x @ w["q"]) / np.sqrt(D)
        p = np.exp(s - s.max())
        ys.append((p / p.sum()) @ np.stack(vs))
    cache = np.zeros((T_MAX, D), np.float32)
    return ys, cache + np.pad(np.stack(ks), ((0, T_MAX - len(ks)), (0, 0))), \
        cache + np.pad(np.stack(vs), ((0, T_MAX - len(vs)), (0, 0)))


def labels(plan):
    return [ins.label for ins in plan.compiled.instructions]


@pytest.mark.parametrize("backend", BACKENDS)
def test_kv_cache_decode_loop(backend):
    w = weights()
    f = tgx.compile(attention_step, state="cache", policy="heuristic", backends=[backend],
                    weights="w")
    cache = {"k": np.zeros((T_MAX, D), np.float32), "v": np.zeros((T_MAX, D), np.float32)}
    k_obj, v_obj = cache["k"], cache["v"]
    xs = np.random.default_rng(1).standard_normal((12, D)).astype(np.float32)
    ys_ref, k_ref, v_ref = numpy_decode(xs, w)
    for pos, x in enumerate(xs):
        y, cache = f(x, cache, np.int32(pos), w)
        np.testing.assert_allclose(y, ys_ref[pos], rtol=2e-5, atol=2e-6)
        assert cache["k"] is k_obj and cache["v"] is v_obj       # the caller's very arrays
    np.testing.assert_allclose(k_obj, k_ref, rtol=2e-5, atol=2e-6)
    np.testing.assert_allclose(v_obj, v_ref, rtol=2e-5, atol=2e-6)
    assert f.trace_count == 1 and len(f._plans) == 1

    plan = f.lower(xs[0], cache, np.int32(0), w)
    cg = plan.compiled
    inplace = [x for x in labels(plan) if "[inplace]" in x]
    if backend == "jax":      # immutable arrays: the result is copied into the cache once
        assert not inplace and all(copy for _, _, copy in cg.state)
        # the XLA region takes the caller's cache, x and pos as they are: no copy_to@jax
        assert not any(x.startswith("copy_to@jax") for x in labels(plan)), labels(plan)
    else:                     # only the window is written; no whole-cache update runs
        assert inplace == [f"dynamic_update_slice[inplace]@{backend}"] * 2
        assert not any(x.startswith("dynamic_update_slice@") for x in labels(plan))
        assert not any(copy for _, _, copy in cg.state)
    assert plan.memory.bytes_by_kind()["state"]["cpu"] == 2 * T_MAX * D * 4
    assert plan.estimate_memory()["cpu"] >= 2 * T_MAX * D * 4
    text = str(plan)
    assert "state      cpu" in text and "state: 2 buffer(s)" in text


def test_dynamic_cache_length_and_position_reuse_the_plan():
    w = weights()
    f = tgx.compile(attention_step, state="cache", policy="heuristic", backends=["numpy"],
                    weights="w", dynamic={"cache": {0: "T"}})
    xs = np.random.default_rng(2).standard_normal((5, D)).astype(np.float32)
    ys_ref, _, _ = numpy_decode(xs, w)
    for t in (8, 24):
        cache = {"k": np.zeros((t, D), np.float32), "v": np.zeros((t, D), np.float32)}
        for pos, x in enumerate(xs):
            y, cache = f(x, cache, np.int32(pos), w)
            np.testing.assert_allclose(y, ys_ref[pos], rtol=2e-5, atol=2e-6)
    assert f.trace_count == 1 and len(f._plans) == 1
    plan = f.lower(xs[0], {"k": tgx.Spec(("T", D)), "v": tgx.Spec(("T", D))}, np.int32(0), w)
    assert plan.memory.bytes_by_kind(T=100)["state"]["cpu"] == 2 * 100 * D * 4


def read_old_after_update(cache, x, pos):
    new = lax.dynamic_update_slice(cache, x[None], (pos, 0))
    total_new = tnp.sum(new, axis=0)
    old_t = tnp.transpose(cache)                    # a view of the old value,
    total_old = tnp.sum(old_t * 1.0, axis=1)        # read after the update in trace order
    return (total_new, total_old), new


@pytest.mark.parametrize("backend", [b for b in BACKENDS if b.values[0] != "jax"])
def test_reader_of_the_old_state_runs_before_the_inplace_write(backend):
    f = tgx.compile(read_old_after_update, state="cache", policy="heuristic",
                    backends=[backend])
    cache = np.arange(12, dtype=np.float32).reshape(4, 3)
    old = cache.copy()
    x = np.full(3, 100, np.float32)
    (tn, to), new = f(cache, x, np.int32(2))
    assert new is cache
    np.testing.assert_allclose(to, old.sum(0))        # saw the old row, not the new one
    expect = old.copy()
    expect[2] = 100
    np.testing.assert_allclose(tn, expect.sum(0))
    np.testing.assert_array_equal(cache, expect)
    ls = labels(f.lower(cache, x, np.int32(2)))
    t_write = ls.index(f"dynamic_update_slice[inplace]@{backend}")
    t_old = [t for t, lb in enumerate(ls) if lb.startswith("transpose")][0]
    assert t_old < t_write                            # scheduled before the write


def test_reader_of_both_values_falls_back_to_a_copy():
    def f(cache, x, pos):
        new = lax.dynamic_update_slice(cache, x[None], (pos, 0))
        return new - cache, new                       # one equation reads old and new

    g = tgx.compile(f, state="cache", policy="heuristic", backends=["numpy"])
    cache = np.ones((4, 3), np.float32)
    d, new = g(cache, np.full(3, 5, np.float32), np.int32(9))    # clamped to row 3
    assert new is cache and (cache[3] == 5).all() and (cache[:3] == 1).all()
    np.testing.assert_array_equal(d, np.r_[np.zeros((3, 3)), np.full((1, 3), 4)])
    cg = g.lower(cache, np.ones(3, np.float32), np.int32(0)).compiled
    assert not any("[inplace]" in i.label for i in cg.instructions)
    assert cg.state[0][2] and "depends on the update" in cg.state_reasons[0]


def test_output_viewing_the_old_state_is_not_overwritten():
    def f(cache, x, pos):
        return cache[1], lax.dynamic_update_slice(cache, x[None], (pos, 0))

    g = tgx.compile(f, state="cache", policy="heuristic", backends=["numpy"])
    cache = np.zeros((4, 3), np.float32)
    for pos in range(3):
        old_row, cache2 = g(cache, np.full(3, pos + 1, np.float32), np.int32(pos))
        assert cache2 is cache
        np.testing.assert_array_equal(old_row, np.full(3, 2.0 if pos > 1 else 0.0))
    np.testing.assert_array_equal(cache[:3, 0], [1, 2, 3])


def test_unchanged_and_computed_state():
    def f(a, b, c):
        return a.sum(), (a, b * 2.0)                   # a returned as is, b recomputed

    g = tgx.compile(f, state=("a", "b"), policy="heuristic", backends=["numpy"])
    a, b = np.ones(3, np.float32), np.ones(2, np.float32)
    y, (a2, b2) = g(a, b, np.float32(0))
    assert a2 is a and b2 is b and (b == 2).all() and (a == 1).all() and float(y) == 3


@pytest.mark.skipif("torch" not in available_backends(), reason="torch missing")
def test_torch_tensor_state_with_backend_arrays():
    import torch

    def f(cache, x, pos):
        new = lax.dynamic_update_slice(cache, x[None], (pos, 0))
        return new.sum(), new

    g = tgx.compile(f, state="cache", policy="heuristic", backends=["torch"],
                    return_backend_arrays=True)
    cache = torch.zeros(4, 3)
    _, new = g(cache, np.ones(3, np.float32), np.int32(1))
    assert new is cache and float(cache.sum()) == 3 and float(cache[1].sum()) == 3
    with pytest.raises(tgx.BindingError, match="return_backend_arrays"):
        tgx.compile(f, state="cache", policy="heuristic", backends=["torch"])(
            cache, np.ones(3, np.float32), np.int32(1))


# -- errors ------------------------------------------------------------------------------------

def _step(cache, x, pos):
    return x.sum(), lax.dynamic_update_slice(cache, x[None], (pos, 0))


def test_state_argument_errors():
    g = tgx.compile(_step, state="cache", policy="heuristic", backends=["numpy"])
    x, pos = np.ones(3, np.float32), np.int32(0)
    ro = np.zeros((4, 3), np.float32)
    ro.flags.writeable = False
    with pytest.raises(tgx.BindingError, match=r"state cache.*read-only"):
        g(ro, x, pos)
    with pytest.raises(tgx.BindingError, match="non-contiguous"):
        g(np.zeros((3, 4), np.float32).T, x, pos)
    counter = tgx.compile(lambda n: (n, n + 1.0), state="n", policy="heuristic",
                          backends=["numpy"])
    with pytest.raises(tgx.BindingError, match=r"writable NumPy array \(tgx updates it in "
                                               r"place\), got float"):
        counter(1.0)
    n = np.zeros((), np.float32)
    for _ in range(3):
        assert counter(n)[1] is n
    assert float(n) == 3.0
    c = np.zeros((4, 3), np.float32)
    with pytest.raises(tgx.BindingError, match="also passed as another argument"):
        tgx.compile(lambda cache, other: (other.sum(), cache * 1.0), state="cache")(c, c)
    with pytest.raises(ValueError, match="state names an unknown argument 'kv'"):
        tgx.compile(_step, state="kv")
    with pytest.raises(ValueError, match="both weights"):
        tgx.compile(_step, state="cache", weights=0)


def test_returned_state_must_match_the_state_arguments():
    c, x, pos = np.zeros((4, 3), np.float32), np.ones(3, np.float32), np.int32(0)
    cases = [
        (lambda cache, x, pos: cache * 2.0, tgx.TgxError, "must return \\(outputs, new_state\\)"),
        (lambda cache, x, pos: (x, cache[:2]), tgx.ShapeError,
         r"new state cache is f32\[2,3\], but the state argument is f32\[4,3\]"),
        (lambda cache, x, pos: (x, cache.astype("float64")), tgx.DTypeError,
         r"new state cache is f64\[4,3\]"),
        (lambda cache, x, pos: (x, (cache, cache)), tgx.TgxError, "has structure tuple"),
    ]
    for fn, exc, msg in cases:
        with pytest.raises(exc, match=msg):
            tgx.compile(fn, state="cache", policy="heuristic", backends=["numpy"])(c, x, pos)
    with pytest.raises(tgx.ShapeError, match=r"new state kv\['v'\] is f32\[3\]"):
        tgx.compile(lambda kv: (0.0, {"k": kv["k"], "v": kv["v"][0]}), state="kv",
                    policy="heuristic", backends=["numpy"])({"k": c, "v": c})


def test_dynamic_slice_shape_rule_errors():
    spec = tgx.make_graph
    with pytest.raises(tgx.ShapeError, match=r"dynamic_update_slice: update f32\[3\] and "
                                             r"operand f32\[4,3\] differ in rank"):
        spec(lambda c, u, i: lax.dynamic_update_slice(c, u, (i, i)))(
            tgx.Spec((4, 3)), tgx.Spec((3,)), tgx.Spec((), "int32"))
    with pytest.raises(tgx.ShapeError, match=r"update f32\[5,3\] is larger than the operand "
                                             r"f32\[4,3\] along axis 0"):
        spec(lambda c, u, i: lax.dynamic_update_slice(c, u, (i, i)))(
            tgx.Spec((4, 3)), tgx.Spec((5, 3)), tgx.Spec((), "int32"))
    with pytest.raises(tgx.DTypeError, match=r"dynamic_slice: start index 0 must be an integer "
                                             r"scalar, got f32\[\] \(operand f32\[4,3\]\)"):
        spec(lambda c, i: tgx.primitives.dynamic_slice_p.bind(c, i, i, slice_sizes=(1, 1)))(
            tgx.Spec((4, 3)), tgx.Spec((), "float32"))
    with pytest.raises(tgx.DTypeError, match="start indices must be integer scalars"):
        lax.dynamic_slice(np.zeros((4, 3)), (0.5, 0), (1, 1))
    with pytest.raises(tgx.ShapeError, match=r"2 start indices for the rank-3 operand"):
        lax.dynamic_slice(np.zeros((4, 3, 2)), (0, 0), (1, 1, 1))
    with pytest.raises(tgx.ShapeError, match=r"slice_sizes \(5, 1\) do not fit"):
        lax.dynamic_slice(np.zeros((4, 3)), (0, 0), (5, 1))


# -- clamping: a property test against jax.lax ------------------------------------------------

@st.composite
def windows(draw):
    rank = draw(st.integers(1, 3))
    shape = tuple(draw(st.integers(1, 5)) for _ in range(rank))
    sizes = tuple(draw(st.integers(0, d)) for d in shape)
    starts = tuple(draw(st.integers(-8, 8)) for _ in shape)
    return shape, sizes, starts


@given(windows())
def test_dynamic_slice_and_update_clamp_like_jax(case):
    jlax = pytest.importorskip("jax").lax
    from tgx.backends.numpy_backend import numpy_dynamic_update_slice_inplace

    shape, sizes, starts = case
    x = np.arange(np.prod(shape), dtype=np.int32).reshape(shape)
    u = -1 - np.arange(np.prod(sizes), dtype=np.int32).reshape(sizes)
    idx = tuple(np.int32(s) for s in starts)
    np.testing.assert_array_equal(lax.dynamic_slice(x, idx, sizes),
                                  np.asarray(jlax.dynamic_slice(x, idx, sizes)))
    expect = np.asarray(jlax.dynamic_update_slice(x, u, idx))
    np.testing.assert_array_equal(lax.dynamic_update_slice(x, u, idx), expect)
    buf = x.copy()
    assert numpy_dynamic_update_slice_inplace(buf, u, *idx) is buf
    np.testing.assert_array_equal(buf, expect)


def test_measured_policy_keeps_the_inplace_update(tmp_path):
    store = tgx.BenchmarkStore(str(tmp_path / "store.json"))
    f = tgx.compile(_step, state="cache", backends=["numpy"], store=store)   # "fastest"
    cache = np.zeros((4, 3), np.float32)
    for pos in range(2):
        _, new = f(cache, np.full(3, pos + 1.0, np.float32), np.int32(pos))
        assert new is cache
    np.testing.assert_array_equal(cache[:, 0], [1, 2, 0, 0])
    plan = f.lower(cache, np.ones(3, np.float32), np.int32(0))
    assert "dynamic_update_slice[inplace]@numpy" in labels(plan)


# -- elementwise updates written straight into the state buffer ---------------------------------

NOT_JAX = [b for b in BACKENDS if b.values[0] != "jax"]


@pytest.mark.parametrize("backend", NOT_JAX)
def test_optimizer_step_writes_its_update_into_the_state(backend):
    """Adam's new params and moments are elementwise ops of the old ones: each runs with the
    caller's array (or its zero-copy torch view) as its output, so no leaf is copied (on
    torch, `adam_update` writes a parameter and its two moments)."""
    from tgx import optim

    rng = np.random.default_rng(0)
    params = {"w": rng.standard_normal((8, 4)).astype(np.float32),
              "b": np.zeros(4, np.float32)}
    x = rng.standard_normal((16, 8)).astype(np.float32)
    y = rng.standard_normal((16, 4)).astype(np.float32)
    opt = optim.adam(1e-2)

    def step(p, s, x, y):
        v, g = tgx.value_and_grad(lambda p: tnp.mean((x @ p["w"] + p["b"] - y) ** 2))(p)
        u, s = opt.update(g, s, p)
        return v, (optim.apply_updates(p, u), s)

    f = tgx.compile(step, state=("p", "s"), backends=[backend], policy="heuristic")
    ref = tgx.compile(step, backends=["numpy"], policy="heuristic")   # new arrays each call
    s = opt.init(params)
    p_ref, s_ref = {k: v.copy() for k, v in params.items()}, opt.init(params)
    w_obj = params["w"]
    for _ in range(4):
        loss, (params, s) = f(params, s, x, y)
        loss_ref, (p_ref, s_ref) = ref(p_ref, s_ref, x, y)
        np.testing.assert_allclose(loss, loss_ref, rtol=1e-6)
    assert params["w"] is w_obj
    for got, want in zip(tgx.tree_flatten((params, s))[0], tgx.tree_flatten((p_ref, s_ref))[0]):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
    cg = f.lower(params, s, x, y).compiled
    assert not any(copy for _, _, copy in cg.state), cg.state_reasons
    # one instruction per leaf, or on torch one fused Adam kernel per parameter for three
    into = [i for i in cg.instructions if "[into state]" in i.label]
    assert sum(len(i.outs) for i in into) == len(cg.state)


def _old_and_new(s, x):
    """Readers of the old state before and after (in program order) its elementwise update."""
    before = tnp.sum(s, axis=0)
    new = s * 0.5 + x
    after = s.T @ x                          # reads the old s after the update was traced
    return (before, after), new


@pytest.mark.parametrize("backend", NOT_JAX)
def test_readers_of_the_old_state_run_before_the_elementwise_write(backend):
    f = tgx.compile(_old_and_new, state="s", policy="heuristic", backends=[backend])
    s = np.arange(12, dtype=np.float32).reshape(4, 3)
    x = np.full((4, 3), 10, np.float32)
    old = s.copy()
    (before, after), new = f(s, x)
    assert new is s
    np.testing.assert_allclose(before, old.sum(0))
    np.testing.assert_allclose(after, old.T @ x)
    np.testing.assert_allclose(s, old * 0.5 + x)
    assert any("[into state]" in i.label for i in f.lower(s, x).compiled.instructions)


def test_elementwise_update_reading_a_view_of_the_state_is_copied():
    def f(s):
        return tnp.sum(s), s + s.T           # reads the state transposed while writing it

    g = tgx.compile(f, state="s", policy="heuristic", backends=["numpy"])
    s = np.arange(9, dtype=np.float32).reshape(3, 3)
    old = s.copy()
    _, new = g(s)
    assert new is s
    np.testing.assert_array_equal(s, old + old.T)
    cg = g.lower(s).compiled
    assert cg.state[0][2] and "view of the state" in cg.state_reasons[0]


def test_elementwise_update_of_a_broadcast_result_is_copied():
    def f(s, x):
        return tnp.sum(x), s[:1] + x          # shape (1, 3) + (4, 3): not s's own window

    g = tgx.compile(f, state="s", policy="heuristic", backends=["numpy"])
    s = np.arange(12, dtype=np.float32).reshape(4, 3)
    x = np.ones((4, 3), np.float32)
    old = s.copy()
    g(s, x)
    np.testing.assert_array_equal(s, old[:1] + x)


@st.composite
def state_programs(draw):
    """A few elementwise steps over (s, x) and the old-state readers around them."""
    ops = draw(st.lists(st.sampled_from(["add_x", "mul_s", "sub_s", "scale", "neg", "max_x"]),
                        min_size=1, max_size=4))
    readers = draw(st.lists(st.sampled_from(["sum", "row", "matmul"]), max_size=3))
    return ops, readers


def _apply(ops, readers, s, x, lib):
    outs = []
    v = s
    for i, op in enumerate(ops):
        v = {"add_x": lambda v: v + x, "mul_s": lambda v: v * s, "sub_s": lambda v: v - s,
             "scale": lambda v: v * 0.25, "neg": lambda v: -v,
             "max_x": lambda v: lib.maximum(v, x)}[op](v)
        if i < len(readers):
            r = readers[i]
            outs.append({"sum": lambda: lib.sum(s, axis=1), "row": lambda: s[1] * 1.0,
                         "matmul": lambda: s @ x.T}[r]())
    return tuple(outs), v


@pytest.mark.parametrize("backend", NOT_JAX)
@given(state_programs())
def test_elementwise_state_updates_match_numpy(backend, prog):
    ops, readers = prog
    f = tgx.compile(lambda s, x: _apply(ops, readers, s, x, tnp), state="s",
                    policy="heuristic", backends=[backend])
    rng = np.random.default_rng(len(ops) * 7 + len(readers))
    s = rng.standard_normal((4, 3)).astype(np.float32)
    x = rng.standard_normal((4, 3)).astype(np.float32)
    want_outs, want = _apply(ops, readers, s.copy(), x, np)
    outs, new = f(s, x)
    assert new is s
    np.testing.assert_allclose(s, want, rtol=1e-6, atol=1e-6)
    for got, exp in zip(outs, want_outs):
        np.testing.assert_allclose(got, exp, rtol=1e-5, atol=1e-5)


# -- jax arrays as state: immutable, so the new value comes back as a new array -----------------

@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kind", ["elementwise", "window"])
@pytest.mark.parametrize("donate", [False, True])
def test_jax_array_state_is_returned_not_written(backend, kind, donate):
    jnp = pytest.importorskip("jax.numpy")
    import jax

    def step(c, x, pos):
        if kind == "window":
            return x.sum(), lax.dynamic_update_slice(c, x[None], (pos, 0))
        return x.sum(), c * 0.5 + x

    f = tgx.compile(step, state="c", policy="heuristic", backends=[backend], donate=donate)
    c0 = np.arange(12, dtype=np.float32).reshape(4, 3)
    c = jnp.asarray(c0)
    want = c0.copy()
    for pos in range(3):
        x = np.full(3, pos + 1, np.float32)
        total, new = f(c, jnp.asarray(x), np.int32(pos))
        assert isinstance(new, jax.Array) and isinstance(total, jax.Array)
        if donate and backend == "jax":   # one XLA call reads it: XLA took its buffer
            assert c.is_deleted()
        else:
            np.testing.assert_array_equal(np.asarray(c), want)  # the argument is untouched
        if kind == "window":
            want[pos] = x
        else:
            want = want * 0.5 + x
        np.testing.assert_allclose(np.asarray(new), want, rtol=1e-6)
        c = new
    assert f.trace_count == 1


def test_a_numpy_view_of_a_jax_array_converts_back_to_that_array():
    jax = pytest.importorskip("jax")
    from tgx.backends import get_backend

    jb = get_backend("jax")
    a = jax.numpy.arange(6.0).reshape(2, 3)
    view = np.asarray(a)
    assert jb.convert(view, "cpu") is a                        # no device_put
    part = jb.convert(view[1:], "cpu")                         # a slice is a new array
    assert part is not a and np.asarray(part).tolist() == [[3.0, 4.0, 5.0]]
    other = jb.convert(np.ones((2, 3), np.float32), "cpu")
    assert isinstance(other, jax.Array) and float(other.sum()) == 6.0


def test_donated_state_is_written_into_its_own_buffer():
    """Each new state leaf reuses its own leaf's buffer, whatever order the region computes
    them in (jax pairs donated arguments with results by shape, in order: left to that, a
    leaf's buffer went to another's new value, and XLA copied the leaves still to be read)."""
    jnp = pytest.importorskip("jax.numpy")

    def step(s, x):
        a, b, c = s
        c2 = c + a * x        # computed first: the new leaves in reverse order
        b2 = b * 0.5 + c2
        a2 = a - b2
        return (a2 * b2).sum(), (a2, b2, c2)

    f = tgx.compile(step, state="s", policy="heuristic", backends=["jax"])
    rng = np.random.default_rng(3)
    leaves = [rng.standard_normal((8, 16)).astype(np.float32) for _ in range(3)]
    x = jnp.asarray(rng.standard_normal((8, 16)).astype(np.float32))
    state = tuple(jnp.asarray(v) for v in leaves)
    a, b, c = leaves
    for _ in range(3):
        buffers = [v.unsafe_buffer_pointer() for v in state]
        total, state = f(state, x)
        c = c + a * np.asarray(x)
        b = b * 0.5 + c
        a = a - b
        for got, want in zip(state, (a, b, c)):
            np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(float(total), float((a * b).sum()), rtol=1e-4)
        assert [v.unsafe_buffer_pointer() for v in state] == buffers
