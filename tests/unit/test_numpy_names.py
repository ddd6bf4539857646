"""The NumPy and torch names users reach for: each new `tgx.numpy` name against NumPy (values
and dtypes), traced and eager; `tgx.numpy` exporting only public names; eager calls promoting
exactly as traced code; `tgx.nn`'s torch signatures (softmax dtype=, dropout's argument order,
input= and inplace=) and torch's Tracer methods against torch."""

from __future__ import annotations

import inspect
import itertools
import warnings

import numpy as np
import pytest

import tgx
import tgx.nn as tnn
import tgx.numpy as tnp

torch = pytest.importorskip("torch")


def both(fn, *arrays):
    """`fn(*arrays)` eagerly and traced (evaluated on the same arrays); checks that the two
    agree in dtype and shape, and returns the eager result."""
    eager = np.asarray(fn(*arrays))
    g = tgx.make_graph(fn)(*[tgx.Spec(a.shape, a.dtype) for a in arrays])
    traced = np.asarray(tgx.eval_graph(g, *arrays))
    assert g.out_avals[0].dtype == eager.dtype == traced.dtype
    assert eager.shape == traced.shape
    np.testing.assert_array_equal(eager, traced)
    return eager


def check(got, want, rtol=0.0, atol=0.0):
    want = np.asarray(want)
    assert got.dtype == want.dtype, (got.dtype, want.dtype)
    assert got.shape == want.shape, (got.shape, want.shape)
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol, equal_nan=True)


SPECIAL = np.array([0.0, -0.0, 1.5, -2.0, np.inf, -np.inf, np.nan, 1e-30], np.float32)


# ---------------------------------------------------------------------------------------------
# Floating-point classes, logarithms and powers


@pytest.mark.parametrize("name", ["isnan", "isinf", "isfinite"])
@pytest.mark.parametrize("x", [SPECIAL, SPECIAL.astype(np.float16), SPECIAL.astype(np.float64),
                               np.array([1, -2, 0], np.int32), np.array([True, False])],
                         ids=["f32", "f16", "f64", "i32", "bool"])
def test_float_classes(name, x):
    check(both(getattr(tnp, name), x), getattr(np, name)(x))


