"""`copy_to[backend, device]`: move a value to another backend's array format / memory space.

Identity on values; its own primitive so transfers are visible in the IR and costed by the
planner. `tgx.rebackend` inserts it at every boundary between backends.

>>> import tgx, tgx.numpy as tnp
>>> from tgx.primitives.transfer import copy_to
>>> g = tgx.make_graph(lambda x: copy_to(x, backend="torch"))(tgx.Spec(("N",)))
>>> print(g)
{ lambda ; a:f32[N]. let
    b:f32[N] = copy_to[backend='torch' device='cpu'] a
  in (b) }
"""

from __future__ import annotations

import numpy as np

from ..core import Primitive
from ..shapes import ShapedArray

copy_to_p = Primitive("copy_to", family="transfer")


@copy_to_p.def_shape
def _copy_to_shape(x: ShapedArray, *, backend: str, device: str = "cpu") -> ShapedArray:
    return x


@copy_to_p.def_impl
def _copy_to_impl(x, *, backend, device="cpu"):
    return np.asarray(x)


def copy_to(x, backend: str, device: str = "cpu"):
    """Bind `copy_to`: `x` as an array of `backend` on `device` (same values)."""
    return copy_to_p.bind(x, backend=backend, device=device)
