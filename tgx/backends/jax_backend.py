"""The JAX backend: kernels over `jax.Array`, each jitted once per (primitive, params, avals).

x64 is enabled when this backend loads (`jax_enable_x64`): tgx graphs carry float64 and int64
values (the reference dtypes of the op table and of Python ints), and without x64 jax silently
computes them in 32 bits. This is a process-wide jax setting; it only widens what jax accepts.

A connected region of equations assigned to jax is lowered as one `jax.jit` callable by
`tgx.lowering.lower` (XLA fuses it); these per-primitive kernels are its building blocks.
"""

from __future__ import annotations

import functools

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
from jax import lax  # noqa: E402

from .. import primitives  # noqa: E402,F401 - registers the atomic primitives
from ..core import PRIMITIVES  # noqa: E402
from ..primitives import transfer  # noqa: E402,F401 - registers copy_to
from .registry import Kernel, add_kernel, register_kernel  # noqa: E402
from .transfers import to_jax  # noqa: E402

NAME = "jax"


@functools.cache
def _jitted(fn, params: tuple):
    return jax.jit(functools.partial(fn, **dict(params)))


def _specializer(fn):
    def specialize(params: dict):
        return _jitted(fn, tuple(sorted(params.items())))
    return specialize


def _add(name, fn, checker=None, returns_view=False):
    fn.__name__ = fn.__qualname__ = f"jax_{name}"
    add_kernel(Kernel(name, NAME, fn, checker, returns_view=returns_view,
                      specialize=_specializer(fn)))


_UNARY = {"neg": jnp.negative, "exp": jnp.exp, "log": jnp.log, "sin": jnp.sin, "cos": jnp.cos,
          "sqrt": jnp.sqrt, "atan": jnp.arctan, "erf": jax.scipy.special.erf,
          "floor": jnp.floor, "round": jnp.round, "not": jnp.invert, "copy": jnp.array}
_BINARY = {"add": jnp.add, "sub": jnp.subtract, "mul": jnp.multiply, "max": jnp.maximum,
           "min": jnp.minimum, "pow": jnp.power, "and": jnp.bitwise_and, "or": jnp.bitwise_or,
           "xor": jnp.bitwise_xor, "shift_left": jnp.left_shift,
           "shift_right_logical": lax.shift_right_logical, "eq": jnp.equal,
           "ne": jnp.not_equal, "lt": jnp.less, "le": jnp.less_equal, "gt": jnp.greater,
           "ge": jnp.greater_equal}
for _n, _f in _UNARY.items():
    _add(_n, (lambda f: lambda x: f(x))(_f))
for _n, _f in _BINARY.items():
    _add(_n, (lambda f: lambda x, y: f(x, y))(_f))


def _div(x, y):
    if jnp.issubdtype(x.dtype, jnp.floating):
        return x / y
    q = jnp.abs(x) // jnp.where(y == 0, 1, jnp.abs(y)).astype(x.dtype)
    return (jnp.sign(x) * jnp.sign(y) * q).astype(x.dtype)


def _convert(x, *, new_dtype, weak_type=False):
    if x.dtype == new_dtype:
        return x
    if jnp.issubdtype(x.dtype, jnp.floating) and jnp.issubdtype(new_dtype, jnp.integer):
        return jnp.trunc(x.astype(jnp.float64)).astype(new_dtype)
    return x.astype(new_dtype)


def _reduce(fn):
    def k(x, *, axes):
        if x.dtype in (jnp.float16, jnp.bfloat16) and fn in (jnp.sum, jnp.prod):
            return fn(x.astype(jnp.float32), axis=axes).astype(x.dtype)
        return fn(x, axis=axes).astype(x.dtype)
    return k


def _argmax(x, *, axis, index_dtype):
    return jnp.argmax(x, axis=axis).astype(index_dtype)


def _pad(x, v, *, padding_config):
    return lax.pad(x, v.astype(x.dtype), padding_config)


def _gather(x, idx, *, axis):
    return jnp.take(x, idx, axis=axis, mode="clip")


def _iota(*, dtype, shape, dimension):
    return lax.broadcasted_iota(dtype, shape, dimension)


def _slice(x, *, start_indices, limit_indices, strides=None):
    return lax.slice(x, start_indices, limit_indices, strides)


def _dynamic_slice(x, *idx, slice_sizes):
    return lax.dynamic_slice(x, idx, slice_sizes)


def _dynamic_update_slice(x, update, *idx):
    return lax.dynamic_update_slice(x, update, idx)


for _n, _f in {
    "div": _div, "select": lambda p, t, f: jnp.where(p, t, f),
    "convert_element_type": _convert,
    "dot_general": lambda x, y, *, dimension_numbers: lax.dot_general(
        x, y, dimension_numbers, preferred_element_type=x.dtype),
    "reshape": lambda x, *, new_sizes: jnp.reshape(x, new_sizes),
    "broadcast_in_dim": lambda x, *, shape, broadcast_dimensions: lax.broadcast_in_dim(
        x, shape, broadcast_dimensions),
    "transpose": lambda x, *, permutation: jnp.transpose(x, permutation),
    "slice": _slice, "pad": _pad,
    "concatenate": lambda *xs, dimension: jnp.concatenate(xs, axis=dimension),
    "gather": _gather,
    "dynamic_slice": _dynamic_slice, "dynamic_update_slice": _dynamic_update_slice,
    "rev": lambda x, *, dimensions: lax.rev(x, dimensions),
    "iota": _iota,
    "dim_as_value": lambda *, expr, dtype: jnp.asarray(expr, dtype=dtype),
    "reduce_sum": _reduce(jnp.sum), "reduce_prod": _reduce(jnp.prod),
    "reduce_max": _reduce(jnp.max), "reduce_min": _reduce(jnp.min), "argmax": _argmax,
}.items():
    _add(_n, _f)


@register_kernel("copy_to", NAME)
def jax_copy_to(x, *, backend="jax", device="cpu"):
    return to_jax(x, device)


def register_composites() -> None:
    """Register jax.nn kernels for the composite primitives declared so far."""
    from . import composites

    for name in composites.register(NAME, PRIMITIVES):
        for k in _KERNELS_OF(name):
            object.__setattr__(k, "specialize", _specializer(k.fn))


def _KERNELS_OF(name):  # noqa: N802
    from .registry import _KERNELS

    return _KERNELS.get((name, NAME), [])


register_composites()