@pytest.mark.parametrize("name", ["log2", "log10", "exp2"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
def test_log_and_exp_bases(name, dtype):
    x = np.array([1.0, 2.0, 8.0, 0.5, 10.0, 1000.0, 3.7, 1e-3], dtype)
    if name == "exp2":
        x = np.array([0.0, 1.0, 3.0, -1.0, -10.0, 0.5, 7.25, 12.0], dtype)
    rtol = {np.float16: 1e-3, np.float32: 2e-7, np.float64: 1e-15}[dtype]
    check(both(getattr(tnp, name), x), getattr(np, name)(x), rtol=rtol)


def test_exp2_is_exact_at_integers_and_logs_of_ints_are_float():
    check(both(tnp.exp2, np.arange(-5, 20, dtype=np.float32)),
          np.exp2(np.arange(-5, 20, dtype=np.float32)))
    assert both(tnp.log2, np.array([1, 2, 4], np.int32)).dtype == np.float32  # jax.numpy's
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        check(both(tnp.log10, np.array([0.0, -1.0], np.float32)),
              np.log10(np.array([0.0, -1.0], np.float32)))


# ---------------------------------------------------------------------------------------------
# Creation


@pytest.mark.parametrize("kw", [
    dict(start=0.0, stop=1.0, num=5),
    dict(start=-3.0, stop=7.0, num=11, endpoint=False),
    dict(start=2.0, stop=-1.0, num=7),
    dict(start=1.0, stop=2.0, num=1),
    dict(start=1.0, stop=2.0, num=0),
    dict(start=0.0, stop=1.0, num=50),
])
def test_linspace_scalars(kw):
    got = tnp.linspace(**kw)
    check(np.asarray(got), np.linspace(**kw, dtype=np.float32), rtol=1e-6, atol=1e-7)
    g = tgx.make_graph(lambda: tnp.linspace(**kw))()
    check(tgx.eval_graph(g), np.linspace(**kw, dtype=np.float32), rtol=1e-6, atol=1e-7)


def test_linspace_arrays_axis_dtypes_and_step():
    lo = np.array([0.0, 1.0, -2.0], np.float32)
    hi = np.array([1.0, 3.0, 4.0], np.float32)
    for axis in (0, 1, -1):
        check(both(lambda a, b, axis=axis: tnp.linspace(a, b, 5, axis=axis), lo, hi),
              np.linspace(lo, hi, 5, axis=axis), rtol=1e-6, atol=1e-7)
    check(both(lambda a: tnp.linspace(a, 10.0, 4), np.array(0.0)), np.linspace(0.0, 10.0, 4))
    check(np.asarray(tnp.linspace(0, 10, 4, dtype=np.int32)),
          np.linspace(0, 10, 4, dtype=np.int32))
    check(np.asarray(tnp.linspace(-5, 5, 7, dtype=np.int64)),
          np.linspace(-5, 5, 7, dtype=np.int64))
    check(np.asarray(tnp.linspace(0, 1, 5, dtype=np.float16)),
          np.linspace(0, 1, 5, dtype=np.float16))
    y, step = tnp.linspace(0.0, 1.0, 4, endpoint=False, retstep=True)
    _, want = np.linspace(0.0, 1.0, 4, endpoint=False, retstep=True)
    assert float(step) == pytest.approx(want)


@pytest.mark.parametrize("k", [0, 1, 2, -1, -3])
def test_diag_builds_and_extracts(k):
    v = np.array([1.5, -2.0, 3.0], np.float32)
    check(both(lambda x: tnp.diag(x, k), v), np.diag(v, k))
    m = np.arange(20, dtype=np.int32).reshape(4, 5)
    check(both(lambda x: tnp.diag(x, k), m), np.diag(m, k))
    check(both(lambda x: tnp.diag(x, k), m.T.copy()), np.diag(m.T, k))
    check(np.asarray(tnp.diag(m, 9)), np.diag(m, 9))     # past the corner: empty


def test_diag_of_a_symbolic_vector():
    g = tgx.make_graph(lambda v: tnp.diag(v, -1))(tgx.Spec(("N",)))
    for n in (1, 4):
        v = np.arange(1, n + 1, dtype=np.float32)
        check(tgx.eval_graph(g, v), np.diag(v, -1))


# ---------------------------------------------------------------------------------------------
# Sorting, gathering along an axis, cumulative products


def _sort_input(rng):
    x = rng.standard_normal((4, 9)).astype(np.float32)
    x[0, [2, 5]] = np.nan
    x[1, :4] = 1.0            # ties: a stable sort keeps their order
    x[2, 3], x[2, 7] = np.inf, -np.inf
    x[3, 1] = -0.0
    return x


@pytest.mark.parametrize("axis", [-1, 0, None])
def test_sort_and_argsort_match_numpy_stable(rng, axis):
    x = _sort_input(rng)
    check(both(lambda a: tnp.argsort(a, axis), x), np.argsort(x, axis, kind="stable"))
    check(both(lambda a: tnp.sort(a, axis), x), np.sort(x, axis))
    xi = rng.integers(-3, 3, (5, 6)).astype(np.int32)
    check(both(lambda a: tnp.argsort(a, axis), xi), np.argsort(xi, axis, kind="stable"))
    check(both(lambda a: tnp.sort(a, axis), xi), np.sort(xi, axis))
    xb = rng.integers(0, 2, (3, 5)).astype(bool)
    check(both(lambda a: tnp.argsort(a, axis), xb), np.argsort(xb, axis, kind="stable"))


@pytest.mark.parametrize("dim", [0, 1])
def test_descending_sort_matches_torch_stable(rng, dim):
    x = _sort_input(rng)
    values, indices = torch.sort(torch.from_numpy(x), dim=dim, descending=True, stable=True)
    check(both(lambda a: tnp.argsort(a, dim, descending=True), x), indices.numpy())
    check(both(lambda a: tnp.sort(a, dim, descending=True), x), values.numpy())


def test_sort_along_a_symbolic_axis(rng):
    g = tgx.make_graph(lambda a: (tnp.sort(a), tnp.argsort(a)))(tgx.Spec(("B", "N")))
    for shape in [(2, 5), (3, 1), (1, 12)]:
        x = rng.standard_normal(shape).astype(np.float32)
        s, i = tgx.eval_graph(g, x)
        check(s, np.sort(x))
        check(i, np.argsort(x, kind="stable"))


@pytest.mark.parametrize("axis", [0, 1, 2, -1])
def test_take_along_axis(rng, axis):
    x = rng.standard_normal((3, 4, 5)).astype(np.float32)
    n = x.shape[axis]
    shape = list(x.shape)
    shape[axis] = 6
    idx = rng.integers(-n, n, shape)
    check(both(lambda a, i: tnp.take_along_axis(a, i, axis), x, idx),
          np.take_along_axis(x, idx, axis))
    # the other axes broadcast
    shape = [1] * 3
    shape[axis] = 2
    idx = rng.integers(0, n, shape).astype(np.int32)
    check(both(lambda a, i: tnp.take_along_axis(a, i, axis), x, idx),
          np.take_along_axis(x, idx, axis))


def test_take_along_axis_flattened_and_with_argsort(rng):
    x = rng.standard_normal((3, 4)).astype(np.float32)
    idx = rng.integers(0, 12, 5)
    check(both(lambda a, i: tnp.take_along_axis(a, i, None), x, idx),
          np.take_along_axis(x, idx, None))
    top2 = both(lambda a: tnp.take_along_axis(a, tnp.argsort(a, -1)[:, -2:], -1), x)
    check(top2, np.sort(x, -1)[:, -2:])


@pytest.mark.parametrize("axis", [0, 1, None])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32, np.int64, np.bool_])
def test_cumprod(rng, axis, dtype):
    x = (rng.standard_normal((5, 11)) * 2).astype(dtype)
    if dtype == np.bool_:
        x = rng.integers(0, 4, (5, 11)) > 0
    rtol = 1e-5 if dtype == np.float32 else 1e-12
    check(both(lambda a: tnp.cumprod(a, axis), x), np.cumprod(x, axis), rtol=rtol)
    check(both(lambda a: tnp.cumprod(a, axis, dtype=np.float64), x),
          np.cumprod(x, axis, dtype=np.float64), rtol=1e-5)


