"""`tgx.vmap` against a Python loop over the examples whose results are stacked with np.stack.

Every case runs eagerly (NumPy under the batch trace) and traced (`tgx.make_graph` of the
vmapped function, checked, then evaluated), for several `in_axes` / `out_axes`.
"""

from __future__ import annotations

import dataclasses
import importlib
import pathlib
import zlib
from collections.abc import Callable

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tgx
import tgx.lax as tlax
import tgx.nn as tnn
import tgx.numpy as tnp
import tgx.primitives as P
from tgx.core import PRIMITIVES, Primitive
from tgx.errors import OptionError, ShapeError, TgxError, Unsupported
from tgx.primitives.transfer import copy_to
from tgx.shapes import bfloat16, float16, float32, float64, int32
from tgx.transforms.evaluate import eval_graph
from tgx.transforms.vmap import BatchTracer, vmap

TOL = {float64: (1e-9, 1e-11), float32: (1e-5, 1e-5), float16: (5e-3, 5e-3),
       bfloat16: (3e-2, 3e-2)}
B = 3


def _take(a, i, ax):
    return a if ax is None else np.take(a, i, axis=ax)


def loop(f: Callable, args, in_axes, out_axes=0):
    """The reference: `f` on each example (eager tgx on NumPy), stacked along `out_axes`."""
    size = next(np.shape(a)[ax] for a, ax in zip(args, in_axes) if ax is not None)
    outs = [f(*[_take(a, i, ax) for a, ax in zip(args, in_axes)]) for i in range(size)]
    leaves = [tgx.tree_flatten(o)[0] for o in outs]
    _, tree = tgx.tree_flatten(outs[0])
    axes = list(out_axes) if isinstance(out_axes, (tuple, list)) else [out_axes] * len(leaves[0])
    return tgx.tree_unflatten(tree, [np.stack([np.asarray(ls[k]) for ls in leaves], axis=ax)
                                     for k, ax in enumerate(axes)])


def assert_close(actual, expected, what=""):
    a_l, a_tree = tgx.tree_flatten(actual)
    e_l, e_tree = tgx.tree_flatten(expected)
    assert len(a_l) == len(e_l), what
    for a, e in zip(a_l, e_l):
        a, e = np.asarray(a), np.asarray(e)
        assert a.shape == e.shape, f"{what}: shape {a.shape} vs loop {e.shape}"
        assert a.dtype == e.dtype, f"{what}: dtype {a.dtype} vs loop {e.dtype}"
        if a.dtype.kind in "biu":
            np.testing.assert_array_equal(a, e, err_msg=what)
        else:
            rtol, atol = TOL[e.dtype]
            np.testing.assert_allclose(a.astype(np.float64), e.astype(np.float64), rtol=rtol,
                                       atol=atol, equal_nan=True, err_msg=what)


def check(f, args, in_axes, out_axes=0, traced=True, what=""):
    """vmap(f) eagerly and traced against the loop."""
    with np.errstate(all="ignore"):
        expected = loop(f, args, in_axes, out_axes)
        assert_close(vmap(f, tuple(in_axes), out_axes)(*args), expected, f"{what} (eager)")
        if traced:
            g = tgx.make_graph(vmap(f, tuple(in_axes), out_axes))(*args)
            tgx.check_graph(g)
            assert_close(eval_graph(g, *args), expected, f"{what} (traced)")
    return expected


# ---------------------------------------------------------------------------------------------
# Every atomic primitive, bound directly: per-example arguments drawn B times and stacked


def normal(*shape, dtype=float32):
    return lambda rng: rng.standard_normal(shape).astype(dtype)


def positive(*shape):
    return lambda rng: (np.abs(rng.standard_normal(shape)) + 0.5).astype(float32)


def ints(lo, hi, *shape, dtype=int32):
    return lambda rng: rng.integers(lo, hi, shape).astype(dtype)


def bools(*shape):
    return lambda rng: rng.random(shape) > 0.5


@dataclasses.dataclass
class Case:
    prim: str                 # the atomic primitive the case exercises
    fn: Callable              # per-example function
    args: tuple               # one draw(rng) -> per-example array per argument
    name: str = ""

    def __repr__(self):
        return self.name or self.prim


