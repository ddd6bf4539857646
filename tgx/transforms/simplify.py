"""`simplify`: peephole rewrites written as data, run to a fixed point.

A rule is `Rule(name, match, fn)`: `match` is a primitive name, a set of names or a predicate on
the equation; `fn(eqn, ins, ctx)` returns the replacement outputs (values of the new graph) or
None for "no change". Rules compose into a `PatternMatcher` with `+`, and `PASSES` is the
pipeline as a table of named matchers:

- `reshape_folding`: reshape of reshape is one reshape;
- `identity_elimination`: reshape/transpose/convert/copy/broadcast that do nothing;
- `transpose_folding`: transpose of transpose is one transpose (or nothing), transposes of
  dot_general operands fold into its dimension numbers when the free axes keep their order,
  and a transpose swapping a dot_general's two groups of free axes (its only use) is the
  product with its operands swapped (a weight gradient `(dy.T @ x).T` is `x.T @ dy`);
- `constant_folding`: equations on constants only are evaluated with the NumPy reference when
  the result is small; `x*1`, `x/1`, `x+0`, `x-0` become `x` when the result's shape and dtype
  are those of `x` (broadcasting respected);
- `cse`: equal equations on equal inputs (commutative operands in either order) are computed
  once;
- `dce`: equations whose results are unused are dropped (every primitive is pure).

IEEE safety: `0*x` is not `0` when `x` is inf or NaN, so it is folded to zeros (with the
broadcast shape and dtype) only with `simplify(g, unsafe_math=True)`. `x+0 → x` is kept by
default: it only changes the sign of a zero (`-0.0 + 0.0 == +0.0`), which compares equal.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .. import numpy as tnp
from ..core import Eqn, Graph, Literal, Var, pp_eqn
from ..errors import TgxError
from ..graph.hashing import literal_key
from ..primitives import dot_general_p, transpose_p
from ..shapes import aval_of, is_concrete_shape, math_prod, shapes_equal
from ..tracing import GraphBuilder, Tracer
from .rewrite import rebind

MAX_FOLD_ELEMENTS = 1024  # larger constants stay as equations (graphs stay small)


# ---------------------------------------------------------------------------------------------
# Rules and matchers as data


@dataclass(frozen=True)
class Rule:
    name: str
    match: str | frozenset | Callable[[Eqn], bool]
    fn: Callable

    def matches(self, eqn: Eqn) -> bool:
        m = self.match
        if isinstance(m, str):
            return eqn.primitive.name == m
        if isinstance(m, frozenset):
            return eqn.primitive.name in m
        return bool(m(eqn))


@dataclass(frozen=True)
class PatternMatcher:
    """An ordered list of rules; `a + b` tries a's rules, then b's."""

    name: str
    rules: tuple

    def __add__(self, other: PatternMatcher) -> PatternMatcher:
        return PatternMatcher(f"{self.name}+{other.name}", self.rules + other.rules)


@dataclass
class Change:
    """One rewrite: which rule, the equation before, what replaced it, the user's line."""

    rule: str
    before: str
    after: str
    source: Any = None

    def __str__(self) -> str:
        at = f"  ({self.source})" if self.source is not None else ""
        return f"[{self.rule}] {self.before}  =>  {self.after}{at}"


@dataclass
class Report:
    changes: list = field(default_factory=list)
    iterations: int = 0

    def by_rule(self) -> dict:
        out: dict = {}
        for c in self.changes:
            out[c.rule] = out.get(c.rule, 0) + 1
        return out

    def __str__(self) -> str:
        return "\n".join(str(c) for c in self.changes) or "(no changes)"


class Ctx:
    """What a rule may ask about the new graph being built: producers and constant values."""

    def __init__(self, builder: GraphBuilder, unsafe_math: bool):
        self.builder = builder
        self.unsafe_math = unsafe_math
        self._producers: dict[int, Eqn] = {}
        self._seen = 0
        self.cse: dict = {}
        #: variable id of the graph being rewritten -> how many equations and outputs read it
        self.uses: dict[int, int] = {}

    def producer(self, x) -> Eqn | None:
        if not isinstance(x, Tracer):
            return None
        eqns = self.builder.eqns
        for e in eqns[self._seen:]:
            for v in e.outvars:
                self._producers[v.id] = e
        self._seen = len(eqns)
        return self._producers.get(x.variable.id)

    def const(self, x) -> np.ndarray | None:
        """The value of `x` when it is a literal or a constant of the graph, else None."""
        if isinstance(x, Literal):
            return np.asarray(x.val, dtype=x.aval.dtype)
        if isinstance(x, (np.ndarray, np.generic)):
            return np.asarray(x)
        if isinstance(x, Tracer):
            for v, c in zip(self.builder.constvars, self.builder.consts):
                if v is x.variable:
                    return np.asarray(c)
        return None


