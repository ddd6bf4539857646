"""NumPy's array protocol on `tgx.tracing.Tracer`: operators and methods forwarded to the
`tgx.numpy` functions (installed when `tgx.numpy` is imported, which `import tgx` does).

>>> import tgx, tgx.numpy as tnp
>>> g = tgx.make_graph(lambda x: (-x).sum(axis=0) + x.T[0])(tgx.Spec((3, 3)))
>>> [e.primitive.name for e in g.eqns]
['neg', 'reduce_sum', 'transpose', 'slice', 'reshape', 'add']
"""

from __future__ import annotations

import numpy as np

from ..primitives.ops import (
    add,
    argmax,
    astype,
    bitwise_and,
    bitwise_or,
    bitwise_xor,
    divide,
    equal,
    expand_dims,
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
from ..errors import OptionError, Unsupported
from ..shapes import canonicalize_axes
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


# torch's spellings: `x.view(2, -1)`, `x.permute(1, 0)`, `x.unsqueeze(0)`, `x.squeeze(dim=0)`,
# `x.sum(dim=1, keepdim=True)`


def _tracer_view(x, *shape):
    """torch `Tensor.view(*shape)`: a reshape (traced arrays are values, so every reshape is
    as good as a view)."""
    if len(shape) == 1 and (isinstance(shape[0], (np.dtype, type))
                            or type(shape[0]).__name__ == "dtype"):  # numpy or torch dtypes
        raise Unsupported(f"view({shape[0]!r}) reinterprets the bits as another dtype; use "
                          f"astype to convert values")
    return _tracer_reshape(x, *shape)


def _tracer_permute(x, *dims):
    """torch `Tensor.permute(*dims)`."""
    if len(dims) == 1 and isinstance(dims[0], (tuple, list)):
        dims = tuple(dims[0])
    return transpose(x, dims)


def _tracer_unsqueeze(x, dim):
    """torch `Tensor.unsqueeze(dim)`: a new axis of size 1 at `dim`."""
    return expand_dims(x, dim)


def _tracer_squeeze(x, axis=None, *, dim=None):
    """NumPy `squeeze(axis)` (an axis not of size 1 is an error), or torch's
    `squeeze(dim=...)`, which leaves a dim not of size 1 alone."""
    if dim is None:
        return squeeze(x, axis)
    if axis is not None:
        raise OptionError(f"squeeze: pass axis= or dim=, not both (got {axis}, {dim})")
    shape = x.shape
    dims = canonicalize_axes(dim, len(shape), "squeeze")
    return squeeze(x, tuple(d for d in dims if type(shape[d]) is int and shape[d] == 1))


def _with_dim(fn):
    """A reduction method taking torch's `dim=` / `keepdim=` as well as NumPy's `axis=` /
    `keepdims=`."""
    def method(x, axis=None, *args, dim=None, keepdim=None, **kwargs):
        if dim is not None:
            if axis is not None:
                raise OptionError(f"{fn.__name__}: pass axis= or dim=, not both")
            axis = dim
        if keepdim is not None:
            kwargs["keepdims"] = keepdim
        return fn(x, axis, *args, **kwargs)

    method.__name__ = method.__qualname__ = fn.__name__
    method.__doc__ = fn.__doc__
    return method


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
    "reshape": _tracer_reshape, "astype": astype, "sum": _with_dim(sum),
    "mean": _with_dim(mean), "max": max, "min": min, "prod": _with_dim(prod),
    "argmax": _with_dim(argmax), "argmin": _with_dim(argmin), "any": _with_dim(any),
    "all": _with_dim(all), "transpose": _tracer_transpose, "squeeze": _tracer_squeeze,
    "ravel": ravel, "flatten": ravel, "clip": clip, "swapaxes": swapaxes, "take": take,
    "var": var, "std": std, "cumsum": _with_dim(cumsum), "repeat": repeat,
    "view": _tracer_view, "permute": _tracer_permute, "unsqueeze": _tracer_unsqueeze,
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
