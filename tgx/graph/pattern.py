"""Sub-graph pattern matching and rewriting, with patterns written as plain traced Python.

A pattern is a `Graph` (or a function plus example `Spec`s, traced with `make_graph`). It
matches a set of equations of the graph when, walking back from the pattern's outputs:

- every pattern equation maps to a distinct graph equation with the same primitive, and params
  and output avals that unify (symbolic dims of the pattern bind consistently to the graph's
  dims; concrete dims and other params must be equal);
- commutative primitives match in either operand order;
- a pattern input matches any graph value of the same dtype and rank whose shape unifies; the
  same pattern input always maps to the same graph value;
- pattern literals match graph literals of equal value and dtype (a pattern's `dim_as_value[D]`
  also matches the literal count when `D` is concrete in the graph, so `mean` over a symbolic
  axis matches `mean` over a concrete one);
- values computed inside the occurrence, other than the pattern's outputs, are used nowhere
  else (otherwise the occurrence could not be replaced) and are not graph outputs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import sympy

from ..core import Eqn, Graph, Literal, Params, Var
from ..errors import SymbolicShapeError, TgxError
from ..shapes import ShapedArray, as_dim, dim_eq
from ..tracing import GraphBuilder, make_graph, tree_flatten
from ..transforms.decompose import decompose
from ..transforms.simplify import dead_code_elimination
from .hashing import structural_hash


@dataclass
class Match:
    """One occurrence of a pattern: the graph equations it covers (indices, in graph order), the
    graph values bound to the pattern's inputs and outputs, and the binding of its dims."""

    eqns: tuple
    inputs: tuple
    outputs: tuple
    dims: dict = field(default_factory=dict)

    @property
    def root(self) -> int:
        """Index of the last equation of the occurrence (where a replacement is emitted)."""
        return self.eqns[-1]


def as_pattern(pattern: Graph | Callable, specs: tuple = (), graph: Graph | None = None) -> Graph:
    """The pattern as a graph without dead equations. Composite primitives of the pattern that
    `graph` does not contain are decomposed, so a pattern written with `tnp.mean` matches a
    decomposed graph."""
    if isinstance(pattern, Graph):
        g = pattern
    else:
        if not specs:
            raise TgxError("a pattern given as a function needs example Specs for its inputs, "
                           "e.g. find_pattern(g, fn, tgx.Spec(('N', 'D')))")
        g = make_graph(pattern)(*specs)

    if graph is not None:
        present = {e.primitive.name for e in graph.eqns}
        if any(not e.primitive.atomic and e.primitive.name not in present for e in g.eqns):
            # a kernel's pattern is matched against every graph the planner solves: it is
            # decomposed once per set of composites kept (only they change the result)
            key = (id(g), frozenset(e.primitive.name for e in graph.eqns
                                    if not e.primitive.atomic))
            hit = _DECOMPOSED.get(key)
            if hit is None or hit[0] is not g:
                hit = _DECOMPOSED[key] = (g, dead_code_elimination(decompose(g, keep=present)))
            return hit[1]
    return dead_code_elimination(g)


#: (id(pattern), the graph's composites) -> (pattern, the pattern decomposed keeping them);
#: the pattern is held so that its id is not reused while the entry lives
_DECOMPOSED: dict = {}


# ---------------------------------------------------------------------------------------------
# Unification of dims and params


def _dims_equal(a: Any, b: Any) -> bool:
    try:
        return dim_eq(as_dim(a), as_dim(b))
    except (SymbolicShapeError, TgxError, TypeError):
        return False


def _unify_dim(pd: Any, gd: Any, dims: dict) -> dict | None:
    if not isinstance(pd, sympy.Basic):
        return dims if _dims_equal(pd, gd) else None
    if isinstance(pd, sympy.Symbol):
        if pd in dims:
            return dims if _dims_equal(dims[pd], gd) else None
        return {**dims, pd: gd}
    unknown = [s for s in pd.free_symbols if s not in dims]
    if not unknown:
        return dims if _dims_equal(pd.xreplace(dims), gd) else None
    if len(unknown) == 1:  # e.g. 2*N against 128: solve for N
        s = unknown[0]
        sols = sympy.solve(sympy.Eq(pd.xreplace(dims), sympy.sympify(gd)), s)
        if len(sols) == 1:
            return {**dims, s: as_dim(sols[0])}
    return None


#: prefix of the symbols standing for a wildcard param (`param_wildcards`)
WILDCARD = "param:"