def bind(name, **params):
    return lambda *xs: PRIMITIVES[name].bind(*xs, **params)


CASES: list[Case] = []
for _n in ["neg", "exp", "sin", "cos", "atan", "erf", "floor", "round", "copy"]:
    CASES.append(Case(_n, bind(_n), (normal(3, 4),)))
for _n in ["log", "sqrt"]:
    CASES.append(Case(_n, bind(_n), (positive(3, 4),)))
CASES += [
    Case("not", bind("not"), (ints(-9, 9, 3, 4),)),
    Case("not", bind("not"), (bools(4),), "not[bool]"),
    Case("convert_element_type", bind("convert_element_type", new_dtype=np.dtype(int32),
                                      weak_type=False), (normal(3, 4),)),
    Case("copy_to", lambda x: copy_to(x, backend="numpy"), (normal(2, 3),)),
]
for _n in ["add", "sub", "mul", "max", "min"]:
    CASES.append(Case(_n, bind(_n), (normal(2, 1, 4), normal(3, 4))))
CASES += [
    Case("add", bind("add"), (normal(3, 4), normal()), "add[scalar]"),
    Case("div", bind("div"), (normal(2, 1, 4), positive(3, 4))),
    Case("div", bind("div"), (ints(-20, 20, 4), ints(1, 5, 4)), "div[int]"),
    Case("pow", bind("pow"), (positive(3, 4), normal(4))),
]
for _n in ["and", "or", "xor"]:
    CASES.append(Case(_n, bind(_n), (ints(0, 64, 3, 4), ints(0, 64, 4))))
CASES += [
    Case("shift_left", bind("shift_left"), (ints(0, 100, 3, 4), ints(0, 8, 3, 4))),
    Case("shift_right_logical", bind("shift_right_logical"),
         (ints(-100, 100, 3, 4), ints(0, 8, 4))),
]
for _n in ["eq", "ne", "lt", "le", "gt", "ge"]:
    CASES.append(Case(_n, bind(_n), (ints(-2, 3, 3, 4, dtype=float32),
                                      ints(-2, 3, 4, dtype=float32))))
CASES += [
    Case("select", bind("select"), (bools(3, 4), normal(4), normal())),
    Case("dot_general", bind("dot_general", dimension_numbers=(((1,), (0,)), ((), ()))),
         (normal(3, 4), normal(4, 5)), "dot_general[matmul]"),
    Case("dot_general", bind("dot_general", dimension_numbers=(((2,), (1,)), ((0,), (0,)))),
         (normal(2, 3, 4), normal(2, 4, 5)), "dot_general[batch]"),
    Case("dot_general", bind("dot_general", dimension_numbers=(((0, 2), (1, 0)), ((), ()))),
         (normal(4, 3, 5), normal(5, 4, 2)), "dot_general[2 contract]"),
    Case("dot_general", bind("dot_general", dimension_numbers=(((0,), (0,)), ((), ()))),
         (normal(4), normal(4, 2)), "dot_general[vec]"),
    Case("reshape", bind("reshape", new_sizes=(2, 6)), (normal(3, 4),)),
    Case("reshape", bind("reshape", new_sizes=(6, 4)), (normal(2, 3, 4),), "reshape[merge]"),
    Case("broadcast_in_dim", bind("broadcast_in_dim", shape=(2, 3, 4),
                                  broadcast_dimensions=(1, 2)), (normal(3, 1),)),
    Case("broadcast_in_dim", bind("broadcast_in_dim", shape=(2, 3), broadcast_dimensions=()),
         (normal(),), "broadcast_in_dim[scalar]"),
    Case("transpose", bind("transpose", permutation=(2, 0, 1)), (normal(2, 3, 4),)),
    Case("slice", bind("slice", start_indices=(1, 0), limit_indices=(5, 6), strides=(2, 3)),
         (normal(5, 6),)),
    Case("slice", bind("slice", start_indices=(1,), limit_indices=(3,), strides=None),
         (normal(4),), "slice[nostride]"),
    Case("pad", bind("pad", padding_config=((1, 2, 1), (-1, 0, 0))), (normal(3, 4), normal())),
    Case("concatenate", bind("concatenate", dimension=0),
         (normal(2, 4), normal(3, 4), normal(1, 4))),
    Case("concatenate", bind("concatenate", dimension=1), (normal(2, 1), normal(2, 3)),
         "concatenate[1]"),
    Case("gather", bind("gather", axis=0), (normal(5, 4), ints(0, 5, 2, 3))),
    Case("gather", bind("gather", axis=1), (normal(5, 4), ints(-2, 6, 3)), "gather[axis1]"),
    Case("dynamic_slice", bind("dynamic_slice", slice_sizes=(2, 3)),
         (normal(6, 5), ints(-8, 8), ints(-8, 8, dtype=np.int64))),
    Case("dynamic_update_slice", bind("dynamic_update_slice"),
         (normal(6, 5), normal(2, 3), ints(-8, 8), ints(-8, 8))),
    Case("dynamic_update_slice", bind("dynamic_update_slice"),
         (normal(6, 5), normal(6, 2), ints(-8, 8), ints(-8, 8)), "dynamic_update_slice[rows]"),
    Case("rev", bind("rev", dimensions=(1,)), (normal(3, 4),)),
    Case("iota", lambda x: x + P.iota_p.bind(dtype=np.dtype(float32), shape=(3, 4),
                                             dimension=1), (normal(4),)),
    Case("dim_as_value", lambda x: x * P.dim_as_value_p.bind(expr=4, dtype=np.dtype(float32)),
         (normal(3),)),
    Case("argmax", bind("argmax", axis=1, index_dtype=np.dtype(np.int64)), (normal(3, 4, 2),)),
]
if "scatter_add" in PRIMITIVES:
    CASES += [
        Case("scatter_add", bind("scatter_add", axis=1),
             (normal(3, 5), ints(-1, 6, 2, 4), normal(3, 2, 4, dtype=float32))),
        Case("scatter_add", bind("scatter_add", axis=0),
             (normal(4), ints(0, 4, 6), normal(6)), "scatter_add[repeats]"),
    ]
