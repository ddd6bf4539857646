"""What a generated kernel needs to know about a fused region: one analysis for every emitter.

A region of `tgx.fuse` (a `fused` equation) is run by a generated kernel as a loop over a
2-D iteration space, *rows* × *columns*: the columns are the last axis of the region's
*domain* (the shape of its largest values), the rows every axis before it, flattened. Each
value of the body is either per element (it varies along the columns) or per row (a row
statistic: the result of a reduction over the last axis, a `(S, 1)` operand, a scalar), and
each body input is read through a 2-D view of its own: `(rows_in, N or 1)` with row index
`(r // div) % mod`, which covers the broadcasts models write (a `(D,)` weight, a `(S, 1)`
row statistic, an `(L, S)` mask against `(H, L, S)` scores, a `(B, 1, D)` bias).

Reductions over the last axis (`reduce_sum`, `reduce_max`, `reduce_min`) turn a per-element
value into a per-row one, and later ops may read it (RMSNorm's sum of squares, softmax's
maximum and sum): a value is available after `stage` passes over the columns, so an emitter
that streams columns (numba) runs one pass per stage, and one that holds a whole row in
registers (Triton) runs them in one go. `analyze` says which regions fit and why others do
not; `numba_codegen` and `triton_codegen` emit from the same `Region`.

>>> import tgx, tgx.numpy as tnp
>>> def rms(x, w):
...     return x / tnp.sqrt(tnp.mean(x * x, axis=-1, keepdims=True) + 1e-6) * w
>>> g = tgx.make_graph(rms)(tgx.Spec((4, 8)), tgx.Spec((8,)))
>>> g = tgx.fuse(tgx.decompose(g), rows=True)
>>> r = analyze(g.eqns[0].params["graph"])
>>> r.domain, r.n_stages, [i.kind for i in r.inputs]
((4, 8), 2, ['elem', 'elem'])
>>> analyze(tgx.fuse(tgx.make_graph(lambda x: tnp.sum(tnp.exp(x), axis=0))(
...     tgx.Spec((4, 8)))).eqns[0].params["graph"])
'reduce_sum over axes (0,) (only the last axis, of a value of the region shape)'
"""

from __future__ import annotations

import hashlib
import pathlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from ..core import Eqn, Graph, Literal
from ..primitives.fused import reference_loop
from ..shapes import dim_eq
from ..transforms.decompose import decompose

#: atomic elementwise primitives the emitters know (each writes its own expression)
ELEMENTWISE = frozenset({
    "add", "sub", "mul", "div", "neg", "max", "min", "pow", "exp", "log", "sqrt", "sin",
    "cos", "atan", "erf", "floor", "copy", "eq", "ne", "lt", "le", "gt", "ge", "select",
    "and", "or", "not", "convert_element_type",
    "tanh"})   # a composite the generators write themselves (its decomposition: exp, log, ...)
#: composites a body keeps whole (`body_of`): each generator has its own form of them
KEEP = frozenset({"tanh"})
#: reductions over the last axis, with the identity they start from
REDUCTIONS = {"reduce_sum": 0.0, "reduce_max": -np.inf, "reduce_min": np.inf}
#: ops that only re-index (no code: the value is the operand's, read at the same point)
VIEWS = frozenset({"broadcast_in_dim", "reshape"})
DTYPES = frozenset({"float32", "float64", "bool"})

#: source hash of the analysis (generated kernels' source hashes include it)
SOURCE_HASH = hashlib.sha256(pathlib.Path(__file__).read_bytes()).hexdigest()


@dataclass(frozen=True)
class Input:
    """How body input `index` is read. kind: "elem" (varies along the columns), "row" (one
    value per row), "scalar" (one value). `lead`: the domain's leading axes its leading dims
    follow, a contiguous run `[a, b)` (None: the same for every row)."""

    index: int
    kind: str
    dtype: str
    lead: tuple[int, int] | None


@dataclass(frozen=True)
class Value:
    """A value of the body: `elem` (per element) or per row, available after `stage`
    column passes (0: from the inputs)."""

    elem: bool
    stage: int
    dtype: str


