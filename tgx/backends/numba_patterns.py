"""Pattern kernels tgx generates with numba: one pass for what a transformer layer does between
its matrix products, wherever a model contains it (`tgx.planning.kernel_patterns`).

- `rms_norm_1p`: `rms_norm(h, 1 + w)`, Gemma's RMSNorm (the weight is stored minus one);
- `residual_rms_norm`: `x + rms_norm(h, w)`, a residual add of a normalised branch;
- `residual_rms_norm_1p`: `x + rms_norm(h, 1 + w)`, the same in Gemma's form;
- `gelu_tanh_gate`: `gelu(a, approximate="tanh") * b`, the GeGLU gate of an MLP;
- `masked_softmax`, `scaled_masked_softmax`: `softmax(where(mask, s [* scale], -inf))`, the
  attention weights of a hand-written attention (a mask of the scores' shape or (L, S)).

Each reads its inputs once and writes its output once, where the op-by-op form makes a pass
(and, in a plan, an instruction) per op. The epsilon of the norms is a wildcard param, so one
kernel serves every model's value. The gate evaluates tanh by a rational approximation LLVM
vectorizes (the one Eigen and XLA use for float32; `math.tanh` is a scalar libm call, 4x
slower here); it is checked against float64 like every pattern kernel before it is offered.

All are serial (`own_pool` False): a plan with them keeps BLAS's threads for its GEMMs. They
are NumPy-backend kernels (NumPy arrays in and out, see `tgx.backends.numba_kernels`),
registered only when numba is installed, and compiled on first use with an on-disk cache.

>>> import numpy as np
>>> a = np.array([[0.0, 1.0]], np.float32)
>>> y = gelu_tanh_gate(a, np.ones_like(a)) if HAVE_NUMBA else np.float32([[0, 0.8412]])
>>> [round(float(v), 4) for v in y[0]]
[0.0, 0.8412]
"""

from __future__ import annotations

import functools

import numpy as np

from .. import nn as tnn
from .. import numpy as tnp
from ..shapes import Spec, float32
from ..tracing import make_graph
from ..graph.pattern import param_wildcards
from .numba_kernels import HAVE_NUMBA, _jit, rms_norm_last
from .registry import Kernel, add_kernel

NAME = "numpy"

# tanh(x) ≈ x·P(x²)/Q(x²) on |x| ≤ 7.9 (±1 beyond, to float32 precision): Eigen's and XLA's
# float32 approximation (odd numerator of degree 13, even denominator of degree 6).
_A13, _A11, _A9 = -2.76076847742355e-16, 2.00018790482477e-13, -8.60467152213735e-11
_A7, _A5, _A3 = 5.12229709037114e-08, 1.48572235717979e-05, 6.37261928875436e-04
_A1 = 4.89352455891786e-03
_B6, _B4, _B2 = 1.19825839466702e-06, 1.18534705686654e-04, 2.26843463243900e-03
_B0 = 4.89352518554385e-03
_CLAMP = 7.90531110763549805


def _gelu_tanh_gate(a, b, out):
    a1, b1, o1 = a.reshape(-1), b.reshape(-1), out.reshape(-1)
    c = np.float32(0.7978845608028654)   # sqrt(2/pi)
    k = np.float32(0.044715)
    lim = np.float32(_CLAMP)
    a13, a11, a9, a7 = np.float32(_A13), np.float32(_A11), np.float32(_A9), np.float32(_A7)
    a5, a3, a1c = np.float32(_A5), np.float32(_A3), np.float32(_A1)
    b6, b4, b2, b0 = np.float32(_B6), np.float32(_B4), np.float32(_B2), np.float32(_B0)
    for i in range(a1.size):
        x = a1[i]
        u = c * (x + k * x * x * x)
        u = min(max(u, -lim), lim)
        u2 = u * u
        p = u2 * a13 + a11
        p = u2 * p + a9
        p = u2 * p + a7
        p = u2 * p + a5
        p = u2 * p + a3
        p = u2 * p + a1c
        p = u * p
        q = u2 * b6 + b4
        q = u2 * q + b2
        q = u2 * q + b0
        o1[i] = np.float32(0.5) * x * (np.float32(1.0) + p / q) * b1[i]


def _masked_softmax(s, mask, scale, out):
    """softmax(where(mask, s * scale, -inf)) over the last axis; s (B, L, S), mask (1 or B,
    L, S). A row with every key masked is NaN, as the reference computes it (0 / 0)."""
    b, rows, n = s.shape
    for i in range(b):
        mi = i if mask.shape[0] > 1 else 0
        for r in range(rows):
            top = -np.inf
            for j in range(n):
                if mask[mi, r, j]:
                    v = s[i, r, j] * scale
                    out[i, r, j] = v
                    if v > top:
                        top = v
            if top == -np.inf:
                for j in range(n):
                    out[i, r, j] = np.nan
                continue
            den = np.float32(0.0)
            for j in range(n):
                if mask[mi, r, j]:
                    e = np.exp(out[i, r, j] - top)
                    out[i, r, j] = e
                    den += e
                else:
                    out[i, r, j] = 0.0
            inv = np.float32(1.0) / den
            for j in range(n):
                out[i, r, j] *= inv


gelu_tanh_gate_loop = _jit(_gelu_tanh_gate, parallel=False)
masked_softmax_loop = _jit(_masked_softmax, parallel=False)


