"""`equivalent(g1, g2)`: do two graphs compute the same function?

Three methods, cheapest first:

1. structural: equal `structural_hash` (renaming, independent reordering, commutative swaps);
2. sympy: for graphs of elementwise arithmetic only, each output as a sympy expression of one
   scalar symbol per input, and `simplify(e1 - e2) == 0` (a proof: `(a+b)*c ≡ a*c + b*c`);
3. numerical: both graphs evaluated with the NumPy reference in float64 on random inputs at
   several concrete bindings of the symbolic dims. Floats are drawn in [0.5, 2] so that division,
   logs and square roots stay defined; integers in [1, 4]; bools at random.

The numerical check can only refute, or fail to refute: a `Verdict` with method "numerical"
says "equal on every sample", not "proved".
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import sympy

from ..core import Graph, Literal
from ..errors import TgxError
from ..shapes import ShapedArray, bool_, float64, free_symbols, is_float
from ..tracing import GraphBuilder
from ..transforms.evaluate import eval_graph_flat
from .hashing import structural_hash


@dataclass
class Verdict:
    """The answer of `equivalent`: truthy when the graphs are equivalent."""

    equivalent: bool
    method: str  # "structural" | "sympy" | "numerical"
    max_error: float = 0.0
    counterexample: dict | None = None
    reason: str = ""
    bindings: list = field(default_factory=list)

    def __bool__(self) -> bool:
        return self.equivalent

    def __str__(self) -> str:
        what = "equivalent" if self.equivalent else "not equivalent"
        extra = f" ({self.reason})" if self.reason else ""
        return f"{what} by {self.method}, max error {self.max_error:.3g}{extra}"


def equivalent(g1: Graph, g2: Graph, *, trials: int = 3, rtol: float = 1e-6, atol: float = 1e-9,
               seed: int = 0, use_sympy: bool = True) -> Verdict:
    """Whether `g1` and `g2` compute the same outputs for the same inputs.

    >>> import tgx, tgx.numpy as tnp
    >>> s = tgx.Spec(("N",), "float32")
    >>> g1 = tgx.make_graph(lambda a, b, c: (a + b) * c)(s, s, s)
    >>> g2 = tgx.make_graph(lambda a, b, c: a * c + b * c)(s, s, s)
    >>> v = tgx.equivalent(g1, g2); (v.equivalent, v.method)
    (True, 'sympy')
    """
    problem = _signature_mismatch(g1, g2)
    if problem:
        return Verdict(False, "structural", float("inf"), reason=problem)
    if structural_hash(g1) == structural_hash(g2):
        return Verdict(True, "structural")
    if use_sympy and _sympy_proves(g1, g2):
        return Verdict(True, "sympy")
    return _numerical(g1, g2, trials, rtol, atol, seed)


# ---------------------------------------------------------------------------------------------
# Signatures


def _signature_mismatch(g1: Graph, g2: Graph) -> str:
    if len(g1.invars) != len(g2.invars):
        return f"{len(g1.invars)} inputs vs {len(g2.invars)}"
    if len(g1.outvars) != len(g2.outvars):
        return f"{len(g1.outvars)} outputs vs {len(g2.outvars)}"
    for i, (a, b) in enumerate(zip(g1.in_avals, g2.in_avals)):
        if a.dtype != b.dtype or a.ndim != b.ndim:
            return f"input {i}: {a.str_short()} vs {b.str_short()}"
    for i, (a, b) in enumerate(zip(g1.out_avals, g2.out_avals)):
        if a.dtype != b.dtype or a.ndim != b.ndim:
            return f"output {i}: {a.str_short()} vs {b.str_short()}"
    return ""


# ---------------------------------------------------------------------------------------------
# Sympy proofs for elementwise arithmetic

_SYMPY_UNARY = {"neg": lambda x: -x, "exp": sympy.exp, "log": sympy.log, "sin": sympy.sin,
                "cos": sympy.cos, "sqrt": sympy.sqrt, "atan": sympy.atan, "erf": sympy.erf,
                "copy": lambda x: x}
_SYMPY_BINARY = {"add": lambda x, y: x + y, "sub": lambda x, y: x - y,
                 "mul": lambda x, y: x * y, "div": lambda x, y: x / y,
                 "pow": lambda x, y: x ** y, "max": sympy.Max, "min": sympy.Min}


def _sympy_outputs(g: Graph, symbols: list) -> list | None:
    if g.constvars:
        return None
    env: dict[int, Any] = {v.id: s for v, s in zip(g.invars, symbols)}

    def read(x):
        if isinstance(x, Literal):
            val = x.val.item() if isinstance(x.val, (np.generic, np.ndarray)) else x.val
            if isinstance(val, float):
                return sympy.Rational(val) if np.isfinite(val) else sympy.nan
            return sympy.Integer(int(val))
        return env[x.id]

    for e in g.eqns:
        name = e.primitive.name
        if not all(is_float(v.aval.dtype) for v in (*e.outvars, *e.invars)):
            return None
        if name in _SYMPY_UNARY:
            out = _SYMPY_UNARY[name](read(e.invars[0]))
        elif name in _SYMPY_BINARY:
            out = _SYMPY_BINARY[name](read(e.invars[0]), read(e.invars[1]))
        elif name == "convert_element_type":
            out = read(e.invars[0])
        else:
            return None
        env[e.outvars[0].id] = out
    return [read(v) for v in g.outvars]


def _sympy_proves(g1: Graph, g2: Graph) -> bool:
    pairs = [*zip(g1.in_avals, g2.in_avals), *zip(g1.out_avals, g2.out_avals)]
    if any(a.shape != b.shape for a, b in pairs):
        return False  # broadcasting could differ; let the numerical check decide
    symbols = [sympy.Symbol(f"x{i}", positive=True) for i in range(len(g1.invars))]
    o1, o2 = _sympy_outputs(g1, symbols), _sympy_outputs(g2, symbols)
    if o1 is None or o2 is None:
        return False
    for a, b in zip(o1, o2):
        diff = sympy.expand(a - b)
        if diff == 0:
            continue
        if sympy.count_ops(diff) > 200 or sympy.simplify(diff) != 0:
            return False
    return True


# ---------------------------------------------------------------------------------------------
# Numerical check


def _to_float64(g: Graph) -> Graph:
    """The same program with every floating dtype widened to float64 (params and literals too)."""

    def widen(d):
        return float64 if isinstance(d, np.dtype) and is_float(d) else d

    def widen_param(p):
        if isinstance(p, np.dtype):
            return widen(p)
        if isinstance(p, tuple):
            return tuple(widen_param(x) for x in p)
        if isinstance(p, Graph):
            return _to_float64(p)
        return p

    def widen_aval(a: ShapedArray) -> ShapedArray:
        return a.update(dtype=widen(a.dtype))

    with GraphBuilder() as b:
        args = [b.new_arg(widen_aval(v.aval)) for v in g.invars]
        env: dict[int, Any] = {v.id: a for v, a in zip(g.invars, args)}
        for v, c in zip(g.constvars, g.consts):
            c = np.asarray(c)
            env[v.id] = c.astype(float64) if is_float(c.dtype) else c

        def read(x):
            if isinstance(x, Literal):
                return Literal(x.val, widen_aval(x.aval))
            return env[x.id]

        for e in g.eqns:
            params = {k: widen_param(p) for k, p in e.params.items()}
            outs = e.primitive.bind(*[read(x) for x in e.invars], **params)
            outs = outs if e.primitive.multiple_results else [outs]
            for v, o in zip(e.outvars, outs):
                env[v.id] = o
        return b.build([a.variable for a in args], [read(v) for v in g.outvars])


def _bindings(g: Graph, trials: int, rng) -> list[dict]:
    syms = set()
    for v in g.invars:
        syms |= free_symbols(v.aval.shape)
    syms = sorted(syms, key=lambda s: s.name)
    out = []
    for t in range(trials):
        out.append({s: int(rng.integers(1, 6)) if t else 2 + i % 3 for i, s in enumerate(syms)})
    return out


def random_inputs(avals: list[ShapedArray], dims: dict, rng) -> list[np.ndarray]:
    """Inputs for `avals` under the binding `dims`: floats in [0.5, 2], ints in [1, 4]."""
    out = []
    for a in avals:
        shape = tuple(int(d) if type(d) is int else int(d.xreplace(dims)) for d in a.shape)
        if a.dtype == bool_:
            x = rng.random(shape) < 0.5
        elif is_float(a.dtype):
            x = rng.uniform(0.5, 2.0, shape)
        else:
            x = rng.integers(1, 5, shape)
        out.append(np.asarray(x).astype(a.dtype))
    return out


def _run(g: Graph, g64: Graph | None, xs: list) -> list[np.ndarray]:
    if g64 is not None:
        xs = [x.astype(float64) if is_float(x.dtype) else x for x in xs]
        return [np.asarray(o) for o in eval_graph_flat(g64, xs)]
    return [np.asarray(o) for o in eval_graph_flat(g, xs)]


def _numerical(g1, g2, trials, rtol, atol, seed) -> Verdict:
    rng = np.random.default_rng(seed)
    try:
        w1, w2 = _to_float64(g1), _to_float64(g2)
    except TgxError:
        w1 = w2 = None  # a primitive refuses float64: compare in the graphs' own precision
        rtol, atol = max(rtol, 1e-3), max(atol, 1e-5)
    worst = 0.0
    bindings = _bindings(g1, trials, rng)
    for dims in bindings:
        xs = random_inputs(g1.in_avals, dims, rng)
        o1 = _run(g1, w1, xs)
        try:
            o2 = _run(g2, w2, xs)
        except TgxError as e:
            return Verdict(False, "numerical", float("inf"), reason=f"g2 fails: {e}",
                           counterexample={"dims": dims, "inputs": xs, "outputs1": o1,
                                           "outputs2": None}, bindings=bindings)
        for k, (a, b) in enumerate(zip(o1, o2)):
            err, ok = _compare(a, b, rtol, atol)
            worst = max(worst, err)
            if not ok:
                return Verdict(False, "numerical", err, reason=f"output {k} differs",
                               counterexample={"dims": dims, "inputs": xs, "outputs1": o1,
                                               "outputs2": o2}, bindings=bindings)
    return Verdict(True, "numerical", worst, bindings=bindings)


def _compare(a: np.ndarray, b: np.ndarray, rtol: float, atol: float) -> tuple[float, bool]:
    if a.shape != b.shape:
        return float("inf"), False
    if a.dtype == bool_ or b.dtype == bool_ or a.size == 0:
        same = bool(np.array_equal(a, b))
        return (0.0 if same else 1.0), same
    a64, b64 = a.astype(float64), b.astype(float64)
    nan_a, nan_b = np.isnan(a64), np.isnan(b64)
    if not np.array_equal(nan_a, nan_b):
        return float("inf"), False
    a64, b64 = np.where(nan_a, 0, a64), np.where(nan_b, 0, b64)
    with np.errstate(invalid="ignore"):
        diff = np.abs(a64 - b64)
        diff = np.where(a64 == b64, 0.0, diff)  # equal infinities
    err = float(np.max(diff)) if diff.size else 0.0
    ok = bool(np.all(diff <= atol + rtol * np.abs(b64)))
    return err, ok

