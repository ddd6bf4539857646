"""Op-table entries for the elementwise math composites (tgx/primitives/math.py), against
PyTorch (and JAX where torch lacks the op)."""

from __future__ import annotations

import jax
import numpy as np
import torch

import tgx.numpy as tnp
from tgx.shapes import bfloat16, float16, float32, float64, int32, int64

from .op_table import OpInfo, Sample, randn, register

jax.config.update("jax_enable_x64", True)

F = (float32, float64)
FH = (float32, float64, float16, bfloat16)


def to_torch(a):
    if isinstance(a, np.ndarray) or isinstance(a, np.generic):
        a = np.asarray(a)
        if a.dtype == bfloat16:
            return torch.from_numpy(a.astype(np.float32)).to(torch.bfloat16)
        return torch.from_numpy(a.copy())
    return a


def from_torch(t, like=None):
    if isinstance(t, (tuple, list)):
        return type(t)(from_torch(x) for x in t)
    if t.dtype == torch.bfloat16:
        return t.float().numpy().astype(bfloat16)
    return t.detach().numpy()


def torch_ref(fn):
    """A reference running `fn` on torch tensors made from the NumPy inputs."""
    def ref(*args, **kwargs):
        return from_torch(fn(*[to_torch(a) for a in args], **kwargs))
    ref.torch_fn = fn  # the gradient tests run torch.autograd on it
    return ref


def jax_ref(fn):
    def ref(*args, **kwargs):
        out = fn(*[jax.numpy.asarray(a) if isinstance(a, np.ndarray) else a for a in args],
                 **kwargs)
        return jax.tree_util.tree_map(np.asarray, out)
    ref.jax_fn = fn  # the gradient tests run jax.vjp on it
    return ref


def unary_samples(low=-3.0, high=3.0, edge=()):
    """Random (3, 5) and (7, 5) with a symbolic leading dim, a scalar, and edge values."""
    def make(rng, dt):
        out = [
            Sample((randn(rng, (3, 5), dt, low=low, high=high),), symbolic={0: {0: "N"}}),
            Sample((randn(rng, (7, 5), dt, low=low, high=high),), symbolic={0: {0: "N"}},
                   name="[7x5]"),
            Sample((randn(rng, (), dt, low=low, high=high),), name="[scalar]"),
        ]
        if edge:
            out.append(Sample((np.asarray(edge, np.float64).astype(dt),), name="[edge]"))
        return out
    return make


HALF_TOL = {float16: (1e-2, 1e-2), bfloat16: (5e-2, 5e-2)}

UNARY = [
    # name, tnp fn, torch fn, sample kwargs, dtypes
    ("abs", tnp.abs, torch.abs, dict(edge=(0.0, -0.0, -1e4, 1e4)), FH),
    ("sign", tnp.sign, torch.sign, dict(edge=(0.0, -2.0, 3.0, np.nan)), FH),
    ("square", tnp.square, torch.square, {}, FH),
    ("reciprocal", tnp.reciprocal, torch.reciprocal, dict(low=0.2, high=4.0), FH),
    ("rsqrt", tnp.rsqrt, torch.rsqrt, dict(low=0.1, high=9.0), FH),
    ("ceil", tnp.ceil, torch.ceil, dict(low=-5, high=5, edge=(-0.5, 0.5, 2.0, -2.0)), FH),
    ("log1p", tnp.log1p, torch.log1p,
     dict(low=-0.99, high=5.0, edge=(0.0, 1e-10, -1e-10, 3e-8, -0.999, 1e4)), FH),
    ("expm1", tnp.expm1, torch.expm1,
     dict(low=-3.0, high=3.0, edge=(0.0, 1e-10, -1e-10, 3e-8, -0.49, 0.49, -30.0, 20.0)), FH),
    ("tan", tnp.tan, torch.tan, dict(low=-1.4, high=1.4), FH),
    ("arcsin", tnp.arcsin, torch.asin, dict(low=-0.99, high=0.99, edge=(-1.0, 0.0, 1.0)), FH),
    ("arccos", tnp.arccos, torch.acos, dict(low=-0.99, high=0.99, edge=(-1.0, 0.0, 1.0)), FH),
    ("sinh", tnp.sinh, torch.sinh, dict(low=-5, high=5, edge=(0.0, 1e-8, -1e-8)), FH),
    ("cosh", tnp.cosh, torch.cosh, dict(low=-5, high=5, edge=(0.0, 1e-8)), FH),
    ("tanh", tnp.tanh, torch.tanh,
     dict(low=-4, high=4, edge=(0.0, 1e-8, -1e-8, 1e-3, 20.0, -20.0, 1e4, -1e4)), FH),
    ("arcsinh", tnp.arcsinh, torch.asinh, dict(low=-5, high=5, edge=(0.0, 1e-8, 1e4, -1e4)),
     FH),
    ("arccosh", tnp.arccosh, torch.acosh, dict(low=1.0, high=8.0, edge=(1.0, 1.0001, 1e4)),
     FH),
    ("arctanh", tnp.arctanh, torch.atanh,
     dict(low=-0.95, high=0.95, edge=(0.0, 1e-8, -0.5)), FH),
    ("erfinv", tnp.erfinv, torch.erfinv, dict(low=-0.99, high=0.99, edge=(0.0, 0.999)),
     (float32,)),
]