@dataclass(frozen=True)
class Region:
    """The analysis of one body (`analyze`): its domain and everything an emitter reads."""

    body: Graph
    domain: tuple
    inputs: tuple[Input, ...]
    values: dict          # var id -> Value (inputs and equation results)
    outputs: tuple[str, ...]   # per body output: "elem" (domain-shaped) or "row"
    sizes: tuple          # per domain axis: its size, or (input, dim) giving it at run time
    n_stages: int         # 1 + the largest stage of an output or reduction operand

    @property
    def reductions(self) -> list[Eqn]:
        return [e for e in self.body.eqns if e.primitive.name in REDUCTIONS]

    def value(self, x) -> Value | None:
        return None if isinstance(x, Literal) else self.values[x.id]


def body_of(eqn_or_graph) -> Graph:
    """The body of a `fused` equation (or a region's graph) as the generators read it: every
    composite decomposed but those in `KEEP`."""
    g = eqn_or_graph.params["graph"] if isinstance(eqn_or_graph, Eqn) else eqn_or_graph
    return decompose(g, keep=KEEP)


def _eq(a, b) -> bool:
    try:
        return dim_eq(a, b)
    except Exception:  # noqa: BLE001 - undecidable for some binding: not equal for us
        return False


def _is_one(d) -> bool:
    return type(d) is int and d == 1


def _domain(eqns: Sequence[Eqn]) -> tuple | str:
    """The iteration space: the operand shape of the reductions, else the broadcast of the
    results' shapes (elementwise regions)."""
    red = [e.invars[0].aval.shape for e in eqns if e.primitive.name in REDUCTIONS]
    if red:
        for s in red[1:]:
            if len(s) != len(red[0]) or not all(_eq(a, b) for a, b in zip(s, red[0])):
                return f"reductions over values of shapes {red[0]} and {s}"
        return tuple(red[0])
    shapes = [v.aval.shape for e in eqns for v in e.outvars]
    nd = max(len(s) for s in shapes)
    dom: list = [1] * nd
    for s in shapes:
        for k, d in enumerate(s, nd - len(s)):
            if _is_one(d):
                continue
            if _is_one(dom[k]):
                dom[k] = d
            elif not _eq(dom[k], d):
                return f"values of shapes {tuple(dom)} and {s} in one region"
    return tuple(dom)


