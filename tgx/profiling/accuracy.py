"""Accuracy against a float64 NumPy golden result: absolute, relative and ULP error."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import ml_dtypes
import numpy as np

from tgx.backends.threads import one_blas_thread
from tgx.store import Status

#: |ref| below this is "near zero": excluded from the relative error, and the absolute
#: part of the pass criterion ``|actual - golden| <= atol + rtol * |golden|``.
DEFAULT_ATOL = {"float64": 1e-12, "float32": 1e-6, "float16": 1e-3, "bfloat16": 1e-2}
#: The relative error counts elements whose |ref| is at least this fraction of the output's
#: largest |ref| (and above atol): next to a zero crossing cancellation makes an element's
#: relative error meaningless (sin near π: a 1e-8 absolute error is 1e-3 relative), and such
#: elements are judged by the absolute error. Without the floor `tolerance=` would exclude
#: every accurate kernel whose output crosses zero.
REL_FLOOR = 1e-3
#: Relative tolerance of the pass criterion.
DEFAULT_RTOL = {"float64": 1e-9, "float32": 1e-4, "float16": 1e-2, "bfloat16": 5e-2}


@dataclass(frozen=True)
class Accuracy:
    """Result of `accuracy`. Errors are maxima over all outputs and finite elements;
    `ulp_err` is in units of the last place of the actual dtype."""

    status: Status
    max_abs_err: float | None
    max_rel_err: float | None
    ulp_err: float | None
    nonfinite_mismatch: bool = False
    message: str = ""

    @property
    def passed(self) -> bool:
        return self.status == Status.PASSED


def to_numpy(x: Any) -> Any:
    """A NumPy view/copy of a NumPy, torch or JAX array (bf16 stays bf16 via ml_dtypes);
    other values are returned as they are."""
    if isinstance(x, np.ndarray | np.generic):
        return x
    if hasattr(x, "detach") and hasattr(x, "cpu"):  # torch.Tensor, without importing torch
        t = x.detach().cpu()
        if str(t.dtype) == "torch.bfloat16":
            return t.float().numpy().astype(ml_dtypes.bfloat16)  # exact: bf16 ⊂ f32
        return t.numpy()
    if hasattr(x, "__array__"):
        return np.asarray(x)
    return x


def _leaves(x: Any) -> list:
    if isinstance(x, list | tuple):
        return [leaf for item in x for leaf in _leaves(item)]
    if isinstance(x, Mapping):
        return [leaf for k in sorted(x, key=str) for leaf in _leaves(x[k])]
    return [x]


def _map(f: Callable, x: Any) -> Any:
    if isinstance(x, list | tuple):
        return type(x)(_map(f, item) for item in x)
    if isinstance(x, Mapping):
        return {k: _map(f, v) for k, v in x.items()}
    return f(x)


def _is_float(dtype: np.dtype) -> bool:
    return np.issubdtype(dtype, np.floating) or dtype == ml_dtypes.bfloat16


def golden_inputs(args: Any) -> Any:
    """The inputs of the golden computation: every floating array (already rounded to its
    own dtype, f16/bf16/f32) converted exactly to float64; other values unchanged.

    >>> golden_inputs((np.float32([0.1]), 3))[0].dtype
    dtype('float64')
    """
    def cast(x: Any) -> Any:
        x = to_numpy(x)
        if isinstance(x, float):
            return np.float64(x)
        if isinstance(x, np.ndarray | np.generic) and _is_float(x.dtype):
            return np.asarray(x, dtype=np.float64)
        return x
    return _map(cast, args)


def golden(fn_numpy: Callable, args: Any) -> Any:
    """``fn_numpy(*golden_inputs(args))`` with floating results as float64 arrays (BLAS on
    one thread: `tgx.backends.threads.one_blas_thread`).

    >>> golden(np.exp, (np.float32([0.0]),))
    array([1.])
    """
    # OpenBLAS's worker threads spin for ~0.1 s after a multi-threaded call, and a torch
    # kernel timed meanwhile stalls on the cores they hold (a 5 µs torch.sum measured 8 ms
    # right after a 256×256 float64 matmul on a 2-core CPU)
    with one_blas_thread():
        out = fn_numpy(*golden_inputs(tuple(args)))
    return _map(lambda y: np.asarray(y, np.float64) if _is_float(np.asarray(y).dtype)
                else np.asarray(y), out)


def ulp_spacing(x: np.ndarray, dtype: Any) -> np.ndarray:
    """Spacing of `dtype` (float64 array) at the magnitudes `x`: ``2**(e - nmant)`` with `e`
    the binary exponent of ``|x|`` clipped at the smallest normal exponent; works for bf16
    (7-bit mantissa, via ``ml_dtypes.finfo``) as for IEEE types.

    >>> float(ulp_spacing(np.array([1.0]), np.float32)[0]) == float(np.spacing(np.float32(1)))
    True
    """
    fi = ml_dtypes.finfo(dtype)
    mag = np.abs(np.asarray(x, np.float64))
    _, exp = np.frexp(mag)  # |x| = m * 2**exp, m in [0.5, 1)
    e = np.where(mag == 0, fi.minexp, np.maximum(exp.astype(np.int64) - 1, fi.minexp))
    return np.ldexp(1.0, (e - fi.nmant).astype(np.int32))


def _dtype_name(dtype: Any) -> str:
    return "bfloat16" if np.dtype(dtype) == ml_dtypes.bfloat16 else np.dtype(dtype).name


def _max_ulps(diff: np.ndarray, a64: np.ndarray, g64: np.ndarray, dtype: Any) -> float:
    """max(diff / ULP) with the ULP of `dtype` at the smaller magnitude of the actual and the
    golden result rounded to `dtype` (one step down across a power of two still counts as
    1); the exact spacing is taken only where it can be the maximum: ``u = max(x, tiny) *
    eps/2`` bounds it as ``ulp <= u < 2 ulp``, so only elements within 2x of the largest
    ``diff / u`` can hold the largest ``diff / ulp``."""
    fi = ml_dtypes.finfo(dtype)
    ref = np.abs(g64.astype(dtype).astype(np.float64))
    np.minimum(ref, np.abs(a64), out=ref)
    approx = np.maximum(ref, 2.0 ** fi.minexp)
    approx *= 2.0 ** -fi.nmant
    np.divide(diff, approx, out=approx)
    top = float(approx.max())
    if top == 0.0:
        return 0.0
    near = approx * 2 >= top
    return float((diff[near] / ulp_spacing(ref[near], dtype)).max())


#: elements compared at a time: the float64 temporaries of a chunk stay in the cache (a
#: Gemma head's 4M logits compared whole: 0.13 s; in chunks: see `_compare`)
CHUNK = 1 << 15


def _all_finite(a: np.ndarray) -> bool:
    try:
        return bool(np.isfinite(a).all())
    except TypeError:  # a dtype without the ufunc
        return bool(np.isfinite(a.astype(np.float64)).all())


def _compare(a: np.ndarray, g64: np.ndarray, dtype: Any, at: float, rt: float) -> tuple:
    """(max |a - g|, max relative error where |g| is above the floor, max ULPs, the number
    of elements outside ``at + rt * |g|``, (actual, golden) of the worst of them) for 1-D
    finite arrays, `CHUNK` elements at a time."""
    floor = max(at, REL_FLOOR * float(np.abs(g64).max()))
    m_abs = m_rel = m_ulp = 0.0
    over, worst, worst_by = 0, None, -np.inf
    for s in range(0, a.size, CHUNK):
        a64, g = a[s:s + CHUNK].astype(np.float64), g64[s:s + CHUNK]
        diff = a64 - g
        np.abs(diff, out=diff)
        absg = np.abs(g)
        m_abs = max(m_abs, float(diff.max()))
        big = absg > floor
        if big.any():
            m_rel = max(m_rel, float((diff[big] / absg[big]).max()))
        m_ulp = max(m_ulp, _max_ulps(diff, a64, g, dtype))
        limit = absg
        limit *= rt
        limit += at
        outside = diff > limit
        if outside.any():
            over += int(outside.sum())
            excess = diff - limit
            j = int(np.argmax(excess))
            if excess[j] > worst_by:  # the first of equals, as one argmax over all would
                worst_by, worst = excess[j], (a64[j], g[j])
    return m_abs, m_rel, m_ulp, over, worst


def accuracy(actual: Any, golden: Any, dtype: Any = None, *, atol: float | None = None,
             rtol: float | None = None) -> Accuracy:
    """Compare `actual` (an array or a tuple/list/dict of arrays, NumPy, torch or JAX) with
    the float64 `golden` result of the same structure.

    PASSED when shapes match, non-finite values (NaN, ±Inf) sit in the same places with the
    same values, and ``|actual - golden| <= atol + rtol * |golden|`` elsewhere; tolerances
    default per dtype (`DEFAULT_ATOL`, `DEFAULT_RTOL`); integer and bool outputs must match
    exactly. `dtype` (default: the actual dtype) picks the tolerances and the ULP unit.

    >>> a = accuracy(np.float32([1.0, 2.0]), np.array([1.0, 2.0]))
    >>> a.status.value, a.ulp_err
    ('PASSED', 0.0)
    """
    acts, golds = [to_numpy(a) for a in _leaves(actual)], _leaves(golden)
    if len(acts) != len(golds):
        return Accuracy(Status.INCORRECT_SHAPE, None, None, None,
                        message=f"expected {len(golds)} outputs, got {len(acts)}")
    max_abs = max_rel = max_ulp = 0.0
    failures = []
    for i, (a, g) in enumerate(zip(acts, golds)):
        a, g = np.asarray(a), np.asarray(g)
        if a.shape != g.shape:
            return Accuracy(Status.INCORRECT_SHAPE, None, None, None,
                            message=f"output {i}: expected shape {g.shape}, got {a.shape}")
        dt = np.dtype(dtype) if dtype is not None else a.dtype
        if not _is_float(dt):
            diff = np.abs(a.astype(np.float64) - g.astype(np.float64))
            err = float(diff.max()) if diff.size else 0.0
            max_abs, max_ulp = max(max_abs, err), max(max_ulp, err)
            if err:
                failures.append(f"output {i} ({dt}): {int(np.count_nonzero(diff))} elements "
                                f"differ, max |diff| {err:g}")
            continue
        name = _dtype_name(dt)
        at = DEFAULT_ATOL.get(name, 1e-6) if atol is None else atol
        rt = DEFAULT_RTOL.get(name, 1e-4) if rtol is None else rtol
        g64 = np.asarray(g, np.float64)
        if not (np.isfinite(g64).all() and _all_finite(a)):
            a64 = a.astype(np.float64)
            fa, fg = np.isfinite(a64), np.isfinite(g64)
            bad = (fa != fg) | (~fa & ~fg & ~((a64 == g64) | (np.isnan(a64) & np.isnan(g64))))
            if bad.any():
                where = tuple(int(j) for j in np.argwhere(bad)[0])
                return Accuracy(Status.INCORRECT_NUMERICAL, None, None, None, True,
                                f"output {i}: {int(bad.sum())} non-finite mismatches, first "
                                f"at {where}: got {a64[where]}, expected {g64[where]}")
            both = fa & fg
            a, g64 = a64[both], g64[both]
        else:  # the usual case, without masked copies
            a, g64 = a.ravel(), g64.ravel()
        if a.size == 0:
            continue
        m_abs, m_rel, m_ulp, over, worst = _compare(a, g64, dt, at, rt)
        max_abs, max_rel, max_ulp = max(max_abs, m_abs), max(max_rel, m_rel), max(max_ulp, m_ulp)
        if over:
            failures.append(f"output {i} ({name}): {over} elements outside atol={at:g} "
                            f"rtol={rt:g}, worst got {worst[0]!r} expected {worst[1]!r}")
    status = Status.INCORRECT_NUMERICAL if failures else Status.PASSED
    return Accuracy(status, max_abs, max_rel, max_ulp, False, "; ".join(failures))