def param_wildcards(pattern: Graph, names) -> Graph:
    """`pattern` with the params called `names` (e.g. "eps") matching any value: the
    value an occurrence has is in its `Match.dims` under ``Symbol("param:eps")`` (see
    `match_params`), so one kernel serves every value (it receives it as a keyword).

    >>> import tgx, tgx.nn as tnn
    >>> p = tgx.make_graph(lambda x: tnn.rms_norm(x, (8,), eps=1e-6))(tgx.Spec((2, 8)))
    >>> g = tgx.make_graph(lambda x: tnn.rms_norm(x, (8,), eps=1e-5))(tgx.Spec((2, 8)))
    >>> [match_params(m) for m in find_pattern(g, param_wildcards(p, ["eps"]))]
    [{'eps': 1e-05}]
    """
    names = set(names)
    eqns = []
    for e in pattern.eqns:
        if names & set(e.params):
            params = {k: sympy.Symbol(WILDCARD + k) if k in names else v
                      for k, v in e.params.items()}
            e = Eqn(e.primitive, e.invars, e.outvars, Params(params), e.source_info)
        eqns.append(e)
    return Graph(pattern.constvars, pattern.consts, pattern.invars, pattern.outvars, eqns,
                 pattern.in_tree, pattern.out_tree)


def match_params(match: Match) -> dict:
    """The values an occurrence binds to the pattern's wildcard params, by param name."""
    return {k.name[len(WILDCARD):]: v for k, v in match.dims.items()
            if isinstance(k, sympy.Symbol) and k.name.startswith(WILDCARD)}


def _unify_value(p: Any, g: Any, dims: dict) -> dict | None:
    if isinstance(p, sympy.Symbol) and p.name.startswith(WILDCARD):  # any value, the same
        if p in dims:                                                # one each time
            return dims if type(dims[p]) is type(g) and dims[p] == g else None
        return {**dims, p: g}
    if isinstance(p, tuple):
        if not isinstance(g, tuple) or len(p) != len(g):
            return None
        for a, b in zip(p, g):
            dims = _unify_value(a, b, dims)
            if dims is None:
                return None
        return dims
    if isinstance(p, sympy.Basic) or (isinstance(g, sympy.Basic) and isinstance(p, int)):
        return _unify_dim(p, g, dims)
    if isinstance(p, Graph) or isinstance(g, Graph):
        ok = isinstance(p, Graph) and isinstance(g, Graph) and \
            structural_hash(p) == structural_hash(g)
        return dims if ok else None
    if type(p) is not type(g):
        return None
    return dims if p == g else None


def _unify_aval(p: ShapedArray, g: ShapedArray, dims: dict) -> dict | None:
    if p.dtype != g.dtype or len(p.shape) != len(g.shape):
        return None
    for a, b in zip(p.shape, g.shape):
        dims = _unify_dim(a, b, dims)
        if dims is None:
            return None
    return dims


def _literal_value(x: Literal):
    v = x.val
    return v.item() if isinstance(v, (np.generic, np.ndarray)) else v


def _literals_equal(p: Literal, g: Literal) -> bool:
    if p.aval.dtype != g.aval.dtype:
        return False
    a, b = _literal_value(p), _literal_value(g)
    return a == b or (a != a and b != b)  # NaN matches NaN


# ---------------------------------------------------------------------------------------------
# The matcher


class _Index:
    """Producers and users of every value of a graph."""

    def __init__(self, graph: Graph):
        self.graph = graph
        self.producer: dict[int, tuple[int, int]] = {}
        self.users: dict[int, list[int]] = {}
        self.by_prim: dict[str, list[int]] = {}
        for i, e in enumerate(graph.eqns):
            self.by_prim.setdefault(e.primitive.name, []).append(i)
            for k, v in enumerate(e.outvars):
                self.producer[v.id] = (i, k)
            for x in e.invars:
                if isinstance(x, Var):
                    self.users.setdefault(x.id, []).append(i)
        self.outputs = {v.id for v in graph.outvars if isinstance(v, Var)}
        self.consts = {v.id: c for v, c in zip(graph.constvars, graph.consts)}


@dataclass(frozen=True)
class _State:
    vmap: dict  # pattern var id -> graph atom
    emap: dict  # pattern eqn index -> graph eqn index
    dims: dict

    def bind(self, **kw) -> _State:
        return _State(kw.get("vmap", self.vmap), kw.get("emap", self.emap),
                      kw.get("dims", self.dims))