for name, fn, tfn, kw, dts in UNARY:
    tol = dict(HALF_TOL)
    ref = torch_ref(tfn) if name != "sign" else jax_ref(jax.numpy.sign)  # torch.sign(nan) = 0
    if name == "erfinv":
        tol[float32] = (5e-5, 1e-6)   # Giles' single-precision polynomial
    register(OpInfo(f"tnp.{name}[composite]", fn, ref, unary_samples(**kw),
                    dtypes=dts, tol=tol, decomposes=True))


def sign_int_samples(rng, dt):
    return [Sample((rng.integers(-5, 6, (4, 3)).astype(dt),), symbolic={0: {0: "N"}}),
            Sample((rng.integers(-5, 6, (6, 3)).astype(dt),), symbolic={0: {0: "N"}},
                   name="[6x3]")]


register(
    OpInfo("tnp.abs[int]", tnp.abs, torch_ref(torch.abs), sign_int_samples,
           dtypes=(int32, int64), decomposes=True),
    OpInfo("tnp.sign[int]", tnp.sign, torch_ref(torch.sign), sign_int_samples,
           dtypes=(int32, int64), decomposes=True),
    OpInfo("tnp.square[int]", tnp.square, torch_ref(torch.square), sign_int_samples,
           dtypes=(int32, int64), decomposes=True),
)


def binary_samples(rng, dt):
    return [
        Sample((randn(rng, (4, 3), dt, scale=3), randn(rng, (4, 3), dt, scale=3)),
               symbolic={0: {0: "N"}, 1: {0: "N"}}),
        Sample((randn(rng, (6, 3), dt, scale=3), randn(rng, (6, 3), dt, scale=3)),
               symbolic={0: {0: "N"}, 1: {0: "N"}}, name="[6x3]"),
        Sample((randn(rng, (4, 1, 3), dt), randn(rng, (5, 1), dt)), name="[bcast]"),
    ]


def atan2_samples(rng, dt):
    edge = np.array([[0.0, 1.0, -1.0, 0.0, 2.0, -2.0], [1.0, 0.0, 0.0, -1.0, -2.0, -2.0]], dt)
    return binary_samples(rng, dt) + [Sample((edge[0], edge[1]), name="[axes]")]


def mod_samples(rng, dt):
    def nz(shape):
        return (randn(rng, shape, dt, low=0.5, high=4) * rng.choice([-1, 1], shape)).astype(dt)
    return [Sample((randn(rng, (4, 3), dt, scale=5), nz((4, 3))),
                   symbolic={0: {0: "N"}, 1: {0: "N"}}),
            Sample((randn(rng, (6, 3), dt, scale=5), nz((6, 3))),
                   symbolic={0: {0: "N"}, 1: {0: "N"}}, name="[6x3]"),
            Sample((randn(rng, (2, 3), dt, scale=5), 1.5), name="[scalar]")]


def mod_int_samples(rng, dt):
    def nz(shape):
        return (rng.integers(1, 6, shape) * rng.choice([-1, 1], shape)).astype(dt)
    return [Sample((rng.integers(-20, 20, (4, 3)).astype(dt), nz((4, 3))),
                   symbolic={0: {0: "N"}, 1: {0: "N"}}),
            Sample((rng.integers(-20, 20, (5, 3)).astype(dt), nz((5, 3))),
                   symbolic={0: {0: "N"}, 1: {0: "N"}}, name="[5x3]")]


def clip_samples(rng, dt):
    return [
        Sample((randn(rng, (4, 3), dt, scale=2), -0.5, 0.7), symbolic={0: {0: "N"}}),
        Sample((randn(rng, (6, 3), dt, scale=2), -0.5, 0.7), symbolic={0: {0: "N"}},
               name="[6x3]"),
        Sample((randn(rng, (4, 3), dt, scale=2), randn(rng, (3,), dt) - 1,
                randn(rng, (4, 1), dt) + 1), name="[arrays]"),
        Sample((randn(rng, (4, 3), dt, scale=2), None, 0.3), name="[max only]"),
    ]


def _torch_clip(x, lo, hi):
    return torch.clamp(x, lo, hi)


register(
    OpInfo("tnp.arctan2[composite]", tnp.arctan2, torch_ref(torch.atan2), atan2_samples,
           dtypes=FH, tol=HALF_TOL, decomposes=True),
    OpInfo("tnp.remainder[composite]", tnp.remainder, torch_ref(torch.remainder), mod_samples,
           dtypes=F, tol={float32: (1e-5, 1e-5)}, decomposes=True),
    OpInfo("tnp.remainder[composite,int]", tnp.remainder, torch_ref(torch.remainder),
           mod_int_samples, dtypes=(int32, int64), decomposes=True),
    OpInfo("tnp.clip[composite]", tnp.clip, torch_ref(_torch_clip), clip_samples, dtypes=FH,
           decomposes=True),
    OpInfo("tnp.logaddexp", tnp.logaddexp, torch_ref(torch.logaddexp), lambda rng, dt:
           binary_samples(rng, dt) + [Sample((np.array([1e4, -1e4, 0.0], dt),
                                              np.array([1e4, 1e4, -1e4], dt)), name="[edge]")],
           dtypes=F, decomposes=True),
)
