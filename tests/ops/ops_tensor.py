"""Op-table entries for the composite reductions (mean, var, std, argmin) and tensor ops
(cumsum, split, chunk, tile, repeat, roll, vstack, hstack, one_hot), against PyTorch / JAX."""

from __future__ import annotations

import jax
import numpy as np
import torch
import torch.nn.functional as TF

import tgx.nn as tnn
import tgx.numpy as tnp
from tgx.shapes import bfloat16, float16, float32, float64, int32, int64

from .op_table import OpInfo, Sample, randn, register
from .ops_math import jax_ref, torch_ref

jax.config.update("jax_enable_x64", True)

F = (float32, float64)
FH = (float32, float64, float16, bfloat16)


def reduce_samples(rng, dt, **extra):
    return [
        Sample((randn(rng, (4, 5, 3), dt),), dict(axis=1, **extra), symbolic={0: {0: "N"}}),
        Sample((randn(rng, (2, 5, 3), dt),), dict(axis=1, **extra), symbolic={0: {0: "N"}},
               name="[2]"),
        Sample((randn(rng, (4, 5, 3), dt),), dict(axis=(0, 2), keepdims=True, **extra),
               name="[keep]"),
        Sample((randn(rng, (4, 5), dt),), dict(**extra), symbolic={0: {0: "N", 1: "M"}},
               name="[all]"),
        Sample((randn(rng, (3, 2), dt),), dict(**extra), symbolic={0: {0: "N", 1: "M"}},
               name="[all,3x2]"),
    ] + ([] if dt.itemsize == 2 else [  # a large mean: half precision cannot resolve the spread
        Sample((randn(rng, (4, 5), dt) + np.asarray(1e3, dt),), dict(axis=-1, **extra),
               name="[offset]")])


def _torch_moment(f):
    def ref(x, axis=None, keepdims=False, ddof=0):
        dim = tuple(range(x.ndim)) if axis is None else axis
        return f(x, dim=dim, correction=ddof, keepdim=keepdims)
    return ref


def _torch_mean(x, axis=None, keepdims=False):
    dim = tuple(range(x.ndim)) if axis is None else axis
    return torch.mean(x, dim=dim, keepdim=keepdims)


def _ddof(d):
    return lambda rng, dt: reduce_samples(rng, dt, ddof=d)


MOMENT_TOL = {float32: (1e-4, 1e-5), float16: (2e-2, 2e-2), bfloat16: (1e-1, 1e-1)}

register(
    OpInfo("tnp.mean[composite]", tnp.mean, torch_ref(_torch_mean), reduce_samples, dtypes=FH,
           tol={float16: (1e-2, 1e-2), bfloat16: (5e-2, 5e-2)}, decomposes=True),
    OpInfo("tnp.var", tnp.var, torch_ref(_torch_moment(torch.var)), reduce_samples, dtypes=F,
           tol=MOMENT_TOL, decomposes=True),
    OpInfo("tnp.var[ddof=1]", tnp.var, torch_ref(_torch_moment(torch.var)), _ddof(1),
           dtypes=F, tol=MOMENT_TOL, decomposes=True),
    OpInfo("tnp.std[ddof=1]", tnp.std, torch_ref(_torch_moment(torch.std)), _ddof(1),
           dtypes=(float32, float64, float16), tol=MOMENT_TOL, decomposes=True),
    OpInfo("tnp.var[correction]", lambda x: tnp.var(x, axis=0, correction=1),
           lambda x: np.var(x, axis=0, ddof=1), lambda rng, dt: [
               Sample((randn(rng, (5, 3), dt),), symbolic={0: {0: "N"}}),
               Sample((randn(rng, (8, 3), dt),), symbolic={0: {0: "N"}}, name="[8]")],
           dtypes=F, tol=MOMENT_TOL, decomposes=True),
)


