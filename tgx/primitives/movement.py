"""Atomic movement primitives: reshape, broadcast_in_dim, transpose, slice, pad, concatenate,
gather, scatter_add, rev, dynamic_slice, dynamic_update_slice, and iota (the index generator).

Shape params may hold symbolic dims (`reshape[new_sizes=(2*N, 4)]`); evaluators substitute
the binding before calling the NumPy reference.
"""

from __future__ import annotations

import numpy as np

from ..core import Primitive
from ..errors import DTypeError, ShapeError
from ..shapes import (
    ShapedArray,
    as_dim,
    ceil_div,
    dim_eq,
    dim_ge,
    dim_str,
    is_int,
    prod,
    shape_str,
)

# ---------------------------------------------------------------------------------------------
reshape_p = Primitive("reshape", family="movement", is_view=True)


@reshape_p.def_shape
def _reshape_shape(x: ShapedArray, *, new_sizes: tuple) -> ShapedArray:
    if not dim_eq(prod(x.shape), prod(new_sizes)):
        raise ShapeError(f"reshape: cannot reshape {shape_str(x.shape)} ({dim_str(prod(x.shape))} "
                         f"elements) into {shape_str(new_sizes)} ({dim_str(prod(new_sizes))} "
                         f"elements)")
    return x.update(shape=new_sizes)


@reshape_p.def_impl
def _reshape_impl(x, *, new_sizes):
    return np.reshape(x, new_sizes)


# ---------------------------------------------------------------------------------------------
broadcast_in_dim_p = Primitive("broadcast_in_dim", family="movement")


@broadcast_in_dim_p.def_shape
def _bid_shape(x: ShapedArray, *, shape: tuple, broadcast_dimensions: tuple) -> ShapedArray:
    if len(broadcast_dimensions) != x.ndim or list(broadcast_dimensions) != sorted(
            set(broadcast_dimensions)) or any(not 0 <= d < len(shape)
                                              for d in broadcast_dimensions):
        raise ShapeError(f"broadcast_in_dim: broadcast_dimensions {broadcast_dimensions} do not "
                         f"fit operand {x} and shape {shape_str(shape)}")
    for i, d in enumerate(broadcast_dimensions):
        if not (x.shape[i] == 1 or dim_eq(x.shape[i], shape[d])):
            raise ShapeError(f"broadcast_in_dim: operand dim {i} ({dim_str(x.shape[i])}) cannot "
                             f"broadcast to {dim_str(shape[d])} in {shape_str(shape)}")
    return x.update(shape=shape)


@broadcast_in_dim_p.def_impl
def _bid_impl(x, *, shape, broadcast_dimensions):
    if type(x) is np.ndarray and x.flags.c_contiguous:
        # the read-only view np.broadcast_to makes, built directly (0.4 against 3 us: a
        # training step's loss broadcasts its scalars and row statistics)
        strides = [0] * len(shape)
        for i, d in enumerate(broadcast_dimensions):
            if x.shape[i] != 1:
                strides[d] = x.strides[i]
        y = np.ndarray(shape, x.dtype, x, 0, strides)
        y.flags.writeable = False
        return y
    expanded = [1] * len(shape)
    for i, d in enumerate(broadcast_dimensions):
        expanded[d] = x.shape[i]
    return np.broadcast_to(np.reshape(x, expanded), shape)


# ---------------------------------------------------------------------------------------------
transpose_p = Primitive("transpose", family="movement", is_view=True)


@transpose_p.def_shape
def _transpose_shape(x: ShapedArray, *, permutation: tuple) -> ShapedArray:
    if sorted(permutation) != list(range(x.ndim)):
        raise ShapeError(f"transpose: {permutation} is not a permutation of the axes of {x}")
    return x.update(shape=tuple(x.shape[p] for p in permutation))


@transpose_p.def_impl
def _transpose_impl(x, *, permutation):
    return np.transpose(x, permutation)


# ---------------------------------------------------------------------------------------------
slice_p = Primitive("slice", family="movement")


