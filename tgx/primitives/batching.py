"""Batching rules (`tgx.vmap`) for every atomic primitive, and for the composites whose rule is
one line (elementwise ones, and those that only take an axis).

A rule is `rule(args, dims, **params) -> (out, out_dim)` (a list of outs and of dims for a
primitive with several results): `dims[i]` is the batch axis of `args[i]`, or None when that
argument is the same for every example. The rule runs with the vmap trace set aside, so the
primitives it binds act on the batched values below (staged into the graph builder, or eager).
`out_dim` may be any axis, or None for a result that does not depend on the batch. A rule may
return `NotImplemented` to decline (a composite is then batched through its decomposition).

Most rules move the batch axis to the front (a transpose, free as a view) and shift the axes
in the parameters by one; the ones that can keep the batch axis where it is (unary
elementwise, reductions, slice, pad, rev, dot_general) do. Composites without a rule are
batched through their decomposition by `tgx.transforms.vmap`.
"""

from __future__ import annotations

import numpy as np

from ..core import PRIMITIVES
from ..errors import TgxError
from ..shapes import as_dim, bool_, dim_eq, int64
from . import ops, transfer  # noqa: F401  (transfer declares copy_to, batched below)
from .elementwise import (
    BINARY,
    COMPARE,
    UNARY,
    convert_element_type_p,
    copy_p,
    select_p,
)
from .linalg import dot_general_p
from .movement import (
    broadcast_in_dim_p,
    concatenate_p,
    dim_as_value_p,
    dynamic_slice_p,
    dynamic_update_slice_p,
    gather_p,
    iota_p,
    pad_p,
    reshape_p,
    rev_p,
    slice_p,
    transpose_p,
)
from .reductions import REDUCTIONS, argmax_p

# ---------------------------------------------------------------------------------------------
# Helpers


def _shape(x) -> tuple:
    return ops._aval(x).shape


def _other_axes(ndim: int, d: int) -> list[int]:
    """The axes of a batched value that are not its batch axis: per-example axis i is
    `_other_axes(ndim, d)[i]`."""
    return [i for i in range(ndim) if i != d]


def _front(x, d):
    """`x` with its batch axis `d` moved to 0."""
    return ops.moveaxis(x, d, 0) if d else x


def _batched_front(x, d, size):
    """`x` with a batch axis of `size` at 0: moved there, or broadcast when `x` has none."""
    if d is not None:
        return _front(x, d)
    shape = _shape(x)
    return broadcast_in_dim_p.bind(ops._as_operand(x), shape=(size,) + tuple(shape),
                                   broadcast_dimensions=tuple(range(1, len(shape) + 1)))


def _axis_size(args, dims):
    return next(_shape(a)[d] for a, d in zip(args, dims) if d is not None)


def _insert(seq: tuple, d: int, item) -> tuple:
    return tuple(seq[:d]) + (item,) + tuple(seq[d:])


def _zero_index(dtype=np.int32):
    return np.zeros((), dtype)


def _provably_equal(a, b) -> bool:
    try:
        return dim_eq(a, b)
    except TgxError:  # undecidable symbolic comparison: not provably equal
        return False


def _dim_value(d):
    """A dim (or an expression of dims) as an int64 operand: a Python int, or `dim_as_value`."""
    return d if type(d) is int else ops._shape_value(as_dim(d), int64)


def _register(prim, rule) -> None:
    if prim.batch is None:  # a family file may declare its own
        prim.def_batch(rule)


# ---------------------------------------------------------------------------------------------
# Elementwise: broadcasting aligns trailing axes, so batched operands get their batch axis in
# front and size-1 axes up to the widest per-example rank.


def _unary_rule(prim):
    def rule(args, dims, **params):
        return prim.bind(*args, **params), dims[0]

    return rule