def analyze_eqns(eqns: Sequence[Eqn], invars: Sequence, outvars: Sequence | None,
                 check_ops: bool = True):
    """`Region` parts for equations `eqns` reading `invars` (or the reason they do not fit).
    `outvars=None` checks a partial region (the fuse stage growing one): no output rules.
    `check_ops=False` lets any elementwise primitive through (composites not yet
    decomposed)."""
    if not eqns:
        return "an empty region"
    dom = _domain(eqns)
    if isinstance(dom, str):
        return dom
    nd = len(dom)
    if nd == 0:
        return "a 0-d region"
    # vmap: per dim of a value, the domain axis it follows (None: constant along it)
    vmap: dict[int, tuple] = {}
    inputs: list[Input] = []
    # per domain axis, its size at run time: the int, or (input, dim) giving a symbolic one
    sizes: list = [d if type(d) is int else None for d in dom]
    values: dict[int, Value] = {}
    for i, v in enumerate(invars):
        a = v.aval
        if a.dtype.name not in DTYPES:
            return f"dtype {a.dtype.name} (float32, float64 and bool only)"
        if a.ndim > nd:
            return f"input of shape {a.str_short()} in a region of shape {dom}"
        m = []
        for k, d in enumerate(a.shape, nd - a.ndim):
            if _eq(d, dom[k]):     # (a unit dim of a unit axis follows it: the same)
                m.append(k)
                if sizes[k] is None:
                    sizes[k] = (i, k - (nd - a.ndim))
            elif _is_one(d):
                m.append(None)
            else:
                return (f"input of shape {a.str_short()} does not broadcast against the "
                        f"region's {dom}")
        vmap[v.id] = tuple(m)
        lead = [k for k in m if k is not None and k < nd - 1]
        if lead and lead != list(range(lead[0], lead[-1] + 1)):
            return f"input of shape {a.str_short()} broadcast in the middle of its rows"
        elem = bool(m) and m[-1] == nd - 1
        kind = "elem" if elem else ("row" if lead else "scalar")
        inputs.append(Input(i, kind, a.dtype.name, (lead[0], lead[-1] + 1) if lead else None))
        values[v.id] = Value(elem, 0, a.dtype.name)

    def vm(x):
        return () if isinstance(x, Literal) else vmap[x.id]

    def stage(x):
        return 0 if isinstance(x, Literal) else values[x.id].stage

    for e in eqns:
        name = e.primitive.name
        if len(e.outvars) != 1:
            return f"{name} has several results"
        out = e.outvars[0]
        oa = out.aval
        if oa.dtype.name not in DTYPES:
            return f"dtype {oa.dtype.name} (float32, float64 and bool only)"
        x = e.invars[0] if e.invars else None
        if name in REDUCTIONS:
            xa = x.aval
            if tuple(e.params["axes"]) != (xa.ndim - 1,) or vm(x)[-1:] != (nd - 1,):
                return (f"{name} over axes {tuple(e.params['axes'])} (only the last axis, "
                        f"of a value of the region shape)")
            m = vm(x)[:-1]
            st = stage(x) + 1
            if not values[x.id].elem:
                return f"{name} of a value that is one per row"
        elif name == "reshape":
            if isinstance(x, Literal):
                return "a reshape of a constant"
            s, t = tuple(x.aval.shape), tuple(oa.shape)
            if t == s + (1,):
                m = vm(x) + (None,)
            elif s == t + (1,):
                m = vm(x)[:-1]
            else:
                return f"a reshape from {x.aval.str_short()} to {oa.str_short()} (only a " \
                       f"trailing unit dim added or removed)"
            if x.id in {v.id for v in invars}:
                # read through its own view: a reshaped input would need another one
                return "a reshape of a region input"
            st = stage(x)
        elif name == "broadcast_in_dim":
            if not isinstance(x, Literal) and x.id in {v.id for v in invars} and x.aval.ndim:
                if tuple(e.params["broadcast_dimensions"]) != tuple(
                        range(oa.ndim - x.aval.ndim, oa.ndim)):
                    return "a broadcast of a region input that is not right-aligned"
            m = [None] * oa.ndim
            for k, d in enumerate(e.params["broadcast_dimensions"]):
                m[d] = vm(x)[k] if not isinstance(x, Literal) else None
            m = tuple(m)
            st = stage(x)
        elif e.primitive.elementwise and (not check_ops or name in ELEMENTWISE):
            m = [None] * oa.ndim
            for y in e.invars:
                ym = vm(y)
                for k, ax in enumerate(ym, oa.ndim - len(ym)):
                    if ax is None:
                        continue
                    if m[k] is not None and m[k] != ax:
                        return (f"{name} of a value along the rows against one along the "
                                f"columns ({e})")
                    m[k] = ax
            m = tuple(m)
            st = max((stage(y) for y in e.invars), default=0)
        else:
            return f"no code for {name}"
        if len(m) != oa.ndim:
            return f"{name}: rank {oa.ndim} against {len(m)} mapped dims"
        for d, ax in zip(oa.shape, m):
            if ax is not None and not _eq(d, dom[ax]):
                return f"{name} result {oa.str_short()} does not fit the region's {dom}"
        vmap[out.id] = m
        values[out.id] = Value(bool(m) and m[-1] == nd - 1, st, oa.dtype.name)

    floats = {v.dtype for v in values.values()} - {"bool"}
    if len(floats) > 1:
        # its float64 results would carry float32 roundings, which the check of a kernel
        # against the float64 reference (at float64's tolerance) refuses: split at the cast
        return "float32 and float64 values in one region"
    if None in sizes:
        return f"no input gives the size of axis {sizes.index(None)} of the region's {dom}"
    outs: list[str] = []
    last = max((values[e.invars[0].id].stage for e in eqns if e.primitive.name in REDUCTIONS),
               default=-1)
    for v in outvars or ():
        if isinstance(v, Literal):
            return "a region returning a constant"
        s, m = tuple(v.aval.shape), vmap[v.id]
        if len(s) == nd and all(ax in (k, None) for k, ax in enumerate(m)) and all(
                _eq(a, b) for a, b in zip(s, dom)):
            outs.append("elem")
            last = max(last, values[v.id].stage)
        elif (len(s) in (nd - 1, nd) and not values[v.id].elem
              and all(ax in (k, None) for k, ax in enumerate(m))
              and all(_eq(a, b) for a, b in zip(s, dom[:-1]))
              and (len(s) == nd - 1 or _is_one(s[-1]))):
            outs.append("row")
        else:
            return f"an output of shape {v.aval.str_short()} in a region of shape {dom}"
    return dict(domain=dom, inputs=tuple(inputs), values=values, outputs=tuple(outs),
                sizes=tuple(sizes), n_stages=last + 1)