@slice_p.def_shape
def _slice_shape(x: ShapedArray, *, start_indices: tuple, limit_indices: tuple,
                 strides: tuple | None = None) -> ShapedArray:
    strides = strides or (1,) * x.ndim
    if not (len(start_indices) == len(limit_indices) == len(strides) == x.ndim):
        raise ShapeError(f"slice: start {start_indices}, limit {limit_indices} and strides "
                         f"{strides} must each have one entry per axis of {x}")
    out = []
    for ax, (d, s, e, st) in enumerate(zip(x.shape, start_indices, limit_indices, strides)):
        if not (dim_ge(s, 0) and dim_ge(e, s) and dim_ge(d, e)) or st < 1:
            raise ShapeError(f"slice: axis {ax} needs 0 <= start <= limit <= size and stride >= "
                             f"1, got start={dim_str(s)}, limit={dim_str(e)}, size={dim_str(d)}, "
                             f"stride={st}")
        out.append(ceil_div(as_dim(e - s), st))
    return x.update(shape=tuple(out))


@slice_p.def_impl
def _slice_impl(x, *, start_indices, limit_indices, strides=None):
    strides = strides or (1,) * x.ndim
    return x[tuple(slice(s, e, st) for s, e, st in zip(start_indices, limit_indices, strides))]


# ---------------------------------------------------------------------------------------------
# pad(x, padding_value, padding_config=((lo, hi, interior), ...)); lo/hi may be negative (crop).
pad_p = Primitive("pad", family="movement")


@pad_p.def_shape
def _pad_shape(x: ShapedArray, v: ShapedArray, *, padding_config: tuple) -> ShapedArray:
    if v.shape != () or v.dtype != x.dtype:
        raise ShapeError(f"pad: padding value must be a scalar of dtype {x.dtype}, got {v}")
    if len(padding_config) != x.ndim:
        raise ShapeError(f"pad: padding_config {padding_config} needs one entry per axis of {x}")
    out = []
    for d, (lo, hi, interior) in zip(x.shape, padding_config):
        if interior < 0:
            raise ShapeError(f"pad: interior padding must be >= 0, got {interior}")
        n = as_dim(lo + hi + d + (d - 1) * interior) if not (d == 0) else as_dim(lo + hi)
        if not dim_ge(n, 0):
            raise ShapeError(f"pad: negative padding {padding_config} removes more than {x}")
        out.append(n)
    return x.update(shape=tuple(out), weak_type=False)


@pad_p.def_impl
def _pad_impl(x, v, *, padding_config):
    # Interior padding first (dilate), then edges with np.pad, then crop negative edges.
    for ax, (_, _, interior) in enumerate(padding_config):
        if interior and x.shape[ax] > 0:
            n = x.shape[ax]
            shape = list(x.shape)
            shape[ax] = n + (n - 1) * interior
            out = np.full(shape, v, dtype=x.dtype)
            idx = [slice(None)] * x.ndim
            idx[ax] = slice(None, None, interior + 1)
            out[tuple(idx)] = x
            x = out
    widths = [(max(lo, 0), max(hi, 0)) for lo, hi, _ in padding_config]
    x = np.pad(x, widths, constant_values=v)
    idx = tuple(slice(-lo if lo < 0 else 0, x.shape[i] + hi if hi < 0 else None)
                for i, (lo, hi, _) in enumerate(padding_config))
    return x[idx]


# ---------------------------------------------------------------------------------------------
concatenate_p = Primitive("concatenate", family="movement")


@concatenate_p.def_shape
def _concat_shape(*xs: ShapedArray, dimension: int) -> ShapedArray:
    if not xs:
        raise ShapeError("concatenate: needs at least one operand")
    x0 = xs[0]
    if not 0 <= dimension < x0.ndim:
        raise ShapeError(f"concatenate: dimension {dimension} out of range for {x0}")
    for x in xs[1:]:
        if x.dtype != x0.dtype:
            raise DTypeError(f"concatenate: operands of different dtypes "
                             f"{', '.join(x.str_short() for x in xs)}")
        if x.ndim != x0.ndim or any(not dim_eq(a, b) for i, (a, b) in
                                     enumerate(zip(x.shape, x0.shape)) if i != dimension):
            raise ShapeError(f"concatenate: shapes {', '.join(shape_str(x.shape) for x in xs)} "
                             f"differ outside dimension {dimension}")
    size = as_dim(sum((x.shape[dimension] for x in xs), 0))
    return x0.update(shape=x0.shape[:dimension] + (size,) + x0.shape[dimension + 1:],
                     weak_type=False)