def arg_samples(rng, dt):
    return [s for s in reduce_samples(rng, dt) if "keep" not in s.name] + [
        Sample((np.array([[3, 1, 1, 2], [0, 0, -1, -1]], dt),), dict(axis=1), name="[ties]")]


def int_arg_samples(rng, dt):
    info = np.iinfo(dt)
    return [Sample((rng.integers(-9, 9, (4, 5)).astype(dt),), dict(axis=1),
                   symbolic={0: {0: "N"}}),
            Sample((rng.integers(-9, 9, (2, 5)).astype(dt),), dict(axis=1),
                   symbolic={0: {0: "N"}}, name="[2]"),
            Sample((np.array([[info.max, info.min, 0], [info.min, info.min, 5]], dt),),
                   dict(axis=1), name="[extremes]")]


def _torch_argmin(x, axis=None, keepdims=False):
    return torch.argmin(x, dim=axis, keepdim=keepdims)


register(
    OpInfo("tnp.argmin[composite]", tnp.argmin, torch_ref(_torch_argmin), arg_samples,
           dtypes=F, decomposes=True),
    OpInfo("tnp.argmin[int]", tnp.argmin, torch_ref(_torch_argmin), int_arg_samples,
           dtypes=(int32, int64), decomposes=True),
)


def cumsum_samples(rng, dt):
    return [
        Sample((randn(rng, (4, 5), dt),), dict(axis=0), symbolic={0: {0: "N"}}),
        Sample((randn(rng, (7, 5), dt),), dict(axis=0), symbolic={0: {0: "N"}}, name="[7]"),
        Sample((randn(rng, (2, 6, 3), dt),), dict(axis=1), name="[mid]"),
        Sample((randn(rng, (3, 4), dt),), {}, name="[flat]"),
    ]


def _torch_cumsum(x, axis=None):
    if axis is None:
        x, axis = x.reshape(-1), 0
    return torch.cumsum(x, dim=axis)


register(
    OpInfo("tnp.cumsum", tnp.cumsum, torch_ref(_torch_cumsum), cumsum_samples, dtypes=FH,
           tol={float32: (1e-5, 1e-5), float16: (1e-2, 2e-2), bfloat16: (5e-2, 1e-1)},
           decomposes=True),
    OpInfo("tnp.cumsum[int]", tnp.cumsum, torch_ref(_torch_cumsum), lambda rng, dt: [
        Sample((rng.integers(-9, 9, (4, 5)).astype(dt),), dict(axis=1), symbolic={0: {0: "N"}}),
        Sample((rng.integers(-9, 9, (6, 5)).astype(dt),), dict(axis=1), symbolic={0: {0: "N"}},
               name="[6]")], dtypes=(int64,), decomposes=True),
)


# Pure movement: plain tnp wrappers over atomic primitives, checked against jax.numpy / torch.
def movement(name, fn, ref, make, dtypes=(float32,)):
    register(OpInfo(name, fn, ref, make, dtypes=dtypes, decomposes=True))


def split_fn(x, sections, axis=0):
    return tuple(tnp.split(x, sections, axis))


def jsplit(x, sections, axis=0):
    return tuple(np.asarray(p) for p in jax.numpy.split(x, sections, axis))


movement("tnp.split", split_fn, jsplit, lambda rng, dt: [
    Sample((randn(rng, (4, 6), dt), 3), dict(axis=1), symbolic={0: {0: "N"}}),
    Sample((randn(rng, (2, 6), dt), 3), dict(axis=1), symbolic={0: {0: "N"}}, name="[2]"),
    Sample((randn(rng, (6, 2), dt), [1, 4]), dict(axis=0), name="[indices]"),
    Sample((randn(rng, (6, 2), dt), 2), dict(axis=0), symbolic={0: {1: "N"}}, name="[sym]"),
    Sample((randn(rng, (6, 5), dt), 2), dict(axis=0), symbolic={0: {1: "N"}}, name="[sym5]"),
])
movement("tnp.array_split", lambda x, n, axis=0: tuple(tnp.array_split(x, n, axis)),
         lambda x, n, axis=0: tuple(np.asarray(p) for p in jax.numpy.array_split(x, n, axis)),
         lambda rng, dt: [Sample((randn(rng, (7, 2), dt), 3)),
                          Sample((randn(rng, (2, 8), dt), 3), dict(axis=1), name="[ax1]")])
