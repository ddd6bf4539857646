"""`tgx.lax`: low-level ops with `jax.lax` names and semantics, for what `tgx.numpy` cannot say.

Dynamic slicing reads or writes a window whose start is only known at run time (a traced
integer scalar such as a decode position): a negative start counts from the end of its axis,
then every start is clamped so that the window fits, exactly as in `jax.lax`.

>>> import numpy as np, tgx, tgx.lax as lax
>>> cache = np.zeros((4, 2), np.float32)
>>> lax.dynamic_update_slice(cache, np.ones((1, 2), np.float32), (np.int32(7), 0))
array([[0., 0.],
       [0., 0.],
       [0., 0.],
       [1., 1.]], dtype=float32)
>>> lax.dynamic_slice(np.arange(6), (np.int32(-2),), (3,))   # -2 -> 4, clamped to 3
array([3, 4, 5])
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from . import primitives as P
from .errors import DTypeError
from .shapes import as_dim, aval_of, canonicalize_axis, is_int
from .tracing import Tracer

__all__ = ["dynamic_slice", "dynamic_slice_in_dim", "dynamic_update_slice",
           "dynamic_update_slice_in_dim"]


def _aval(x: Any):
    return x.aval if isinstance(x, Tracer) else aval_of(x)


def _starts(op: str, start_indices) -> list:
    """One integer scalar per axis: a sequence of scalars, or a 1-D integer array."""
    if isinstance(start_indices, (Tracer, np.ndarray)):
        a = _aval(start_indices)
        if a.ndim != 1:
            raise DTypeError(f"{op}: start_indices must be a sequence of integer scalars or a "
                             f"1-D integer array, got {a.str_short()}")
        return [start_indices[i] for i in range(a.shape[0])]
    out = []
    for i in start_indices:
        if isinstance(i, bool) or not isinstance(i, (int, np.integer, np.ndarray, Tracer)):
            raise DTypeError(f"{op}: start indices must be integer scalars, got "
                             f"{type(i).__name__} {i!r}")
        if isinstance(i, int) and not isinstance(i, np.integer):
            i = np.int32(i) if -2**31 <= i < 2**31 else np.int64(i)  # int32, as in jax
        if not is_int(_aval(i).dtype):
            raise DTypeError(f"{op}: start indices must be integer scalars, got "
                             f"{_aval(i).str_short()}")
        out.append(i)
    return out


def dynamic_slice(operand, start_indices: Sequence, slice_sizes: Sequence):
    """The window of `operand` of shape `slice_sizes` starting at `start_indices` (traced
    integer scalars; clamped so the window fits, negative ones counted from the end).

    >>> import numpy as np
    >>> dynamic_slice(np.arange(12).reshape(3, 4), (np.int32(1), np.int32(3)), (2, 2))
    array([[ 6,  7],
           [10, 11]])
    """
    idx = _starts("dynamic_slice", start_indices)
    return P.dynamic_slice_p.bind(operand, *idx,
                                  slice_sizes=tuple(as_dim(s) for s in slice_sizes))


def dynamic_update_slice(operand, update, start_indices: Sequence):
    """`operand` with the window at `start_indices` replaced by `update` (same rank and dtype;
    starts clamped so the window fits). Functional: the result is a new array, but a state
    buffer updated this way under `tgx.compile(state=...)` is written in place.

    >>> import numpy as np
    >>> dynamic_update_slice(np.zeros(5, np.int32), np.array([7, 8], np.int32), (np.int32(1),))
    array([0, 7, 8, 0, 0], dtype=int32)
    """
    idx = _starts("dynamic_update_slice", start_indices)
    return P.dynamic_update_slice_p.bind(operand, update, *idx)


def dynamic_slice_in_dim(operand, start_index, slice_size, axis: int = 0):
    """`dynamic_slice` along one axis (the others whole)."""
    a = _aval(operand)
    axis = canonicalize_axis(axis, a.ndim, "dynamic_slice_in_dim")
    starts = [np.int32(0)] * a.ndim
    starts[axis] = start_index
    sizes = list(a.shape)
    sizes[axis] = slice_size
    return dynamic_slice(operand, starts, sizes)


def dynamic_update_slice_in_dim(operand, update, start_index, axis: int):
    """`dynamic_update_slice` at `start_index` along `axis` (0 along the others)."""
    a = _aval(operand)
    axis = canonicalize_axis(axis, a.ndim, "dynamic_update_slice_in_dim")
    starts = [np.int32(0)] * a.ndim
    starts[axis] = start_index
    return dynamic_update_slice(operand, update, starts)
