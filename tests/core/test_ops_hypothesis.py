"""Property tests: shape rules and values of tnp ops over random shapes, against NumPy."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import tgx
import tgx.numpy as tnp

BINARY = [(tnp.add, np.add), (tnp.subtract, np.subtract), (tnp.multiply, np.multiply),
          (tnp.maximum, np.maximum), (tnp.minimum, np.minimum), (tnp.less, np.less)]


def run(fn, *args):
    g = tgx.make_graph(fn)(*args)
    tgx.check_graph(g)
    return g, tgx.eval_graph(g, *args)


@given(hnp.mutually_broadcastable_shapes(num_shapes=2, max_dims=4, max_side=4),
       st.sampled_from(BINARY), st.integers(0, 2**31))
def test_binary_broadcasting_matches_numpy(shapes, op, seed):
    rng = np.random.default_rng(seed)
    a, b = (rng.standard_normal(s).astype(np.float32) for s in shapes.input_shapes)
    g, out = run(op[0], a, b)
    expected = op[1](a, b)
    assert g.out_avals[0].shape == expected.shape
    np.testing.assert_array_equal(out, expected)


@given(hnp.array_shapes(min_dims=1, max_dims=4, max_side=5), st.data())
def test_reductions_over_random_axes(shape, data):
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float64)
    axes = data.draw(st.lists(st.integers(0, len(shape) - 1), unique=True, max_size=len(shape)))
    axis = tuple(axes) if axes else None
    keepdims = data.draw(st.booleans())
    for t, n in [(tnp.sum, np.sum), (tnp.max, np.max), (tnp.mean, np.mean)]:
        g, out = run(lambda x, t=t: t(x, axis=axis, keepdims=keepdims), x)
        expected = n(x, axis=axis, keepdims=keepdims)
        assert tuple(g.out_avals[0].shape) == expected.shape
        np.testing.assert_allclose(out, expected, rtol=1e-12)


@given(hnp.array_shapes(min_dims=1, max_dims=4, max_side=4), st.data())
def test_reshape_with_minus_one_and_symbolic_leading_dim(shape, data):
    size = int(np.prod(shape))
    divisors = [d for d in range(1, size + 1) if size % d == 0]
    last = data.draw(st.sampled_from(divisors))
    x = np.arange(size, dtype=np.float32).reshape(shape)
    g, out = run(lambda x: x.reshape(-1, last), x)
    np.testing.assert_array_equal(out, x.reshape(-1, last))
    # The same reshape with the leading dim symbolic gives N * (size / shape[0]) / last rows.
    rest = size // shape[0]
    if rest % last == 0:
        gs = tgx.make_graph(lambda x: x.reshape(-1, last))(
            tgx.Spec(("N",) + tuple(shape[1:]), "float32"))
        for n in (1, 3):
            xn = np.arange(n * rest, dtype=np.float32).reshape((n,) + tuple(shape[1:]))
            np.testing.assert_array_equal(tgx.eval_graph(gs, xn), xn.reshape(-1, last))


slice_st = st.builds(slice, st.none() | st.integers(-6, 6), st.none() | st.integers(-6, 6),
                     st.none() | st.sampled_from([1, 2, 3, -1, -2]))


@given(hnp.array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=5), st.data())
def test_basic_indexing_matches_numpy(shape, data):
    x = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape)
    key = tuple(data.draw(slice_st | st.integers(-shape[i], shape[i] - 1))
                for i in range(data.draw(st.integers(1, len(shape)))))
    g, out = run(lambda x: x[key], x)
    np.testing.assert_array_equal(out, x[key])
    assert tuple(g.out_avals[0].shape) == x[key].shape


@given(st.lists(st.integers(1, 4), min_size=1, max_size=3), st.integers(0, 2), st.data())
def test_concatenate_sums_symbolic_sizes(sizes, axis_seed, data):
    arrays = [np.full((n, 2), i, np.float32) for i, n in enumerate(sizes)]
    names = [f"S{i}" for i in range(len(sizes))]
    g = tgx.make_graph(lambda *xs: tnp.concatenate(xs, axis=0))(
        *[tgx.Spec((n, 2)) for n in names])
    assert str(g.out_avals[0].shape[0]) == str(sum(tgx.shapes.sym(n) for n in names))
    np.testing.assert_array_equal(tgx.eval_graph(g, *arrays), np.concatenate(arrays))
