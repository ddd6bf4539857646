"""Op-table entries for the losses of `tgx.nn`, against `torch.nn.functional`."""

from __future__ import annotations


import numpy as np
import torch.nn.functional as F

import tgx.nn as tnn
import tgx.primitives.losses  # noqa: F401 - registers the primitives
from tgx.shapes import bfloat16, float16, float32, float64

from .op_table import OpInfo, Sample, randn, register, torch_ref

ALL = (float32, float64, float16, bfloat16)
SYM2 = {0: {0: "N"}, 1: {0: "N"}}






def _targets(rng, shape, n_cls, ignore_frac=0.0):
    t = rng.integers(0, n_cls, shape)
    if ignore_frac:
        t = np.where(rng.random(shape) < ignore_frac, -100, t)
    return t.astype(np.int64)


def ce_samples(rng, dt):
    out = []
    w5 = randn(rng, (5,), dt, positive=True)
    for extra, kw in [((), {}), ((w5,), dict(label_smoothing=0.1)),
                      ((), dict(reduction="sum", ignore_index=2))]:
        for n in (3, 6):
            frac = 0.0 if "ignore_index" in kw else 0.3  # (targets may only be -100 if ignored)
            out.append(Sample((randn(rng, (n, 5), dt), _targets(rng, (n,), 5, frac)) + extra, kw,
                              symbolic=SYM2, name=f"[N={n},{len(extra)},{sorted(kw)}]"))
    out += [
        Sample((randn(rng, (2, 4, 3), dt), _targets(rng, (2, 3), 4, 0.3)),
               dict(reduction="none", label_smoothing=0.2), name="[NCd,none]"),
        Sample((randn(rng, (3, 4), dt), np.full((3,), -100, np.int64)), name="[all-ignored]"),
        Sample((randn(rng, (3, 4), dt), np.full((3,), -100, np.int64),
                randn(rng, (4,), dt, positive=True)), dict(label_smoothing=0.3),
               name="[all-ignored,smooth]"),
        Sample(((rng.choice([-1.0, 1.0], (4, 6)) * 1e4).astype(dt), _targets(rng, (4,), 6)),
               name="[large-logits]"),
        Sample((randn(rng, (5,), dt), np.asarray(2, np.int64)), name="[1-D]"),
    ]
    for n in (3, 4):
        probs = np.abs(randn(rng, (n, 5), np.float64)) + 0.1
        out.append(Sample((randn(rng, (n, 5), dt), (probs / probs.sum(1, keepdims=True))
                           .astype(dt)), dict(label_smoothing=0.1), symbolic=SYM2,
                          name=f"[probs,N={n}]"))
    out.append(Sample((randn(rng, (2, 3, 4), dt), randn(rng, (2, 3, 4), dt, positive=True),
                       randn(rng, (3,), dt, positive=True)), dict(reduction="none"),
                      name="[probs,NCd,weight]"))
    return out


def nll_samples(rng, dt):
    def logp(shape):
        x = randn(rng, shape, np.float64)
        return (x - np.log(np.exp(x).sum(1, keepdims=True))).astype(dt)
    out = [Sample((logp((n, 4)), _targets(rng, (n,), 4, 0.3)), symbolic=SYM2, name=f"[N={n}]")
           for n in (4, 7)]
    out += [Sample((logp((3, 4, 2)), _targets(rng, (3, 2), 4, 0.3),
                    randn(rng, (4,), dt, positive=True)), dict(reduction=r), name=f"[{r}]")
            for r in ("none", "mean", "sum")]
    out.append(Sample((logp((2, 3)), np.full((2,), -100, np.int64)), name="[all-ignored]"))
    return out


def pair_samples(make_target=None, kwargs_list=({},)):
    def make(rng, dt):
        out = []
        for kw in kwargs_list:
            for n in (3, 5):
                x = randn(rng, (n, 4), dt)
                t = make_target(rng, (n, 4), dt) if make_target else randn(rng, (n, 4), dt)
                out.append(Sample((x, t), dict(kw), symbolic=SYM2, name=f"[N={n},{kw}]"))
        return out
    return make


