"""`tgx.numpy` (imported as `tnp`): array ops with NumPy / jax.numpy names and signatures.

Thin wrappers: each promotes dtypes jax.numpy-style (Python scalars are weakly typed), inserts
the casts and reshapes the primitives need, and binds. Outside a trace they run eagerly on NumPy.
The binders of atomic primitives live one layer down in `tgx.primitives.ops` (decompositions
use them too) and are re-exported here; the modules of this package add the rest by job, and
`tracer` installs the operators and methods of traced arrays.

>>> import numpy as np, tgx.numpy as tnp
>>> tnp.add(np.float32(1), 2).dtype
dtype('float32')
"""

import numpy as _np

from ..primitives.ops import (
    add,
    arctan,
    argmax,
    asarray,
    astype,
    bitwise_and,
    bitwise_not,
    bitwise_or,
    bitwise_xor,
    broadcast_arrays,
    broadcast_to,
    concatenate,
    cos,
    divide,
    equal,
    erf,
    exp,
    expand_dims,
    flip,
    floor,
    full,
    full_like,
    greater,
    greater_equal,
    index_axis,
    invert,
    iota,
    left_shift,
    less,
    less_equal,
    log,
    logical_and,
    logical_not,
    logical_or,
    logical_xor,
    matmul,
    max,
    maximum,
    min,
    minimum,
    moveaxis,
    multiply,
    ndim,
    negative,
    not_equal,
    ones,
    ones_like,
    ravel,
    right_shift_logical,
    shape,
    sin,
    slice_axis,
    sqrt,
    squeeze,
    stack,
    subtract,
    sum,
    swapaxes,
    take,
    transpose,
    tri,
    true_divide,
    where,
    zeros,
    zeros_like,
)
from ..shapes import bfloat16, bool_, float16, float32, float64, int32, int64, uint32
from . import tracer  # noqa: F401  (installs the operators and methods of traced arrays)
from .composite import (
    abs,
    absolute,
    acos,
    acosh,
    arccos,
    arccosh,
    arcsin,
    arcsinh,
    arctan2,
    arctanh,
    argmin,
    asin,
    asinh,
    atan2,
    atanh,
    ceil,
    clip,
    cosh,
    cumsum,
    erfinv,
    expm1,
    log1p,
    logaddexp,
    mean,
    mod,
    reciprocal,
    remainder,
    rsqrt,
    sign,
    sinh,
    square,
    std,
    tan,
    tanh,
    var,
)
from .creation import arange, array, diag, eye, linspace, tril, triu
from .elementwise import (
    around,
    exp2,
    floor_divide,
    isfinite,
    isinf,
    isnan,
    log2,
    log10,
    positive,
    power,
    round,
)
from .indexing import take_along_axis
from .linalg import dot, einsum, outer, tensordot, vdot
from .movement import (
    array_split,
    chunk,
    hstack,
    pad,
    repeat,
    reshape,
    roll,
    row_stack,
    split,
    tile,
    vstack,
)
from .reductions import all, amax, amin, any, cumprod, prod
from .sorting import argsort, sort

pi, e, inf, nan = _np.pi, _np.e, _np.inf, _np.nan
newaxis = None
ndarray = _np.ndarray

__all__ = [
    "abs", "absolute", "acos", "acosh", "add", "all", "amax", "amin", "any", "arange", "arccos",
    "arccosh", "arcsin", "arcsinh", "arctan", "arctan2", "arctanh", "argmax", "argmin", "argsort",
    "around", "array", "array_split", "asarray", "asin", "asinh", "astype", "atan2", "atanh",
    "bfloat16", "bitwise_and", "bitwise_not", "bitwise_or", "bitwise_xor", "bool_",
    "broadcast_arrays", "broadcast_to", "ceil", "chunk", "clip", "concatenate", "cos", "cosh",
    "cumprod", "cumsum", "diag", "divide", "dot", "e", "einsum", "equal", "erf", "erfinv", "exp",
    "exp2", "expand_dims", "expm1", "eye", "flip", "float16", "float32", "float64", "floor",
    "floor_divide", "full", "full_like", "greater", "greater_equal", "hstack", "index_axis", "inf",
    "int32", "int64", "invert", "iota", "isfinite", "isinf", "isnan", "left_shift", "less",
    "less_equal", "linspace", "log", "log10", "log1p", "log2", "logaddexp", "logical_and",
    "logical_not", "logical_or", "logical_xor", "matmul", "max", "maximum", "mean", "min",
    "minimum", "mod", "moveaxis", "multiply", "nan", "ndarray", "ndim", "negative", "newaxis",
    "not_equal", "ones", "ones_like", "outer", "pad", "pi", "positive", "power", "prod", "ravel",
    "reciprocal", "remainder", "repeat", "reshape", "right_shift_logical", "roll", "round",
    "row_stack", "rsqrt", "shape", "sign", "sin", "sinh", "slice_axis", "sort", "split", "sqrt",
    "square", "squeeze", "stack", "std", "subtract", "sum", "swapaxes", "take", "take_along_axis",
    "tan", "tanh", "tensordot", "tile", "transpose", "tri", "tril", "triu", "true_divide",
    "uint32", "var", "vdot", "vstack", "where", "zeros", "zeros_like",
]


def __dir__():
    # the public names only: not the submodules (tgx.numpy.composite, ...) or helpers
    return sorted(__all__)