for _n in ["reduce_sum", "reduce_max", "reduce_min", "reduce_prod"]:
    CASES.append(Case(_n, bind(_n, axes=(0, 2)), (normal(3, 4, 2),)))
    CASES.append(Case(_n, bind(_n, axes=(0,)), (normal(3),), f"{_n}[all]"))


def in_axes_configs(per_example, fn):
    """(name, in_axes, out_axes): mapped at 0, mapped last, and mixes with None."""
    n = len(per_example)
    with np.errstate(all="ignore"):
        out_rank = np.ndim(tgx.tree_flatten(fn(*per_example))[0][0])
    out = [("all0", (0,) * n, 0), ("last", (-1,) * n, -1)]
    if n > 1:
        out.append(("first", (1 if np.ndim(per_example[0]) else 0,) + (None,) * (n - 1), 0))
        out.append(("rest", (None,) + (0,) * (n - 1), 1 if out_rank else 0))
    if n > 2:
        out.append(("lastonly", (None,) * (n - 1) + (0,), 0))
    return out


def stack_args(draws, in_axes):
    """Argument k: draw 0 when unmapped, else the B draws stacked along its axis."""
    return [draws[0][k] if ax is None else np.stack([d[k] for d in draws], axis=ax)
            for k, ax in enumerate(in_axes)]


@pytest.mark.parametrize("case", CASES, ids=repr)
def test_atomic_primitive_vs_loop(case):
    rng = np.random.default_rng(zlib.crc32(repr(case).encode()))
    draws = [[make(rng) for make in case.args] for _ in range(B)]
    for name, in_axes, out_axes in in_axes_configs(draws[0], case.fn):
        check(case.fn, stack_args(draws, in_axes), in_axes, out_axes, what=f"{case!r}[{name}]")


def test_every_atomic_primitive_has_a_rule_and_a_case():
    atomic = {n for n, p in PRIMITIVES.items()
              if p.atomic and p.family and p.impl.__module__.startswith("tgx.")}
    assert {n for n in atomic if PRIMITIVES[n].batch is None} == set()
    assert atomic - {c.prim for c in CASES} == set()


# ---------------------------------------------------------------------------------------------
# The op table (tests/ops): every op of tgx.numpy / tgx.nn / tgx.lax on B samples of its first
# dtype, stacked: all traced arguments mapped (eager), and the first one mapped on its last
# axis with the others shared (traced, out_axes=-1).