def _kl_target(rng, shape, dt):
    p = np.abs(randn(rng, shape, np.float64))
    p[0, 0] = 0.0
    return (p / p.sum(-1, keepdims=True)).astype(dt)


def kl_samples(rng, dt):
    out = pair_samples(_kl_target, [dict(reduction=r) for r in
                                    ("mean", "sum", "none", "batchmean")])(rng, dt)
    for n in (2, 4):
        out.append(Sample((randn(rng, (n, 3), dt), randn(rng, (n, 3), dt)),
                          dict(log_target=True, reduction="batchmean"), symbolic=SYM2,
                          name=f"[log_target,N={n}]"))
    return out


def bce_samples(rng, dt):
    def probs(shape):
        return rng.uniform(0.02, 0.98, shape).astype(dt)
    out = []
    for kw in ({}, dict(reduction="sum"), dict(reduction="none")):
        for n in (3, 5):
            out.append(Sample((probs((n, 4)), probs((n, 4))), kw, symbolic=SYM2,
                              name=f"[N={n},{kw}]"))
    edge = np.array([[0.0, 1.0, 0.5, 1e-3]], dt)
    out.append(Sample((edge, np.array([[1.0, 0.0, 0.5, 1.0]], dt)),
                      dict(reduction="none"), name="[clamped-logs]"))
    out.append(Sample((probs((2, 4)), probs((2, 4)), probs((4,))), name="[weight]"))
    return out


def bce_logits_samples(rng, dt):
    out = []
    pw = randn(rng, (4,), dt, positive=True)
    for extra in ((), (None, None, None, "sum", pw)):
        for n in (3, 5):
            out.append(Sample((randn(rng, (n, 4), dt, scale=3), rng.uniform(0, 1, (n, 4))
                               .astype(dt)) + extra, symbolic=SYM2, name=f"[N={n},{len(extra)}]"))
    big = np.array([[-100.0, 100.0, -30.0, 30.0]], dt)
    out.append(Sample((big, np.array([[1.0, 0.0, 0.0, 1.0]], dt)), dict(reduction="none"),
                      name="[large-logits]"))
    out.append(Sample((randn(rng, (2, 4), dt), rng.uniform(0, 1, (2, 4)).astype(dt),
                       randn(rng, (2, 1), dt, positive=True), None, None, "none",
                       randn(rng, (4,), dt, positive=True)), name="[weight,pos_weight]"))
    return out


HALF_TOL = {float16: (1e-2, 1e-2), bfloat16: (4e-2, 4e-2)}
ENTRIES = [
    ("cross_entropy", tnn.cross_entropy, F.cross_entropy, ce_samples),
    ("nll_loss", tnn.nll_loss, F.nll_loss, nll_samples),
    ("mse_loss", tnn.mse_loss, F.mse_loss,
     pair_samples(kwargs_list=({}, dict(reduction="none")))),
    ("l1_loss", tnn.l1_loss, F.l1_loss, pair_samples(kwargs_list=({}, dict(reduction="sum")))),
    ("smooth_l1_loss", tnn.smooth_l1_loss, F.smooth_l1_loss,
     pair_samples(kwargs_list=({}, dict(beta=0.5, reduction="none"), dict(beta=0.0)))),
    ("kl_div", tnn.kl_div, F.kl_div, kl_samples),
    ("binary_cross_entropy", tnn.binary_cross_entropy, F.binary_cross_entropy, bce_samples),
    ("binary_cross_entropy_with_logits", tnn.binary_cross_entropy_with_logits,
     F.binary_cross_entropy_with_logits, bce_logits_samples),
]
for name, fn, ref, samples in ENTRIES:
    register(OpInfo(f"tnn.{name}", fn, torch_ref(ref), samples, dtypes=ALL, tol=HALF_TOL,
                    decomposes=True))
