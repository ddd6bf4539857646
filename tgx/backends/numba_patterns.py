"""Pattern kernels tgx generates with numba: one pass for what a transformer layer does between
its matrix products, wherever a model contains it (`tgx.planning.kernel_patterns`).

- `rms_norm_1p`: `rms_norm(h, 1 + w)`, Gemma's RMSNorm (the weight is stored minus one);
- `residual_rms_norm`: `x + rms_norm(h, w)`, a residual add of a normalised branch;
- `residual_rms_norm_1p`: `x + rms_norm(h, 1 + w)`, the same in Gemma's form;
- `gelu_tanh_gate`: `gelu(a, approximate="tanh") * b`, the GeGLU gate of an MLP;
- `silu_gate`: `silu(a) * b`, the SwiGLU gate;
- `masked_softmax`, `scaled_masked_softmax`: `softmax(where(mask, s [* scale], -inf))`, the
  attention weights of a hand-written attention (a mask of the scores' shape or (L, S));
- `rotary_emb`: `x * cos + rotate_half(x) * sin`, RoPE written out (a hand-written RoPE, and
  the decomposition of the `apply_rotary_emb` primitive, which has the same loop as its own
  numba kernel);
- `lstm_gates`, `gru_gates`: an LSTM / GRU cell after its two GEMMs (the bias adds, the gate
  nonlinearities, the state update; the LSTM's is a two-output pattern, (h', c')), as
  `lstm_cell` / `gru_cell` decompose;
- `adam_update`, `adamw_update`: one parameter's step of `tgx.optim.adam` / `adamw` (the
  new parameter and both moments, written into the plan's state buffers), in the arrays'
  dtype and NumPy's order of operations, without fastmath: bit for bit NumPy's result.

Each reads its inputs once and writes its output once, where the op-by-op form makes a pass
(and, in a plan, an instruction) per op. The epsilon of the norms is a wildcard param, so one
kernel serves every model's value. tanh is a rational approximation LLVM vectorizes (the one
Eigen and XLA use for float32; `math.tanh` is a scalar libm call, 4x slower here), and the
sigmoid is (1 + tanh(x / 2)) / 2 (numba's `exp` stays a scalar call too); the softmax's exp
is 2^k·p(r) with 2^k made from its bits, and its row maximum an integer maximum of the
scores' bits. Each kernel is checked against float64 like every pattern kernel before it is
offered.

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
from ..primitives.rnn import _chunks
from .numba_kernels import HAVE_NUMBA, _jit, rms_norm_last, rope_f32
from .numba_kernels import _rope_checker as _numba_rope_checker
from .numpy_library import _sdpa_ok, sdpa_with
from .numpy_library import masked_softmax as numpy_masked_softmax
from .registry import Kernel, LazyForms, add_kernel

NAME = "numpy"

# tanh(x) ≈ x·P(x²)/Q(x²) on |x| ≤ 7.9 (±1 beyond, to float32 precision): Eigen's and XLA's
# float32 approximation (odd numerator of degree 13, even denominator of degree 6).
_A13, _A11, _A9 = -2.76076847742355e-16, 2.00018790482477e-13, -8.60467152213735e-11
_A7, _A5, _A3 = 5.12229709037114e-08, 1.48572235717979e-05, 6.37261928875436e-04
_A1 = 4.89352455891786e-03
_B6, _B4, _B2 = 1.19825839466702e-06, 1.18534705686654e-04, 2.26843463243900e-03
_B0 = 4.89352518554385e-03
_CLAMP = 7.90531110763549805


def _tanh32_py(u):
    """tanh(u), float32, as x·P(x²)/Q(x²) (see `_A13`): branch-free, so loops vectorize."""
    lim = np.float32(_CLAMP)
    u = min(max(u, -lim), lim)
    u2 = u * u
    p = u2 * np.float32(_A13) + np.float32(_A11)
    p = u2 * p + np.float32(_A9)
    p = u2 * p + np.float32(_A7)
    p = u2 * p + np.float32(_A5)
    p = u2 * p + np.float32(_A3)
    p = u2 * p + np.float32(_A1)
    q = u2 * np.float32(_B6) + np.float32(_B4)
    q = u2 * q + np.float32(_B2)
    q = u2 * q + np.float32(_B0)
    return u * p / q


def _sigmoid32_py(x):
    """1 / (1 + exp(-x)) as (1 + tanh(x / 2)) / 2: numba's exp is a scalar libm call here
    (4 ns an element, 10x NumPy's), the rational tanh vectorizes. Absolute error ~1e-7."""
    return np.float32(0.5) + np.float32(0.5) * tanh32(np.float32(0.5) * x)


# Replaced by their numba compilations (inlined into the loops) before a loop first compiles.
tanh32, sigmoid32 = _tanh32_py, _sigmoid32_py


def _jit_loop(fn):
    """`fn` compiled serially by numba on its first call, with `tanh32` and `sigmoid32`
    compiled first so that it can call them."""
    loop = _jit(fn, parallel=False)

    def run(*args):
        global tanh32, sigmoid32
        if tanh32 is _tanh32_py:
            import numba

            inline = functools.partial(numba.njit, inline="always", fastmath=True,
                                       error_model="numpy")
            tanh32 = inline()(_tanh32_py)
            sigmoid32 = inline()(_sigmoid32_py)
        return loop(*args)

    run.__name__ = run.__qualname__ = fn.__name__
    return run


def _gelu_tanh_gate(a, b, out):
    a1, b1, o1 = a.reshape(-1), b.reshape(-1), out.reshape(-1)
    c = np.float32(0.7978845608028654)   # sqrt(2/pi)
    k = np.float32(0.044715)
    for i in range(a1.size):
        x = a1[i]
        o1[i] = np.float32(0.5) * x * (np.float32(1.0) + tanh32(c * (x + k * x * x * x))) * b1[i]


def _silu_gate(a, b, out):
    a1, b1, o1 = a.reshape(-1), b.reshape(-1), out.reshape(-1)
    for i in range(a1.size):
        x = a1[i]
        o1[i] = x * sigmoid32(x) * b1[i]


def _lstm_gates(xw, b_ih, hw, b_hh, c, h_out, c_out):
    """The LSTM cell after its two GEMMs: z = (xw + b_ih) + (hw + b_hh), gates i, f, g, o
    the quarters of z's last axis; c' = σ(f)·c + σ(i)·tanh(g), h' = σ(o)·tanh(c')."""
    rows, n = c.shape
    for r in range(rows):
        for j in range(n):
            zi = (xw[r, j] + b_ih[j]) + (hw[r, j] + b_hh[j])
            zf = (xw[r, n + j] + b_ih[n + j]) + (hw[r, n + j] + b_hh[n + j])
            zg = (xw[r, 2 * n + j] + b_ih[2 * n + j]) + (hw[r, 2 * n + j] + b_hh[2 * n + j])
            zo = (xw[r, 3 * n + j] + b_ih[3 * n + j]) + (hw[r, 3 * n + j] + b_hh[3 * n + j])
            c2 = sigmoid32(zf) * c[r, j] + sigmoid32(zi) * tanh32(zg)
            c_out[r, j] = c2
            h_out[r, j] = sigmoid32(zo) * tanh32(c2)


def _gru_gates(xw, b_ih, hw, b_hh, h, out):
    """The GRU cell after its two GEMMs: gi = xw + b_ih, gh = hw + b_hh split in r, z, n;
    r = σ(gi_r + gh_r), z = σ(gi_z + gh_z), n = tanh(gi_n + r·gh_n), h' = n + z·(h − n)."""
    rows, n = h.shape
    for r in range(rows):
        for j in range(n):
            rg = sigmoid32((xw[r, j] + b_ih[j]) + (hw[r, j] + b_hh[j]))
            zg = sigmoid32((xw[r, n + j] + b_ih[n + j]) + (hw[r, n + j] + b_hh[n + j]))
            ng = tanh32((xw[r, 2 * n + j] + b_ih[2 * n + j])
                        + rg * (hw[r, 2 * n + j] + b_hh[2 * n + j]))
            out[r, j] = ng + zg * (h[r, j] - ng)


# exp(x) = 2^k · exp(r), k = round(x / ln 2), r = x − k·ln 2 (ln 2 in two parts), exp(r) by
# Cephes' expf polynomial; 2^k as the float32 bits (k + 127) << 23, written to an int32
# scratch row and read back through a float32 view: no libm call, so the loop vectorizes.
_LOG2E, _LN2_HI, _LN2_LO = 1.4426950408889634, 0.693359375, -2.12194440e-4
_E5, _E4, _E3 = 1.9875691500e-4, 1.3981999507e-3, 8.3334519073e-3
_E2, _E1, _E0 = 4.1665795894e-2, 1.6666665459e-1, 5.0000001201e-1


def _masked_softmax(s, mask, scale, out, bits, empty):
    """softmax(where(mask, s * scale, -inf)) over the last axis; s (B, L, S), mask (1 or B,
    L, S), bits an int32 scratch row (S,). A row with every key masked is `empty`: NaN as
    the pattern's reference computes it (0 / 0), zeros for attention."""
    b, rows, n = s.shape
    pow2 = bits.view(np.float32)
    si = s.view(np.int32)
    lowest, highest = np.int32(-2147483648), np.int32(2147483647)
    for i in range(b):
        mi = i if mask.shape[0] > 1 else 0
        for r in range(rows):
            # The row's largest and smallest unmasked s as integer keys (float32 bits, the
            # negatives' flipped, order as the floats do): numba leaves a float max
            # reduction scalar (36 µs for 65k floats), an integer one vectorizes (7 µs).
            hi, lo = lowest, highest
            for j in range(n):
                k = si[i, r, j]
                k = k if k >= 0 else k ^ np.int32(0x7fffffff)
                hi = max(hi, k if mask[mi, r, j] else lowest)
                lo = min(lo, k if mask[mi, r, j] else highest)
            if hi == lowest:
                for j in range(n):
                    out[i, r, j] = empty
                continue
            k = hi if scale >= 0 else lo          # max(s * scale) = scale * (max or min s)
            bits[0] = k if k >= 0 else k ^ np.int32(0x7fffffff)
            top = pow2[0] * scale
            for j in range(n):   # exp(s·scale − top) ∈ [2^-126, 1]: k ∈ [-126, 0]
                x = min(max(s[i, r, j] * scale - top, np.float32(-87.0)), np.float32(0.0))
                k = np.floor(x * np.float32(_LOG2E) + np.float32(0.5))
                x = x - k * np.float32(_LN2_HI) - k * np.float32(_LN2_LO)
                y = np.float32(_E5) * x + np.float32(_E4)
                y = y * x + np.float32(_E3)
                y = y * x + np.float32(_E2)
                y = y * x + np.float32(_E1)
                y = y * x + np.float32(_E0)
                out[i, r, j] = y * (x * x) + x + np.float32(1.0)
                bits[j] = (np.int32(k) + np.int32(127)) << 23
            den = np.float32(0.0)
            for j in range(n):
                e = out[i, r, j] * pow2[j] if mask[mi, r, j] else np.float32(0.0)
                out[i, r, j] = e
                den += e
            inv = np.float32(1.0) / den
            for j in range(n):
                out[i, r, j] *= inv


gelu_tanh_gate_loop = _jit_loop(_gelu_tanh_gate)
silu_gate_loop = _jit_loop(_silu_gate)
lstm_gates_loop = _jit_loop(_lstm_gates)
gru_gates_loop = _jit_loop(_gru_gates)
masked_softmax_loop = _jit(_masked_softmax, parallel=False)


def gelu_tanh_gate(a, b):
    """`gelu(a, approximate="tanh") * b`, float32, one pass."""
    a, b = np.ascontiguousarray(a), np.ascontiguousarray(b)
    out = np.empty_like(a)
    gelu_tanh_gate_loop(a, b, out)
    return out


def silu_gate(a, b):
    """`silu(a) * b` (SwiGLU's gate), float32, one pass.

    >>> a = np.array([[0.0, 2.0]], np.float32)
    >>> y = silu_gate(a, np.ones_like(a)) if HAVE_NUMBA else np.float32([[0, 1.7616]])
    >>> [round(float(v), 4) for v in y[0]]
    [0.0, 1.7616]
    """
    a, b = np.ascontiguousarray(a), np.ascontiguousarray(b)
    out = np.empty_like(a)
    silu_gate_loop(a, b, out)
    return out


def rotary_emb(x, cos, sin):
    """`x * cos + rotate_half(x) * sin` (RoPE written out, as `apply_rotary_emb`
    decomposes), float32, one pass over x (..., T, D) with tables cos, sin (T, D): the loop
    of the `apply_rotary_emb` primitive's numba kernel.

    >>> x, ones = np.array([[1.0, 2.0]], np.float32), np.ones((1, 2), np.float32)
    >>> y = rotary_emb(x, 0 * ones, ones) if HAVE_NUMBA else np.float32([[-2, 1]])
    >>> [float(v) for v in y[0]]
    [-2.0, 1.0]
    """
    return rope_f32(x, cos, sin)


def lstm_gates(xw, b_ih, hw, b_hh, c):
    """(h', c') of an LSTM cell from its two GEMMs' outputs xw, hw (B, 4H) (gates i, f, g,
    o), their biases (4H,) and c (B, H): what `lstm_cell` computes after `x @ w_ih.T` and
    `h @ w_hh.T`, float32, one pass.

    >>> z, b, c = np.zeros((1, 4), np.float32), np.zeros(4, np.float32), np.ones((1, 1), np.float32)
    >>> h2, c2 = lstm_gates(z, b, z, b, c) if HAVE_NUMBA else (np.float32([[0.2311]]), c / 2)
    >>> round(float(h2[0, 0]), 4), float(c2[0, 0])
    (0.2311, 0.5)
    """
    c = np.ascontiguousarray(c)
    h_out, c_out = np.empty_like(c), np.empty_like(c)
    lstm_gates_loop(*map(np.ascontiguousarray, (xw, b_ih, hw, b_hh)), c, h_out, c_out)
    return h_out, c_out


def gru_gates(xw, b_ih, hw, b_hh, h):
    """h' of a GRU cell from its two GEMMs' outputs xw, hw (B, 3H) (gates r, z, n), their
    biases (3H,) and h (B, H): what `gru_cell` computes after `x @ w_ih.T` and
    `h @ w_hh.T`, float32, one pass.

    >>> z, b, h = np.zeros((1, 3), np.float32), np.zeros(3, np.float32), np.ones((1, 1), np.float32)
    >>> float(gru_gates(z, b, z, b, h)[0, 0]) if HAVE_NUMBA else 0.5
    0.5
    """
    h = np.ascontiguousarray(h)
    out = np.empty_like(h)
    gru_gates_loop(*map(np.ascontiguousarray, (xw, b_ih, hw, b_hh)), h, out)
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


def _softmax_rows(s, mask, scale, empty=np.nan):
    rows, n = s.shape[-2:]
    s3 = np.ascontiguousarray(s.reshape(-1, rows, n))
    m3 = np.ascontiguousarray(mask.reshape(-1, rows, n))
    out = np.empty_like(s3)
    masked_softmax_loop(s3, m3, np.float32(scale), out, np.empty(n, np.int32),
                        np.float32(empty))
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


def _rope_checker(avals, params):
    return _float32(avals, params) or _numba_rope_checker(avals, params)


def _cell_checker(avals, params):
    xw, b_ih, hw, b_hh, h = avals
    if _float32(avals, params):
        return _float32(avals, params)
    if h.ndim != 2 or xw.shape != hw.shape:
        return f"batched gate products of one shape, got {xw.str_short()}, {hw.str_short()}"
    return None


def _specs(rank: int):
    rows = ("B", "T")[2 - (rank - 1):] if rank > 1 else ()
    return Spec((*rows, "D")), Spec(("D",))


def _lstm_pattern(xw, b_ih, hw, b_hh, c):
    i, f, g, o = _chunks((xw + b_ih) + (hw + b_hh), 4)   # as `lstm_cell` decomposes
    c2 = tnn.sigmoid(f) * c + tnn.sigmoid(i) * tnp.tanh(g)
    return tnn.sigmoid(o) * tnp.tanh(c2), c2


def _gru_pattern(xw, b_ih, hw, b_hh, h):
    ir, iz, in_ = _chunks(xw + b_ih, 3)                   # as `gru_cell` decomposes
    hr, hz, hn = _chunks(hw + b_hh, 3)
    r, z = tnn.sigmoid(ir + hr), tnn.sigmoid(iz + hz)
    n = tnp.tanh(in_ + r * hn)
    return n + z * (h - n)


_EPS = 1e-6   # what the norm patterns are traced with; a wildcard (any epsilon matches)

#: name, pattern, its inputs' kinds (see `pattern_forms`), kernel, checker
PATTERNS = (
    ("rms_norm_1p", lambda h, w: tnn.rms_norm(h, ("D",), 1.0 + w, _EPS), "rw",
     rms_norm_1p, _float32),
    ("residual_rms_norm", lambda x, h, w: x + tnn.rms_norm(h, ("D",), w, _EPS), "rrw",
     residual_rms_norm, _same_shape),
    ("residual_rms_norm_1p", lambda x, h, w: x + tnn.rms_norm(h, ("D",), 1.0 + w, _EPS),
     "rrw", residual_rms_norm_1p, _same_shape),
    ("gelu_tanh_gate", lambda a, b: tnn.gelu(a, approximate="tanh") * b, "rr",
     gelu_tanh_gate, _same_shape),
    ("silu_gate", lambda a, b: tnn.silu(a) * b, "rr", silu_gate, _same_shape),
    ("masked_softmax", lambda s, m: tnn.softmax(tnp.where(m, s, -np.inf), axis=-1), "sm",
     masked_softmax, _softmax_checker),
    ("scaled_masked_softmax",
     lambda s, m, c: tnn.softmax(tnp.where(m, s * c, -np.inf), axis=-1), "smc",
     scaled_masked_softmax, _softmax_checker),
    ("rotary_emb", lambda x, c, s: x * c + tnn.rotate_half(x) * s, "xtt", rotary_emb,
     _rope_checker),
    ("lstm_gates", _lstm_pattern, "4", lstm_gates, _cell_checker),
    ("gru_gates", _gru_pattern, "3", gru_gates, _cell_checker),
)


@functools.cache
def pattern_forms(name: str) -> tuple:
    """The pattern graphs of library pattern `name`, one per rank of its row inputs (a
    pattern input matches values of its rank), `eps` a wildcard. Shared by every backend's
    kernels of the pattern (`tgx.backends.torch_patterns`).

    Kinds of inputs: "r" rows (..., D) and "w" a weight (D,); "s" scores (..., L, S), "m"
    their mask ((..., L, S) or (L, S)), "c" a scale; "x" RoPE's x (..., T, D) and "t" a
    table (T, D); "4", "3": a recurrent cell's gate products (B, nH) and biases (nH,), and
    its state (B, H)."""
    fn, inputs = next((f, i) for n, f, i, _, _ in PATTERNS if n == name)
    if inputs in ("4", "3"):
        z, b = Spec(("B", f"{inputs}*H")), Spec((f"{inputs}*H",))
        return (make_graph(fn)(z, b, z, b, Spec(("B", "H"))),)
    if inputs == "xtt":   # x of rank 2-4, tables (T, D) broadcast against it
        t = Spec(("T", "D"))
        return tuple(make_graph(fn)(Spec(("B", "H", "T", "D")[4 - rank:]), t, t)
                     for rank in (2, 3, 4))
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


# -- optimizer steps ---------------------------------------------------------------------------


def adam_pattern(p, g, m, v, nss, bc2, c1, b2, c2, eps):
    """One parameter's Adam step as `tgx.optim.adam` and `apply_updates` trace it (tests
    check that it matches there): `nss` is minus the bias-corrected step size, `bc2` the
    square root of the second moment's bias correction, both computed once for all
    parameters; `c1 = 1 - b1`, `c2 = 1 - b2`."""
    m2 = m + c1 * (g - m)
    v2 = v * b2 + c2 * g * g
    return p + nss * (m2 / (tnp.sqrt(v2) / bc2 + eps)), m2, v2


def adamw_pattern(p, g, m, v, nss, bc2, c1, b2, c2, eps, dr):
    """`adam_pattern` of `tgx.optim.adamw`: the decoupled decay `- dr * p` (dr = lr *
    weight_decay) inside the update."""
    m2 = m + c1 * (g - m)
    v2 = v * b2 + c2 * g * g
    return p + (nss * (m2 / (tnp.sqrt(v2) / bc2 + eps)) - dr * p), m2, v2


def adam_forms(pattern, scalars: int) -> tuple:
    """`pattern` for parameters of rank 1-4 (its scalars also match literals: an optimizer's
    constants are literals in its graph)."""
    dims = ("A", "B", "C", "D")
    return tuple(make_graph(pattern)(*[Spec(dims[:rank])] * 4, *[Spec(())] * scalars)
                 for rank in (1, 2, 3, 4))


def adam_checker(avals, params):
    p = avals[0]
    if any(a.dtype != p.dtype for a in avals) or p.dtype.name not in ("float32", "float64"):
        return f"one float dtype throughout, got {', '.join(a.str_short() for a in avals)}"
    if any(a.shape != p.shape for a in avals[1:4]):
        return "parameter, gradient and moments of one shape"
    return None


def _adam_loop(p, g, m, v, s):
    """`adam_pattern` element by element, in place into p, m and v, in its order of
    operations and in the arrays' dtype (s: nss, bc2, c1, b2, c2, eps), so it rounds as
    NumPy's ops do."""
    nss, bc2, c1, b2, c2, eps = s[0], s[1], s[2], s[3], s[4], s[5]
    p1, g1, m1, v1 = p.reshape(-1), g.reshape(-1), m.reshape(-1), v.reshape(-1)
    for i in range(p1.size):
        gi, mi = g1[i], m1[i]
        m2 = mi + c1 * (gi - mi)
        v2 = v1[i] * b2 + c2 * gi * gi
        p1[i] = p1[i] + nss * (m2 / (np.sqrt(v2) / bc2 + eps))
        m1[i] = m2
        v1[i] = v2


def _adamw_loop(p, g, m, v, s):
    """`adamw_pattern` as `_adam_loop` (s: nss, bc2, c1, b2, c2, eps, dr)."""
    nss, bc2, c1, b2, c2, eps, dr = s[0], s[1], s[2], s[3], s[4], s[5], s[6]
    p1, g1, m1, v1 = p.reshape(-1), g.reshape(-1), m.reshape(-1), v.reshape(-1)
    for i in range(p1.size):
        gi, mi, pi = g1[i], m1[i], p1[i]
        m2 = mi + c1 * (gi - mi)
        v2 = v1[i] * b2 + c2 * gi * gi
        p1[i] = pi + (nss * (m2 / (np.sqrt(v2) / bc2 + eps)) - dr * pi)
        m1[i] = m2
        v1[i] = v2


# no fastmath: each op rounds as NumPy's (a reciprocal in place of the division would not)
adam_loop = _jit(_adam_loop, parallel=False, fastmath=False)
adamw_loop = _jit(_adamw_loop, parallel=False, fastmath=False)


def _adam_step(loop, p, g, m, v, scalars, outs):
    # In place into the outputs, each first holding its input (where it is not that very
    # array): a loop reading p and writing a p_out that LLVM cannot prove apart from it
    # takes its scalar path when they are one array (a plan's state), 3.1 against 1.4 ms
    # for a (2048, 640) parameter.
    new = []
    for i, x in enumerate((p, m, v)):
        buf = None if outs is None else outs.get(i)
        if buf is None:
            buf = np.array(x, order="C")
        elif buf is not x:
            np.copyto(buf, x)
        new.append(buf)
    loop(new[0], np.ascontiguousarray(g), new[1], new[2], np.array(scalars, p.dtype))
    return tuple(new)


def adam_update(p, g, m, v, nss, bc2, c1, b2, c2, eps, outs=None):
    """`adam_pattern` in one pass over p, g, m and v: `(p', m', v')`, written into
    `outs={position: array}` where given (a plan's state buffers; one may be its own input).
    Bit for bit what NumPy's ops give in the arrays' dtype.

    >>> one = np.ones(2, np.float32)
    >>> p2, m2, v2 = adam_update(one, one, 0 * one, 0 * one, -0.1, 1.0, 0.1, 0.999, 0.001,
    ...                          0.0) if HAVE_NUMBA else (one - 0.1 * 0.1 / 0.001**0.5,) * 3
    >>> [round(float(x), 4) for x in p2]
    [0.6838, 0.6838]
    """
    return _adam_step(adam_loop, p, g, m, v, (nss, bc2, c1, b2, c2, eps), outs)


def adamw_update(p, g, m, v, nss, bc2, c1, b2, c2, eps, dr, outs=None):
    """`adamw_pattern` in one pass, as `adam_update`."""
    return _adam_step(adamw_loop, p, g, m, v, (nss, bc2, c1, b2, c2, eps, dr), outs)


@functools.lru_cache(maxsize=16)
def _attend_mask(rows: int, keys: int, causal: bool) -> np.ndarray:
    """A (1, rows, keys) bool mask: the causal one, or every key."""
    m = np.ones((rows, keys), bool)
    m = np.tril(m) if causal else m
    m.flags.writeable = False
    return m.reshape(1, rows, keys)


def _numba_softmax(s, mask, is_causal, scale):
    """`numpy_library.masked_softmax` with numba's loop (vectorized exp, an integer row
    maximum; a row with every key masked gives zeros): 14 against 39 us for 4x64x64 float32
    scores. Where the loop does not compute what the primitive does (scores of another
    dtype, a float mask, a mask with heads), NumPy's."""
    rows, keys = s.shape[-2:]
    if s.dtype != np.float32 or (mask is not None and (
            mask.dtype != np.bool_ or mask.shape[-2:] != (rows, keys)
            or any(d != 1 for d in mask.shape[:-2]))):
        return numpy_masked_softmax(s, mask, is_causal, scale)
    if mask is None:
        m = _attend_mask(rows, keys, is_causal)
    else:   # (an all-True mask is not and-ed in: 4 us of the demo's 55 us attention)
        m = mask.reshape(1, rows, keys)
        if is_causal:
            m = _attend_mask(rows, keys, True) & m
    return _softmax_rows(s, m, scale, empty=0.0)


def numba_softmax_sdpa(q, k, v, *mask, has_mask, is_causal, scale, enable_gqa):
    """Attention for many query rows (prefill): the products by BLAS, as NumPy's kernel,
    the softmax by numba's loop."""
    return sdpa_with(_numba_softmax, q, k, v, mask[0] if has_mask else None, is_causal,
                     scale, enable_gqa)


def _register() -> None:
    for name, _, _, kernel, checker in PATTERNS:
        forms = LazyForms(functools.partial(pattern_forms, name))
        add_kernel(Kernel(name, NAME, kernel, checker, "numba", pattern=forms))


if HAVE_NUMBA:
    _register()
    add_kernel(Kernel("scaled_dot_product_attention", NAME, numba_softmax_sdpa, _sdpa_ok,
                      "numba-softmax"))
    for _name, _fn, _pattern, _scalars in (("adam_update", adam_update, adam_pattern, 6),
                                           ("adamw_update", adamw_update, adamw_pattern, 7)):
        add_kernel(Kernel(_name, NAME, _fn, adam_checker, "numba", outs_into=True,
                          pattern=LazyForms(functools.partial(adam_forms, _pattern, _scalars))))
