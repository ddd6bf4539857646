"""Op-table entries for the activations and the softmax family (tgx.nn), against
torch.nn.functional and jax.nn, including |x| = 1e4 (no overflow, decomposed graph too)."""

from __future__ import annotations

import jax
import numpy as np
import torch
import torch.nn.functional as TF

import tgx
import tgx.nn as tnn
from tgx.shapes import bfloat16, float16, float32, float64

from .op_table import OpInfo, Sample, randn, register
from .ops_math import HALF_TOL, jax_ref, torch_ref, unary_samples

jax.config.update("jax_enable_x64", True)

FH = (float32, float64, float16, bfloat16)
BIG = (0.0, -1e4, 1e4, -50.0, 50.0, 1e-7, -1e-7)


def with_kwargs(make, **kw):
    def samples(rng, dt):
        return [Sample(s.args, {**s.kwargs, **kw}, s.symbolic, s.name) for s in make(rng, dt)]
    return samples


ACTS = [
    ("relu", tnn.relu, TF.relu, {}),
    ("leaky_relu", tnn.leaky_relu, TF.leaky_relu, dict(negative_slope=0.2)),
    ("elu", tnn.elu, TF.elu, dict(alpha=1.3)),
    ("selu", tnn.selu, TF.selu, {}),
    ("celu", tnn.celu, TF.celu, dict(alpha=0.7)),
    ("gelu", tnn.gelu, TF.gelu, {}),
    ("gelu_tanh", tnn.gelu, TF.gelu, dict(approximate="tanh")),
    ("sigmoid", tnn.sigmoid, torch.sigmoid, {}),
    ("silu", tnn.silu, TF.silu, {}),
    ("softplus", tnn.softplus, TF.softplus, {}),
    ("softplus_beta", tnn.softplus, TF.softplus, dict(beta=2.0, threshold=5.0)),
    ("hardtanh", tnn.hardtanh, TF.hardtanh, dict(min_val=-0.5, max_val=2.0)),
    ("hardswish", tnn.hardswish, TF.hardswish, {}),
    ("tanh", tnn.tanh, torch.tanh, {}),
    ("mish", tnn.mish, TF.mish, {}),
    ("logsigmoid", tnn.logsigmoid, TF.logsigmoid, {}),
]

for name, fn, tfn, kw in ACTS:
    edge = BIG if name != "hardswish" else BIG + (-3.0, 3.0)
    register(OpInfo(f"tnn.{name}", fn, torch_ref(tfn),
                    with_kwargs(unary_samples(low=-6, high=6, edge=edge), **kw),
                    dtypes=FH, tol=HALF_TOL, decomposes=True))


def _gelu_vjp(ct, x, approximate="none"):
    """What `tgx.grad` runs for gelu: its VJP (the `gelu_grad` composite)."""
    return tgx.vjp(lambda x: tnn.gelu(x, approximate=approximate), x)[1](ct)[0]


def gelu_grad_samples(rng, dt):
    edge = np.asarray(BIG + (10.0, -10.0, 9.5, 3.0, -3.0), np.float64)
    return [
        Sample((randn(rng, (3, 5), dt), randn(rng, (3, 5), dt, low=-6, high=6)),
               symbolic={0: {0: "N"}, 1: {0: "N"}}),
        Sample((randn(rng, (7, 5), dt), randn(rng, (7, 5), dt, low=-6, high=6)),
               name="[7x5]"),
        Sample((np.ones(edge.shape, dt), edge.astype(dt)), name="[edge]"),
    ]


for _name, _kw in (("gelu_grad", {}), ("gelu_grad_tanh", dict(approximate="tanh"))):
    register(OpInfo(f"tnn.{_name}", _gelu_vjp, torch_ref(torch.ops.aten.gelu_backward),
                    with_kwargs(gelu_grad_samples, **_kw), dtypes=FH, tol=HALF_TOL,
                    decomposes=True))


def softmax_samples(rng, dt):
    edge = np.array([[1e4, 0.0, -1e4], [-1e4, -1e4, -1e4], [0.0, 0.0, 0.0], [1e4, 1e4, 5.0]], dt)
    return [
        Sample((randn(rng, (3, 5), dt, scale=3),), dict(dim=-1), symbolic={0: {0: "N", 1: "K"}}),
        Sample((randn(rng, (4, 6), dt, scale=3),), dict(dim=-1), symbolic={0: {0: "N", 1: "K"}},
               name="[4x6]"),
        Sample((randn(rng, (2, 3, 4), dt, scale=3),), dict(dim=1), name="[dim1]"),
        Sample((edge,), dict(dim=-1), name="[edge]"),
        Sample((edge,), dict(dim=0), name="[edge0]"),
    ]


def lse_samples(rng, dt):
    edge = np.array([[1e4, 0.0, -1e4], [-1e4, -1e4, -1e4], [0.0, 0.0, 0.0], [-np.inf] * 3], dt)
    return [
        Sample((randn(rng, (3, 5), dt, scale=3),), dict(dim=-1), symbolic={0: {0: "N", 1: "K"}}),
        Sample((randn(rng, (4, 6), dt, scale=3),), dict(dim=-1), symbolic={0: {0: "N", 1: "K"}},
               name="[4x6]"),
        Sample((randn(rng, (2, 3, 4), dt, scale=3),), dict(dim=(0, 2), keepdim=True),
               name="[keep]"),
        Sample((edge,), dict(dim=1), name="[edge]"),
    ]


def _jax_lse(x, dim, keepdim=False):
    return jax.nn.logsumexp(x, axis=dim, keepdims=keepdim)


register(
    OpInfo("tnn.softmax", tnn.softmax, torch_ref(TF.softmax), softmax_samples, dtypes=FH,
           tol=HALF_TOL, decomposes=True),
    OpInfo("tnn.log_softmax", tnn.log_softmax, torch_ref(TF.log_softmax), softmax_samples,
           dtypes=FH, tol={float16: (1e-2, 2e-2), bfloat16: (5e-2, 1e-1)}, decomposes=True),
    OpInfo("tnn.logsumexp", tnn.logsumexp, jax_ref(_jax_lse), lse_samples,
           dtypes=(float32, float64, bfloat16), tol={bfloat16: (5e-2, 1e-1)}, decomposes=True),
    OpInfo("tnn.softmax[axis]", lambda x: tnn.softmax(x, axis=0),
           torch_ref(lambda x: TF.softmax(x, dim=0)), lambda rng, dt: [
               Sample(s.args, {}, s.symbolic, s.name) for s in softmax_samples(rng, dt)[:2]],
           dtypes=(float32,), decomposes=True),
)