def _aval(x):
    if isinstance(x, (Tracer, Literal)):
        return x.aval

    return aval_of(x)


def _same_aval(a, b) -> bool:
    """Same dtype and provably the same shape (undecidable symbolic comparisons say no)."""
    try:
        return a.dtype == b.dtype and shapes_equal(a.shape, b.shape)
    except TgxError:
        return False


# ---------------------------------------------------------------------------------------------
# Rules


def _reshape_of_reshape(eqn, ins, ctx):
    p = ctx.producer(ins[0])
    if p is not None and p.primitive.name == "reshape":
        src = _tracer_of(ctx, p.invars[0])
        if _same_aval(_aval(src), eqn.outvars[0].aval):
            return [src]
        return rebind(eqn, [src])
    return None


def _tracer_of(ctx: Ctx, atom):
    return atom if isinstance(atom, Literal) else Tracer(ctx.builder, atom)


def _identity(eqn, ins, ctx):
    name = eqn.primitive.name
    x = ins[0]
    rank = len(_aval(x).shape)
    if not _same_aval(_aval(x), eqn.outvars[0].aval):
        return None
    if name == "transpose" and tuple(eqn.params["permutation"]) != tuple(range(rank)):
        return None
    if name == "broadcast_in_dim" and \
            tuple(eqn.params["broadcast_dimensions"]) != tuple(range(rank)):
        return None
    if isinstance(x, Literal):
        return None  # an output cannot be a bare literal of the new graph in every case
    return [x]


def _transpose_of_transpose(eqn, ins, ctx):
    p = ctx.producer(ins[0])
    if p is None or p.primitive.name != "transpose":
        return None
    inner, outer = p.params["permutation"], eqn.params["permutation"]
    perm = tuple(inner[i] for i in outer)
    src = _tracer_of(ctx, p.invars[0])
    if perm == tuple(range(len(perm))):
        return [src]

    return [transpose_p.bind(src, permutation=perm)]


def _fold_transpose_into_dot(eqn, ins, ctx):
    (lc, rc), (lb, rb) = eqn.params["dimension_numbers"]
    new_ins, dims = list(ins), [[lc, lb], [rc, rb]]
    changed = False
    for side in (0, 1):
        p = ctx.producer(ins[side])
        if p is None or p.primitive.name != "transpose":
            continue
        perm = p.params["permutation"]
        c, b = dims[side]
        free = [i for i in range(len(perm)) if i not in c and i not in b]
        if [perm[i] for i in free] != sorted(perm[i] for i in free):
            continue  # the output's axis order would change
        dims[side] = [tuple(perm[i] for i in c), tuple(perm[i] for i in b)]
        new_ins[side] = _tracer_of(ctx, p.invars[0])
        changed = True
    if not changed:
        return None

    dn = ((dims[0][0], dims[1][0]), (dims[0][1], dims[1][1]))
    return [dot_general_p.bind(*new_ins, dimension_numbers=dn)]


def _dot_general_swapped(eqn, ins, ctx):
    """transpose(dot_general(a, b)) -> dot_general(b, a) where the permutation keeps the
    batch axes and swaps the two groups of free axes, the product read by nothing else:
    the result comes out in the wanted layout instead of a strided copy of it."""
    x = eqn.invars[0]
    p = ctx.producer(ins[0])
    if p is None or p.primitive.name != "dot_general" or ctx.uses.get(x.id, 0) != 1:
        return None
    (lc, rc), (lb, rb) = p.params["dimension_numbers"]
    nb = len(lb)
    nl = p.invars[0].aval.ndim - len(lc) - nb
    nr = p.invars[1].aval.ndim - len(rc) - nb
    swap = (*range(nb), *range(nb + nl, nb + nl + nr), *range(nb, nb + nl))
    if tuple(eqn.params["permutation"]) != swap:
        return None
    a, b = (_tracer_of(ctx, v) for v in p.invars)
    return [dot_general_p.bind(b, a, dimension_numbers=((rc, lc), (rb, lb)))]


