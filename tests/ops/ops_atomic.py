"""Op-table entries for `tgx.numpy` over the atomic primitives, against NumPy."""

from __future__ import annotations

import numpy as np
import scipy.special

import tgx.numpy as tnp
from tgx.shapes import float16, float32, float64, int32, int64

from .op_table import OpInfo, Sample, randn, register

F = (float32, float64)
FH = (float32, float64, float16)


def unary_samples(positive=False, low=None, high=None):
    def make(rng, dt):
        return [
            Sample((randn(rng, (3, 5), dt, positive=positive, low=low, high=high),),
                   symbolic={0: {0: "N"}}),
            Sample((randn(rng, (7, 5), dt, positive=positive, low=low, high=high),),
                   symbolic={0: {0: "N"}}, name="[7x5]"),
            Sample((randn(rng, (), dt, positive=positive, low=low, high=high),), name="[scalar]"),
        ]
    return make


def binary_samples(positive_rhs=False):
    def make(rng, dt):
        r = dict(positive=positive_rhs)
        return [
            Sample((randn(rng, (4, 3), dt), randn(rng, (4, 3), dt, **r)),
                   symbolic={0: {0: "N"}, 1: {0: "N"}}),
            Sample((randn(rng, (6, 3), dt), randn(rng, (6, 3), dt, **r)),
                   symbolic={0: {0: "N"}, 1: {0: "N"}}, name="[6x3]"),
            Sample((randn(rng, (4, 1, 3), dt), randn(rng, (5, 1), dt, **r)), name="[bcast]"),
            Sample((randn(rng, (2, 3), dt), 2.5 if positive_rhs else -1.5), name="[scalar]"),
        ]
    return make


def int_samples(rng, dt):
    return [
        Sample((rng.integers(-20, 20, (4, 3)).astype(dt),
                (rng.integers(1, 6, (4, 3)) * rng.choice([-1, 1], (4, 3))).astype(dt)),
               symbolic={0: {0: "N"}, 1: {0: "N"}}),
        Sample((rng.integers(-20, 20, (5, 3)).astype(dt),
                (rng.integers(1, 6, (5, 3)) * rng.choice([-1, 1], (5, 3))).astype(dt)),
               symbolic={0: {0: "N"}, 1: {0: "N"}}, name="[5x3]"),
    ]


for name, fn, ref, kw in [
    ("exp", tnp.exp, np.exp, {}),
    ("log", tnp.log, np.log, dict(positive=True)),
    ("sin", tnp.sin, np.sin, {}),
    ("cos", tnp.cos, np.cos, {}),
    ("sqrt", tnp.sqrt, np.sqrt, dict(positive=True)),
    ("arctan", tnp.arctan, np.arctan, {}),
    ("erf", tnp.erf, scipy.special.erf, {}),
    ("floor", tnp.floor, np.floor, dict(low=-5, high=5)),
    ("round", tnp.round, np.round, dict(low=-5, high=5)),
    ("negative", tnp.negative, np.negative, {}),
    ("absolute", tnp.abs, np.abs, {}),
    ("square", tnp.square, np.square, {}),
    ("reciprocal", tnp.reciprocal, np.reciprocal, dict(positive=True)),
]:
    register(OpInfo(f"tnp.{name}", fn, ref, unary_samples(**kw), dtypes=FH))

for name, fn, ref, pos in [
    ("add", tnp.add, np.add, False),
    ("subtract", tnp.subtract, np.subtract, False),
    ("multiply", tnp.multiply, np.multiply, False),
    ("divide", tnp.divide, np.divide, True),
    ("maximum", tnp.maximum, np.maximum, False),
    ("minimum", tnp.minimum, np.minimum, False),
    ("power", tnp.power, np.power, True),
    ("floor_divide", tnp.floor_divide, np.floor_divide, True),
    ("remainder", tnp.remainder, np.remainder, True),
]:
    samples = binary_samples(positive_rhs=pos)
    if name == "power":
        samples = (lambda make: lambda rng, dt: [
            Sample((np.abs(s.args[0]) + np.asarray(0.5, dt),) + s.args[1:], s.kwargs, s.symbolic,
                   s.name) for s in make(rng, dt)])(samples)
    register(OpInfo(f"tnp.{name}", fn, ref, samples, dtypes=FH if name in (
        "add", "multiply", "subtract") else F))