@concatenate_p.def_impl
def _concat_impl(*xs, dimension):
    return np.concatenate(xs, axis=dimension)


# ---------------------------------------------------------------------------------------------
# gather(x, indices, axis): `take` along one axis. Indices outside [0, size) are clamped, which
# every backend can do identically (tgx.numpy normalises negative indices before binding).
gather_p = Primitive("gather", family="movement")


@gather_p.def_shape
def _gather_shape(x: ShapedArray, idx: ShapedArray, *, axis: int) -> ShapedArray:
    if not is_int(idx.dtype):
        raise DTypeError(f"gather: indices must be integers, got {idx.str_short()}")
    if not 0 <= axis < x.ndim:
        raise ShapeError(f"gather: axis {axis} out of range for {x}")
    return x.update(shape=x.shape[:axis] + idx.shape + x.shape[axis + 1:])


@gather_p.def_impl
def _gather_impl(x, idx, *, axis):
    return np.take(x, np.clip(idx, 0, x.shape[axis] - 1), axis=axis)


# scatter_add(x, indices, updates, axis): `x` with `updates` added at `indices` along `axis`
# (repeated indices accumulate; indices clamped as gather clamps them). The transpose of gather:
# the gradient of an embedding lookup. Atomic because no cheap decomposition exists (a one-hot
# matmul would cost V times more).
scatter_add_p = Primitive("scatter_add", family="movement")


@scatter_add_p.def_shape
def _scatter_add_shape(x: ShapedArray, idx: ShapedArray, updates: ShapedArray, *,
                       axis: int) -> ShapedArray:
    if not is_int(idx.dtype):
        raise DTypeError(f"scatter_add: indices must be integers, got {idx.str_short()}")
    if not 0 <= axis < x.ndim:
        raise ShapeError(f"scatter_add: axis {axis} out of range for {x}")
    want = x.shape[:axis] + idx.shape + x.shape[axis + 1:]
    if updates.ndim != len(want) or not all(dim_eq(a, b) for a, b in zip(updates.shape, want)):
        raise ShapeError(f"scatter_add: updates {updates} must have shape {shape_str(want)} "
                         f"(operand {x}, indices {idx}, axis {axis})")
    if updates.dtype != x.dtype:
        raise DTypeError(f"scatter_add: updates {updates} and operand {x} differ in dtype")
    return x.update(weak_type=False)


@scatter_add_p.def_impl
def _scatter_add_impl(x, idx, updates, *, axis):
    out = np.array(x, copy=True)
    where = (slice(None),) * axis + (np.clip(idx, 0, x.shape[axis] - 1),)
    np.add.at(out, where, updates)
    return out


# ---------------------------------------------------------------------------------------------
# dynamic_slice(x, *start_indices, slice_sizes) and dynamic_update_slice(x, update,
# *start_indices): windows at start indices only known at run time (traced integer scalars),
# with jax.lax semantics: a negative index counts from the end of its axis, then every start is
# clamped so that the window fits (a KV cache write at `pos` never goes out of bounds).
dynamic_slice_p = Primitive("dynamic_slice", family="movement")
dynamic_update_slice_p = Primitive("dynamic_update_slice", family="movement")


def dynamic_starts(shape, sizes, start_indices) -> tuple:
    """Concrete window starts, as jax.lax clamps them: `i + d` for a negative `i`, then
    `min(max(i, 0), d - size)` per axis (indices: anything `int()` accepts, 0-d arrays too)."""
    out = []
    for d, s, i in zip(shape, sizes, start_indices):
        i = int(i)
        if i < 0:
            i += d
        out.append(min(max(i, 0), d - s))
    return tuple(out)


def dynamic_window(shape, sizes, start_indices) -> tuple:
    """The tuple of slices selecting the clamped window (for `x[dynamic_window(...)]`)."""
    return tuple(slice(s, s + n) for s, n in
                 zip(dynamic_starts(shape, sizes, start_indices), sizes))


def _check_starts(op: str, x: ShapedArray, idx, what: str) -> None:
    if len(idx) != x.ndim:
        raise ShapeError(f"{op}: {len(idx)} start indices for the rank-{x.ndim} {what} {x} "
                         f"(one integer scalar per axis)")
    for ax, i in enumerate(idx):
        if i.shape != () or not is_int(i.dtype):
            raise DTypeError(f"{op}: start index {ax} must be an integer scalar, got "
                             f"{i.str_short()} (operand {x})")


