"""Products of `tgx.numpy` over `dot_general` beyond `matmul` (in `tgx.primitives.ops`):
dot, tensordot, vdot, outer, einsum."""

from __future__ import annotations

import string

import numpy as np

from .. import primitives as P
from ..errors import ShapeError, Unsupported
from ..primitives.ops import (
    _as_operand,
    _aval,
    _cast,
    _promoted,
    multiply,
    ravel,
    reshape,
    sum,
    transpose,
)
from ..shapes import canonicalize_axis, promote, shape_str


def dot(a, b):
    """NumPy dot: the last axis of `a` with the second-to-last of `b` (the only one if 1-D)."""
    (a, b), _, _ = _promoted(a, b)
    a, b = _as_operand(a), _as_operand(b)
    na, nb = _aval(a).ndim, _aval(b).ndim
    if na == 0 or nb == 0:
        return multiply(a, b)
    rc = 0 if nb == 1 else nb - 2
    return P.dot_general_p.bind(a, b, dimension_numbers=(((na - 1,), (rc,)), ((), ())))


def tensordot(a, b, axes=2):
    """Sum of products over `axes`: an int N (the last N axes of `a` with the first N of
    `b`) or a pair of axis sequences; the result has `a`'s free axes, then `b`'s. One
    `dot_general`.

    >>> tensordot(np.ones((2, 3, 4), np.float32), np.ones((3, 4, 5), np.float32)).shape
    (2, 5)
    """
    (a, b), _, _ = _promoted(a, b)
    a, b = _as_operand(a), _as_operand(b)
    na, nb = _aval(a).ndim, _aval(b).ndim
    if isinstance(axes, (int, np.integer)):
        n = int(axes)
        if not 0 <= n <= min(na, nb):
            raise ShapeError(f"tensordot: axes={n} for operands of rank {na} and {nb}")
        ca, cb = tuple(range(na - n, na)), tuple(range(n))
    else:
        try:
            ca, cb = axes
        except (TypeError, ValueError):
            raise ShapeError(f"tensordot: axes must be an int or a pair of axis sequences, "
                             f"got {axes!r}") from None
        ca = (ca,) if isinstance(ca, (int, np.integer)) else tuple(ca)
        cb = (cb,) if isinstance(cb, (int, np.integer)) else tuple(cb)
        if len(ca) != len(cb):
            raise ShapeError(f"tensordot: axes {axes!r} pair {len(ca)} axes of a with "
                             f"{len(cb)} of b")
        ca = tuple(canonicalize_axis(int(i), na, "tensordot") for i in ca)
        cb = tuple(canonicalize_axis(int(i), nb, "tensordot") for i in cb)
    return P.dot_general_p.bind(a, b, dimension_numbers=((ca, cb), ((), ())))


def vdot(a, b):
    return dot(ravel(a), ravel(b))


def outer(a, b):
    return multiply(reshape(a, (-1, 1)), reshape(b, (1, -1)))


def einsum(subscripts: str, *operands):
    """Einstein summation over dot_general, transpose, reshape and reduce_sum.

    >>> import numpy as np
    >>> einsum("ij,jk->ik", np.eye(2, dtype=np.float32), np.ones((2, 3), np.float32)).shape
    (2, 3)
    """
    subscripts = subscripts.replace(" ", "")
    if "->" in subscripts:
        ins, out = subscripts.split("->")
    else:
        ins = subscripts
        letters = [c for c in ins.replace(",", "") if c in string.ascii_letters]
        out = "".join(sorted(c for c in set(letters) if letters.count(c) == 1))
    specs = ins.split(",")
    if len(specs) != len(operands):
        raise ShapeError(f"einsum: {len(specs)} operand specs in {subscripts!r} but "
                         f"{len(operands)} operands")
    if "." in subscripts:
        raise Unsupported("einsum: ellipsis ('...') is not supported yet")
    operands = list(operands)
    dtype, _ = promote(*[_aval(x) for x in operands])
    operands = [_as_operand(_cast(x, dtype)) for x in operands]
    for s, x in zip(specs, operands):
        if len(s) != _aval(x).ndim:
            raise ShapeError(f"einsum: spec {s!r} has {len(s)} labels but operand has shape "
                             f"{shape_str(_aval(x).shape)}")
        if len(set(s)) != len(s):
            raise Unsupported(f"einsum: repeated label in {s!r} (diagonals) is not "
                              f"supported")
    # Contract left to right, summing out labels no later operand or the output needs.
    cur, cur_spec = operands[0], specs[0]
    for k in range(1, len(operands)):
        rest = "".join(specs[k + 1:]) + out
        cur, cur_spec = _einsum_pair(cur, cur_spec, operands[k], specs[k], rest)
    keep = set(out)
    drop = [i for i, c in enumerate(cur_spec) if c not in keep]
    if drop:
        cur = sum(cur, axis=tuple(drop))
        cur_spec = "".join(c for c in cur_spec if c in keep)
    if sorted(cur_spec) != sorted(out):
        raise ShapeError(f"einsum: output labels {out!r} do not match inputs {ins!r}")
    return transpose(cur, tuple(cur_spec.index(c) for c in out))


def _einsum_pair(x, xs: str, y, ys: str, needed: str):
    # Sum out labels used only by one operand and not needed later.
    def sum_private(z, zs, other):
        drop = [i for i, c in enumerate(zs) if c not in other and c not in needed]
        if drop:
            z = sum(z, axis=tuple(drop))
            zs = "".join(c for i, c in enumerate(zs) if i not in drop)
        return z, zs

    x, xs = sum_private(x, xs, ys)
    y, ys = sum_private(y, ys, xs)
    batch = [c for c in xs if c in ys and c in needed]
    contract = [c for c in xs if c in ys and c not in needed]
    dn = ((tuple(xs.index(c) for c in contract), tuple(ys.index(c) for c in contract)),
          (tuple(xs.index(c) for c in batch), tuple(ys.index(c) for c in batch)))
    out = P.dot_general_p.bind(x, y, dimension_numbers=dn)
    spec = "".join(batch) + "".join(c for c in xs if c not in ys) + "".join(
        c for c in ys if c not in xs)
    return out, spec