def _op_infos():
    for f in sorted((pathlib.Path(__file__).parents[1] / "ops").glob("ops_*.py")):
        importlib.import_module(f"tests.ops.{f.stem}")
    from tests.ops.op_table import OPS

    return OPS


OPS = _op_infos()


def _stacked_reference(info, sample, arg_sets, axis):
    """The op table's reference on each argument set, stacked along `axis`."""
    from tests.ops.op_table import reference

    outs = [tgx.tree_flatten(reference(info, dataclasses.replace(sample, args=a)))[0]
            for a in arg_sets]
    return [np.stack([np.asarray(o[k]) for o in outs], axis=axis) for k in range(len(outs[0]))]


def _compare(info, dtype, actual, expected, what):
    rtol, atol = info.tolerance(dtype)
    for a, e in zip(tgx.tree_flatten(actual)[0], expected):
        a = np.asarray(a)
        assert a.shape == e.shape, f"{info.name}{what}: {a.shape} vs {e.shape}"
        np.testing.assert_allclose(a.astype(np.float64), e.astype(np.float64), rtol=rtol,
                                   atol=atol, equal_nan=True, err_msg=f"{info.name}{what}")


@pytest.mark.parametrize("info", OPS, ids=lambda i: i.name)
def test_op_table_vs_reference_loop(info):
    from tests.ops.op_table import split_args

    dt = np.dtype(info.dtypes[0])
    seed = zlib.crc32(info.name.encode())
    per = [info.samples(np.random.default_rng(seed + b), dt) for b in range(B)]
    checked = 0
    for si in range(len(per[0])):
        samples = [p[si] for p in per]
        s0 = samples[0]
        idx, fn = split_args(info, s0)
        if not idx or any(np.shape(s.args[i]) != np.shape(s0.args[i])
                          for s in samples for i in idx):
            continue  # nothing traced, or shapes that differ between draws
        with np.errstate(all="ignore"):
            # every traced argument mapped on axis 0, eagerly
            args = [np.stack([s.args[i] for s in samples]) for i in idx]
            _compare(info, dt, vmap(fn)(*args),
                     _stacked_reference(info, s0, [s.args for s in samples], 0),
                     f"{s0.name} (all mapped)")
            # the first mapped on its last axis, the others shared; traced; out_axes=-1
            first = idx[0]
            sets = [tuple(s.args[first] if k == first else a for k, a in enumerate(s0.args))
                    for s in samples]
            args = ([np.stack([s.args[first] for s in samples], axis=-1)]
                    + [s0.args[i] for i in idx[1:]])
            g = tgx.make_graph(vmap(fn, (-1,) + (None,) * (len(idx) - 1), -1))(*args)
            tgx.check_graph(g)
            _compare(info, dt, eval_graph(g, *args), _stacked_reference(info, s0, sets, -1),
                     f"{s0.name} (first mapped)")
        checked += 1
    if not checked:
        pytest.skip("no sample with traced arguments of fixed shape")


# ---------------------------------------------------------------------------------------------
# Composites: rules keep some whole, the others are batched through their decomposition