def _elementwise_rule(prim):
    def rule(args, dims, **params):
        if len(args) == 1:
            return prim.bind(*args, **params), dims[0]
        ranks = [len(_shape(a)) - (d is not None) for a, d in zip(args, dims)]
        rank = max(ranks)
        batched = {d for d in dims if d is not None}
        if len(batched) == 1 and all(
                (r == rank) if d is not None else (r == 0) for r, d in zip(ranks, dims)):
            # one batch axis, same per-example ranks, unbatched scalars: nothing to align
            return prim.bind(*args, **params), batched.pop()
        xs = []
        for a, d, r in zip(args, dims, ranks):
            if d is not None:
                a = _front(a, d)
                s = _shape(a)
                if r < rank:
                    a = reshape_p.bind(a, new_sizes=(s[0],) + (1,) * (rank - r) + tuple(s[1:]))
            xs.append(a)
        return prim.bind(*xs, **params), 0

    return rule


for _p in UNARY + [convert_element_type_p, copy_p, transfer.copy_to_p]:
    _register(_p, _unary_rule(_p))
for _p in BINARY + COMPARE + [select_p]:
    _register(_p, _elementwise_rule(_p))


# ---------------------------------------------------------------------------------------------
# Reductions and ops along an axis: the batch axis stays where it is, the axes are remapped.


def _reduce_rule(prim):
    def rule(args, dims, *, axes, **params):
        (x,), (d,) = args, dims
        other = _other_axes(len(_shape(x)), d)
        new_axes = tuple(sorted(other[a] for a in axes))
        keep = params.get("keepdims", False)
        out_d = d if keep else d - sum(a < d for a in new_axes)
        return prim.bind(x, axes=new_axes, **params), out_d

    return rule


def _axis_rule(prim, removes_axis: bool):
    def rule(args, dims, *, axis, **params):
        (x,), (d,) = args, dims
        new_axis = _other_axes(len(_shape(x)), d)[axis]
        out_d = d - 1 if removes_axis and new_axis < d else d
        return prim.bind(x, axis=new_axis, **params), out_d

    return rule


for _p in REDUCTIONS:
    if _p is not argmax_p:
        _register(_p, _reduce_rule(_p))
_register(argmax_p, _axis_rule(argmax_p, removes_axis=True))


# ---------------------------------------------------------------------------------------------
# Movement


def _reshape_rule(args, dims, *, new_sizes):
    (x,), (d,) = args, dims
    x = _front(x, d)
    return reshape_p.bind(x, new_sizes=(_shape(x)[0],) + tuple(new_sizes)), 0


def _broadcast_in_dim_rule(args, dims, *, shape, broadcast_dimensions):
    (x,), (d,) = args, dims
    x = _front(x, d)
    return broadcast_in_dim_p.bind(
        x, shape=(_shape(x)[0],) + tuple(shape),
        broadcast_dimensions=(0,) + tuple(b + 1 for b in broadcast_dimensions)), 0


def _transpose_rule(args, dims, *, permutation):
    (x,), (d,) = args, dims
    other = _other_axes(len(_shape(x)), d)
    return transpose_p.bind(x, permutation=(d,) + tuple(other[p] for p in permutation)), 0


def _slice_rule(args, dims, *, start_indices, limit_indices, strides=None):
    (x,), (d,) = args, dims
    size = _shape(x)[d]
    return slice_p.bind(x, start_indices=_insert(start_indices, d, 0),
                        limit_indices=_insert(limit_indices, d, size),
                        strides=None if strides is None else _insert(strides, d, 1)), d


def _rev_rule(args, dims, *, dimensions):
    (x,), (d,) = args, dims
    other = _other_axes(len(_shape(x)), d)
    return rev_p.bind(x, dimensions=tuple(sorted(other[a] for a in dimensions))), d


def _pad_rule(args, dims, *, padding_config):
    (x, v), (dx, dv) = args, dims
    if dv is None:
        return pad_p.bind(x, v, padding_config=_insert(padding_config, dx, (0, 0, 0))), dx
    # A padding value per example: pad with anything, then select the value where a padded
    # mask of the per-example shape is False.
    size = _shape(v)[dv]
    x = _batched_front(x, dx, size)
    dtype = ops._aval(x).dtype
    padded = pad_p.bind(x, np.zeros((), dtype), padding_config=((0, 0, 0),) + padding_config)
    example = tuple(_shape(x)[1:])
    inside = pad_p.bind(ops.full(example, True, bool_), np.asarray(False),
                        padding_config=padding_config)
    out_rank = len(_shape(padded)) - 1
    v = reshape_p.bind(_front(v, dv), new_sizes=(size,) + (1,) * out_rank)
    return select_p.bind(inside, padded, v), 0