def _same_atom(a, b) -> bool:
    if isinstance(a, Var) or isinstance(b, Var):
        return a is b
    return _literals_equal(a, b)


class _Matcher:
    def __init__(self, pattern: Graph, graph: Graph, index: _Index | None = None):
        self.p = _Index(pattern)
        self.g = index or _Index(graph)
        self.pinputs = {v.id for v in pattern.invars}

    def atom(self, p, g, st: _State) -> Iterator[_State]:
        pg = self.p.graph
        if isinstance(p, Literal):
            if isinstance(g, Literal) and _literals_equal(p, g):
                yield st
            return
        if p.id in st.vmap:
            if _same_atom(st.vmap[p.id], g):
                yield st
            return
        if p.id in self.p.consts:
            c = self.g.consts.get(g.id) if isinstance(g, Var) else None
            if c is not None and np.array_equal(np.asarray(c), np.asarray(self.p.consts[p.id])) \
                    and np.asarray(c).dtype == np.asarray(self.p.consts[p.id]).dtype:
                yield st.bind(vmap={**st.vmap, p.id: g})
            return
        if p.id in self.pinputs:
            dims = _unify_aval(p.aval, g.aval, st.dims)
            if dims is not None:
                yield st.bind(vmap={**st.vmap, p.id: g}, dims=dims)
            return
        pi, pk = self.p.producer[p.id]
        pe = pg.eqns[pi]
        if isinstance(g, Literal):
            # A symbolic count in the pattern against a concrete count in the graph.
            if pe.primitive.name == "dim_as_value" and g.aval.dtype == p.aval.dtype:
                val = _literal_value(g)
                if float(val).is_integer() and val > 0:
                    dims = _unify_dim(pe.params["expr"], int(val), st.dims)
                    if dims is not None:  # covered, by no graph equation
                        yield st.bind(vmap={**st.vmap, p.id: g}, dims=dims,
                                      emap={**st.emap, pi: None})
            return
        if g.id not in self.g.producer:
            return
        gi, gk = self.g.producer[g.id]
        ge = self.g.graph.eqns[gi]
        if gk != pk or gi in st.emap.values() or ge.primitive is not pe.primitive \
                or len(ge.invars) != len(pe.invars) or len(ge.outvars) != len(pe.outvars) \
                or set(ge.params) != set(pe.params):
            return
        dims = st.dims
        for k in pe.params:
            dims = _unify_value(pe.params[k], ge.params[k], dims)
            if dims is None:
                return
        for pv, gv in zip(pe.outvars, ge.outvars):
            dims = _unify_aval(pv.aval, gv.aval, dims)
            if dims is None:
                return
        vmap = {**st.vmap, **{pv.id: gv for pv, gv in zip(pe.outvars, ge.outvars)}}
        st2 = _State(vmap, {**st.emap, pi: gi}, dims)
        orders = [ge.invars]
        if pe.primitive.commutative and len(ge.invars) == 2:
            orders.append(ge.invars[::-1])
        for gins in orders:
            yield from self.seq(pe.invars, gins, st2)

    def seq(self, ps, gs, st: _State) -> Iterator[_State]:
        if not ps:
            yield st
            return
        for st2 in self.atom(ps[0], gs[0], st):
            yield from self.seq(ps[1:], gs[1:], st2)

    def outputs(self, pouts, st: _State) -> Iterator[_State]:
        if not pouts:
            yield st
            return
        p = pouts[0]
        if isinstance(p, Literal) or p.id in st.vmap or p.id in self.pinputs:
            yield from self.outputs(pouts[1:], st)
            return
        pi, pk = self.p.producer[p.id]
        for gi in self.g.by_prim.get(self.p.graph.eqns[pi].primitive.name, ()):
            ge = self.g.graph.eqns[gi]
            if pk < len(ge.outvars):
                for st2 in self.atom(p, ge.outvars[pk], st):
                    yield from self.outputs(pouts[1:], st2)

    def valid(self, st: _State) -> Match | None:
        pg, gg = self.p.graph, self.g.graph
        if len(st.emap) != len(pg.eqns):
            return None
        matched = {gi for gi in st.emap.values() if gi is not None}
        out_ids = {v.id for v in pg.outvars if isinstance(v, Var)}
        root = max(matched)
        for pi, gi in st.emap.items():
            if gi is None:
                continue
            for pv, gv in zip(pg.eqns[pi].outvars, gg.eqns[gi].outvars):
                users = self.g.users.get(gv.id, ())
                if pv.id in out_ids:
                    # Outside users must come after the root, where the replacement goes.
                    if any(u not in matched and u < root for u in users):
                        return None
                    continue
                if gv.id in self.g.outputs or any(u not in matched for u in users):
                    return None
        inputs = tuple(st.vmap.get(v.id) for v in pg.invars)
        for x in inputs:
            if isinstance(x, Var) and self.g.producer.get(x.id, (-1,))[0] in matched:
                return None
        outputs = tuple(x if isinstance(x, Literal) else st.vmap[x.id] for x in pg.outvars)
        return Match(tuple(sorted(matched)), inputs, outputs, dict(st.dims))