for name, fn, ref in [("floor_divide", tnp.floor_divide, np.floor_divide),
                      ("remainder", tnp.remainder, np.remainder),
                      ("add", tnp.add, np.add), ("multiply", tnp.multiply, np.multiply),
                      ("bitwise_and", tnp.bitwise_and, np.bitwise_and),
                      ("bitwise_xor", tnp.bitwise_xor, np.bitwise_xor),
                      ("left_shift", tnp.left_shift, np.left_shift)]:
    samples = int_samples
    if name == "left_shift":
        samples = lambda rng, dt: [Sample((rng.integers(0, 1000, (4, 3)).astype(dt),  # noqa: E731
                                           rng.integers(0, 8, (4, 3)).astype(dt)))]
    register(OpInfo(f"tnp.{name}[int]", fn, ref, samples, dtypes=(int32, int64)))

for name, fn, ref in [("less", tnp.less, np.less), ("less_equal", tnp.less_equal, np.less_equal),
                      ("greater", tnp.greater, np.greater), ("equal", tnp.equal, np.equal),
                      ("not_equal", tnp.not_equal, np.not_equal),
                      ("greater_equal", tnp.greater_equal, np.greater_equal)]:
    def cmp_samples(rng, dt):
        a = rng.integers(-2, 3, (4, 3)).astype(dt)
        b = rng.integers(-2, 3, (4, 3)).astype(dt)
        return [Sample((a, b), symbolic={0: {0: "N"}, 1: {0: "N"}}),
                Sample((a[:2], b[:2]), symbolic={0: {0: "N"}, 1: {0: "N"}}, name="[2x3]"),
                Sample((a, np.float64(0.0).astype(dt)), name="[scalar]")]
    register(OpInfo(f"tnp.{name}", fn, ref, cmp_samples, dtypes=(float32, int32)))


def where_samples(rng, dt):
    return [Sample((rng.random((4, 3)) > 0.5, randn(rng, (4, 3), dt), randn(rng, (3,), dt)),
                   symbolic={0: {0: "N"}, 1: {0: "N"}}),
            Sample((rng.random((2, 3)) > 0.5, randn(rng, (2, 3), dt), randn(rng, (3,), dt)),
                   symbolic={0: {0: "N"}, 1: {0: "N"}}, name="[2x3]")]


register(
    OpInfo("tnp.where", tnp.where, np.where, where_samples, dtypes=(float32, int32)),
    OpInfo("tnp.logical_and", tnp.logical_and, np.logical_and,
           lambda rng, dt: [Sample((rng.random((4, 3)) > 0.5, rng.random((4, 3)) > 0.5))],
           dtypes=(np.dtype(bool),)),
    OpInfo("tnp.astype[int]", lambda x: tnp.astype(x, "int32"), lambda x: x.astype(np.int32),
           unary_samples(low=-50, high=50)),
    OpInfo("tnp.astype[f16]", lambda x: tnp.astype(x, "float16"), lambda x: x.astype(np.float16),
           unary_samples(), tol={float32: (1e-3, 1e-3), float64: (1e-3, 1e-3)}),
)


def reduce_samples(rng, dt):
    return [
        Sample((randn(rng, (4, 5, 3), dt),), dict(axis=1), symbolic={0: {0: "N"}}),
        Sample((randn(rng, (2, 5, 3), dt),), dict(axis=1), symbolic={0: {0: "N"}}, name="[2]"),
        Sample((randn(rng, (4, 5, 3), dt),), dict(axis=(0, 2), keepdims=True), name="[keep]"),
        Sample((randn(rng, (4, 5), dt),), {}, symbolic={0: {0: "N", 1: "M"}}, name="[all]"),
        Sample((randn(rng, (3, 2), dt),), {}, symbolic={0: {0: "N", 1: "M"}}, name="[all,3x2]"),
        Sample((randn(rng, (4, 5), dt),), dict(axis=-1), name="[neg]"),
    ]