def _concatenate_rule(args, dims, *, dimension):
    size = _axis_size(args, dims)
    xs = [_batched_front(a, d, size) for a, d in zip(args, dims)]
    return concatenate_p.bind(*xs, dimension=dimension + 1), 0


def _no_operand_rule(prim):
    # iota and dim_as_value have no operands, so vmap never batches them: the same value
    # serves every example (kept for completeness: each atomic primitive has a rule)
    def rule(args, dims, **params):
        return prim.bind(*args, **params), None

    return rule


_register(reshape_p, _reshape_rule)
_register(broadcast_in_dim_p, _broadcast_in_dim_rule)
_register(transpose_p, _transpose_rule)
_register(slice_p, _slice_rule)
_register(rev_p, _rev_rule)
_register(pad_p, _pad_rule)
_register(concatenate_p, _concatenate_rule)
_register(iota_p, _no_operand_rule(iota_p))
_register(dim_as_value_p, _no_operand_rule(dim_as_value_p))


# ---------------------------------------------------------------------------------------------
# Gathers with per-example indices: one gather on the batch and indexed axes flattened
# together (example b's row i is row b * d + i), so no per-example loop is needed and the batch
# size may be symbolic.


def take_per_example(x, idx, axis: int, clamp: bool = True):
    """`out[b, ..., j..., ...] = x[b, ..., idx[b, j...], ...]`: a `take` along `axis` of a value
    with its batch axis at 0, with indices that differ per example (batch axis 0 of `idx`).
    Indices are clamped to `[0, d)`, as `gather` clamps them (`clamp=False`: they are)."""
    xs = _shape(x)
    size, d = xs[0], xs[axis]
    rest = tuple(xs[1:axis]) + tuple(xs[axis + 1:])
    k = len(_shape(idx)) - 1
    flat = ops.reshape(ops.moveaxis(x, axis, 1), (size * d,) + rest)
    idx = ops.astype(idx, int64)
    if clamp:
        idx = ops.minimum(ops.maximum(idx, 0), _dim_value(d - 1))
    offsets = ops.multiply(ops.iota(int64, (size,) + (1,) * k, 0), _dim_value(d))
    out = gather_p.bind(flat, ops.add(idx, offsets), axis=0)   # (B, *k, *rest)
    # the indexed axes go back where `axis` was
    before = axis - 1
    perm = ((0,) + tuple(range(1 + k, 1 + k + before)) + tuple(range(1, 1 + k))
            + tuple(range(1 + k + before, len(_shape(out)))))
    return ops.transpose(out, perm)


def _gather_rule(args, dims, *, axis):
    (x, idx), (dx, di) = args, dims
    if di is None:
        other = _other_axes(len(_shape(x)), dx)
        new_axis = other[axis]
        out = gather_p.bind(x, idx, axis=new_axis)
        # the index dims replace axis `new_axis`; the batch axis moves if it came after it
        return out, dx if dx < new_axis else dx - 1 + len(_shape(idx))
    if dx is None:
        # unbatched operand: the batch axis of the indices lands among the gathered dims
        return gather_p.bind(x, idx, axis=axis), axis + di
    return take_per_example(_front(x, dx), _front(idx, di), axis + 1), 0


_register(gather_p, _gather_rule)


