"""The NumPy backend: the host format, every primitive's reference implementation, and `out=`
kernels.

Graph inputs arrive and outputs leave as NumPy arrays, on the host. Every primitive (atomic or
composite, including ones declared later) gets a kernel wrapping its NumPy reference.
Elementwise ufuncs, matmul and sums also get an `out` variant that writes into a preallocated
workspace view (`writes_out`), in place when the first input dies there.
"""

from __future__ import annotations

import functools

import numpy as np

from .. import primitives  # noqa: F401 - registers the atomic primitives
from ..core import PRIMITIVES
from ..primitives import transfer  # noqa: F401 - registers copy_to
from ..primitives.movement import dynamic_window
from ..shapes import bfloat16, float16
from .base import Backend, to_host
from .numpy_library import SHORT_EXTREMA_AXIS, last_axis_reduce, short_last_axis
from .registry import (
    Kernel,
    add_kernel,
    as_method,
    matmul_layout_reason,
    matmul_permutations,
    on_missing,
    register_kernel,
    source_hash,
)

NAME = "numpy"


def _reference_kernel(name: str):
    impl = PRIMITIVES[name].impl

    def kernel(*xs, **params):
        out = impl(*xs, **params)
        if type(out) is np.ndarray:
            return out
        if isinstance(out, (list, tuple)):
            return [np.asarray(o) for o in out]
        return np.asarray(out)

    kernel.__name__ = f"numpy_{name}"
    kernel.__qualname__ = f"numpy_{name}"
    return kernel


def _register_reference(name: str) -> None:
    p = PRIMITIVES.get(name)
    if p is None or p.impl is None or name in _SPECIAL:
        return
    k = _reference_kernel(name)
    # NumPy references may return views of their inputs (reshape, transpose, a composite
    # returning an input …): only the primitives known to build a fresh array are not marked.
    fresh = p.atomic and (p.elementwise or p.family == "reduction") and name not in _MAY_ALIAS
    add_kernel(Kernel(name, NAME, k, None, "default", returns_view=not fresh,
                      source_hash=_impl_hash(p), dtype_exact=p.atomic,
                      specialize=_AS_METHOD.get(name)))


#: views whose reference is one ndarray method: bound, the run function calls the method
#: itself (`MethodCall`) instead of the reference through `np.reshape`'s Python wrapper
_AS_METHOD = {"reshape": as_method("reshape", "new_sizes"),
              "transpose": as_method("transpose", "permutation")}


def _impl_hash(p) -> str:
    return source_hash(p.impl)


# -- kernels that differ from the reference (dtype-exact reductions, transfers) --------------
_SPECIAL = {"reduce_sum", "reduce_prod", "reduce_max", "reduce_min", "copy_to", "select"}
_MAY_ALIAS = {"convert_element_type", "copy"}


def _lowp(dtype) -> bool:
    return dtype == float16 or dtype == bfloat16


@register_kernel("reduce_sum", NAME)
def numpy_reduce_sum(x, *, axes):
    if short_last_axis(x, axes):
        return last_axis_reduce(np.add, x)
    if _lowp(x.dtype):
        return np.asarray(np.sum(x.astype(np.float32), axis=axes)).astype(x.dtype)
    return np.asarray(np.sum(x, axis=axes, dtype=x.dtype))


#: the integer views of the float dtypes, for `numpy_select`'s bit masks
_BITS = {np.dtype(np.float32): np.int32, np.dtype(np.float64): np.int64}
#: elements from which a select of two array branches goes by bit masks (below it
#: `np.where`'s one pass is the faster: 1.0 against 3.2 us at 512 elements)
SELECT_BITS_MIN = 4096


def _zero_bits(x, ints) -> bool:
    return x.ndim == 0 and int(x.view(ints)) == 0   # +0.0 (not -0.0)


@register_kernel("select", NAME)
def numpy_select(pred, t, f, out=None):
    """`where(pred, t, f)`; for float branches by bit masks: `pred` as -1 / 0 integers
    and-ed with each branch's bits, exact for every value (inf, NaN, -0.0). `np.where`
    branches per element: 48 us for a (256, 64) float32 ReLU gradient with a random mask,
    where the mask takes 4.7 (a branch of +0.0, the ReLU's and a masked loss's, needs one
    and) or 12 (two array branches). `out`: the buffer to write."""
    ints = _BITS.get(t.dtype) if type(t) is np.ndarray and type(f) is np.ndarray else None
    if ints is not None and type(pred) is np.ndarray and pred.dtype == np.bool_ and \
            f.dtype == t.dtype:
        zero_t, zero_f = _zero_bits(t, ints), _zero_bits(f, ints)
        if zero_t or zero_f or pred.size >= SELECT_BITS_MIN:
            shape = pred.shape
            if t.shape not in (shape, ()) or f.shape not in (shape, ()):
                shape = np.broadcast_shapes(shape, t.shape, f.shape)
            res = np.empty(shape, t.dtype) if out is None else out
            bits = res.view(ints)
            p8 = pred.view(np.int8)
            if zero_f:    # t where pred: its bits and -1, else 0
                np.bitwise_and(t.view(ints), np.negative(p8), out=bits)
            elif zero_t:  # f where not pred
                np.bitwise_and(f.view(ints), np.subtract(p8, np.int8(1)), out=bits)
            else:
                keep = np.negative(p8)
                np.bitwise_and(t.view(ints), keep, out=bits)
                bits |= np.bitwise_and(f.view(ints), np.invert(keep))
            return res
    r = np.where(pred, t, f)
    if out is None:
        return r
    np.copyto(out, r)
    return out