def analyze(body: Graph) -> Region | str:
    """The `Region` of a body as `body_of` gives it, or the reason no kernel is
    generated."""
    if body.constvars:
        return "constants in the body"
    r = analyze_eqns(body.eqns, body.invars, body.outvars)
    return r if isinstance(r, str) else Region(body, **r)


def run_shapes(region: Region, shapes: Sequence[tuple]) -> tuple:
    """At run time, from the inputs' concrete shapes: (rows, cols, per input its 2-D view's
    shape and its row map (div, mod), per output its shape)."""
    dom = tuple(s if type(s) is int else shapes[s[0]][s[1]] for s in region.sizes)
    nd = len(dom)
    rows = int(np.prod(dom[:-1], dtype=np.int64)) if nd > 1 else 1
    views = []
    for inp in region.inputs:
        if inp.kind == "scalar":
            views.append(None)
            continue
        cols = dom[-1] if inp.kind == "elem" else 1
        a, b = inp.lead if inp.lead else (0, 0)
        mod = int(np.prod(dom[a:b], dtype=np.int64)) if inp.lead else 1
        div = int(np.prod(dom[b:nd - 1], dtype=np.int64)) if inp.lead else 1
        views.append(((mod, cols), div, mod))
    outs = []
    for kind, v in zip(region.outputs, region.body.outvars):
        if kind == "elem":
            outs.append(dom)
        else:
            outs.append(dom[:-1] + ((1,) if v.aval.ndim == nd else ()))
    return rows, dom[-1], tuple(views), tuple(outs)


def check_against_float64(fn: Callable, body: Graph, avals, seed: int = 0) -> str | None:
    """Run `fn` (NumPy arrays in, list out) on random inputs of `avals` (concrete) and compare
    with the float64 evaluation of `body`; None when it agrees (the reason otherwise)."""
    rng = np.random.default_rng(seed)
    xs = []
    for a in avals:
        if a.dtype == np.bool_:
            xs.append(rng.random(a.shape) < 0.7)
        else:
            xs.append(rng.uniform(-2, 2, a.shape).astype(a.dtype))
    try:
        got = fn(*xs)
    except Exception as e:  # noqa: BLE001 - a kernel that fails is declined, with why
        return f"raised {type(e).__name__}: {e}"
    got = got if isinstance(got, (list, tuple)) else [got]
    with np.errstate(all="ignore"):
        want = reference_loop(body, [x.astype(np.float64) if x.dtype.kind == "f" else x
                                     for x in xs])
    for g, w, v in zip(got, want, body.outvars):
        g = np.asarray(g)
        if g.shape != tuple(v.aval.shape) or g.dtype != v.aval.dtype:
            return f"returned {g.dtype}{list(g.shape)}, not {v.aval.str_short()}"
        w = np.asarray(w)
        if g.dtype == np.bool_:
            ok = (g == w).mean() > 0.99
        else:
            eps = 1e-4 if g.dtype == np.float32 else 1e-9
            fin = np.isfinite(w)
            scale = max(1.0, float(np.abs(w[fin]).max())) if fin.any() else 1.0
            ok = (np.array_equal(np.isfinite(g), fin)
                  and float(np.abs(g[fin] - w[fin]).max(initial=0)) <= eps * scale)
        if not ok:
            return "disagrees with the float64 reference"
    return None