for name, fn, ref in [("sum", tnp.sum, np.sum), ("max", tnp.max, np.max),
                      ("min", tnp.min, np.min), ("prod", tnp.prod, np.prod),
                      ("mean", tnp.mean, np.mean)]:
    register(OpInfo(f"tnp.{name}", fn, ref, reduce_samples, dtypes=F))


def arg_samples(rng, dt):
    return [s for s in reduce_samples(rng, dt) if "keep" not in s.name and isinstance(
        s.kwargs.get("axis", 0), int)]


register(
    OpInfo("tnp.argmax", tnp.argmax, np.argmax, arg_samples, dtypes=F),
    OpInfo("tnp.argmin", tnp.argmin, np.argmin, arg_samples, dtypes=F),
    OpInfo("tnp.any", tnp.any, np.any, lambda rng, dt: [
        Sample((rng.random((4, 3)) > 0.8,), dict(axis=0)),
        Sample((np.zeros((4, 3), bool),), dict(axis=1))], dtypes=(np.dtype(bool),)),
    OpInfo("tnp.all", tnp.all, np.all, lambda rng, dt: [
        Sample((rng.random((4, 3)) > 0.2,), dict(axis=0)),
        Sample((np.ones((4, 3), bool),), {})], dtypes=(np.dtype(bool),)),
)


def movement(name, fn, ref, make, dtypes=(float32,)):
    register(OpInfo(f"tnp.{name}", fn, ref, make, dtypes=dtypes))


movement("reshape", tnp.reshape, np.reshape, lambda rng, dt: [
    Sample((randn(rng, (4, 8), dt), (-1, 4)), symbolic={0: {0: "N"}}),
    Sample((randn(rng, (2, 8), dt), (-1, 4)), symbolic={0: {0: "N"}}, name="[2]"),
    Sample((randn(rng, (2, 3, 4), dt), (6, 4)), name="[merge]")])
movement("transpose", tnp.transpose, np.transpose, lambda rng, dt: [
    Sample((randn(rng, (2, 3, 4), dt), (2, 0, 1)), symbolic={0: {1: "N"}}),
    Sample((randn(rng, (2, 5, 4), dt), (2, 0, 1)), symbolic={0: {1: "N"}}, name="[5]"),
    Sample((randn(rng, (2, 3), dt),), name="[default]")])
movement("broadcast_to", tnp.broadcast_to, np.broadcast_to, lambda rng, dt: [
    Sample((randn(rng, (3, 1), dt), (2, 3, 4))), Sample((randn(rng, (), dt), (5,)))])
movement("expand_dims", tnp.expand_dims, np.expand_dims, lambda rng, dt: [
    Sample((randn(rng, (3, 4), dt), 1)), Sample((randn(rng, (3, 4), dt), (0, -1)))])
movement("squeeze", tnp.squeeze, np.squeeze, lambda rng, dt: [
    Sample((randn(rng, (3, 1, 4, 1), dt),)), Sample((randn(rng, (3, 1, 4), dt), 1))])
movement("concatenate", lambda *xs, axis=0: tnp.concatenate(xs, axis=axis),
         lambda *xs, axis=0: np.concatenate(xs, axis=axis), lambda rng, dt: [
    Sample((randn(rng, (3, 4), dt), randn(rng, (2, 4), dt)), dict(axis=0),
           symbolic={0: {0: "N"}, 1: {0: "M"}}),
    Sample((randn(rng, (1, 4), dt), randn(rng, (5, 4), dt)), dict(axis=0),
           symbolic={0: {0: "N"}, 1: {0: "M"}}, name="[1+5]"),
    Sample((randn(rng, (3, 4), dt), randn(rng, (3, 2), dt), randn(rng, (3, 1), dt)),
           dict(axis=1), name="[3 ops]")])
movement("stack", lambda *xs, axis=0: tnp.stack(xs, axis=axis),
         lambda *xs, axis=0: np.stack(xs, axis=axis), lambda rng, dt: [
    Sample((randn(rng, (3, 4), dt), randn(rng, (3, 4), dt)), dict(axis=1))])
