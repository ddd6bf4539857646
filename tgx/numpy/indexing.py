"""`x[key]` for tracers: basic indexing (ints, slices, None, ...) as `slice`, `rev` and
`reshape`; integer-array indexing as `gather`."""

from __future__ import annotations

import builtins

import numpy as np

from .. import primitives as P
from ..errors import IndexingError, ShapeError, TracerControlFlowError, Unsupported, user_site
from ..primitives.ops import (
    _as_operand,
    _aval,
    _cast,
    _normalize_index,
    _prod_dims,
    _shape_value,
    add,
    asarray,
    astype,
    broadcast_to,
    multiply,
    reshape,
)
from ..shapes import (
    as_dim,
    broadcast_shapes,
    canonicalize_axis,
    dim_ge,
    dim_str,
    int64,
    is_int,
    shape_str,
)
from ..tracing import Tracer


def _getitem(x, key):
    a = _aval(x)
    if not isinstance(key, tuple):
        key = (key,)
    if builtins.any(isinstance(k, (Tracer, np.ndarray, list)) and not (
            isinstance(k, np.ndarray) and k.ndim == 0) for k in key):
        return _advanced_getitem(x, key)
    n_real = builtins.sum(1 for k in key if k is not None and k is not Ellipsis)
    if n_real > a.ndim:
        raise IndexingError(f"too many indices for an array of shape {shape_str(a.shape)}: {key}")
    if builtins.sum(1 for k in key if k is Ellipsis) > 1:
        raise IndexingError("an index can only have a single ellipsis ('...')")
    if builtins.any(k is Ellipsis for k in key):
        i = next(j for j, k in enumerate(key) if k is Ellipsis)
        key = key[:i] + (slice(None),) * (a.ndim - n_real) + key[i + 1:]
    else:
        key = key + (slice(None),) * (a.ndim - n_real)
    starts, limits, strides, out_shape, rev_axes, squeeze_axes = [], [], [], [], [], []
    new_axes = []
    ax = 0
    for k in key:
        if k is None:
            new_axes.append(len(out_shape) + len(new_axes))
            continue
        d = a.shape[ax]
        if isinstance(k, slice):
            s, e, st = _slice_bounds(k, d, ax)
            if st < 0:
                rev_axes.append(ax)
                st = -st
            starts.append(s)
            limits.append(e)
            strides.append(st)
            out_shape.append(None)
        else:
            if isinstance(k, (bool, np.bool_)):
                raise IndexingError("boolean indices have data-dependent shapes and cannot be "
                                    "traced")
            try:
                i = int(k)
            except TypeError:
                raise IndexingError(f"unsupported index {k!r}") from None
            if i < 0:
                i = as_dim(d + i)
            if not (dim_ge(i, 0) and dim_ge(d, as_dim(i + 1))):
                raise IndexingError(f"index {int(k)} is out of bounds for axis {ax} with size "
                                    f"{dim_str(d)}")
            starts.append(i)
            limits.append(as_dim(i + 1))
            strides.append(1)
            squeeze_axes.append(ax)
        ax += 1
    out = x
    if rev_axes:
        out = P.rev_p.bind(out, dimensions=tuple(rev_axes))
    trivial = builtins.all(type(s) is int and s == 0 for s in starts) and builtins.all(
        st == 1 for st in strides) and builtins.all(lim is d or lim == d
                                                     for lim, d in zip(limits, a.shape))
    if not trivial:
        out = P.slice_p.bind(out, start_indices=tuple(starts), limit_indices=tuple(limits),
                             strides=None if builtins.all(st == 1 for st in strides)
                             else tuple(strides))
    if squeeze_axes or new_axes:
        shape = [d for i, d in enumerate(_aval(out).shape) if i not in squeeze_axes]
        for pos in new_axes:
            shape.insert(pos, 1)
        out = reshape(out, tuple(shape))
    return out


def _slice_bounds(k: slice, d, ax):
    st = 1 if k.step is None else int(k.step)
    if st == 0:
        raise IndexingError("slice step cannot be zero")
    if st < 0:
        # Reverse the axis, then slice forward: x[a:b:-s] == rev(x)[d-1-a : d-1-b : s].
        if k.start is None and k.stop is None:
            return 0, d, st
        if type(d) is not int:
            raise Unsupported("negative-step slices with bounds need a concrete dim")
        idx = range(d)[k]
        if len(idx) == 0:
            return 0, 0, -1
        return d - 1 - idx[0], d - 1 - idx[-1] + 1, st
    s = _clamp(k.start, d, 0)
    e = _clamp(k.stop, d, d)
    if not _ge(e, s):
        e = s
    return s, e, st


def _ge(a, b):
    return dim_ge(a, b)


