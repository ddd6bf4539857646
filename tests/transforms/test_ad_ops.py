"""Gradients of every op in the op table: tgx's VJP against torch.autograd or jax.vjp (float32
and float64) and against central finite differences in float64."""

from __future__ import annotations

import importlib
import pathlib
import zlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import torch.nn.functional as F

import tgx
import tgx.numpy as tnp
from tests.ops.op_table import OPS, split_args

for _f in sorted(pathlib.Path(__file__).parents[1].joinpath("ops").glob("ops_*.py")):
    importlib.import_module(f"tests.ops.{_f.stem}")

jax.config.update("jax_enable_x64", True)

# Ops whose reference is a local NumPy function: the torch function with the same semantics.
TORCH = {
    "tnp.abs[composite]": torch.abs, "tnp.square[composite]": torch.square,
    "tnp.reciprocal[composite]": torch.reciprocal, "tnp.rsqrt[composite]": torch.rsqrt,
    "tnp.log1p[composite]": torch.log1p, "tnp.expm1[composite]": torch.expm1,
    "tnp.tan[composite]": torch.tan, "tnp.arcsin[composite]": torch.arcsin,
    "tnp.arccos[composite]": torch.arccos, "tnp.sinh[composite]": torch.sinh,
    "tnp.cosh[composite]": torch.cosh, "tnp.tanh[composite]": torch.tanh,
    "tnp.arcsinh[composite]": torch.arcsinh, "tnp.arccosh[composite]": torch.arccosh,
    "tnp.arctanh[composite]": torch.arctanh, "tnp.erfinv[composite]": torch.erfinv,
    "tnp.arctan2[composite]": torch.arctan2, "tnp.logaddexp": torch.logaddexp,
    "tnp.erf": torch.erf, "tnn.tanh": torch.tanh, "tnn.relu": F.relu,
    "tnn.sigmoid": torch.sigmoid, "tnn.silu": F.silu, "tnn.mish": F.mish,
    "tnn.logsigmoid": F.logsigmoid, "tnn.selu": F.selu, "tnn.hardswish": F.hardswish,
    "tnn.scaled_dot_product_attention": F.scaled_dot_product_attention,
    "tnp.concatenate": lambda *xs, axis=0: torch.cat(xs, axis),
    "tnp.stack": lambda *xs, axis=0: torch.stack(xs, axis),
}

# Inputs without a derivative: the op is differentiated only with respect to the others.
NOT_DIFFERENTIABLE = {
    "tnn.kl_div": (1,),  # the target (t·log t has no derivative at t = 0)
    # class / element weights: torch refuses to differentiate them
    "tnn.cross_entropy": (2,), "tnn.nll_loss": (2,), "tnn.binary_cross_entropy": (2,),
    "tnn.binary_cross_entropy_with_logits": (2, 6),
}
# Samples where the reference library's gradient is a convention tgx does not share.
NO_REFERENCE_AT = {
    ("tnn.cross_entropy", "[all-ignored]"): "torch: a NaN loss (mean over no targets) with "
                                            "zero gradients; tgx: NaN gradients",
    ("tnn.cross_entropy", "[all-ignored,smooth]"): "as above",
    ("tnn.nll_loss", "[all-ignored]"): "as cross_entropy",
}
# Where a finite difference cannot stand for the derivative.
NO_FINITE_DIFFERENCE = {
    "tnp.astype[f16]": "the forward rounds to float16: steps of 1e-6 vanish",
    "tnp.floor": "piecewise constant", "tnp.round": "piecewise constant",
    "tnp.ceil[composite]": "piecewise constant", "tnp.sign[composite]": "piecewise constant",
    "tnp.floor_divide": "piecewise constant",
}
# Samples placed where a difference quotient straddles a discontinuity or a curvature at the
# scale of the step.
NO_FINITE_DIFFERENCE_AT = {
    ("tnp.arctan2[composite]", "[axes]"): "zeros on the branch cut",
    ("tnn.rms_norm", "[zeros]"): "rms = sqrt(eps): curvature at the scale of the step",
    ("tnn.binary_cross_entropy", "[clamped-logs]"): "x at 0 and 1, where the logs are clamped",
}
TOL = {np.float32: (2e-4, 1e-4), np.float64: (1e-8, 1e-10)}
# torch's celu backward rounds 1/alpha to float32: 1e-8 relative error in float64.
TOL_OVERRIDE = {("tnn.celu", np.float64): (1e-7, 1e-10)}