@register_kernel("select", NAME, variant="out", writes_out=True)
def numpy_select_out(pred, t, f, *, out):
    return numpy_select(pred, t, f, out)


def _extremum_kernel(name: str, ufunc):
    reference = PRIMITIVES[name].impl

    def kernel(x, *, axes):
        if short_last_axis(x, axes, SHORT_EXTREMA_AXIS):
            return last_axis_reduce(ufunc, x)   # the same values, NaN included
        return reference(x, axes=axes)

    kernel.__name__ = kernel.__qualname__ = f"numpy_{name}"
    return kernel


for _name, _ufunc in (("reduce_max", np.maximum), ("reduce_min", np.minimum)):
    add_kernel(Kernel(_name, NAME, _extremum_kernel(_name, _ufunc), None, "default"))


@register_kernel("reduce_prod", NAME)
def numpy_reduce_prod(x, *, axes):
    if _lowp(x.dtype):
        return np.asarray(np.prod(x.astype(np.float32), axis=axes)).astype(x.dtype)
    return np.asarray(np.prod(x, axis=axes, dtype=x.dtype))


@register_kernel("copy_to", NAME, returns_view=True)
def numpy_copy_to(x, *, backend="numpy", device="cpu"):
    return BACKEND.convert(x)


# -- out= variants ----------------------------------------------------------------------------
_UFUNCS = {
    "neg": np.negative, "exp": np.exp, "log": np.log, "sin": np.sin, "cos": np.cos,
    "sqrt": np.sqrt, "atan": np.arctan, "floor": np.floor, "add": np.add,
    "sub": np.subtract, "mul": np.multiply, "max": np.maximum, "min": np.minimum,
    "pow": np.power, "and": np.bitwise_and, "or": np.bitwise_or, "xor": np.bitwise_xor,
    "eq": np.equal, "ne": np.not_equal, "lt": np.less, "le": np.less_equal,
    "gt": np.greater, "ge": np.greater_equal,
}


def _no_lowp(avals, params):
    if any(_lowp(a.dtype) for a in avals):
        return "the out= kernel computes in the input dtype; half precision goes through float32"
    return None


def _float_div_only(avals, params):
    if avals[0].dtype.kind in "iu":
        return "integer div has C semantics; the reference kernel implements them"
    return _no_lowp(avals, params)


def _ufunc_out_kernel(name: str, ufunc):
    def kernel(*xs, out):
        ufunc(*xs, out=out)
        return out

    kernel.__name__ = kernel.__qualname__ = f"numpy_{name}_out"
    return kernel


def _ufunc_out_specialize(ufunc, kernel):
    """Bound to a workspace view, the kernel is the ufunc itself with `out=` (which returns
    `out`): the run function then calls `np.add(x, y, out=view)` directly, without the
    wrapper's extra Python call (measured on a 200-op chain of (4, 16) arrays: 0.26 ->
    0.15 ms)."""
    def specialize(params: dict, out):
        if out is None:
            return functools.partial(kernel, **params) if params else kernel
        return functools.partial(ufunc, out=out, **params)
    return specialize


for _name, _uf in _UFUNCS.items():
    _k = _ufunc_out_kernel(_name, _uf)
    add_kernel(Kernel(_name, NAME, _k, _no_lowp, "out", writes_out=True, inplace_ok=True,
                      specialize=_ufunc_out_specialize(_uf, _k)))


@register_kernel("div", NAME, checker=_float_div_only, variant="out", writes_out=True,
                 inplace_ok=True)
def numpy_div_out(x, y, *, out):
    np.divide(x, y, out=out)
    return out


def _matmul_ok(avals, params):
    return _no_lowp(avals, params) or matmul_layout_reason(avals, params)


def _matmul_out_specialize(params: dict, out):
    """`out=` matmul with the operand permutations worked out once, at binding."""
    px, py = matmul_permutations(params["dimension_numbers"])
    if px is None and py is None:
        return functools.partial(np.matmul, out=out)

    def run(x, y):
        return np.matmul(x if px is None else x.transpose(px),
                         y if py is None else y.transpose(py), out=out)
    return run


@register_kernel("dot_general", NAME, checker=_matmul_ok, variant="out", writes_out=True,
                 specialize=_matmul_out_specialize)
def numpy_matmul_out(x, y, *, dimension_numbers, out):
    px, py = matmul_permutations(dimension_numbers)
    np.matmul(x if px is None else x.transpose(px), y if py is None else y.transpose(py),
              out=out)
    return out