movement("pad", tnp.pad, np.pad, lambda rng, dt: [
    Sample((randn(rng, (3, 4), dt), ((1, 2), (0, 3))), symbolic={0: {0: "N"}}),
    Sample((randn(rng, (5, 4), dt), ((1, 2), (0, 3))), symbolic={0: {0: "N"}}, name="[5]"),
    Sample((randn(rng, (3, 4), dt), 1), dict(constant_values=2.0), name="[value]")])
movement("take", tnp.take, np.take, lambda rng, dt: [
    Sample((randn(rng, (6, 4), dt), np.array([[0, 5], [-1, 2]]), 0), symbolic={0: {1: "N"}}),
    Sample((randn(rng, (6, 3), dt), np.array([[0, 5], [-1, 2]]), 0), symbolic={0: {1: "N"}},
           name="[3]"),
    Sample((randn(rng, (6, 4), dt), np.array([3, 1]), 1), name="[axis1]")])
movement("flip", tnp.flip, np.flip, lambda rng, dt: [
    Sample((randn(rng, (3, 4), dt), 1)), Sample((randn(rng, (3, 4), dt),), name="[all]")])
movement("matmul", tnp.matmul, np.matmul, lambda rng, dt: [
    Sample((randn(rng, (5, 3), dt), randn(rng, (3, 2), dt)), symbolic={0: {0: "N"}}),
    Sample((randn(rng, (7, 3), dt), randn(rng, (3, 2), dt)), symbolic={0: {0: "N"}}, name="[7]"),
    Sample((randn(rng, (2, 5, 3), dt), randn(rng, (3, 4), dt)), name="[batch-lhs]"),
    Sample((randn(rng, (5, 3), dt), randn(rng, (2, 3, 4), dt)), name="[batch-rhs]"),
    Sample((randn(rng, (2, 1, 5, 3), dt), randn(rng, (4, 3, 2), dt)), name="[bcast]"),
    Sample((randn(rng, (3,), dt), randn(rng, (3, 4), dt)), name="[vec]")], dtypes=F)
movement("dot", tnp.dot, np.dot, lambda rng, dt: [
    Sample((randn(rng, (5, 3), dt), randn(rng, (3, 2), dt))),
    Sample((randn(rng, (2, 5, 3), dt), randn(rng, (4, 3, 2), dt)), name="[nd]")], dtypes=F)
movement("einsum", tnp.einsum, np.einsum, lambda rng, dt: [
    Sample(("bij,bjk->bik", randn(rng, (2, 3, 4), dt), randn(rng, (2, 4, 5), dt))),
    Sample(("ij,kj->ik", randn(rng, (3, 4), dt), randn(rng, (5, 4), dt)), name="[nt]"),
    Sample(("bhqd,bhkd->bhqk", randn(rng, (2, 2, 3, 4), dt), randn(rng, (2, 2, 5, 4), dt)),
           name="[attn]"),
    Sample(("ij,jk,kl->il", randn(rng, (2, 3), dt), randn(rng, (3, 4), dt),
            randn(rng, (4, 2), dt)), name="[chain]"),
    Sample(("ij->j", randn(rng, (2, 3), dt)), name="[sum]")], dtypes=F)
movement("tril", tnp.tril, np.tril, lambda rng, dt: [
    Sample((randn(rng, (4, 4), dt),)), Sample((randn(rng, (3, 5), dt), 1), name="[k]")])


def getitem(key):
    return (lambda x: x[key]), (lambda x: x[key])


for i, key in enumerate([
    (1,), (slice(1, None), slice(None, None, 2)), (Ellipsis, -1), (None, 0, slice(None, 2)),
    (slice(None, None, -1),), (np.array([2, 0, 1]),), (slice(None), np.array([[1, 0], [2, 2]])),
    (np.array([0, 2]), np.array([1, 3])), (slice(-2, None),),
]):
    fn, ref = getitem(key)
    movement(f"getitem[{i}]", fn, ref, lambda rng, dt: [
        Sample((randn(rng, (4, 5), dt),), symbolic={}),
    ])


movement("getitem[symbolic]", lambda x: x[1:, :-1], lambda x: x[1:, :-1], lambda rng, dt: [
    Sample((randn(rng, (4, 5), dt),), symbolic={0: {0: "N"}}),
    Sample((randn(rng, (2, 5), dt),), symbolic={0: {0: "N"}}, name="[2]")])