def test_cumprod_along_a_symbolic_axis(rng):
    g = tgx.make_graph(lambda a: tnp.cumprod(a, axis=1))(tgx.Spec((2, "N")))
    for n in (1, 3, 8):
        x = rng.standard_normal((2, n)).astype(np.float32)
        check(tgx.eval_graph(g, x), np.cumprod(x, 1), rtol=1e-5)


# ---------------------------------------------------------------------------------------------
# Products, new axes, reshape's NumPy 2 spelling


@pytest.mark.parametrize("axes", [2, 1, 0, ([1, 2], [1, 0]), ([-1], [0]), (1, 1), ([], [])])
def test_tensordot(rng, axes):
    a = rng.standard_normal((2, 3, 4)).astype(np.float32)
    b = rng.standard_normal({2: (3, 4, 5), 1: (4, 5), 0: (2, 2), (1, 1): (3, 3, 2)}.get(
        axes if isinstance(axes, int) else tuple(axes) if axes == (1, 1) else None,
        (4, 3, 2))).astype(np.float32)
    check(both(lambda x, y: tnp.tensordot(x, y, axes), a, b), np.tensordot(a, b, axes),
          rtol=1e-5, atol=1e-5)


def test_tensordot_promotes_as_jax_numpy():
    a = np.arange(6, dtype=np.int32).reshape(2, 3)
    b = np.ones((3,), np.float32)
    # int32 with float32 is float32 in tgx (jax.numpy's lattice), float64 in NumPy
    check(both(lambda x, y: tnp.tensordot(x, y, 1), a, b),
          np.tensordot(a, b, 1).astype(np.float32))


