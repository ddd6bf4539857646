"""Sorting of `tgx.numpy` as a composite of atomic primitives (tgx has no sort primitive):
each element's rank is counted by comparing it with every other element of its row, so the
work and the memory are O(n²) in the length n of the sorted axis. Meant for short axes (top-k
over a few hundred logits, ordering a few boxes); a 1024-long axis needs 1M comparisons per
row.

Ascending, NaNs sort last (NumPy); descending, first (torch, jax.numpy). Always stable: equal
elements keep their order.
"""

from __future__ import annotations

from ..errors import Unsupported
from ..primitives.ops import (
    _as_operand,
    _aval,
    equal,
    expand_dims,
    greater,
    iota,
    less,
    logical_and,
    logical_not,
    logical_or,
    moveaxis,
    reshape,
    sum,
    where,
)
from ..shapes import DEFAULT_INT, canonicalize_axis, int64, is_float
from .elementwise import isnan
from .indexing import take_along_axis


def _before(xj, xi, descending: bool):
    """Whether xj sorts strictly before xi (NaN after every number ascending, before
    descending), and whether the two are tied."""
    if not is_float(_aval(xi).dtype):
        return (greater(xj, xi) if descending else less(xj, xi)), equal(xj, xi)
    nan_i, nan_j = isnan(xi), isnan(xj)
    if descending:
        before = logical_or(greater(xj, xi), logical_and(nan_j, logical_not(nan_i)))
    else:
        before = logical_or(less(xj, xi), logical_and(nan_i, logical_not(nan_j)))
    return before, logical_or(equal(xj, xi), logical_and(nan_i, nan_j))


def _ranks(x, descending: bool):
    """The sorted position of every element along the last axis (a permutation per row)."""
    n = _aval(x).shape[-1]
    xi, xj = expand_dims(x, -1), expand_dims(x, -2)        # [..., i, j]
    before, tied = _before(xj, xi, descending)
    j_first = less(iota(int64, (n, n), 1), iota(int64, (n, n), 0))
    return sum(logical_or(before, logical_and(tied, j_first)), axis=-1)


def argsort(a, axis: int | None = -1, kind=None, order=None, *, stable: bool = True,
            descending: bool = False):
    """Indices that sort `a` along `axis` (flattened when None), stably, as int64; O(n²) in
    the axis length (see the module). `kind` is accepted and ignored (always stable).

    >>> import numpy as np
    >>> argsort(np.array([3.0, 1.0, np.nan, 1.0]))
    array([1, 3, 0, 2])
    """
    if order is not None:
        raise Unsupported("argsort: order= (structured arrays) is not supported")
    x = _as_operand(a)
    if axis is None:
        x, axis = reshape(x, (-1,)), 0
    nd = _aval(x).ndim
    if nd == 0:
        raise Unsupported("argsort of a 0-d array")
    axis = canonicalize_axis(axis, nd, "argsort")
    x = moveaxis(x, axis, -1)
    n = _aval(x).shape[-1]
    rank = _ranks(x, descending)
    # perm[r] = the i whose rank is r: a one-hot of the ranks, weighted by i
    hit = equal(expand_dims(rank, -2), iota(DEFAULT_INT, (n, 1), 0))   # [..., r, i]
    perm = sum(where(hit, iota(DEFAULT_INT, (n, n), 1), 0), axis=-1)
    return moveaxis(perm, -1, axis)


def sort(a, axis: int | None = -1, kind=None, order=None, *, stable: bool = True,
         descending: bool = False):
    """`a` sorted along `axis` (flattened when None): `take_along_axis(a, argsort(a))`; O(n²)
    in the axis length (see the module).

    >>> import numpy as np
    >>> sort(np.array([[3, 1, 2]], np.int32))
    array([[1, 2, 3]], dtype=int32)
    """
    x = _as_operand(a)
    if axis is None:
        x, axis = reshape(x, (-1,)), 0
    return take_along_axis(x, argsort(x, axis, kind, order, stable=stable,
                                      descending=descending), axis)