def _scatter_add_rule(args, dims, *, axis):
    prim = PRIMITIVES["scatter_add"]
    (x, idx, upd), (dx, di, du) = args, dims
    size = _axis_size(args, dims)
    x = _batched_front(x, dx, size)
    if di is None:
        # updates are (x[:axis], idx dims, x[axis+1:]) per example: batch axis in front fits
        return prim.bind(x, idx, _batched_front(upd, du, size), axis=axis + 1), 0
    # per-example indices: scatter into the batch and indexed axes flattened together, as
    # take_per_example gathers
    upd = _batched_front(upd, du, size)
    idx = _front(idx, di)
    xs = _shape(x)
    d, k = xs[axis + 1], len(_shape(idx)) - 1
    rest = tuple(xs[1:axis + 1]) + tuple(xs[axis + 2:])
    flat = ops.reshape(ops.moveaxis(x, axis + 1, 1), (size * d,) + rest)
    idx = ops.minimum(ops.maximum(ops.astype(idx, int64), 0), _dim_value(d - 1))
    idx = ops.add(idx, ops.multiply(ops.iota(int64, (size,) + (1,) * k, 0), _dim_value(d)))
    # updates (B, pre, *k, post) -> (B, *k, pre, post)
    perm = ((0,) + tuple(range(1 + axis, 1 + axis + k)) + tuple(range(1, 1 + axis))
            + tuple(range(1 + axis + k, len(_shape(upd)))))
    out = prim.bind(flat, idx, ops.transpose(upd, perm), axis=0)
    return ops.moveaxis(ops.reshape(out, (size, d) + rest), 1, axis + 1), 0


if "scatter_add" in PRIMITIVES:  # declared beside gather (the transpose of gather, for grad)
    _register(PRIMITIVES["scatter_add"], _scatter_add_rule)


def _clamped_start(start, d, size):
    """jax.lax's start: `start + d` when negative, then clamped to `[0, d - size]` (int64)."""
    start = ops.astype(start, int64)
    dv = _dim_value(d)
    start = ops.where(ops.less(start, 0), ops.add(start, dv), start)
    return ops.minimum(ops.maximum(start, 0), _dim_value(d - size))


def _dynamic_slice_rule(args, dims, *, slice_sizes):
    x, *idx = args
    dx, *didx = dims
    size = _axis_size(args, dims)
    if all(d is None for d in didx):
        x = _front(x, dx)
        return dynamic_slice_p.bind(x, _zero_index(), *idx,
                                    slice_sizes=(size,) + tuple(slice_sizes)), 0
    # Per-example starts: slice the axes with shared starts at once, then gather each axis
    # whose start differs per example (`start_b + iota(size)`, clamped as dynamic_slice does).
    x = _batched_front(x, dx, size)
    shape = tuple(_shape(x)[1:])
    batched_axes = [ax for ax, d in enumerate(didx) if d is not None]
    if len(batched_axes) < len(idx):
        starts = [_zero_index() if ax in batched_axes else i for ax, i in enumerate(idx)]
        sizes = [shape[ax] if ax in batched_axes else s for ax, s in enumerate(slice_sizes)]
        x = dynamic_slice_p.bind(x, _zero_index(), *starts, slice_sizes=(size,) + tuple(sizes))
    for ax in batched_axes:
        n = slice_sizes[ax]
        start = _clamped_start(_front(idx[ax], didx[ax]), shape[ax], n)   # (B,)
        window = ops.add(ops.reshape(start, (size, 1)), ops.iota(int64, (1, n), 1))
        x = take_per_example(x, window, ax + 1, clamp=False)
    return x, 0


