"""NumPy kernels that differ from the obvious NumPy call for speed on small or masked arrays:
`select` by bit masks, reductions and softmaxes over a short last axis a column at a time,
`broadcast_in_dim` as a view built directly, `convert_element_type`'s common case. Each
against NumPy's own call (bit for bit where the kernel promises it) or float64."""

from __future__ import annotations

import hypothesis.strategies as st
import numpy as np
import pytest
from hypothesis import given, settings

import tgx
import tgx.nn as tnn
from tgx.backends.numpy_backend import (SELECT_BITS_MIN, numpy_reduce_sum,
                                        numpy_reduce_sum_out, numpy_select)
from tgx.backends.numpy_library import (SHORT_AXIS, SHORT_EXTREMA_AXIS, last_axis_reduce,
                                        numpy_log_softmax, numpy_softmax, short_last_axis)
from tgx.backends.registry import kernels_for
from tgx.primitives.elementwise import _cast_impl
from tgx.primitives.movement import _bid_impl

SPECIAL = np.array([np.nan, np.inf, -np.inf, -0.0, 0.0, 1e-45, -3.5, 2.0])


def _bits(a):
    a = np.asarray(a)
    return a.view({4: np.int32, 8: np.int64}[a.dtype.itemsize]) if a.dtype.kind == "f" else a


@settings(max_examples=60, deadline=None)
@given(shape=st.lists(st.integers(1, 70), min_size=0, max_size=3).map(tuple),
       dtype=st.sampled_from([np.float32, np.float64, np.int32]),
       t_kind=st.sampled_from(["array", "zero", "-zero", "nan", "row"]),
       f_kind=st.sampled_from(["array", "zero", "-zero", "nan", "row"]),
       mask_kind=st.sampled_from(["full", "row", "scalar"]), into=st.booleans(),
       seed=st.integers(0, 2**16))
def test_select_is_np_where_bit_for_bit(shape, dtype, t_kind, f_kind, mask_kind, into, seed):
    """Every value (NaN, ±inf, -0.0, denormals) comes out as `np.where` gives it, for array
    and scalar branches, broadcast masks and branches, into a given buffer or a fresh one;
    below and above `SELECT_BITS_MIN`."""
    rng = np.random.default_rng(seed)

    def branch(kind):
        if kind == "array":
            return rng.choice(SPECIAL, shape).astype(dtype) if dtype != np.int32 else \
                rng.integers(-9, 9, shape).astype(dtype)
        if kind == "row":
            return (rng.standard_normal(shape[-1:]) * 4).astype(dtype)
        value = {"zero": 0.0, "-zero": -0.0, "nan": np.nan}[kind]
        return np.asarray(value if dtype != np.int32 else 0, dtype)

    t, f = branch(t_kind), branch(f_kind)
    pred = {"full": lambda: rng.random(shape) < 0.5, "row": lambda: rng.random(shape[-1:]) < 0.5,
            "scalar": lambda: np.asarray(rng.random() < 0.5)}[mask_kind]()
    want = np.where(pred, t, f)
    out = np.empty(want.shape, dtype) if into else None
    got = numpy_select(pred, t, f, out)
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(_bits(got), _bits(want))
    if into:
        assert got is out


def test_select_takes_the_bit_mask_path_above_its_threshold():
    """A (256, 64) ReLU gradient with a random mask (np.where: ~48 us, the mask: ~5) and two
    array branches above `SELECT_BITS_MIN` elements: the same bits either way."""
    rng = np.random.default_rng(1)
    x = rng.standard_normal((256, 64)).astype(np.float32)
    y = rng.standard_normal((256, 64)).astype(np.float32)
    assert x.size >= SELECT_BITS_MIN
    for t, f in ((x, np.asarray(np.float32(0))), (x, y), (np.asarray(np.float32(0)), y)):
        np.testing.assert_array_equal(_bits(numpy_select(x > 0, t, f)),
                                      _bits(np.where(x > 0, t, f)))


@settings(max_examples=40, deadline=None)
@given(lead=st.lists(st.integers(1, 9), min_size=0, max_size=2).map(tuple),
       n=st.integers(1, 9), dtype=st.sampled_from([np.float32, np.float64]),
       seed=st.integers(0, 2**16))
def test_sums_over_a_short_last_axis_are_np_sum_bit_for_bit(lead, n, dtype, seed):
    """Summed a column at a time, left to right: NumPy's own order for fewer than 8 terms,
    so the same bits (and NumPy's call itself beyond `SHORT_AXIS`)."""
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((*lead, n)) * rng.exponential(100, (*lead, n))).astype(dtype)
    axes = (x.ndim - 1,)
    want = np.sum(x, axis=axes, dtype=dtype)
    np.testing.assert_array_equal(numpy_reduce_sum(x, axes=axes), want)
    out = np.empty(want.shape, dtype)
    assert numpy_reduce_sum_out(x, axes=axes, out=out) is out
    np.testing.assert_array_equal(out, want)
    if short_last_axis(x, axes):
        assert x.ndim > 1 and 2 <= n <= SHORT_AXIS
        np.testing.assert_array_equal(last_axis_reduce(np.maximum, x), x.max(-1))


@settings(max_examples=40, deadline=None)
@given(lead=st.lists(st.integers(1, 70), min_size=1, max_size=2).map(tuple),
       n=st.integers(1, 20), dtype=st.sampled_from([np.float32, np.float64]),
       nans=st.booleans(), seed=st.integers(0, 2**16))