def _r(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


def _prims(g):
    return {e.primitive.name for e in g.eqns}


def test_softmax_and_rms_norm_stay_whole(rng):
    x, w = _r(rng, B, 4, 6), _r(rng, 6)
    g = tgx.make_graph(vmap(lambda x: tnn.softmax(x, dim=0)))(x)
    assert _prims(g) == {"softmax"}
    check(lambda x: tnn.softmax(x, dim=0), [x], (1,))
    g = tgx.make_graph(vmap(lambda x, w: tnn.rms_norm(x, (6,), w), (0, None)))(x, w)
    assert "rms_norm" in _prims(g)
    # a weight per example: the rule declines and the decomposition is batched
    ws = _r(rng, B, 6)
    g = tgx.make_graph(vmap(lambda x, w: tnn.rms_norm(x, (6,), w)))(x, ws)
    assert "rms_norm" not in _prims(g)
    check(lambda x, w: tnn.rms_norm(x, (6,), w), [x, ws], (0, 0))


COMPOSITES = [
    ("softmax", lambda x: tnn.softmax(x, dim=-1), lambda r: [_r(r, 4, 5)]),
    ("log_softmax", lambda x: tnn.log_softmax(x, dim=0), lambda r: [_r(r, 4, 5)]),
    ("layer_norm", lambda x, w, b: tnn.layer_norm(x, (5,), w, b),
     lambda r: [_r(r, 4, 5), _r(r, 5), _r(r, 5)]),
    ("rms_norm", lambda x, w: tnn.rms_norm(x, (4, 5), w), lambda r: [_r(r, 3, 4, 5),
                                                                     _r(r, 4, 5)]),
    ("matmul", tnn.matmul, lambda r: [_r(r, 3, 4), _r(r, 4, 2)]),
    ("matmul[vec]", tnn.matmul, lambda r: [_r(r, 4), _r(r, 2, 4, 3)]),
    ("linear", tnn.linear, lambda r: [_r(r, 3, 4), _r(r, 2, 4), _r(r, 2)]),
    ("attention", lambda q, k, v: tnn.scaled_dot_product_attention(q, k, v, is_causal=True),
     lambda r: [_r(r, 2, 4, 8), _r(r, 2, 4, 8), _r(r, 2, 4, 8)]),
    ("cross_entropy", lambda x, t: tnn.cross_entropy(x, t),
     lambda r: [_r(r, 4, 6), r.integers(0, 6, 4)]),
    ("gelu+cumsum", lambda x: tnp.cumsum(tnn.gelu(x, approximate="tanh"), axis=0),
     lambda r: [_r(r, 4, 3)]),
    ("logsumexp+var", lambda x: tnn.logsumexp(x, dim=1) + tnp.var(x, axis=1),
     lambda r: [_r(r, 4, 3)]),
]


@pytest.mark.parametrize("name,fn,make", COMPOSITES, ids=[c[0] for c in COMPOSITES])
def test_composite_vs_loop(name, fn, make, rng):
    draws = [make(rng) for _ in range(B)]
    n = len(draws[0])
    configs = [(0,) * n, (-1,) * n, (0,) + (None,) * (n - 1)]
    if n > 1:
        configs.append((None,) + (0,) * (n - 1))
    for in_axes in configs:
        check(fn, stack_args(draws, in_axes), in_axes, what=f"{name}{in_axes}")


# ---------------------------------------------------------------------------------------------
# Hypothesis: broadcasting elementwise ops and reductions over shapes and batch axes

@st.composite
def broadcast_case(draw):
    rank = draw(st.integers(0, 3))
    out = draw(st.lists(st.integers(1, 4), min_size=rank, max_size=rank))
    n = draw(st.integers(1, 3))
    shapes, axes = [], []
    for _ in range(n):
        r = draw(st.integers(0, rank))
        shape = [d if draw(st.booleans()) else 1 for d in out[rank - r:]]
        shapes.append(tuple(shape))
        axes.append(draw(st.one_of(st.none(), st.integers(0, r))))
    if all(a is None for a in axes):
        axes[0] = 0
    out_rank = max(len(s) for s in shapes)
    out_axis = draw(st.integers(-(out_rank + 1), out_rank))
    op = draw(st.sampled_from(["add", "mul", "maximum", "where"]))
    size = draw(st.integers(1, 4))
    return shapes, axes, out_axis, op, size


OPS_BROADCAST = {
    "add": lambda *xs: sum(xs[1:], xs[0]),
    "mul": lambda *xs: tnp.multiply(xs[0], xs[-1]),
    "maximum": lambda *xs: tnp.maximum(xs[0], xs[-1]),
    "where": lambda *xs: tnp.where(xs[0] > 0, xs[-1], -xs[0]),
}


@settings(max_examples=30, deadline=None)
@given(broadcast_case())
def test_hypothesis_elementwise_broadcasting(case):
    shapes, axes, out_axis, op, size = case
    rng = np.random.default_rng(0)
    args = [rng.standard_normal(s[:a] + (size,) + s[a:] if a is not None else s)
            .astype(np.float32) for s, a in zip(shapes, axes)]
    check(OPS_BROADCAST[op], args, axes, out_axis, what=f"{op} {shapes} {axes}")


@st.composite
def reduce_case(draw):
    rank = draw(st.integers(1, 3))
    shape = tuple(draw(st.lists(st.integers(1, 4), min_size=rank, max_size=rank)))
    bdim = draw(st.integers(0, rank))
    op = draw(st.sampled_from(["sum", "max", "min", "mean", "argmax", "prod"]))
    if op == "argmax":
        axis = draw(st.integers(-rank, rank - 1))
    else:
        axis = tuple(sorted(draw(st.sets(st.integers(0, rank - 1), max_size=rank))))
        axis = None if not axis else axis
    keepdims = draw(st.booleans())
    return shape, bdim, op, axis, keepdims, draw(st.integers(1, 4))


@settings(max_examples=30, deadline=None)
@given(reduce_case())
def test_hypothesis_reductions(case):
    shape, bdim, op, axis, keepdims, size = case
    x = np.random.default_rng(1).standard_normal(
        shape[:bdim] + (size,) + shape[bdim:]).astype(np.float32)
    f = lambda x: getattr(tnp, op)(x, axis=axis, keepdims=keepdims)  # noqa: E731
    check(f, [x], (bdim,), what=f"{op} {shape} bdim={bdim} axis={axis}")


# ---------------------------------------------------------------------------------------------
# Composition: nested vmap, closures, pytrees, tgx.compile, symbolic batch sizes


def test_nested_vmap_outer_product_and_matvec(rng):
    a, b = _r(rng, 3), _r(rng, 4)
    outer = vmap(vmap(lambda x, y: x * y, (None, 0)), (0, None))
    np.testing.assert_allclose(outer(a, b), np.outer(a, b), rtol=1e-6)
    m = _r(rng, 5, 4)
    matvec = vmap(vmap(lambda r, v: tnp.sum(r * v), (0, None)), (None, 1), 1)
    np.testing.assert_allclose(matvec(m, _r(rng, 4, 2) * 0 + b[:, None]),
                               (m @ b)[:, None].repeat(2, 1), rtol=1e-5)
    g = tgx.make_graph(outer)(tgx.Spec(("N",)), tgx.Spec(("M",)))
    assert [str(a) for a in g.out_avals] == ["f32[N,M]"]


def test_nested_vmap_captures_the_outer_value(rng):
    xs, ys = _r(rng, 3, 2), _r(rng, 4, 2)
    f = vmap(lambda x: vmap(lambda y: tnp.sum(x * y))(ys))
    np.testing.assert_allclose(f(xs), xs @ ys.T, rtol=1e-5)
    f = vmap(lambda y: vmap(lambda x: tnp.sum(x * y), in_axes=1)(xs.T), out_axes=1)
    np.testing.assert_allclose(f(ys), xs @ ys.T, rtol=1e-5)


def test_pytree_in_axes_kwargs_and_out_axes(rng):
    params = {"w": _r(rng, 4, 2), "b": _r(rng, B, 2)}
    x = _r(rng, 4, B)

    def f(p, x, scale=None):
        y = x @ p["w"] + p["b"]
        return {"y": y * scale, "n": tnp.sum(y)}, p["w"]

    out, w = vmap(f, in_axes=({"w": None, "b": 0}, 1), out_axes=({"y": 1, "n": 0}, None))(
        params, x, scale=np.full((B, 2), 2.0, np.float32))
    y = x.T @ params["w"] + params["b"]
    np.testing.assert_allclose(out["y"], 2 * y.T, rtol=1e-5)
    np.testing.assert_allclose(out["n"], y.sum(1), rtol=1e-5)
    assert w is params["w"] or np.array_equal(w, params["w"])


def test_unbatched_outputs_are_broadcast_and_axis_size(rng):
    x = _r(rng, B, 2)
    out = vmap(lambda x: (x, np.float32(1.0), 2.0 * np.ones(3, np.float32)), out_axes=(0, 0, 1))(x)
    assert out[1].shape == (B,) and out[2].shape == (3, B) and out[2].flags.writeable
    c = _r(rng, 2)
    y = vmap(lambda c: c * 2, in_axes=None, axis_size=4)(c)
    np.testing.assert_allclose(y, np.broadcast_to(c * 2, (4, 2)))


def test_tracers_show_the_per_example_shape(rng):
    seen = []
    vmap(lambda x: seen.append((type(x), x.shape, x.ndim)) or x, in_axes=1)(_r(rng, 2, B, 5))
    assert seen == [(BatchTracer, (2, 5), 2)]


def test_vmap_inside_compile(rng):
    def model(params, x):
        h = tnn.relu(tnn.linear(x, params["w1"], params["b1"]))
        return tnn.softmax(h @ params["w2"], dim=-1)

    params = {"w1": _r(rng, 8, 4), "b1": _r(rng, 8), "w2": _r(rng, 8, 3)}
    xs = _r(rng, 5, 2, 4)
    f = vmap(model, in_axes=(None, 0))
    c = tgx.compile(f, policy="heuristic", backends=["numpy"])
    np.testing.assert_allclose(c(params, xs), loop(model, [params, xs], (None, 0)), rtol=1e-5,
                               atol=1e-6)
    c2 = tgx.compile(f, policy="heuristic", backends=["numpy"], dynamic={"x": {0: "B"}})
    for n in (2, 7):
        xs = _r(rng, n, 2, 4)
        np.testing.assert_allclose(c2(params, xs), loop(model, [params, xs], (None, 0)),
                                   rtol=1e-5, atol=1e-6)


SYMBOLIC = [
    ("mlp", lambda x, w: tnn.softmax(tnp.tanh(x @ w), dim=-1),
     [tgx.Spec(("B", 3)), tgx.Spec((3, 4))], (0, None),
     lambda r, n: [_r(r, n, 3), _r(r, 3, 4)]),
    ("dynamic_slice", lambda x, i: tlax.dynamic_slice(x, (i, np.int32(0)), (2, 3)),
     [tgx.Spec(("B", 6, 3)), tgx.Spec(("B",), "int32")], (0, 0),
     lambda r, n: [_r(r, n, 6, 3), r.integers(-7, 7, n).astype(np.int32)]),
    ("dynamic_update_slice",
     lambda x, u, i: tlax.dynamic_update_slice(x, u, (i, np.int32(1))),
     [tgx.Spec((6, "B", 3)), tgx.Spec(("B", 2, 2)), tgx.Spec(("B",), "int32")], (1, 0, 0),
     lambda r, n: [_r(r, 6, n, 3), _r(r, n, 2, 2), r.integers(-7, 7, n).astype(np.int32)]),
    ("gather+pad", lambda x, i, v: P.pad_p.bind(x, v, padding_config=((1, 1, 0),))[i],
     [tgx.Spec(("B", 5)), tgx.Spec(("B", 2), "int64"), tgx.Spec(("B",))], (0, 0, 0),
     lambda r, n: [_r(r, n, 5), r.integers(0, 7, (n, 2)), _r(r, n)]),
    ("attention", lambda q, k: tnn.scaled_dot_product_attention(q, k, k),
     [tgx.Spec((2, "B", 4)), tgx.Spec((3, 4))], (1, None),
     lambda r, n: [_r(r, 2, n, 4), _r(r, 3, 4)]),
]


@pytest.mark.parametrize("name,fn,specs,in_axes,make", SYMBOLIC, ids=[s[0] for s in SYMBOLIC])
def test_symbolic_batch_size(name, fn, specs, in_axes, make, rng):
    g = tgx.make_graph(vmap(fn, in_axes))(*specs)
    tgx.check_graph(g)
    assert any(not isinstance(d, int) for d in g.out_avals[0].shape)
    for n in (2, 5):
        args = make(rng, n)
        assert_close(eval_graph(g, *args), loop(fn, args, in_axes), f"{name} at B={n}")


def test_symbolic_per_example_dims(rng):
    f = vmap(lambda x: tnp.mean(x, axis=0) - x, in_axes=1)
    g = tgx.make_graph(f)(tgx.Spec(("N", "B")))
    for n, b in ((3, 2), (5, 4)):
        x = _r(rng, n, b)
        assert_close(eval_graph(g, x), loop(lambda x: tnp.mean(x, axis=0) - x, [x], (1,)))


# ---------------------------------------------------------------------------------------------
# Errors


def test_error_mismatched_axis_sizes_names_the_arguments():
    with pytest.raises(ShapeError, match=r"args\[0\] axis 0 has size 3.*args\[1\] axis 1 has "
                                         r"size 4"):
        vmap(lambda a, b: a + b, (0, 1))(np.zeros((3, 2)), np.zeros((2, 4)))
    with pytest.raises(ShapeError, match=r"size B.*size C"):
        tgx.make_graph(vmap(lambda a, b: a + b))(tgx.Spec(("B", 2)), tgx.Spec(("C", 2)))
    with pytest.raises(ShapeError, match="axis_size=5"):
        vmap(lambda a: a, axis_size=5)(np.zeros((3, 2)))


def test_error_in_axes_out_of_range_or_malformed():
    x = np.zeros((3, 2), np.float32)
    with pytest.raises(ShapeError, match=r"in_axes=2 is out of range for args\[0\]"):
        vmap(lambda a: a, 2)(x)
    with pytest.raises(ShapeError, match=r"in_axes=-3"):
        vmap(lambda a: a, -3)(x)
    with pytest.raises(ShapeError, match="2 entries but the function was called with 1"):
        vmap(lambda a: a, (0, 0))(x)
    with pytest.raises(ShapeError, match="does not match its structure"):
        vmap(lambda p: p["a"], ({"b": 0},))({"a": x})
    with pytest.raises(ShapeError, match="Python scalar"):
        vmap(lambda a, s: a * s)(x, 2.0)
    with pytest.raises(ShapeError, match="no argument is mapped"):
        vmap(lambda a: a, None)(x)
    with pytest.raises(OptionError, match="in_axes must be"):
        vmap(lambda a: a, in_axes="0")
    with pytest.raises(OptionError, match="entries must be ints"):
        vmap(lambda a: a, in_axes=(1.5,))(x)


def test_error_out_axes():
    x = np.zeros((3, 2), np.float32)
    with pytest.raises(ShapeError, match=r"out_axes is None for output.*differs between"):
        vmap(lambda a: a * 2, out_axes=None)(x)
    with pytest.raises(ShapeError, match="out_axes=3 is out of range"):
        vmap(lambda a: a * 2, out_axes=3)(x)


def test_error_per_example_shapes_and_leaks():
    with pytest.raises(ShapeError, match=r"per-example operands under tgx.vmap: f32\[2\], "
                                         r"f32\[3\]"):
        vmap(lambda a, b: a + b)(np.zeros((4, 2), np.float32), np.zeros((4, 3), np.float32))
    leaked = []
    vmap(lambda a: leaked.append(a) or a)(np.zeros((4, 2), np.float32))
    with pytest.raises(TgxError, match="leaked"):
        vmap(lambda a: a + leaked[0])(np.zeros((4, 2), np.float32))


_no_rule_p = Primitive("vmap_test_no_rule", family="test")
_no_rule_p.def_shape(lambda x: x)
_no_rule_p.def_impl(lambda x: x)


def test_error_primitive_without_rule():
    assert _no_rule_p.bind(np.ones(2)).shape == (2,)   # fine unbatched, also under vmap:
    vmap(lambda a: a + _no_rule_p.bind(np.ones(2)))(np.ones((3, 2)))
    with pytest.raises(Unsupported, match="vmap_test_no_rule has no batching rule"):
        vmap(_no_rule_p.bind)(np.ones((3, 2)))


def test_composes_with_grad(rng):
    grad = getattr(pytest.importorskip("tgx.transforms.ad"), "grad", None)
    if grad is None:
        pytest.skip("tgx.transforms.ad has no grad yet")
    w, xs = _r(rng, 4, 2), _r(rng, 5, 4)

    def loss(w, x):
        return tnp.sum(tnn.softmax(x @ w, dim=-1) ** 2)

    per_example = np.stack([grad(loss)(w, x) for x in xs])
    assert_close(vmap(grad(loss), (None, 0))(w, xs), per_example, "vmap(grad)")
    total = grad(lambda w: tnp.sum(vmap(loss, (None, 0))(w, xs)))(w)
    np.testing.assert_allclose(total, per_example.sum(0), rtol=1e-5, atol=1e-6)
    g = tgx.make_graph(vmap(grad(loss), (None, 0)))(tgx.Spec((4, 2)), tgx.Spec(("B", 4)))
    assert [str(a) for a in g.out_avals] == ["f32[B,4,2]"]