movement("tnp.chunk", lambda x, n, dim=0: tuple(tnp.chunk(x, n, dim)),
         torch_ref(lambda x, n, dim=0: tuple(torch.chunk(x, n, dim))),
         lambda rng, dt: [Sample((randn(rng, (7, 2), dt), 3)),
                          Sample((randn(rng, (2, 6), dt), 4), dict(dim=1), name="[6/4]")])
movement("tnp.tile", tnp.tile, jax_ref(jax.numpy.tile), lambda rng, dt: [
    Sample((randn(rng, (3, 2), dt), (2, 3)), symbolic={0: {0: "N"}}),
    Sample((randn(rng, (5, 2), dt), (2, 3)), symbolic={0: {0: "N"}}, name="[5]"),
    Sample((randn(rng, (3,), dt), (2, 1, 2)), name="[promote]"),
    Sample((randn(rng, (2, 3), dt), 2), name="[int]"),
])
movement("tnp.repeat", tnp.repeat, torch_ref(lambda x, r, axis=None: torch.repeat_interleave(
    x, torch.as_tensor(r) if not isinstance(r, int) else r, dim=axis)), lambda rng, dt: [
    Sample((randn(rng, (3, 2), dt), 2), dict(axis=0), symbolic={0: {0: "N"}}),
    Sample((randn(rng, (5, 2), dt), 2), dict(axis=0), symbolic={0: {0: "N"}}, name="[5]"),
    Sample((randn(rng, (3, 2), dt), 3), {}, name="[flat]"),
    Sample((randn(rng, (3, 2), dt), [1, 0, 3]), dict(axis=0), name="[list]"),
], dtypes=(float32, int64))
movement("tnp.roll", tnp.roll, torch_ref(lambda x, s, axis=None: torch.roll(x, s, axis)),
         lambda rng, dt: [
    Sample((randn(rng, (4, 3), dt), 1), dict(axis=0), symbolic={0: {0: "N"}}),
    Sample((randn(rng, (6, 3), dt), 1), dict(axis=0), symbolic={0: {0: "N"}}, name="[6]"),
    Sample((randn(rng, (4, 3), dt), -4), dict(axis=1), name="[neg]"),
    Sample((randn(rng, (4, 3), dt), 5), {}, name="[flat]"),
    Sample((randn(rng, (4, 3), dt), (1, 2)), dict(axis=(0, 1)), name="[multi]"),
])
movement("tnp.vstack", lambda *xs: tnp.vstack(xs), lambda *xs: np.asarray(
    torch.vstack([torch.from_numpy(x) for x in xs])), lambda rng, dt: [
    Sample((randn(rng, (3,), dt), randn(rng, (3,), dt))),
    Sample((randn(rng, (2, 3), dt), randn(rng, (1, 3), dt)), name="[2d]")])
movement("tnp.hstack", lambda *xs: tnp.hstack(xs), lambda *xs: np.asarray(
    torch.hstack([torch.from_numpy(x) for x in xs])), lambda rng, dt: [
    Sample((randn(rng, (3,), dt), randn(rng, (2,), dt))),
    Sample((randn(rng, (2, 3), dt), randn(rng, (2, 1), dt)), name="[2d]")])
movement("tnn.one_hot", tnn.one_hot, lambda x, n: TF.one_hot(torch.from_numpy(x), n).numpy(),
         lambda rng, dt: [Sample((rng.integers(0, 5, (4,)).astype(dt), 5)),
                          Sample((rng.integers(0, 3, (2, 3)).astype(dt), 4), name="[2d]")],
         dtypes=(int64,))
