"""Tensor composites that need a primitive of their own: cumsum. (Pure data movement — split,
tile, repeat, roll, flip, stacking — is written directly with atomic movement primitives in
`tgx.numpy`.)"""

from __future__ import annotations

import numpy as np

from ..core import Primitive
from ..errors import DTypeError, ShapeError
from ..shapes import ShapedArray, bool_
from . import ops
from .elementwise import _lowp
from .linalg import dot_general_p

# cumsum(x, axis, reverse): inclusive prefix sums along one axis.
cumsum_p = Primitive("cumsum", family="tensor")


@cumsum_p.def_shape
def _cumsum_shape(x: ShapedArray, *, axis: int, reverse: bool = False) -> ShapedArray:
    if not 0 <= axis < x.ndim:
        raise ShapeError(f"cumsum: axis {axis} out of range for {x}")
    if x.dtype == bool_:
        raise DTypeError("cumsum does not accept bool operands; cast first")
    return ShapedArray(x.shape, x.dtype)


def _cumsum_ref(x, *, axis, reverse=False):
    if reverse:
        return np.flip(np.cumsum(np.flip(x, axis), axis=axis, dtype=x.dtype), axis)
    return np.cumsum(x, axis=axis, dtype=x.dtype)


cumsum_p.def_impl(_lowp(_cumsum_ref))


@cumsum_p.def_decomposition
def _cumsum_decomp(x, *, axis, reverse=False):
    # One dot_general with a triangular 0/1 mask built from iota: works for a symbolic length
    # and is one well-optimised kernel on every backend (O(n^2) work, fine for the n of a
    # sequence axis).
    a = ops._aval(x)
    n = a.shape[axis]
    rows = ops.iota(np.int64, (n, n), 0)
    cols = ops.iota(np.int64, (n, n), 1)
    # out[..., i] = sum_j x[..., j] * mask[j, i]
    mask = ops.greater_equal(rows, cols) if reverse else ops.less_equal(rows, cols)
    mask = ops.astype(mask, a.dtype)
    out = dot_general_p.bind(x, mask, dimension_numbers=(((axis,), (0,)), ((), ())))
    # dot_general puts the new axis last; move it back.
    return ops.moveaxis(out, -1, axis)


TENSOR = [cumsum_p]
