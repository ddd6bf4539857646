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

from __future__ import annotations

import numpy as np

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
    reshape,
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
from .creation import arange, array, eye, tril, triu
from .elementwise import around, floor_divide, positive, power, round
from .linalg import dot, einsum, outer, vdot
from .movement import array_split, chunk, hstack, pad, repeat, roll, row_stack, split, tile, vstack
from .reductions import all, amax, amin, any, prod

pi, e, inf, nan = np.pi, np.e, np.inf, np.nan
ndarray = np.ndarray

__all__ = [
    "abs", "absolute", "acos", "acosh", "add", "all", "amax", "amin", "any", "arange", "arccos",
    "arccosh", "arcsin", "arcsinh", "arctan", "arctan2", "arctanh", "argmax", "argmin",
    "around", "array", "array_split", "asarray", "asin", "asinh", "astype", "atan2", "atanh",
    "bfloat16", "bitwise_and", "bitwise_not", "bitwise_or", "bitwise_xor", "bool_",
    "broadcast_arrays", "broadcast_to", "ceil", "chunk", "clip", "concatenate", "cos", "cosh",
    "cumsum", "divide", "dot", "e", "einsum", "equal", "erf", "erfinv", "exp", "expand_dims",
    "expm1", "eye", "flip", "float16", "float32", "float64", "floor", "floor_divide", "full",
    "full_like", "greater", "greater_equal", "hstack", "index_axis", "inf", "int32", "int64",
    "invert", "iota", "left_shift", "less", "less_equal", "log", "log1p", "logaddexp",
    "logical_and", "logical_not", "logical_or", "logical_xor", "matmul", "max", "maximum",
    "mean", "min", "minimum", "mod", "moveaxis", "multiply", "nan", "ndarray", "ndim",
    "negative", "not_equal", "ones", "ones_like", "outer", "pad", "pi", "positive", "power",
    "prod", "ravel", "reciprocal", "remainder", "repeat", "reshape", "right_shift_logical",
    "roll", "round", "row_stack", "rsqrt", "shape", "sign", "sin", "sinh", "slice_axis",
    "split", "sqrt", "square", "squeeze", "stack", "std", "subtract", "sum", "swapaxes", "take",
    "tan", "tanh", "tile", "transpose", "tri", "tril", "triu", "true_divide", "uint32", "var",
    "vdot", "vstack", "where", "zeros", "zeros_like",
]