def test_newaxis():
    assert tnp.newaxis is None
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    check(both(lambda a: a[:, tnp.newaxis, :], x), x[:, np.newaxis, :])


def test_reshape_shape_keyword():
    x = np.arange(12, dtype=np.float32)
    check(both(lambda a: tnp.reshape(a, shape=(3, -1)), x), np.reshape(x, shape=(3, -1)))
    check(both(lambda a: tnp.reshape(a, (2, 6)), x), np.reshape(x, (2, 6)))
    check(both(lambda a: tnp.reshape(a, newshape=(4, 3)), x), x.reshape(4, 3))
    check(both(lambda a: tnp.reshape(a, shape=(3, 4), copy=True), x), x.reshape(3, 4))
    with pytest.raises(tgx.ShapeError, match="missing"):
        tnp.reshape(x)


# ---------------------------------------------------------------------------------------------
# The namespace


def test_tgx_numpy_exports_only_public_names():
    public = set(tnp.__all__)
    assert set(dir(tnp)) == public
    assert len(public) == len(tnp.__all__)
    for name in public:
        assert not name.startswith("_"), name
        assert hasattr(tnp, name), name
        assert not inspect.ismodule(getattr(tnp, name)), name
    ns: dict = {}
    exec("from tgx.numpy import *", ns)
    assert set(ns) - {"__builtins__"} == public
    new = {"isnan", "isfinite", "isinf", "linspace", "sort", "argsort", "take_along_axis",
           "cumprod", "log2", "log10", "exp2", "tensordot", "diag", "newaxis"}
    assert new <= public
    for name in ["linspace", "sort", "argsort", "take_along_axis", "cumprod", "tensordot",
                 "diag", "reshape"]:   # NumPy's parameters (the first may be named otherwise)
        ours = list(inspect.signature(getattr(tnp, name)).parameters)[1:]
        theirs = set(inspect.signature(getattr(np, name)).parameters)
        assert set(ours) - {"descending", "newshape"} <= theirs, (name, ours, theirs)


# ---------------------------------------------------------------------------------------------
# Eager calls promote as traced code does


OPERANDS = {
    "i32": np.array([1, 2], np.int32), "i64": np.array([1, 2], np.int64),
    "f16": np.array([1, 2], np.float16), "bf16": np.array([1, 2], tnp.bfloat16),
    "f32": np.array([1, 2], np.float32), "f64": np.array([1.0, 2.0]),
    "bool": np.array([True, False]), "u32": np.array([1, 2], np.uint32),
    "f32_0d": np.array(2.0, np.float32), "np.float32": np.float32(2), "np.int32": np.int32(3),
    "np.float64": np.float64(2), "int": 2, "float": 2.5, "True": True,
}
BINARY = ["add", "subtract", "multiply", "divide", "power", "maximum", "floor_divide",
          "remainder", "arctan2", "logaddexp", "equal", "less", "where"]


def _traced_dtype(fn, args):
    arrays = [i for i, a in enumerate(args) if isinstance(a, (np.ndarray, np.generic))]

    def on_arrays(*xs):
        full = list(args)
        for i, x in zip(arrays, xs):
            full[i] = x
        return fn(*full)

    g = tgx.make_graph(on_arrays)(*[args[i] for i in arrays])
    return g.out_avals[0].dtype


@pytest.mark.parametrize("name", BINARY)
def test_eager_promotion_equals_traced(name):
    fn = (lambda a, b: tnp.where(True, a, b)) if name == "where" else getattr(tnp, name)
    np.seterr(all="ignore")  # 1 // False; pytest restores nothing else here, so undo below
    try:
        _check_promotion(name, fn)
    finally:
        np.seterr(all="warn")


