"""Op-table entries for convolution, pooling and padding in `tgx.nn`, against torch (and JAX's
`reduce_window` for the general pooling primitive)."""

from __future__ import annotations

import jax
import numpy as np
import torch.nn.functional as F

import tgx.nn as tnn
import tgx.primitives.conv  # noqa: F401 - registers the primitives
from tgx.shapes import bfloat16, float16, float32, float64

from .op_table import OpInfo, Sample, randn, register, torch_ref

jax.config.update("jax_enable_x64", True)

ALL = (float32, float64, float16, bfloat16)
TOL = {float32: (1e-4, 1e-5), float16: (1e-2, 1e-2), bfloat16: (4e-2, 5e-2)}
SYM = {0: {0: "N"}}






def _pairs(rng, configs, make_args, dt, sizes=(2, 3)):
    """For each config: one sample per batch size (symbolic N), the same static kwargs."""
    out = []
    for i, kw in enumerate(configs):
        for n in sizes:
            out.append(Sample(make_args(rng, n, kw, dt), dict(kw), symbolic=SYM,
                              name=f"[{i},N={n}]"))
    return out


def _conv_args(spatial, cin, cout, kernel, bias=True):
    def make(rng, n, kw, dt):
        g = kw.get("groups", 1)
        args = (randn(rng, (n, cin) + spatial, dt), randn(rng, (cout, cin // g) + kernel, dt,
                                                          scale=0.5))
        return args + ((randn(rng, (cout,), dt),) if bias else ())
    return make


def conv2d_samples(rng, dt):
    configs = [dict(), dict(stride=2, padding=1, groups=2),
               dict(padding="same", dilation=(2, 1), groups=4)]
    out = _pairs(rng, configs, _conv_args((6, 7), 4, 8, (3, 2)), dt)
    # Random extra combinations (unbatched, valid padding, asymmetric strides).
    for i in range(3):
        g = int(rng.choice([1, 2]))
        kw = dict(stride=tuple(int(s) for s in rng.integers(1, 3, 2)),
                  padding=tuple(int(p) for p in rng.integers(0, 2, 2)),
                  dilation=tuple(int(d) for d in rng.integers(1, 3, 2)), groups=g)
        out.append(Sample((randn(rng, (2, 2 * g, 7, 6), dt), randn(rng, (4, 2, 3, 3), dt)), kw,
                          name=f"[random{i}]"))
    out.append(Sample((randn(rng, (3, 5, 5), dt), randn(rng, (2, 3, 2, 2), dt)),
                      dict(padding="valid"), name="[unbatched]"))
    return out


def conv1d_samples(rng, dt):
    return _pairs(rng, [dict(stride=2, padding=2, dilation=2, groups=3)],
                  _conv_args((9,), 3, 6, (3,)), dt) + [
        Sample((randn(rng, (2, 2, 8), dt), randn(rng, (4, 2, 4), dt)), dict(padding="same"),
               name="[same,even-kernel]")]


def _conv_t_args(spatial, cin, og, kernel):
    def make(rng, n, kw, dt):
        g = kw.get("groups", 1)
        return (randn(rng, (n, cin) + spatial, dt), randn(rng, (cin, og) + kernel, dt, scale=0.5),
                randn(rng, (og * g,), dt))
    return make


def conv_transpose2d_samples(rng, dt):
    configs = [dict(), dict(stride=2, padding=1, output_padding=1, groups=2),
               dict(stride=(2, 3), padding=(0, 2), dilation=(1, 2), output_padding=(1, 0))]
    return _pairs(rng, configs, _conv_t_args((4, 5), 4, 3, (3, 3)), dt)


def conv_transpose1d_samples(rng, dt):
    return _pairs(rng, [dict(stride=3, padding=1, output_padding=2, groups=2)],
                  _conv_t_args((5,), 4, 2, (4,)), dt)


def _x_args(spatial, c=3):
    return lambda rng, n, kw, dt: (randn(rng, (n, c) + spatial, dt),)


def max_pool2d_samples(rng, dt):
    configs = [dict(kernel_size=2), dict(kernel_size=3, stride=2, padding=1, ceil_mode=True),
               dict(kernel_size=(2, 3), stride=(1, 2), padding=(1, 1), dilation=(2, 1))]
    return _pairs(rng, configs, _x_args((7, 8)), dt) + [
        Sample((randn(rng, (2, 5, 5), dt),), dict(kernel_size=2, ceil_mode=True),
               name="[unbatched,ceil]")]


def max_pool1d_samples(rng, dt):
    return _pairs(rng, [dict(kernel_size=3, stride=2, padding=1, dilation=2, ceil_mode=True)],
                  _x_args((10,)), dt)


def avg_pool2d_samples(rng, dt):
    configs = [dict(kernel_size=3, stride=2, padding=1, ceil_mode=True),
               dict(kernel_size=3, stride=2, padding=1, ceil_mode=True, count_include_pad=False),
               dict(kernel_size=(2, 4), stride=(2, 3), padding=(1, 2), divisor_override=5)]
    return _pairs(rng, configs, _x_args((7, 8)), dt)


def avg_pool1d_samples(rng, dt):
    return _pairs(rng, [dict(kernel_size=4, stride=3, padding=2, ceil_mode=True,
                             count_include_pad=False)], _x_args((11,)), dt)


def pad_samples(rng, dt):
    out = []
    for mode, pad in (("constant", (1, -1, 2, 0)), ("reflect", (2, 1, 1, 2)),
                      ("replicate", (3, 0, 1, 1)), ("circular", (1, 2, 0, 3))):
        for n in (2, 3):
            kw = dict(mode=mode, value=1.5) if mode == "constant" else dict(mode=mode)
            out.append(Sample((randn(rng, (n, 2, 4, 5), dt), pad), kw, symbolic=SYM,
                              name=f"[{mode},N={n}]"))
    out.append(Sample((randn(rng, (2, 3, 6), dt), (2, 3)), dict(mode="reflect"), name="[3-D]"))
    return out


def _jax_pool_ref(x, reduction, kernel_size, stride, padding, ceil_mode=False):
    """`jax.lax.reduce_window` (max, or sum / count with padding included), ceil_mode off."""
    import jax.numpy as jnp

    assert not ceil_mode
    n = len(kernel_size)
    xj = jnp.asarray(x.astype(np.float64) if x.dtype.itemsize == 8 else x.astype(np.float32))
    dims, strides = (1,) * (x.ndim - n) + kernel_size, (1,) * (x.ndim - n) + stride
    pads = ((0, 0),) * (x.ndim - n) + tuple((p, p) for p in padding)
    if reduction == "max":
        out = jax.lax.reduce_window(xj, -jnp.inf, jax.lax.max, dims, strides, pads)
    else:
        out = jax.lax.reduce_window(xj, 0.0, jax.lax.add, dims, strides, pads) / np.prod(
            kernel_size)
    return np.asarray(out, np.float64)


def pool_samples(rng, dt):
    out = []
    for red, k, s, p in (("max", (2, 2, 3), (1, 2, 2), (1, 0, 1)), ("avg", (3, 2), (2, 1),
                                                                      (1, 1))):
        for n in (2, 3):
            out.append(Sample((randn(rng, (n, 2) + (5, 6, 7)[-len(k):], dt), red, k, s, p),
                              symbolic=SYM, name=f"[{red},N={n}]"))
    return out


for name, fn, ref, samples in [
    ("conv2d", tnn.conv2d, F.conv2d, conv2d_samples),
    ("conv1d", tnn.conv1d, F.conv1d, conv1d_samples),
    ("conv_transpose2d", tnn.conv_transpose2d, F.conv_transpose2d, conv_transpose2d_samples),
    ("conv_transpose1d", tnn.conv_transpose1d, F.conv_transpose1d, conv_transpose1d_samples),
    ("max_pool2d", tnn.max_pool2d, F.max_pool2d, max_pool2d_samples),
    ("max_pool1d", tnn.max_pool1d, F.max_pool1d, max_pool1d_samples),
    ("avg_pool2d", tnn.avg_pool2d, F.avg_pool2d, avg_pool2d_samples),
    ("avg_pool1d", tnn.avg_pool1d, F.avg_pool1d, avg_pool1d_samples),
    ("pad", tnn.pad, F.pad, pad_samples),
]:
    register(OpInfo(f"tnn.{name}", fn, torch_ref(ref), samples, dtypes=ALL, tol=TOL,
                    decomposes=True))
register(OpInfo("tnn.pool", tnn.pool, _jax_pool_ref, pool_samples, dtypes=(float32, float64),
                tol=TOL, decomposes=True))
