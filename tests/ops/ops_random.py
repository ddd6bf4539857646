"""Op-table entries for tgx.random's bit generator against jax.random: the same key gives
bit-identical results (Threefry-2x32, partitionable counter scheme), decomposed graph too."""

from __future__ import annotations

import jax
import jax.extend.random as jr
import numpy as np

import tgx.random as trandom
from tgx.shapes import uint32

from .op_table import OpInfo, Sample, register

jax.config.update("jax_enable_x64", True)


def _key(rng):
    return np.asarray(jax.random.PRNGKey(int(rng.integers(0, 2**31))), np.uint32)


def _jax_threefry(k0, k1, x0, x1):
    x0, x1 = np.broadcast_arrays(x0, x1)
    out = np.asarray(jr.threefry_2x32((k0, k1), np.concatenate([x0.ravel(), x1.ravel()])))
    n = x0.size
    return out[:n].reshape(x0.shape), out[n:].reshape(x0.shape)


def threefry_samples(rng, dt):
    def words(shape):
        return rng.integers(0, 2**32, shape, dtype=np.uint64).astype(np.uint32)
    return [Sample((words(()), words(()), words((5,)), words((5,))), symbolic={2: {0: "N"},
                                                                                3: {0: "N"}}),
            Sample((words(()), words(()), words((9,)), words((9,))), symbolic={2: {0: "N"},
                                                                                3: {0: "N"}},
                   name="[9]"),
            Sample((np.uint32(0), np.uint32(0), np.zeros(3, np.uint32),
                    np.arange(3, dtype=np.uint32)), name="[zero key]"),
            Sample((np.uint32(0xFFFFFFFF), np.uint32(0x13198A2E), np.full(2, 0xFFFFFFFF, np.uint32),
                    np.full(2, 0x03707344, np.uint32)), name="[wrap]")]


def _threefry(k0, k1, x0, x1):
    return tuple(trandom.threefry_2x32(k0, k1, x0, x1))


def bits_samples(rng, dt):
    return [Sample((_key(rng), np.zeros((3, 4), np.float32)), symbolic={1: {0: "N"}}),
            Sample((_key(rng), np.zeros((5, 4), np.float32)), symbolic={1: {0: "N"}},
                   name="[5x4]"),
            Sample((_key(rng), np.zeros((7,), np.float32)), name="[7]")]


def key_samples(rng, dt):
    return [Sample((_key(rng),)), Sample((np.array([0, 0], np.uint32),), name="[zero]"),
            Sample((np.array([0xFFFFFFFF, 7], np.uint32),), name="[big]")]


def _np(x):
    return np.asarray(jax.random.key_data(x)) if jax.dtypes.issubdtype(
        x.dtype, jax.dtypes.prng_key) else np.asarray(x)


register(
    OpInfo("tgx.random.threefry_2x32", _threefry, _jax_threefry, threefry_samples,
           dtypes=(uint32,), decomposes=True),
    OpInfo("tgx.random.bits", lambda k, x: trandom.bits(k, x.shape),
           lambda k, x: np.asarray(jax.random.bits(k, x.shape, np.uint32)), bits_samples,
           dtypes=(uint32,), decomposes=True),
    OpInfo("tgx.random.split", lambda k: trandom.split(k, 3),
           lambda k: _np(jax.random.split(k, 3)), key_samples, dtypes=(uint32,),
           decomposes=True),
    OpInfo("tgx.random.fold_in", lambda k: trandom.fold_in(k, 12345),
           lambda k: _np(jax.random.fold_in(k, 12345)), key_samples, dtypes=(uint32,),
           decomposes=True),
)