def find_pattern(graph: Graph, pattern: Graph | Callable, *specs) -> list[Match]:
    """Every occurrence of `pattern` in `graph` (possibly overlapping), in graph order.

    >>> import tgx, tgx.numpy as tnp
    >>> g = tgx.make_graph(lambda x, y, z: tnp.exp((x + y) * z))(*[tgx.Spec((4,))] * 3)
    >>> ms = tgx.find_pattern(g, lambda a, b, c: c * (b + a), *[tgx.Spec(("N",))] * 3)
    >>> [m.eqns for m in ms]
    [(0, 1)]
    """
    pat = as_pattern(pattern, specs, graph)
    if not pat.eqns:
        raise TgxError("a pattern needs at least one equation")
    m = _Matcher(pat, graph)
    seen = set()
    found = []
    for st in m.outputs(list(pat.outvars), _State({}, {}, {})):
        match = m.valid(st)
        if match is None:
            continue
        key = match.eqns  # commutative symmetries give the same occurrence twice
        if key not in seen:
            seen.add(key)
            found.append(match)
    found.sort(key=lambda mt: (mt.root, mt.eqns))
    return found


def _non_overlapping(matches: list[Match]) -> list[Match]:
    taken: set[int] = set()
    chosen = []
    for mt in matches:
        if taken.isdisjoint(mt.eqns):
            taken.update(mt.eqns)
            chosen.append(mt)
    return chosen


def replace_pattern(graph: Graph, pattern: Graph | Callable, replacement: Callable,
                    *specs) -> Graph:
    """A new graph with every non-overlapping occurrence of `pattern` replaced by what
    `replacement(*inputs)` computes (traced on the matched values, as torch.fx's rewriter).

    >>> import tgx, tgx.numpy as tnp
    >>> g = tgx.make_graph(lambda x: tnp.exp(x) * 2.0)(tgx.Spec(("N",)))
    >>> g2 = tgx.replace_pattern(g, lambda a: a * 2.0, lambda a: a + a, tgx.Spec(("N",)))
    >>> [e.primitive.name for e in g2.eqns]
    ['exp', 'add']
    """
    pat = as_pattern(pattern, specs, graph)
    matches = _non_overlapping(find_pattern(graph, pat))
    at_root = {mt.root: mt for mt in matches}
    skip = {i for mt in matches for i in mt.eqns}

    with GraphBuilder() as b:
        args = [b.new_arg(v.aval, v.hint) for v in graph.invars]
        env: dict[int, Any] = {v.id: a for v, a in zip(graph.invars, args)}
        for v, c in zip(graph.constvars, graph.consts):
            env[v.id] = c

        def read(x):
            if isinstance(x, Literal):
                return np.asarray(x.val, dtype=x.aval.dtype)[()]
            return env[x.id]

        for i, e in enumerate(graph.eqns):
            saved = b.source_override
            b.source_override = e.source_info or saved
            try:
                if i in at_root:
                    mt = at_root[i]
                    outs, _ = tree_flatten(replacement(*[read(x) for x in mt.inputs]))
                    if len(outs) != len(mt.outputs):
                        raise TgxError(f"replacement returns {len(outs)} values, the pattern "
                                       f"has {len(mt.outputs)} outputs")
                    for v, o in zip(mt.outputs, outs):
                        if isinstance(v, Var):
                            env[v.id] = o
                elif i not in skip:
                    outs = e.primitive.bind(*[read(x) for x in e.invars], **e.params)
                    outs = outs if e.primitive.multiple_results else [outs]
                    for v, o in zip(e.outvars, outs):
                        env[v.id] = o
            finally:
                b.source_override = saved
        outs = [x if isinstance(x, Literal) else read(x) for x in graph.outvars]
        return b.build([a.variable for a in args], outs, graph.in_tree, graph.out_tree)
