"""NumPy's array protocol on `tgx.tracing.Tracer`: operators and methods forwarded to the
`tgx.numpy` functions (installed when `tgx.numpy` is imported, which `import tgx` does).

>>> import tgx, tgx.numpy as tnp
>>> g = tgx.make_graph(lambda x: (-x).sum(axis=0) + x.T[0])(tgx.Spec((3, 3)))
>>> [e.primitive.name for e in g.eqns]
['neg', 'reduce_sum', 'transpose', 'slice', 'reshape', 'add']
"""

from __future__ import annotations

from ..primitives.ops import (
    add,
    argmax,
    astype,
    bitwise_and,
    bitwise_or,
    bitwise_xor,
    divide,
    equal,
    greater,
    greater_equal,
    invert,
    less,
    less_equal,
    matmul,
    max,
    min,
    multiply,
    negative,
    not_equal,
    ravel,
    reshape,
    squeeze,
    subtract,
    sum,
    swapaxes,
    take,
    transpose,
)
from ..tracing import Tracer
from .composite import absolute, argmin, clip, cumsum, mean, remainder, std, var
from .elementwise import floor_divide, positive, power
from .indexing import _getitem
from .movement import repeat
from .reductions import all, any, prod


def _swap(f):
    return lambda x, y: f(y, x)


def _tracer_reshape(x, *shape, order="C"):
    if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
        shape = tuple(shape[0])
    return reshape(x, shape, order)


def _tracer_transpose(x, *axes):
    if len(axes) == 1 and isinstance(axes[0], (tuple, list)):
        axes = tuple(axes[0])
    return transpose(x, axes or None)


_METHODS = {
    "__add__": add, "__radd__": _swap(add), "__sub__": subtract, "__rsub__": _swap(subtract),
    "__mul__": multiply, "__rmul__": _swap(multiply), "__truediv__": divide,
    "__rtruediv__": _swap(divide), "__floordiv__": floor_divide,
    "__rfloordiv__": _swap(floor_divide), "__mod__": remainder, "__rmod__": _swap(remainder),
    "__pow__": power, "__rpow__": _swap(power), "__matmul__": matmul,
    "__rmatmul__": _swap(matmul), "__neg__": negative, "__pos__": positive, "__abs__": absolute,
    "__lt__": less, "__le__": less_equal, "__gt__": greater, "__ge__": greater_equal,
    "__eq__": equal, "__ne__": not_equal, "__and__": bitwise_and, "__rand__": bitwise_and,
    "__or__": bitwise_or, "__ror__": bitwise_or, "__xor__": bitwise_xor,
    "__rxor__": bitwise_xor, "__invert__": invert, "__getitem__": _getitem,
    "reshape": _tracer_reshape, "astype": astype, "sum": sum, "mean": mean, "max": max,
    "min": min, "prod": prod, "argmax": argmax, "argmin": argmin, "any": any, "all": all,
    "transpose": _tracer_transpose, "squeeze": squeeze, "ravel": ravel, "flatten": ravel,
    "clip": clip, "swapaxes": swapaxes, "take": take,
    "var": var, "std": std, "cumsum": cumsum, "repeat": repeat,
}


def _install(name: str, fn) -> None:
    # A method named like a slot would replace the slot's descriptor and break every tracer.
    assert name not in Tracer.__slots__, f"Tracer.{name} is a slot, not a method"
    setattr(Tracer, name, fn)


for _name, _fn in _METHODS.items():
    _install(_name, _fn)
Tracer.T = property(lambda x: transpose(x))
Tracer.mT = property(lambda x: swapaxes(x, -1, -2))
Tracer.__hash__ = object.__hash__  # __eq__ is elementwise; identity hashing stays usable
