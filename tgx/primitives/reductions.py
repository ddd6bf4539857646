"""Atomic reductions over a tuple of axes (the axes are removed; `keepdims` is a reshape in
`tgx.numpy`), and argmax."""

from __future__ import annotations

import numpy as np

from ..core import Primitive
from ..errors import DTypeError, ShapeError
from ..shapes import SHORT_NAMES, ShapedArray, bool_, dim_eq, is_int

_NUMPY = {"reduce_sum": np.sum, "reduce_max": np.max, "reduce_min": np.min, "reduce_prod": np.prod}


def _check_axes(name: str, x: ShapedArray, axes: tuple) -> None:
    if not isinstance(axes, tuple) or sorted(set(axes)) != list(axes) or any(
            not 0 <= a < x.ndim for a in axes):
        raise ShapeError(f"{name}: axes must be a sorted tuple of distinct axes of a rank-"
                         f"{x.ndim} operand, got {axes}")


def reduction(name: str, allow_bool: bool) -> Primitive:
    p = Primitive(name, family="reduction")
    fn = _NUMPY[name]

    @p.def_shape
    def _shape(x: ShapedArray, *, axes: tuple) -> ShapedArray:
        _check_axes(name, x, axes)
        if x.dtype == bool_ and not allow_bool:
            raise DTypeError(f"{name} does not accept bool operands; cast first")
        for a in axes:
            if name in ("reduce_max", "reduce_min") and dim_eq(x.shape[a], 0):
                raise ShapeError(f"{name}: cannot reduce over an empty axis {a} of {x}")
        return ShapedArray(tuple(d for i, d in enumerate(x.shape) if i not in axes), x.dtype)

    @p.def_impl
    def _impl(x, *, axes):
        if x.dtype.itemsize == 2 and x.dtype.kind != "i" and name in ("reduce_sum", "reduce_prod"):
            # Accumulate half precision in float32, as torch and XLA do.
            return np.asarray(fn(x.astype(np.float32), axis=axes)).astype(x.dtype)
        return np.asarray(fn(x, axis=axes))

    return p


reduce_sum_p = reduction("reduce_sum", allow_bool=False)
reduce_max_p = reduction("reduce_max", allow_bool=True)
reduce_min_p = reduction("reduce_min", allow_bool=True)
reduce_prod_p = reduction("reduce_prod", allow_bool=False)

# argmax(x, axis, index_dtype): first index of the maximum; NaN counts as the maximum (NumPy).
argmax_p = Primitive("argmax", family="reduction")


@argmax_p.def_shape
def _argmax_shape(x: ShapedArray, *, axis: int, index_dtype) -> ShapedArray:
    if not 0 <= axis < x.ndim:
        raise ShapeError(f"argmax: axis {axis} out of range for {x}")
    if not is_int(index_dtype):
        raise DTypeError(f"argmax: index_dtype must be an integer dtype, got "
                         f"{SHORT_NAMES.get(index_dtype, index_dtype)}")
    if dim_eq(x.shape[axis], 0):
        raise ShapeError(f"argmax: cannot reduce over an empty axis {axis} of {x}")
    return ShapedArray(x.shape[:axis] + x.shape[axis + 1:], index_dtype)


@argmax_p.def_impl
def _argmax_impl(x, *, axis, index_dtype):
    return np.asarray(np.argmax(x, axis=axis)).astype(index_dtype)


REDUCTIONS = [reduce_sum_p, reduce_max_p, reduce_min_p, reduce_prod_p, argmax_p]