@dynamic_slice_p.def_shape
def _dynamic_slice_shape(x: ShapedArray, *idx: ShapedArray, slice_sizes: tuple) -> ShapedArray:
    _check_starts("dynamic_slice", x, idx, "operand")
    if len(slice_sizes) != x.ndim:
        raise ShapeError(f"dynamic_slice: slice_sizes {shape_str(slice_sizes)} needs one entry "
                         f"per axis of the operand {x}")
    for ax, (d, s) in enumerate(zip(x.shape, slice_sizes)):
        if not (dim_ge(s, 0) and dim_ge(d, s)):
            raise ShapeError(f"dynamic_slice: slice_sizes {shape_str(slice_sizes)} do not fit "
                             f"the operand {x}: axis {ax} needs 0 <= {dim_str(s)} <= "
                             f"{dim_str(d)}")
    return x.update(shape=tuple(slice_sizes), weak_type=False)


@dynamic_slice_p.def_impl
def _dynamic_slice_impl(x, *idx, slice_sizes):
    return x[dynamic_window(x.shape, slice_sizes, idx)]


@dynamic_update_slice_p.def_shape
def _dynamic_update_slice_shape(x: ShapedArray, update: ShapedArray,
                                *idx: ShapedArray) -> ShapedArray:
    if update.ndim != x.ndim:
        raise ShapeError(f"dynamic_update_slice: update {update} and operand {x} differ in rank")
    if update.dtype != x.dtype:
        raise DTypeError(f"dynamic_update_slice: update {update} and operand {x} differ in "
                         f"dtype")
    for ax, (d, u) in enumerate(zip(x.shape, update.shape)):
        if not dim_ge(d, u):
            raise ShapeError(f"dynamic_update_slice: update {update} is larger than the operand "
                             f"{x} along axis {ax} ({dim_str(u)} > {dim_str(d)})")
    _check_starts("dynamic_update_slice", x, idx, "operand")
    return x.update(weak_type=False)


@dynamic_update_slice_p.def_impl
def _dynamic_update_slice_impl(x, update, *idx):
    out = np.array(x, copy=True)
    out[dynamic_window(x.shape, update.shape, idx)] = update
    return out


# ---------------------------------------------------------------------------------------------
rev_p = Primitive("rev", family="movement")


@rev_p.def_shape
def _rev_shape(x: ShapedArray, *, dimensions: tuple) -> ShapedArray:
    if any(not 0 <= d < x.ndim for d in dimensions):
        raise ShapeError(f"rev: dimensions {dimensions} out of range for {x}")
    return x


@rev_p.def_impl
def _rev_impl(x, *, dimensions):
    return np.flip(x, dimensions) if dimensions else x


# ---------------------------------------------------------------------------------------------
# iota(dtype, shape, dimension): indices 0..shape[dimension]-1 along one axis.
iota_p = Primitive("iota", family="creation")


@iota_p.def_shape
def _iota_shape(*, dtype, shape: tuple, dimension: int) -> ShapedArray:
    if not 0 <= dimension < len(shape):
        raise ShapeError(f"iota: dimension {dimension} out of range for shape {shape_str(shape)}")
    return ShapedArray(tuple(shape), dtype)


@iota_p.def_impl
def _iota_impl(*, dtype, shape, dimension):
    r = np.arange(shape[dimension], dtype=dtype)
    expanded = [1] * len(shape)
    expanded[dimension] = shape[dimension]
    return np.broadcast_to(r.reshape(expanded), shape)


MOVEMENT = [reshape_p, broadcast_in_dim_p, transpose_p, slice_p, pad_p, concatenate_p, gather_p,
            scatter_add_p, rev_p, iota_p, dynamic_slice_p, dynamic_update_slice_p]


# dim_as_value(expr, dtype): a symbolic size as a scalar value (the divisor of a mean over N).
dim_as_value_p = Primitive("dim_as_value", family="creation")


@dim_as_value_p.def_shape
def _dim_as_value_shape(*, expr, dtype) -> ShapedArray:
    return ShapedArray((), dtype)


@dim_as_value_p.def_impl
def _dim_as_value_impl(*, expr, dtype):
    return np.asarray(expr, dtype=dtype)


MOVEMENT.append(dim_as_value_p)