def _check_promotion(name, fn):
    for (ka, a), (kb, b) in itertools.product(OPERANDS.items(), repeat=2):
        if not any(isinstance(v, np.ndarray) and v.ndim for v in (a, b)):
            continue
        try:
            eager = np.asarray(fn(a, b)).dtype
        except tgx.TgxError:
            with pytest.raises(tgx.TgxError):
                _traced_dtype(fn, (a, b))
            continue
        assert eager == _traced_dtype(fn, (a, b)), (name, ka, kb)


def test_eager_promotion_examples():
    i32, f16 = np.array([1, 2], np.int32), np.array([1, 2], np.float16)
    assert tnp.add(i32, np.float32(1.5)).dtype == np.float32      # a strong float32 scalar
    assert tnp.add(i32, 1.5).dtype == np.float32                  # a weak Python float
    assert tnp.multiply(f16, 2.5).dtype == np.float16             # stays half
    assert tnp.multiply(f16, np.float32(2.5)).dtype == np.float32
    assert tnp.add(i32, 1).dtype == np.int32
    assert tnp.divide(i32, 2).dtype == np.float32
    for fn, args in [(tnp.add, (i32, np.float32(1.5))), (tnp.multiply, (f16, 2.5)),
                     (tnp.divide, (i32, 2)), (tnp.exp2, (i32,)), (tnp.cumprod, (i32,))]:
        assert np.asarray(fn(*args)).dtype == _traced_dtype(fn, args)


# ---------------------------------------------------------------------------------------------
# tgx.nn: torch's signatures


ACTIVATIONS = ["relu", "relu6", "leaky_relu", "elu", "selu", "celu", "gelu", "silu", "sigmoid",
               "tanh", "softplus", "hardtanh", "hardswish", "hardsigmoid", "mish", "logsigmoid",
               "softmax", "log_softmax"]
INPLACE = ["relu", "relu6", "leaky_relu", "elu", "selu", "celu", "silu", "hardtanh",
           "hardswish", "hardsigmoid", "mish", "dropout"]


@pytest.mark.parametrize("name", ACTIVATIONS)
def test_activations_take_input_keyword(rng, name):
    x = rng.standard_normal((3, 5)).astype(np.float32)
    F = torch.nn.functional
    kw = {"dim": -1} if "softmax" in name else {}
    want = getattr(F, name)(input=torch.from_numpy(x), **kw).numpy()
    got = both(lambda a: getattr(tnn, name)(input=a, **kw), x)
    check(got, want, rtol=2e-6, atol=2e-6)
    assert list(inspect.signature(getattr(tnn, name)).parameters)[0] == "input"


@pytest.mark.parametrize("name", INPLACE)
def test_inplace_is_accepted_and_ignored(rng, name):
    x = rng.standard_normal((4,)).astype(np.float32)
    kw = {"training": False} if name == "dropout" else {}
    before = x.copy()
    out = both(lambda a: getattr(tnn, name)(a, inplace=True, **kw), x)
    np.testing.assert_array_equal(x, before)
    F = torch.nn.functional
    check(out, getattr(F, name)(torch.from_numpy(x.copy()), inplace=True, **kw).numpy(),
          rtol=2e-6, atol=2e-6)
    assert "inplace" in (getattr(tnn, name).__doc__ or "")


@pytest.mark.parametrize("name", ["softmax", "log_softmax"])
def test_softmax_dtype(rng, name):
    x = rng.standard_normal((3, 6)).astype(np.float16)
    F = torch.nn.functional
    want = getattr(F, name)(torch.from_numpy(x), 1, dtype=torch.float32).numpy()
    check(both(lambda a: getattr(tnn, name)(a, 1, dtype=np.float32), x), want, rtol=1e-6,
          atol=1e-6)
    check(both(lambda a: getattr(tnn, name)(a, dim=0, dtype=torch.float32), x),
          getattr(F, name)(torch.from_numpy(x), dim=0, dtype=torch.float32).numpy(),
          rtol=1e-6, atol=1e-6)
    assert both(lambda a: getattr(tnn, name)(a, -1), x).dtype == np.float16


