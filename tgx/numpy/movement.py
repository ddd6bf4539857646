"""Data movement of `tgx.numpy` written with atomic primitives: padding, splitting, tiling,
repeating, rolling, stacking (no primitive of its own)."""

from __future__ import annotations

import builtins

import numpy as np

from .. import primitives as P
from ..errors import ShapeError, TracerControlFlowError, Unsupported
from ..primitives.ops import _as_operand, _aval, concatenate, ravel, slice_axis
from ..primitives.ops import reshape as _reshape
from ..shapes import as_dim, canonicalize_axis, dim_div, dim_ge, dim_str, shape_str
from ..tracing import Tracer


def pad(x, pad_width, mode="constant", constant_values=0):
    """Pad with a constant (other modes are in `tgx.nn.pad`)."""
    if mode != "constant":
        raise Unsupported(f"tnp.pad mode={mode!r}: use mode='constant' or tgx.nn.pad")
    a = _aval(x)
    if isinstance(pad_width, int):
        pad_width = ((pad_width, pad_width),) * a.ndim
    pad_width = [tuple(p) if isinstance(p, (tuple, list)) else (p, p) for p in pad_width]
    if len(pad_width) == 1 and a.ndim > 1:
        pad_width = pad_width * a.ndim
    if len(pad_width) != a.ndim:
        raise ShapeError(f"pad: pad_width {pad_width} needs one (before, after) pair per axis of "
                         f"{shape_str(a.shape)}")
    value = np.asarray(constant_values, dtype=a.dtype)
    return P.pad_p.bind(x, value, padding_config=tuple((int(lo), int(hi), 0)
                                                       for lo, hi in pad_width))


def split(x, indices_or_sections, axis: int = 0):
    """NumPy split: into equal sections (must divide the axis) or at the given indices."""
    a = _aval(x)
    axis = canonicalize_axis(axis, a.ndim, "split")
    d = a.shape[axis]
    if isinstance(indices_or_sections, int):
        n = indices_or_sections
        size = dim_div(d, n, f"split: array split does not result in an equal division "
                             f"({dim_str(d)} into {n})")
        bounds = [as_dim(i * size) for i in range(n + 1)]
    else:
        bounds = [0] + [as_dim(i) if i >= 0 else as_dim(d + i) for i in indices_or_sections]
        bounds.append(d)
    return [slice_axis(x, axis, lo, hi if dim_ge(hi, lo) else lo)
            for lo, hi in zip(bounds[:-1], bounds[1:])]


def array_split(x, sections: int, axis: int = 0):
    """NumPy array_split: `sections` parts, the first ones one longer (concrete axis only)."""
    a = _aval(x)
    axis = canonicalize_axis(axis, a.ndim, "array_split")
    d = a.shape[axis]
    if type(d) is not int:
        raise Unsupported("array_split needs a concrete axis length; use split")
    q, r = divmod(d, sections)
    sizes = [q + 1] * r + [q] * (sections - r)
    return split(x, list(np.cumsum(sizes)[:-1].tolist()), axis)


def chunk(x, chunks: int, dim: int = 0):
    """torch.chunk: parts of ceil(d / chunks) elements (the last may be shorter or absent)."""
    a = _aval(x)
    dim = canonicalize_axis(dim, a.ndim, "chunk")
    d = a.shape[dim]
    if type(d) is not int:
        return split(x, chunks, dim)
    size = -(-d // chunks)
    return split(x, list(range(size, d, size)), dim)


def tile(x, reps):
    """NumPy tile: repeat the whole array `reps` times along each axis."""
    reps = (reps,) if isinstance(reps, int) else tuple(reps)
    a = _aval(x)
    x = _as_operand(x)
    n = builtins.max(a.ndim, len(reps))
    shape = (1,) * (n - a.ndim) + tuple(a.shape)
    reps = (1,) * (n - len(reps)) + reps
    x = reshape(x, shape)
    big = []
    for r, d in zip(reps, shape):
        big += [r, d]
    out = P.broadcast_in_dim_p.bind(x, shape=tuple(big),
                                    broadcast_dimensions=tuple(range(1, 2 * n, 2)))
    return reshape(out, tuple(as_dim(r * d) for r, d in zip(reps, shape)))


def repeat(x, repeats, axis=None):
    """Repeat each element `repeats` times along `axis` (flattened when None): NumPy repeat,
    torch repeat_interleave. `repeats` is an int or a concrete sequence of ints."""
    if axis is None:
        x = ravel(x)
        axis = 0
    a = _aval(x)
    axis = canonicalize_axis(axis, a.ndim, "repeat")
    x = _as_operand(x)
    if isinstance(repeats, (int, np.integer)) or (np.ndim(repeats) == 0 and not isinstance(
            repeats, Tracer)):
        r = int(repeats)
        shape = a.shape[:axis + 1] + (r,) + a.shape[axis + 1:]
        dims = tuple(i if i <= axis else i + 1 for i in range(a.ndim))
        out = P.broadcast_in_dim_p.bind(x, shape=shape, broadcast_dimensions=dims)
        return reshape(out, a.shape[:axis] + (as_dim(a.shape[axis] * r),) + a.shape[axis + 1:])
    if isinstance(repeats, Tracer):
        raise TracerControlFlowError("repeat with traced repeats has a data-dependent shape")
    idx = np.repeat(np.arange(len(repeats)), np.asarray(repeats))
    return P.gather_p.bind(x, idx.astype(np.int64), axis=axis)


def roll(x, shift, axis=None):
    """Elements shifted by `shift` along `axis` (cyclically; flattened when None)."""
    if axis is None:
        a = _aval(x)
        return reshape(roll(ravel(x), shift, 0), a.shape)
    if isinstance(shift, (tuple, list)) or isinstance(axis, (tuple, list)):
        shifts = shift if isinstance(shift, (tuple, list)) else [shift] * len(axis)
        for s, ax in zip(shifts, axis):
            x = roll(x, s, ax)
        return x
    a = _aval(x)
    axis = canonicalize_axis(axis, a.ndim, "roll")
    d = a.shape[axis]
    if type(d) is int:
        if d == 0:
            return x
        shift = int(shift) % d
        if shift == 0:
            return x
    elif shift < 0:
        shift = as_dim(d + shift)  # assumes |shift| <= d
    cut = as_dim(d - shift)
    return concatenate([slice_axis(x, axis, cut, d), slice_axis(x, axis, 0, cut)], axis=axis)


def vstack(arrays):
    """Stack along the first axis (1-D arrays become rows)."""
    return concatenate([reshape(x, (1, -1)) if _aval(x).ndim < 2 else x for x in arrays], 0)


def hstack(arrays):
    """Stack along the second axis (the first for 1-D arrays)."""
    arrays = list(arrays)
    return concatenate(arrays, 0 if _aval(arrays[0]).ndim == 1 else 1)


row_stack = vstack


def reshape(a, shape=None, order="C", *, newshape=None, copy=None):
    """Reshape, as NumPy 2: `reshape(x, (2, -1))`, `reshape(x, shape=(2, -1))` (or the older
    `newshape=`); one dim may be -1 and dims may be symbolic. `copy` is accepted and ignored:
    traced arrays are values, never views that a write could reach.

    >>> reshape(np.arange(6), shape=(2, -1)).shape
    (2, 3)
    """
    if shape is not None and newshape is not None:
        raise ShapeError("reshape: pass shape= or newshape=, not both")
    shape = newshape if shape is None else shape
    if shape is None:
        raise ShapeError("reshape: missing the new shape (shape=)")
    return _reshape(a, shape, order)