def _dynamic_update_slice_rule(args, dims):
    x, u, *idx = args
    dx, du, *didx = dims
    size = _axis_size(args, dims)
    x = _batched_front(x, dx, size)
    u = _batched_front(u, du, size)
    if all(d is None for d in didx):
        return dynamic_update_slice_p.bind(x, u, _zero_index(), *idx), 0
    # Per-example starts (a scatter, which tgx has no primitive for): gather the update out to
    # the operand's shape (position i of axis k reads update row i - start_b, clamped) and
    # select it where every axis is inside the window.
    shape, ushape = tuple(_shape(x)[1:]), tuple(_shape(u)[1:])
    rank = len(shape)
    inside = None
    for ax, (i, di) in enumerate(zip(idx, didx)):
        d, n = shape[ax], ushape[ax]
        if _provably_equal(d, n):
            continue  # the window covers the axis: start 0
        start = _clamped_start(_front(i, di) if di is not None else i, d, n)
        start = ops.reshape(ops.broadcast_to(start, (size,)), (size, 1))
        rel = ops.subtract(ops.iota(int64, (1, d), 1), start)               # (B, d)
        u = take_per_example(u, rel, ax + 1)
        ok = ops.logical_and(ops.greater_equal(rel, 0),
                             ops.less(rel, _dim_value(n)))
        ok = ops.reshape(ok, (size,) + (1,) * ax + (d,) + (1,) * (rank - ax - 1))
        inside = ok if inside is None else ops.logical_and(inside, ok)
    if inside is None:
        return u, 0
    return select_p.bind(inside, u, x), 0


_register(dynamic_slice_p, _dynamic_slice_rule)
_register(dynamic_update_slice_p, _dynamic_update_slice_rule)


# ---------------------------------------------------------------------------------------------
# dot_general: a batch axis on both sides becomes one more batch dimension pair; on one side
# only, it is a free dimension of that side.


def _dot_general_rule(args, dims, *, dimension_numbers):
    (lhs, rhs), (dl, dr) = args, dims
    (lc, rc), (lb, rb) = dimension_numbers
    nl, nr = len(_shape(lhs)), len(_shape(rhs))
    lmap = _other_axes(nl, dl) if dl is not None else list(range(nl))
    rmap = _other_axes(nr, dr) if dr is not None else list(range(nr))
    lc, lb = tuple(lmap[a] for a in lc), tuple(lmap[a] for a in lb)
    rc, rb = tuple(rmap[a] for a in rc), tuple(rmap[a] for a in rb)
    if dl is not None and dr is not None:
        out_d = 0
        lb, rb = (dl,) + lb, (dr,) + rb
    elif dl is not None:
        lfree = [a for a in range(nl) if a not in lc and a not in lb]
        out_d = len(lb) + lfree.index(dl)
    else:
        lfree = nl - len(lc) - len(lb)
        rfree = [a for a in range(nr) if a not in rc and a not in rb]
        out_d = len(lb) + lfree + rfree.index(dr)
    out = dot_general_p.bind(lhs, rhs, dimension_numbers=((lc, rc), (lb, rb)))
    return out, out_d


_register(dot_general_p, _dot_general_rule)


# ---------------------------------------------------------------------------------------------
# Composites with a one-line rule stay whole in the batched graph (the others are batched
# through their decomposition): the elementwise ones, and those that only take an axis.

for _p in list(PRIMITIVES.values()):
    if not _p.atomic and _p.elementwise:
        _register(_p, _elementwise_rule(_p))
for _name in ("softmax", "log_softmax", "cumsum"):
    if _name in PRIMITIVES:
        _register(PRIMITIVES[_name], _axis_rule(PRIMITIVES[_name], removes_axis=False))
if "argmin" in PRIMITIVES:
    _register(PRIMITIVES["argmin"], _axis_rule(PRIMITIVES["argmin"], removes_axis=True))
for _name in ("mean", "var", "std", "logsumexp"):
    if _name in PRIMITIVES:
        _register(PRIMITIVES[_name], _reduce_rule(PRIMITIVES[_name]))


def _leading_operand_rule(prim):
    """For a composite that works on trailing axes (the norms over `normalized_shape`,
    `linear` over features): a batch axis in front of its first operand is one more leading
    axis. Declines (NotImplemented: the decomposition is batched) when another operand, a
    weight, differs per example."""

    def rule(args, dims, **params):
        if any(d is not None for d in dims[1:]):
            return NotImplemented
        return prim.bind(_front(args[0], dims[0]), *args[1:], **params), 0

    return rule


for _name in ("layer_norm", "rms_norm", "linear"):
    if _name in PRIMITIVES:
        _register(PRIMITIVES[_name], _leading_operand_rule(PRIMITIVES[_name]))