def gelu_tanh_gate(a, b):
    """`gelu(a, approximate="tanh") * b`, float32, one pass."""
    a, b = np.ascontiguousarray(a), np.ascontiguousarray(b)
    out = np.empty_like(a)
    gelu_tanh_gate_loop(a, b, out)
    return out


def rms_norm_1p(h, w, *, eps):
    """`rms_norm(h, 1 + w)` over the last axis (Gemma's norm), float32."""
    return rms_norm_last(h, w, eps, 1.0)


def residual_rms_norm(x, h, w, *, eps):
    """`x + rms_norm(h, w)` over the last axis, float32."""
    return rms_norm_last(h, w, eps, 0.0, x)


def residual_rms_norm_1p(x, h, w, *, eps):
    """`x + rms_norm(h, 1 + w)` over the last axis (Gemma's residual), float32."""
    return rms_norm_last(h, w, eps, 1.0, x)


def _softmax_rows(s, mask, scale):
    rows, n = s.shape[-2:]
    s3 = np.ascontiguousarray(s.reshape(-1, rows, n))
    m3 = np.ascontiguousarray(mask.reshape(-1, rows, n))
    out = np.empty_like(s3)
    masked_softmax_loop(s3, m3, np.float32(scale), out)
    return out.reshape(s.shape)


def masked_softmax(s, mask):
    """`softmax(where(mask, s, -inf), axis=-1)`, float32; mask of s's shape or its last two
    axes."""
    return _softmax_rows(s, mask, 1.0)


def scaled_masked_softmax(s, mask, scale):
    """`softmax(where(mask, s * scale, -inf), axis=-1)` (attention's scores), float32."""
    return _softmax_rows(s, mask, scale)


def _softmax_checker(avals, params):
    s, mask = avals[:2]
    if s.dtype != float32 or mask.dtype.name != "bool" or any(
            a.dtype != float32 for a in avals[2:]):
        return f"float32 scores and a bool mask, got {s.str_short()}, {mask.str_short()}"
    if s.ndim < 2 or mask.shape not in (s.shape, s.shape[-2:]):
        return f"a mask of the scores' shape or their last two axes, got {mask.str_short()}"
    return None


def _float32(avals, params):
    if any(a.dtype != float32 for a in avals):
        return f"float32 only, got {', '.join(a.str_short() for a in avals)}"
    return None


def _same_shape(avals, params):
    return _float32(avals, params) or (
        None if avals[0].shape == avals[1].shape else "operands of one shape (no broadcasting)")


def _specs(rank: int):
    rows = ("B", "T")[2 - (rank - 1):] if rank > 1 else ()
    return Spec((*rows, "D")), Spec(("D",))


_EPS = 1e-6   # what the norm patterns are traced with; a wildcard (any epsilon matches)

#: name, pattern, which inputs are rows (the rest: the weight), kernel, checker
PATTERNS = (
    ("rms_norm_1p", lambda h, w: tnn.rms_norm(h, ("D",), 1.0 + w, _EPS), "rw",
     rms_norm_1p, _float32),
    ("residual_rms_norm", lambda x, h, w: x + tnn.rms_norm(h, ("D",), w, _EPS), "rrw",
     residual_rms_norm, _same_shape),
    ("residual_rms_norm_1p", lambda x, h, w: x + tnn.rms_norm(h, ("D",), 1.0 + w, _EPS),
     "rrw", residual_rms_norm_1p, _same_shape),
    ("gelu_tanh_gate", lambda a, b: tnn.gelu(a, approximate="tanh") * b, "rr",
     gelu_tanh_gate, _same_shape),
    ("masked_softmax", lambda s, m: tnn.softmax(tnp.where(m, s, -np.inf), axis=-1), "sm",
     masked_softmax, _softmax_checker),
    ("scaled_masked_softmax",
     lambda s, m, c: tnn.softmax(tnp.where(m, s * c, -np.inf), axis=-1), "smc",
     scaled_masked_softmax, _softmax_checker),
)


@functools.cache
def pattern_forms(name: str) -> tuple:
    """The pattern graphs of library pattern `name`, one per rank of its row inputs (a
    pattern input matches values of its rank), `eps` a wildcard. Shared by every backend's
    kernels of the pattern (`tgx.backends.torch_patterns`)."""
    fn, inputs = next((f, i) for n, f, i, _, _ in PATTERNS if n == name)
    forms = []
    if "s" in inputs:   # scores (…, L, S) of rank 2–4, a mask of that shape or (L, S)
        for rank in (2, 3, 4):
            lead = ("B", "H")[:rank - 2]
            for mask in {(*lead, "L", "S"), ("L", "S")}:
                specs = {"s": Spec((*lead, "L", "S")), "m": Spec(mask, "bool"),
                         "c": Spec(())}
                forms.append(make_graph(fn)(*[specs[c] for c in inputs]))
        return tuple(forms)
    for rank in (1, 2, 3):
        x, w = _specs(rank)
        form = make_graph(fn)(*[x if c == "r" else w for c in inputs])
        forms.append(param_wildcards(form, ["eps"]))
    return tuple(forms)


def _register() -> None:
    for name, _, _, kernel, checker in PATTERNS:
        add_kernel(Kernel(name, NAME, kernel, checker, "numba", pattern=pattern_forms(name)))


if HAVE_NUMBA:
    _register()