def _small(aval) -> bool:
    return is_concrete_shape(aval.shape) and math_prod(aval.shape) <= MAX_FOLD_ELEMENTS


def _constant_fold(eqn, ins, ctx):
    if "graph" in eqn.params or not all(_small(v.aval) for v in eqn.outvars):
        return None
    if not eqn.invars and eqn.primitive.name not in ("iota", "dim_as_value"):
        return None
    if eqn.primitive.name == "dim_as_value" and not isinstance(eqn.params["expr"], int):
        return None
    vals = [ctx.const(x) for x in ins]
    if any(v is None for v in vals):
        return None
    with np.errstate(all="ignore"):
        outs = eqn.primitive.impl(*vals, **eqn.params)
    outs = outs if eqn.primitive.multiple_results else [outs]
    return [np.asarray(o, dtype=v.aval.dtype) for o, v in zip(outs, eqn.outvars)]


def _is_all(ctx: Ctx, x, value) -> bool:
    c = ctx.const(x)
    return c is not None and c.size > 0 and bool(np.all(c == value))


def _algebraic(eqn, ins, ctx):
    name = eqn.primitive.name
    out = eqn.outvars[0].aval
    x, y = ins
    if name in ("mul", "add"):
        unit = 1 if name == "mul" else 0
        for a, b in ((x, y), (y, x)):
            if _is_all(ctx, b, unit) and _same_aval(_aval(a), out) and not isinstance(a, Literal):
                return [a]
    if name in ("div", "sub"):
        unit = 1 if name == "div" else 0
        if _is_all(ctx, y, unit) and _same_aval(_aval(x), out) and not isinstance(x, Literal):
            return [x]
    if name == "mul" and ctx.unsafe_math:
        for b in (x, y):
            if _is_all(ctx, b, 0):
                return [tnp.zeros(out.shape, out.dtype)]
    return None


def _cse_key(eqn: Eqn, ins: list):
    keys = []
    for x in ins:
        if isinstance(x, Tracer):
            keys.append(("v", x.variable.id))
        elif isinstance(x, Literal):
            keys.append(("l", literal_key(x)))
        else:
            return None  # raw constants: not worth keying
    if eqn.primitive.commutative:
        keys.sort()
    try:
        hash(eqn.params)
    except TypeError:
        return None
    return (eqn.primitive.name, eqn.params, tuple(keys))


def _cse(eqn, ins, ctx):
    key = _cse_key(eqn, ins)
    if key is None:
        return None
    hit = ctx.cse.get(key)
    if hit is not None:
        return list(hit)
    ctx.cse[key] = None  # filled in by the loop once the equation is emitted
    ctx.cse_pending = key
    return None


def _is_cse_candidate(eqn: Eqn) -> bool:
    return True


R = Rule
reshape_folding = PatternMatcher("reshape_folding", (R("reshape_of_reshape", "reshape",
                                                        _reshape_of_reshape),))
identity_elimination = PatternMatcher("identity_elimination", (R(
    "identity", frozenset({"reshape", "transpose", "convert_element_type", "copy",
                           "broadcast_in_dim"}), _identity),))
transpose_folding = PatternMatcher("transpose_folding", (
    R("transpose_of_transpose", "transpose", _transpose_of_transpose),
    R("dot_general_swapped", "transpose", _dot_general_swapped),
    R("transpose_into_dot_general", "dot_general", _fold_transpose_into_dot)))
constant_folding = PatternMatcher("constant_folding", (
    R("fold_constants", lambda e: True, _constant_fold),
    R("algebraic_identity", frozenset({"mul", "add", "sub", "div"}), _algebraic)))
cse = PatternMatcher("cse", (R("cse", _is_cse_candidate, _cse),))

PASSES = identity_elimination + reshape_folding + transpose_folding + constant_folding + cse


# ---------------------------------------------------------------------------------------------
# The driver


