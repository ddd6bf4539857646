"""Op-table entries for the normalisation ops of `tgx.nn`, against `torch.nn.functional`."""

from __future__ import annotations

import numpy as np
import torch.nn.functional as F

import tgx.nn as tnn
import tgx.primitives.norms  # noqa: F401 - registers the primitives
from tgx.shapes import bfloat16, float16, float32, float64

from .op_table import OpInfo, Sample, randn, register, to_torch, torch_ref

ALL = (float32, float64, float16, bfloat16)
SYM = {0: {0: "N"}}
HALF_TOL = {float32: (1e-4, 1e-5), float16: (1e-2, 1e-2), bfloat16: (4e-2, 4e-2)}






def layer_norm_samples(rng, dt):
    out = []
    for tail, ns in (((4, 6), (6,)), ((4, 6), (4, 6))):
        w, b = randn(rng, ns, dt), randn(rng, ns, dt)
        for n in (2, 3):
            out.append(Sample((randn(rng, (n,) + tail, dt), ns, w, b), symbolic=SYM,
                              name=f"[N={n},{ns}]"))
    out.append(Sample((randn(rng, (3, 5), dt) + np.asarray(50, dt), (5,)), dict(eps=1e-3),
                      name="[offset,no-affine]"))
    out.append(Sample((np.zeros((2, 5), dt), (5,), randn(rng, (5,), dt)), name="[zeros]"))
    return out


def rms_norm_samples(rng, dt):
    w = randn(rng, (8,), dt)
    out = [Sample((randn(rng, (n, 3, 8), dt), (8,), w), symbolic=SYM, name=f"[N={n}]")
           for n in (2, 4)]
    out.append(Sample((randn(rng, (3, 2, 4), dt), (2, 4)), dict(eps=1e-6), name="[2-D shape]"))
    out.append(Sample((np.zeros((2, 8), dt), (8,), w), name="[zeros]"))
    return out


def _bn_ref(x, rm, rv, *args, **kw):
    x, args = to_torch(x), [to_torch(a) for a in args]
    rm = None if rm is None else to_torch(rm).to(x.dtype)
    rv = None if rv is None else to_torch(rv).to(x.dtype)
    y = F.batch_norm(x, rm, rv, *args, **kw)
    return tuple(o.double().numpy() for o in (y, rm, rv) if o is not None)


def _bn_fn(*args, **kw):
    out = tnn.batch_norm_with_stats(*args, **kw)
    return tuple(o for o in out if o is not None)


def batch_norm_samples(rng, dt):
    c = 3
    stat_dt = np.float32 if dt in (float16, bfloat16) else dt  # torch keeps f32 stats for half
    rm = randn(rng, (c,), stat_dt)
    rv = randn(rng, (c,), stat_dt, positive=True)
    w, b = randn(rng, (c,), dt), randn(rng, (c,), dt)
    out = []
    for training in (True, False):
        for n in (2, 3):
            out.append(Sample((randn(rng, (n, c, 4, 5), dt), rm, rv, w, b, training, 0.2),
                              symbolic=SYM, name=f"[N={n},training={training}]"))
    out.append(Sample((randn(rng, (4, c), dt), None, None, w, None, True), name="[no-stats]"))
    out.append(Sample((np.zeros((2, c, 3), dt), rm, rv, None, b, True), name="[zeros]"))
    return out


def group_norm_samples(rng, dt):
    out = []
    w, b = randn(rng, (6,), dt), randn(rng, (6,), dt)
    for n in (2, 3):
        out.append(Sample((randn(rng, (n, 6, 3, 4), dt), 3, w, b), symbolic=SYM,
                          name=f"[N={n}]"))
    out += [Sample((randn(rng, (2, 6, 5), dt), g), name=f"[G={g}]") for g in (1, 6)]
    out.append(Sample((np.zeros((2, 6, 2, 2), dt), 2, w, b), name="[zeros]"))
    return out


register(
    OpInfo("tnn.layer_norm", tnn.layer_norm, torch_ref(F.layer_norm), layer_norm_samples,
           dtypes=ALL, tol=HALF_TOL, decomposes=True),
    OpInfo("tnn.rms_norm", tnn.rms_norm, torch_ref(F.rms_norm), rms_norm_samples, dtypes=ALL,
           tol=HALF_TOL, decomposes=True),
    OpInfo("tnn.batch_norm_with_stats", _bn_fn, _bn_ref, batch_norm_samples, dtypes=ALL,
           tol=HALF_TOL, decomposes=True),
    OpInfo("tnn.group_norm", tnn.group_norm, torch_ref(F.group_norm), group_norm_samples,
           dtypes=ALL, tol=HALF_TOL, decomposes=True),
)