def test_dropout_argument_order_is_torchs():
    x = np.ones((64,), np.float32)
    assert list(inspect.signature(tnn.dropout).parameters)[:4] == [
        "input", "p", "training", "inplace"]
    np.testing.assert_array_equal(tnn.dropout(x, 0.5, False), x)      # training, positional
    np.testing.assert_array_equal(tnn.dropout(x, 0.5, False, False), x)
    y = tnn.dropout(x, 0.25, True, key=tgx.random.key(0))
    assert set(np.unique(y)) <= {0.0, np.float32(1 / 0.75)}
    np.testing.assert_array_equal(y, tnn.dropout(x, 0.25, key=tgx.random.key(0)))
    np.testing.assert_array_equal(tnn.dropout(x, 1.0, True), np.zeros_like(x))
    with pytest.raises(tgx.OptionError, match="key"):
        tnn.dropout(x, 0.5, True)
    with pytest.raises(tgx.OptionError, match="between 0 and 1"):
        tnn.dropout(x, 1.5, False)


# ---------------------------------------------------------------------------------------------
# Tracer methods with torch's spellings


TORCH_METHODS = {
    "view": (lambda a: a.view(6, -1), lambda a: a.view(6, -1)),
    "view_tuple": (lambda a: a.view((4, 6)), lambda a: a.view((4, 6))),
    "permute": (lambda a: a.permute(3, 0, 2, 1), lambda a: a.permute(3, 0, 2, 1)),
    "permute_list": (lambda a: a.permute([2, 3, 1, 0]), lambda a: a.permute([2, 3, 1, 0])),
    "unsqueeze": (lambda a: a.unsqueeze(0), lambda a: a.unsqueeze(0)),
    "unsqueeze_neg": (lambda a: a.unsqueeze(-1), lambda a: a.unsqueeze(-1)),
    "squeeze_dim": (lambda a: a.squeeze(dim=1), lambda a: a.squeeze(dim=1)),
    "squeeze_dim_not_1": (lambda a: a.squeeze(dim=0), lambda a: a.squeeze(dim=0)),
    "squeeze_dims": (lambda a: a.squeeze(dim=(1, 2)), lambda a: a.squeeze(dim=(1, 2))),
    "sum_dim": (lambda a: a.sum(dim=2), lambda a: a.sum(dim=2)),
    "sum_dims_keepdim": (lambda a: a.sum(dim=(0, 3), keepdim=True),
                         lambda a: a.sum(dim=(0, 3), keepdim=True)),
    "mean_dim": (lambda a: a.mean(dim=-1), lambda a: a.mean(dim=-1)),
    "prod_dim": (lambda a: a.prod(dim=3), lambda a: a.prod(dim=3)),
    "argmax_dim": (lambda a: a.argmax(dim=2, keepdim=True),
                   lambda a: a.argmax(dim=2, keepdim=True)),
    "cumsum_dim": (lambda a: a.cumsum(dim=3), lambda a: a.cumsum(dim=3)),
}


@pytest.mark.parametrize("name", list(TORCH_METHODS))
def test_tracer_methods_with_torch_spelling(rng, name):
    ours, theirs = TORCH_METHODS[name]
    x = rng.standard_normal((2, 1, 3, 4)).astype(np.float32)
    g = tgx.make_graph(ours)(tgx.Spec(x.shape))
    check(tgx.eval_graph(g, x), theirs(torch.from_numpy(x)).numpy(), rtol=1e-6, atol=1e-6)


def test_tracer_method_errors():
    with pytest.raises(tgx.ShapeError):     # NumPy's squeeze(axis) still checks the size
        tgx.make_graph(lambda a: a.squeeze(0))(tgx.Spec((2, 1)))
    with pytest.raises(tgx.OptionError, match="not both"):
        tgx.make_graph(lambda a: a.sum(axis=0, dim=0))(tgx.Spec((2, 1)))
    with pytest.raises(tgx.TgxError, match="astype"):
        tgx.make_graph(lambda a: a.view(np.int32))(tgx.Spec((2, 1)))
