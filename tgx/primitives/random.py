"""The counter-based generator behind `tgx.random`: Threefry-2x32 (Salmon et al., "Parallel
random numbers: as easy as 1, 2, 3", SC 2011), 20 rounds, the variant JAX uses.

`threefry2x32(k0, k1, x0, x1) -> (y0, y1)` is a composite primitive over uint32 operands that
broadcast; its decomposition uses only atomic integer ops (add with 32-bit wraparound, xor,
shift_left, shift_right_logical, or), so every backend produces the same bits.
"""

from __future__ import annotations

import numpy as np

from ..core import Primitive
from ..errors import DTypeError
from ..shapes import ShapedArray, broadcast_shapes, uint32
from . import ops
from .elementwise import add_p, or_p, shift_left_p, shift_right_logical_p, xor_p

_ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))
_PARITY = 0x1BD11BDA

threefry2x32_p = Primitive("threefry2x32", multiple_results=True, family="random")


@threefry2x32_p.def_shape
def _threefry_shape(k0: ShapedArray, k1: ShapedArray, x0: ShapedArray, x1: ShapedArray):
    for a in (k0, k1, x0, x1):
        if a.dtype != uint32:
            raise DTypeError(f"threefry2x32 needs uint32 operands, got "
                             f"{', '.join(b.str_short() for b in (k0, k1, x0, x1))}")
    shape = broadcast_shapes(k0.shape, k1.shape, x0.shape, x1.shape, op="threefry2x32")
    return [ShapedArray(shape, uint32), ShapedArray(shape, uint32)]


def _threefry_rounds(k0, k1, x0, x1, add, xor, rotl, const):
    """The 20 rounds, written once over abstract ops (NumPy reference and decomposition)."""
    ks = (k0, k1, xor(xor(k0, k1), const(_PARITY)))
    x0, x1 = add(x0, ks[0]), add(x1, ks[1])
    for i in range(5):
        for r in _ROTATIONS[i % 2]:
            x0 = add(x0, x1)
            x1 = xor(rotl(x1, r), x0)
        x0 = add(x0, ks[(i + 1) % 3])
        x1 = add(add(x1, ks[(i + 2) % 3]), const(i + 1))
    return x0, x1


def _np_rotl(x, r):
    return (x << np.uint32(r)) | (x >> np.uint32(32 - r))


@threefry2x32_p.def_impl
def _threefry_impl(k0, k1, x0, x1):
    shape = np.broadcast_shapes(k0.shape, k1.shape, x0.shape, x1.shape)
    args = [np.broadcast_to(np.asarray(a, np.uint32), shape).copy() for a in (k0, k1, x0, x1)]
    with np.errstate(over="ignore"):
        y0, y1 = _threefry_rounds(*args, add=np.add, xor=np.bitwise_xor, rotl=_np_rotl,
                                  const=np.uint32)
    return [np.asarray(y0, np.uint32), np.asarray(y1, np.uint32)]


@threefry2x32_p.def_decomposition
def _threefry_decomp(k0, k1, x0, x1):
    def const(v):
        return np.asarray(v, np.uint32)

    def rotl(x, r):
        return or_p.bind(shift_left_p.bind(x, const(r)),
                         shift_right_logical_p.bind(x, const(32 - r)))

    k0, k1, x0, x1 = ops.broadcast_arrays(k0, k1, x0, x1)
    return list(_threefry_rounds(k0, k1, x0, x1, add=add_p.bind, xor=xor_p.bind, rotl=rotl,
                                 const=const))


RANDOM = [threefry2x32_p]