def _cases(dtypes):
    out = []
    for info in OPS:
        have = [np.dtype(d) for d in info.dtypes]
        for dt in dtypes:
            # Ops tested in float32 only still get float64 gradients (inputs cast up).
            if dt in have or (np.dtype(np.float32) in have and dt == np.float64):
                out.append(pytest.param(info, dt, id=f"{info.name}-{np.dtype(dt).name}"))
    return out


def _setup(info, dtype, rng):
    """[(fn of the differentiated args, those args, cotangent maker)] per sample."""
    have = [np.dtype(d) for d in info.dtypes]
    sdt = dtype if np.dtype(dtype) in have else np.dtype(np.float32)
    samples = info.samples(np.random.default_rng(zlib.crc32(info.name.encode())), sdt)
    cases = []
    for s in samples:
        idx, fn = split_args(info, s)
        args = [s.args[i].astype(dtype) if s.args[i].dtype.kind == "f" else s.args[i]
                for i in idx]
        skip = NOT_DIFFERENTIABLE.get(info.name, ())
        diff = [k for k, a in enumerate(args) if a.dtype.kind == "f" and idx[k] not in skip]
        if not diff:
            continue
        cases.append((s, idx, fn, args, diff))
    return cases


def _restricted(fn, args, diff):
    def f(*dargs):
        full = list(args)
        for k, a in zip(diff, dargs):
            full[k] = a
        return fn(*full)
    return f


def _float_leaves(out):
    return [o for o in tgx.tree_flatten(out)[0] if np.asarray(o).dtype.kind == "f"]


def _tgx_vjp(f, dargs, cts):
    def scalar_fn(*a):
        total = 0.0
        for leaf, c in zip([o for o in tgx.tree_flatten(f(*a))[0]
                            if o.dtype.kind == "f"], cts):
            total = total + tnp.sum(leaf * c)
        return total
    return tgx.grad(scalar_fn, argnums=tuple(range(len(dargs))))(*dargs)


def _reference_vjp(info, sample, idx, args, diff, cts):
    """The VJP by torch.autograd or jax.vjp, or None when the op has no such reference."""
    torch_fn = getattr(info.ref, "torch_fn", None)
    jax_fn = getattr(info.ref, "jax_fn", None)
    if torch_fn is None and jax_fn is None:
        torch_fn = TORCH.get(info.name)
    if torch_fn is None and jax_fn is None:
        jax_fn = getattr(jnp, getattr(info.ref, "__name__", ""), None)
    full = list(sample.args)
    for k, i in enumerate(idx):
        full[i] = args[k]
    pos = [idx[k] for k in diff]
    if torch_fn is not None:
        ts = [torch.from_numpy(np.array(a)).requires_grad_(i in pos)
              if isinstance(a, np.ndarray) else a for i, a in enumerate(full)]
        kw = {k: torch.from_numpy(np.array(v)) if isinstance(v, np.ndarray) else v
              for k, v in sample.kwargs.items()}
        out = torch_fn(*ts, **kw)
        leaves = [o for o in (out if isinstance(out, (tuple, list)) else [out])
                  if o.dtype.is_floating_point]
        grads = torch.autograd.grad(leaves, [ts[i] for i in pos],
                                    [torch.from_numpy(np.array(c)) for c in cts],
                                    allow_unused=True)
        return [np.zeros_like(args[k]) if g is None else g.numpy() for k, g in zip(diff, grads)]
    if jax_fn is None:
        return None

    def f(*dargs):
        a = list(full)
        for i, d in zip(pos, dargs):
            a[i] = d
        out = jax_fn(*[jnp.asarray(x) if isinstance(x, np.ndarray) else x for x in a],
                     **sample.kwargs)
        return [o for o in jax.tree_util.tree_leaves(out) if jnp.issubdtype(o.dtype,
                                                                             jnp.floating)]

    _, pull = jax.vjp(f, *[jnp.asarray(full[i]) for i in pos])
    return [np.asarray(g) for g in pull([jnp.asarray(c) for c in cts])]