def test_extrema_over_a_short_last_axis_are_nps(lead, n, dtype, nans, seed):
    """reduce_max / reduce_min on NumPy: over a last axis up to `SHORT_EXTREMA_AXIS` long
    (with rows enough) a column at a time, the same values as `np.max` / `np.min`, NaN
    included (of -0.0 and 0.0 either may come out, in NumPy's own reductions too)."""
    rng = np.random.default_rng(seed)
    x = rng.choice(SPECIAL if nans else SPECIAL[3:], (*lead, n)).astype(dtype)
    x += rng.standard_normal(x.shape).astype(dtype) * (np.isfinite(x) & (x != 0))
    axes = (x.ndim - 1,)
    for name, ref in (("reduce_max", np.max), ("reduce_min", np.min)):
        (k,) = kernels_for(name, "numpy")
        np.testing.assert_array_equal(k.fn(x, axes=axes), ref(x, axis=axes))
        if x.ndim > 1:   # another axis: NumPy's own reduction
            np.testing.assert_array_equal(k.fn(x, axes=(0,)), ref(x, axis=0))
    fast = short_last_axis(x, axes, SHORT_EXTREMA_AXIS)
    assert fast == (len(lead) >= 1 and 2 <= n <= SHORT_EXTREMA_AXIS
                    and x.size >= 16 * n * (n - 1))


@settings(max_examples=40, deadline=None)
@given(lead=st.lists(st.integers(1, 9), min_size=1, max_size=2).map(tuple),
       n=st.integers(1, 7), axis_last=st.booleans(),
       dtype=st.sampled_from([np.float32, np.float64]),
       scale=st.sampled_from([1.0, 30.0, 1e3]), seed=st.integers(0, 2**16))
def test_softmax_and_log_softmax_match_float64(lead, n, axis_last, dtype, scale, seed):
    """The library kernels (a short last axis a column at a time, else the reference's
    formula) against float64, with logits far apart and a -inf."""
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((*lead, n)) * scale).astype(dtype)
    x.flat[0] = -np.inf
    axis = x.ndim - 1 if axis_last else 0
    x64 = x.astype(np.float64)
    s = x64 - x64.max(axis, keepdims=True)
    lse = np.log(np.exp(s).sum(axis, keepdims=True))
    tol = dict(rtol=1e-5 if dtype == np.float32 else 1e-12,
               atol=1e-6 if dtype == np.float32 else 1e-14)
    got = numpy_softmax(x, axis=axis)
    assert got.dtype == dtype
    np.testing.assert_allclose(got, np.exp(s - lse), **tol)
    got = numpy_log_softmax(x, axis=axis)
    assert got.dtype == dtype
    finite = np.isfinite(s)
    big = float(np.abs(s[finite]).max()) if finite.any() else 1.0
    np.testing.assert_allclose(got[finite], (s - lse)[finite],
                               **{**tol, "atol": tol["atol"] * max(1.0, big)})
    assert np.all(got[np.isneginf(s)] == -np.inf)
    assert np.all(np.isnan(got[np.isnan(s)]))   # a row of -inf alone


def test_a_classifiers_loss_and_gradient_on_numpy_use_the_short_axis_kernels():
    """A 2-class cross-entropy and its gradient compiled for NumPy run `log_softmax[library]`
    and the short-axis sums, and match float64."""
    rng = np.random.default_rng(0)
    logits = rng.standard_normal((256, 2)).astype(np.float32)
    labels = rng.integers(0, 2, 256)
    f = tgx.compile(tgx.value_and_grad(lambda z, y: tnn.cross_entropy(z, y)),
                    backends=["numpy"])
    z64 = logits.astype(np.float64)
    e = np.exp(z64 - z64.max(1, keepdims=True))
    p = e / e.sum(1, keepdims=True)
    rows = np.arange(256)
    value, grad = f(logits, labels)
    np.testing.assert_allclose(value, np.mean(-np.log(p[rows, labels])), rtol=1e-6)
    onehot = np.zeros_like(p)
    onehot[rows, labels] = 1
    np.testing.assert_allclose(grad, (p - onehot) / 256, rtol=1e-5, atol=1e-9)
    assert any("log_softmax[library]" in i.label
               for i in f.lower(logits, labels).compiled.instructions)


@pytest.mark.parametrize("shape, dims, target", [
    ((256, 1), (0, 1), (256, 2)), ((1,), (0,), (256,)), ((), (), (3, 4)),
    ((2, 3), (1, 2), (4, 2, 3)), ((2, 3), (0, 2), (2, 5, 3)), ((0, 3), (1, 2), (4, 0, 3))])
def test_broadcast_in_dim_is_np_broadcast_to(shape, dims, target):
    x = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape)
    expanded = [1] * len(target)
    for i, d in enumerate(dims):
        expanded[d] = shape[i]
    want = np.broadcast_to(x.reshape(expanded), target)
    got = _bid_impl(x, shape=target, broadcast_dimensions=dims)
    np.testing.assert_array_equal(got, want)
    assert got.shape == target and not got.flags.writeable
    # a non-contiguous operand goes through np.broadcast_to
    if x.ndim == 2 and x.size:
        xt = np.asfortranarray(x)[:, ::-1]
        np.testing.assert_array_equal(_bid_impl(xt, shape=target, broadcast_dimensions=dims),
                                      np.broadcast_to(xt.reshape(expanded), target))


@pytest.mark.parametrize("src", [np.bool_, np.int32, np.int64, np.float64, np.float32])
@pytest.mark.parametrize("dst", [np.float32, np.float64, np.float16])
def test_casts_to_float_are_numpys(src, dst):
    x = np.array([0, 1, -3, 7], src) if src is not np.bool_ else np.array([0, 1, 1, 0], bool)
    got = _cast_impl(x, new_dtype=np.dtype(dst))
    assert got.dtype == dst
    np.testing.assert_array_equal(got, x.astype(dst))