def _sum_ok(avals, params):
    return _no_lowp(avals, params)


@register_kernel("reduce_sum", NAME, checker=_sum_ok, variant="out", writes_out=True)
def numpy_reduce_sum_out(x, *, axes, out):
    if short_last_axis(x, axes):
        return last_axis_reduce(np.add, x, out)
    np.sum(x, axis=axes, dtype=x.dtype, out=out)
    return out


# -- in-place updates of state buffers ---------------------------------------------------------
# Not kernels (selection never picks them: they mutate their first input); the lowering uses
# them for a `dynamic_update_slice` whose operand is a state buffer (`tgx.compile(state=...)`).
def numpy_dynamic_update_slice_inplace(x, update, *idx):
    x[dynamic_window(x.shape, update.shape, idx)] = update
    return x


#: primitives NumPy's library kernels compute with BLAS (OpenBLAS's thread pool)
BLAS_PRODUCTS = frozenset({"dot_general", "linear", "matmul", "scaled_dot_product_attention"})


class NumpyBackend(Backend):
    """NumPy: the host format; zero-copy views into tgx's workspace."""

    name, library = NAME, "numpy"
    host = host_only = True
    writes_workspace = True
    # Rough CPU figures: a 1-element add through NumPy ≈ 1 µs, ~8 GB/s per core, peak from a
    # 512³ matmul (see docs/selection.md; `calibrate()` measures the overhead here).
    cost = (1.0e-6, 8e9, 3e10)
    # Measured on a 64x256 float32 array (2-core CPU): tensor.numpy() and np.asarray of a CPU
    # jax array share memory.
    transfer_in = {"torch": (1.8e-6, None), "jax": (1.0e-6, None)}
    # torch's OpenMP workers keep spinning after an op: a multi-threaded NumPy BLAS call
    # right after one ran ~8 ms slower (a 256x256 matmul after a torch add, minus both alone).
    # XLA's workers spin after a jax call as torch's do: a NumPy 256x256 matmul right after
    # a jax add ran 42-52 us longer than alone (`calibrate`, 2-core AMX Xeon, 2026-11-27)
    switch_in = {"torch": 7.8e-3, "jax": 4.5e-5}
    # ... where OpenBLAS's pool stays asleep (an elementwise ufunc, a numba loop): 1-2 µs
    # after a 64x128x256 torch GEMM alone, 16-33 µs after a 128x640x2048 one; in a plan
    # ~10 µs per switch, both ways (the demo's torch GEMMs between numba loops ran 2.5x
    # their time alone: 773 µs against 512 predicted with 2 µs; 2026-11-27, AMX Xeon).
    # Priced at 7.8 ms, torch's GEMMs and tgx's numba kernels were never in one plan
    # ... and slow the single-threaded work after them for a while: after a jax region, a
    # (256, 64) column sum took 20 us (5 alone), and an LM step's 28 numba Adam updates 415
    # us (~115 alone). Priced at 15 us a switch, that step ran its Adam on NumPy after its
    # jax region, 1.16x the plan with its Adam in the region (2-core AMX Xeon, 2026-11-27)
    switch_in_light = {"torch": 1.0e-5, "jax": 1.0e-4}
    inplace = {"dynamic_update_slice": numpy_dynamic_update_slice_inplace}

    def wakes_pool(self, eqn, kernel=None) -> bool:
        """A BLAS product run by NumPy (OpenBLAS's threads), not by a kernel on a pool of
        its own (numba's).

        >>> import tgx
        >>> g = tgx.make_graph(lambda x: (x @ x) + 1.0)(tgx.Spec((4, 4)))
        >>> [NumpyBackend().wakes_pool(e) for e in g.eqns]
        [True, False]
        """
        return eqn.primitive.name in BLAS_PRODUCTS and not (kernel is not None
                                                              and kernel.own_pool)

    def is_array(self, x) -> bool:
        return isinstance(x, np.ndarray)

    def to_host(self, x):
        return x

    def host_view(self, x):
        return x if x.flags.writeable and x.flags.c_contiguous else None

    def from_host(self, x, device="cpu"):
        return x

    def convert(self, x, device="cpu"):
        return to_host(x)

    def zero_copy_from_host(self, device: str) -> bool:
        return True

    def empty(self, shape, dtype, like=None):
        return np.empty(shape, dtype)


BACKEND = NumpyBackend()


for _name in list(PRIMITIVES):
    _register_reference(_name)
on_missing(NAME, _register_reference)

from . import numpy_library  # noqa: E402,F401 - kernels in the input dtype for hot composites
from . import numba_kernels  # noqa: E402,F401 - generated GEMVs (when numba is installed)
from . import bf16_gemm  # noqa: E402,F401 - oneDNN bfloat16 GEMMs (torch, AVX512-BF16 CPUs)
from . import torch_attention  # noqa: E402,F401 - attention by torch's fused CPU kernel