def _sweep(graph: Graph, matcher: PatternMatcher, unsafe_math: bool, report: Report) -> Graph:
    with GraphBuilder() as b:
        ctx = Ctx(b, unsafe_math)
        for eqn in graph.eqns:
            for x in eqn.invars:
                if not isinstance(x, Literal):
                    ctx.uses[x.id] = ctx.uses.get(x.id, 0) + 1
        for x in graph.outvars:
            if not isinstance(x, Literal):
                ctx.uses[x.id] = ctx.uses.get(x.id, 0) + 1
        args = [b.new_arg(v.aval, v.hint) for v in graph.invars]
        env: dict[int, Any] = {v.id: a for v, a in zip(graph.invars, args)}
        for v, c in zip(graph.constvars, graph.consts):
            env[v.id] = _const_tracer(b, c)

        def read(x):
            return x if isinstance(x, Literal) else env[x.id]

        for eqn in graph.eqns:
            ins = [read(x) for x in eqn.invars]
            saved = b.source_override
            b.source_override = eqn.source_info or saved
            try:
                outs, fired = None, None
                ctx.cse_pending = None
                for rule in matcher.rules:
                    if rule.matches(eqn):
                        outs = rule.fn(eqn, ins, ctx)
                        if outs is not None:
                            fired = rule.name
                            break
                pending = ctx.cse_pending
                if outs is None:
                    outs = rebind(eqn, ins)
                    if pending is not None:
                        ctx.cse[pending] = outs
                else:
                    if pending is not None:
                        ctx.cse.pop(pending, None)
                    outs = [_const_tracer(b, o) if isinstance(o, np.ndarray) else o for o in outs]
                    report.changes.append(Change(fired, pp_eqn(eqn), _describe(outs, ctx),
                                                 eqn.source_info))
            finally:
                b.source_override = saved
            for v, o in zip(eqn.outvars, outs):
                env[v.id] = o
        return b.build([a.variable for a in args], [read(v) for v in graph.outvars],
                       graph.in_tree, graph.out_tree)


def _const_tracer(b: GraphBuilder, c):
    c = np.asarray(c)
    atom = b.to_atom(c)
    return atom if isinstance(atom, Literal) else Tracer(b, atom)


def _describe(outs, ctx: Ctx) -> str:
    parts = []
    for o in outs:
        e = ctx.producer(o)
        if isinstance(o, Literal):
            parts.append(repr(o))
        elif e is not None and e is ctx.builder.eqns[-1]:
            parts.append(pp_eqn(e))
        elif isinstance(o, Tracer):
            parts.append(f"existing value {o.aval.str_short()}")
        else:
            parts.append(repr(o))
    return "; ".join(parts)


def dead_code_elimination(graph: Graph, report: Report | None = None) -> Graph:
    """Drop equations none of whose results is used (and constants nobody reads)."""
    live = {v.id for v in graph.outvars if isinstance(v, Var)}
    keep = []
    for e in reversed(graph.eqns):
        if any(v.id in live for v in e.outvars):
            keep.append(e)
            live.update(x.id for x in e.invars if isinstance(x, Var))
        elif report is not None:
            report.changes.append(Change("dce", pp_eqn(e), "(removed)", e.source_info))
    keep.reverse()
    consts = [(v, c) for v, c in zip(graph.constvars, graph.consts) if v.id in live]
    if len(keep) == len(graph.eqns) and len(consts) == len(graph.constvars):
        return graph
    return graph.replace(eqns=tuple(keep), constvars=tuple(v for v, _ in consts),
                         consts=tuple(c for _, c in consts))


def simplify(graph: Graph, trace: bool = False, *, unsafe_math: bool = False,
             passes: PatternMatcher = PASSES, max_iterations: int = 20):
    """Run the rewrite rules and dead code elimination until nothing changes.

    With `trace=True`, returns `(graph, report)`; the report lists every change (rule name,
    equation before, what replaced it, the user's line).

    >>> import tgx, tgx.numpy as tnp
    >>> g = tgx.make_graph(lambda x: tnp.transpose(tnp.transpose(x)) * 1.0)(tgx.Spec((2, 3)))
    >>> print(tgx.simplify(g))
    { lambda ; a:f32[2,3]. let
    <BLANKLINE>
      in (a) }
    """
    report = Report()
    g = dead_code_elimination(graph, report)
    for it in range(max_iterations):
        before = len(report.changes)
        g = _sweep(g, passes, unsafe_math, report)
        g = dead_code_elimination(g, report)
        report.iterations = it + 1
        if len(report.changes) == before:
            break
    return (g, report) if trace else g
