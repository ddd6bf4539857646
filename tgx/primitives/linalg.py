"""dot_general: the one contraction primitive (matmul, bmm, einsum, linear lower onto it).

`dimension_numbers = ((lhs_contract, rhs_contract), (lhs_batch, rhs_batch))`; the result is
`batch dims + lhs free dims + rhs free dims`, as in XLA.
"""

from __future__ import annotations

import math

import numpy as np

from ..core import Primitive
from ..errors import DTypeError, ShapeError
from ..shapes import ShapedArray, bool_, dim_eq, shape_str

dot_general_p = Primitive("dot_general", family="linalg")


@dot_general_p.def_flops
def _dot_general_flops(in_shapes, out_shapes, *, dimension_numbers) -> float:
    """A multiply and an add per output element and contracted index."""
    (lc, _), _ = dimension_numbers
    k = math.prod(in_shapes[0][a] for a in lc)
    return 2.0 * math.prod(out_shapes[0]) * k


def free_axes(ndim: int, contract, batch) -> list[int]:
    """The axes of a dot_general operand that are neither contracted nor batch, in order."""
    return [i for i in range(ndim) if i not in contract and i not in batch]


@dot_general_p.def_shape
def _dot_general_shape(lhs: ShapedArray, rhs: ShapedArray, *, dimension_numbers) -> ShapedArray:
    (lc, rc), (lb, rb) = dimension_numbers
    if lhs.dtype != rhs.dtype or lhs.dtype == bool_:
        raise DTypeError(f"dot_general requires numeric operands of one dtype, got "
                         f"{lhs.str_short()} and {rhs.str_short()}")
    if len(lc) != len(rc) or len(lb) != len(rb):
        raise ShapeError(f"dot_general: dimension_numbers {dimension_numbers} pair up unequal "
                         f"numbers of axes")
    for ax, n in [*((a, lhs.ndim) for a in (*lc, *lb)), *((a, rhs.ndim) for a in (*rc, *rb))]:
        if not 0 <= ax < n:
            raise ShapeError(f"dot_general: axis {ax} out of range in {dimension_numbers} for "
                             f"{lhs} and {rhs}")
    for kind, ls, rs in (("contracting", lc, rc), ("batch", lb, rb)):
        for a, b in zip(ls, rs):
            if not dim_eq(lhs.shape[a], rhs.shape[b]):
                raise ShapeError(
                    f"dot_general requires {kind} dimensions of equal size, got "
                    f"{shape_str(lhs.shape)} and {shape_str(rhs.shape)} (axis {a} of lhs vs axis "
                    f"{b} of rhs)")
    shape = (tuple(lhs.shape[i] for i in lb)
             + tuple(lhs.shape[i] for i in free_axes(lhs.ndim, lc, lb))
             + tuple(rhs.shape[i] for i in free_axes(rhs.ndim, rc, rb)))
    return ShapedArray(shape, lhs.dtype)


@dot_general_p.def_impl
def _dot_general_impl(lhs, rhs, *, dimension_numbers):
    (lc, rc), (lb, rb) = dimension_numbers
    lf, rf = free_axes(lhs.ndim, lc, lb), free_axes(rhs.ndim, rc, rb)
    # (batch, free, contract) @ (batch, contract, free) as one matmul
    lt = np.transpose(lhs, (*lb, *lf, *lc))
    rt = np.transpose(rhs, (*rb, *rc, *rf))
    bshape = lt.shape[:len(lb)]
    lfs, rfs = lt.shape[len(lb):len(lb) + len(lf)], rt.shape[len(rb) + len(rc):]
    k = int(np.prod(lt.shape[len(lb) + len(lf):], dtype=np.int64))
    m, n = int(np.prod(lfs, dtype=np.int64)), int(np.prod(rfs, dtype=np.int64))
    a = lt.reshape(*bshape, m, k)
    b = rt.reshape(*bshape, k, n)
    if a.dtype.itemsize == 2 and a.dtype.kind != "i":
        out = np.matmul(a.astype(np.float32), b.astype(np.float32)).astype(lhs.dtype)
    else:
        out = np.matmul(a, b)
    return out.reshape((*bshape, *lfs, *rfs))  # a tuple: a 0-d result reshapes too