def _clamp(v, d, default):
    if v is None:
        return default
    if isinstance(v, Tracer):
        raise TracerControlFlowError(
            f"slice bounds must be static (Python ints or symbolic dims), got a traced value "
            f"{v.aval.str_short()}: if it is an argument of a compiled function, mark it "
            f"static: `tgx.compile(f, static_argnames=(\"name\",))`; for a bound known only "
            f"at run time use lax.dynamic_slice, tnp.take or tnp.where{user_site()}")
    if isinstance(v, int) and type(d) is int:
        v = v + d if v < 0 else v
        return builtins.min(builtins.max(v, 0), d)
    if isinstance(v, int) and v < 0:
        v = as_dim(d + v)   # N-2: must be provably >= 0 (NumPy would clamp; we cannot know)
        if not dim_ge(v, 0):
            return 0
        return v
    v = as_dim(v)
    return v if dim_ge(d, v) else d


def _advanced_getitem(x, key):
    """Integer-array indices (adjacent ones broadcast together), mixed with basic indices."""
    a = _aval(x)
    if builtins.any(k is Ellipsis for k in key):
        i = next(j for j, k in enumerate(key) if k is Ellipsis)
        n_real = builtins.sum(1 for k in key if k is not None and k is not Ellipsis)
        key = key[:i] + (slice(None),) * (a.ndim - n_real) + key[i + 1:]
    if builtins.any(k is None for k in key):
        raise Unsupported("mixing None with integer-array indices is not supported")
    key = key + (slice(None),) * (a.ndim - len(key))
    adv = [i for i, k in enumerate(key) if not isinstance(k, slice)]
    if adv != list(range(adv[0], adv[-1] + 1)):
        raise Unsupported("integer-array indices separated by slices are not supported")
    # Basic part first.
    basic = tuple(k if isinstance(k, slice) else slice(None) for k in key)
    x = _getitem(x, basic)
    a = _aval(x)
    idxs = [asarray(k) if not isinstance(k, Tracer) else k for k in key[adv[0]:adv[-1] + 1]]
    for k in idxs:
        if not is_int(_aval(k).dtype):
            raise IndexingError(f"arrays used as indices must be integers, got "
                                f"{_aval(k).str_short()}")
    sizes = [a.shape[i] for i in adv]
    idxs = [_normalize_index(_as_operand(k), d) for k, d in zip(idxs, sizes)]
    if len(idxs) == 1:
        return P.gather_p.bind(x, idxs[0], axis=adv[0])
    # Several adjacent index arrays: fold them into one linear index over the merged axes.
    idx_shape = broadcast_shapes(*[_aval(k).shape for k in idxs], op="index")
    idx_dtype = int64
    lin = None
    for k, d in zip(idxs, sizes):
        k = astype(broadcast_to(k, idx_shape), idx_dtype)
        lin = k if lin is None else add(multiply(lin, _cast(_shape_value(d, idx_dtype),
                                                            idx_dtype)), k)
    merged = a.shape[:adv[0]] + (_prod_dims(sizes),) + a.shape[adv[-1] + 1:]
    x = reshape(x, merged)
    return P.gather_p.bind(x, lin, axis=adv[0])


def take_along_axis(arr, indices, axis=-1):
    """`arr`'s elements at integer `indices` along `axis`, as NumPy: `indices` has `arr`'s rank
    and the other axes broadcast (`axis=None`: `arr` flattened, `indices` 1-D); negative
    indices count from the end. One `gather` from the flattened array at linear indices.

    >>> take_along_axis(np.array([[10, 30, 20]]), np.array([[0, 2, 1]]), axis=1)
    array([[10, 20, 30]])
    """
    if axis is None:
        arr = reshape(arr, (-1,))
        axis = 0
    a = _aval(arr)
    idx = asarray(indices)
    ia = _aval(idx)
    if not is_int(ia.dtype):
        raise IndexingError(f"take_along_axis: indices must be integers, got {ia.str_short()}")
    if ia.ndim != a.ndim:
        raise ShapeError(f"take_along_axis: indices {ia.str_short()} and array {a.str_short()} "
                         f"must have the same rank")
    axis = canonicalize_axis(axis, a.ndim, "take_along_axis")
    arr, idx = _as_operand(arr), astype(_as_operand(idx), int64)
    idx = _normalize_index(idx, a.shape[axis])
    if a.ndim == 1:
        return P.gather_p.bind(arr, idx, axis=0)
    out_shape = list(broadcast_shapes(
        tuple(1 if i == axis else d for i, d in enumerate(a.shape)),
        tuple(1 if i == axis else d for i, d in enumerate(ia.shape)), op="take_along_axis"))
    src_shape = tuple(out_shape[:axis]) + (a.shape[axis],) + tuple(out_shape[axis + 1:])
    out_shape[axis] = ia.shape[axis]
    out_shape = tuple(out_shape)
    arr = broadcast_to(arr, src_shape)
    idx = broadcast_to(idx, out_shape)
    linear, stride = None, 1
    for k in reversed(range(a.ndim)):
        coord = idx if k == axis else P.iota_p.bind(dtype=int64, shape=out_shape, dimension=k)
        term = coord if type(stride) is int and stride == 1 else multiply(
            coord, _cast(_shape_value(stride, int64), int64))
        linear = term if linear is None else add(linear, term)
        stride = _prod_dims([stride, src_shape[k]])
    return P.gather_p.bind(reshape(arr, (-1,)), linear, axis=0)