@pytest.mark.parametrize("info,dtype", _cases([np.float32, np.float64]))
def test_vjp_matches_torch_or_jax(info, dtype):
    rng = np.random.default_rng(1)
    checked = 0
    for s, idx, fn, args, diff in _setup(info, dtype, rng):
        f = _restricted(fn, args, diff)
        dargs = [args[k] for k in diff]
        cts = [rng.standard_normal(np.shape(o)).astype(np.asarray(o).dtype)
               for o in _float_leaves(f(*dargs))]
        if (info.name, s.name) in NO_REFERENCE_AT:
            continue
        expected = _reference_vjp(info, s, idx, args, diff, cts)
        if expected is None:
            continue
        actual = _tgx_vjp(f, dargs, cts)
        rtol, atol = TOL_OVERRIDE.get((info.name, np.dtype(dtype).type),
                                      TOL[np.dtype(dtype).type])
        for k, (a, e) in enumerate(zip(actual, expected)):
            e = np.asarray(e)
            scale = max(1.0, float(np.max(np.abs(e[np.isfinite(e)]), initial=0.0)))
            np.testing.assert_allclose(np.asarray(a, np.float64), e, rtol=rtol,
                                       atol=atol * scale,
                                       err_msg=f"{info.name}{s.name}: gradient of arg {k}")
            assert np.asarray(a).dtype == dtype
        checked += 1
    if checked == 0:
        pytest.skip(f"{info.name}: no torch or jax reference; finite differences check it")


@pytest.mark.parametrize("info,dtype", _cases([np.float64]))
def test_vjp_matches_finite_differences(info, dtype):
    if info.name in NO_FINITE_DIFFERENCE:
        pytest.skip(NO_FINITE_DIFFERENCE[info.name])
    rng = np.random.default_rng(2)
    cases = _setup(info, dtype, rng)
    if not cases:
        pytest.skip(f"{info.name} has no floating-point inputs")
    for s, _idx, fn, args, diff in cases:
        if "edge" in s.name or (info.name, s.name) in NO_FINITE_DIFFERENCE_AT:
            continue  # kinks and saturation points: a difference quotient straddles them
        f = _restricted(fn, args, diff)
        dargs = [args[k] for k in diff]
        cts = [rng.standard_normal(np.shape(o)) for o in _float_leaves(f(*dargs))]

        def scalar(*a, f=f, cts=cts):
            return sum(float(np.sum(np.asarray(o, np.float64) * c))
                       for o, c in zip(_float_leaves(f(*a)), cts))

        grads = _tgx_vjp(f, dargs, cts)
        for _ in range(2):
            vs = [rng.standard_normal(np.shape(a)) for a in dargs]
            eps = 1e-6
            fd = (scalar(*[a + eps * v for a, v in zip(dargs, vs)])
                  - scalar(*[a - eps * v for a, v in zip(dargs, vs)])) / (2 * eps)
            an = sum(float(np.sum(np.asarray(g) * v)) for g, v in zip(grads, vs))
            if np.isnan(fd) and np.isnan(an):
                continue  # a NaN loss (e.g. a mean over no targets) has NaN gradients
            assert abs(fd - an) <= 1e-5 * max(1.0, abs(fd)), (
                f"{info.name}{s.name}: directional derivative {an!r} vs finite difference "
                f"{fd!r}")
