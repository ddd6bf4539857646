"""Op-table entries for `tgx.lax` (dynamic_slice, dynamic_update_slice), against `jax.lax`.

Start indices are traced integer scalars (0-d arrays); the samples cover the clamping edge
cases (past the end, negative, very negative, exactly at the last fitting start) and mixed
index dtypes.
"""

from __future__ import annotations

import numpy as np
import pytest

import tgx.lax as tlax
from tgx.shapes import float32, int32

from .op_table import OpInfo, Sample, randn, register

DT = (float32, int32)


def _jax_lax():
    pytest.importorskip("jax")
    import jax

    jax.config.update("jax_enable_x64", True)  # int64 indices stay int64 (tgx's jax does this)
    return jax.lax


def _arr(rng, shape, dt):
    if np.dtype(dt).kind == "i":
        return rng.integers(-50, 50, shape).astype(dt)
    return randn(rng, shape, dt)


def _i(v, dt=np.int32):
    return np.asarray(v, dt)


# (start per axis, index dtype) of a (8, 5) operand; the window is 3 x 2
STARTS = [((2, 1), np.int32), ((7, 4), np.int32), ((6, 3), np.int32), ((-1, -2), np.int32),
          ((-20, 100), np.int64), ((-8, 0), np.int64), ((100, -100), np.int32)]


def ds_samples(rng, dt):
    out = [Sample((_arr(rng, (8, 5), dt), _i(a, it), _i(b, it)), dict(sizes=(3, 2)),
                  name=f"[{a},{b}]") for (a, b), it in STARTS]
    # symbolic rows: one row of an N-row cache
    out.append(Sample((_arr(rng, (8, 4), dt), _i(5), _i(1)), dict(sizes=(1, 3)),
                      symbolic={0: {0: "N"}}, name="[row]"))
    out.append(Sample((_arr(rng, (11, 4), dt), _i(10), _i(3)), dict(sizes=(1, 3)),
                      symbolic={0: {0: "N"}}, name="[row 11]"))
    out.append(Sample((_arr(rng, (4, 3), dt), _i(1), _i(-1)), dict(sizes=(4, 3)),
                      name="[whole]"))
    out.append(Sample((_arr(rng, (4, 3), dt), _i(2), _i(1)), dict(sizes=(0, 2)),
                      name="[empty]"))
    return out


def dus_samples(rng, dt):
    out = [Sample((_arr(rng, (8, 5), dt), _arr(rng, (3, 2), dt), _i(a, it), _i(b, it)),
                  name=f"[{a},{b}]") for (a, b), it in STARTS]
    out.append(Sample((_arr(rng, (8, 4), dt), _arr(rng, (1, 4), dt), _i(5), _i(0)),
                      symbolic={0: {0: "N"}}, name="[row]"))
    out.append(Sample((_arr(rng, (11, 4), dt), _arr(rng, (1, 4), dt), _i(20), _i(0)),
                      symbolic={0: {0: "N"}}, name="[row 11]"))
    out.append(Sample((_arr(rng, (4, 3), dt), _arr(rng, (4, 3), dt), _i(3), _i(-5)),
                      name="[whole]"))
    out.append(Sample((_arr(rng, (2, 3, 4), dt), _arr(rng, (1, 2, 4), dt), _i(1), _i(2), _i(0)),
                      name="[rank3]"))
    return out


def ds(x, i, j, *, sizes):
    return tlax.dynamic_slice(x, (i, j), sizes)


def ds_ref(x, i, j, *, sizes):
    return np.asarray(_jax_lax().dynamic_slice(x, (i, j), sizes))


def dus(x, u, *idx):
    return tlax.dynamic_update_slice(x, u, idx)


def dus_ref(x, u, *idx):
    return np.asarray(_jax_lax().dynamic_update_slice(x, u, idx))


def ds_in_dim(x, i):
    return tlax.dynamic_slice_in_dim(x, i, 2, axis=1)


def ds_in_dim_ref(x, i):
    return np.asarray(_jax_lax().dynamic_slice_in_dim(x, i, 2, axis=1))


def dus_in_dim(x, u, i):
    return tlax.dynamic_update_slice_in_dim(x, u, i, axis=0)


def dus_in_dim_ref(x, u, i):
    return np.asarray(_jax_lax().dynamic_update_slice_in_dim(x, u, i, axis=0))


register(
    OpInfo("lax.dynamic_slice", ds, ds_ref, ds_samples, dtypes=DT),
    OpInfo("lax.dynamic_update_slice", dus, dus_ref, dus_samples, dtypes=DT),
    OpInfo("lax.dynamic_slice_in_dim", ds_in_dim, ds_in_dim_ref, lambda rng, dt: [
        Sample((_arr(rng, (3, 6), dt), _i(4))), Sample((_arr(rng, (3, 6), dt), _i(-1)),
                                                       name="[neg]")], dtypes=DT),
    OpInfo("lax.dynamic_update_slice_in_dim", dus_in_dim, dus_in_dim_ref, lambda rng, dt: [
        Sample((_arr(rng, (6, 2), dt), _arr(rng, (1, 2), dt), _i(5)),
               symbolic={0: {0: "N"}}),
        Sample((_arr(rng, (9, 2), dt), _arr(rng, (1, 2), dt), _i(-3)),
               symbolic={0: {0: "N"}}, name="[9]"),
        Sample((_arr(rng, (6, 2), dt), _arr(rng, (4, 2), dt), _i(5)), name="[clamp]")],
        dtypes=DT),
)
