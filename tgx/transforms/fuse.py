"""`fuse`: group connected regions of elementwise equations (plus trailing reductions) into
`fused` equations whose body is the region's sub-graph.

Regions grow greedily in graph order: an elementwise equation joins the regions of the
elementwise producers of its operands, and a reduction joins the region producing its operand
as a trailing member (nothing in the region may consume a reduction's result). A merge that
would create a cycle between regions (a path leaving the region and coming back) is refused.
Regions of a single equation stay as they are.

With `rows=True` (the compile pipeline's fuse stage) regions are *row regions*: a reduction
over the last axis may be read by later members (RMSNorm's sum of squares, softmax's
maximum and sum are then one region with the ops around them), and a reshape adding or
removing a trailing unit dim (a reduction's `keepdims`) is a member too, so is a
`broadcast_in_dim` (a literal widened by a decomposition), and so are `mean`,
`var`, `std` and `logsumexp` over the last axis (kept whole in the body). `accept(eqns)`
may refuse a merge: a region then grows only as far as its predicate allows (the fuse stage
passes what its code generators support).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ..core import Eqn, Graph, Literal, Var, free_inputs
from ..graph.canonical import priority_toposort
from ..primitives import fused as _fused  # noqa: F401 - registers the `fused` primitive
from ..primitives.fused import fused_p
from ..tracing import GraphBuilder
from .rewrite import rebind

REDUCTIONS = frozenset({"reduce_sum", "reduce_max", "reduce_min", "reduce_prod", "argmax"})
#: composite reductions that row regions take whole when over the last axis (a hand-written
#: RMSNorm's `mean(x * x)`, a layer norm's `var`): the body keeps them, a generator
#: decomposes it
ROW_COMPOSITES = frozenset({"mean", "var", "std", "logsumexp"})


def _fusible(e: Eqn, rows: bool = False) -> bool:
    if rows and e.primitive.name == "reshape":  # keepdims: a trailing unit dim in or out
        s, t = tuple(e.invars[0].aval.shape), tuple(e.outvars[0].aval.shape)
        return t == s + (1,) or s == t + (1,)
    if rows and e.primitive.name == "broadcast_in_dim":   # a constant or operand, widened
        return True
    return e.primitive.elementwise and not e.primitive.multiple_results


def _row_reduction(e: Eqn) -> bool:
    """A reduction over the last axis only (its result may stay in a row region)."""
    name = e.primitive.name
    return ((name in REDUCTIONS and name not in ("argmax", "reduce_prod"))
            or name in ROW_COMPOSITES) and tuple(e.params.get("axes", ())) == (
                e.invars[0].aval.ndim - 1,)


class _Regions:
    """Union-find over equation indices, with the set of members per region root."""

    def __init__(self, n: int):
        self.parent = list(range(n))
        self.members = {i: [i] for i in range(n)}
        self.closed: set[int] = set()  # regions whose members include a reduction

    def find(self, i: int) -> int:
        while self.parent[i] != i:
            self.parent[i] = self.parent[self.parent[i]]
            i = self.parent[i]
        return i

    def union(self, a: int, b: int) -> int:
        a, b = self.find(a), self.find(b)
        if a == b:
            return a
        if len(self.members[a]) < len(self.members[b]):
            a, b = b, a
        self.parent[b] = a
        self.members[a] += self.members.pop(b)
        if b in self.closed:
            self.closed.add(a)
        return a


def _regions(graph: Graph, rows: bool = False,
             accept: Callable[[Sequence[Eqn]], bool] | None = None) -> _Regions:
    eqns = graph.eqns
    producer: dict[int, int] = {}
    for i, e in enumerate(eqns):
        for v in e.outvars:
            producer[v.id] = i
    preds = [sorted({producer[x.id] for x in e.invars
                     if isinstance(x, Var) and x.id in producer}) for e in eqns]
    R = _Regions(len(eqns))

    def cycle_through_outside(targets: set[int]) -> bool:
        """Whether a member of `targets` depends on another through an equation outside them."""
        first = min(targets)
        stack = [p for m in targets for p in preds[m] if p not in targets]
        seen: set[int] = set()
        while stack:
            j = stack.pop()
            if j in seen or j < first:
                continue
            seen.add(j)
            for p in preds[j]:
                if p in targets:
                    return True
                stack.append(p)
        return False

    def closes(e: Eqn) -> bool:
        """A reduction whose result leaves its region (every one, except row reductions in
        row regions)."""
        return e.primitive.name in REDUCTIONS and not (rows and _row_reduction(e))

    def reduction(e: Eqn) -> bool:
        return e.primitive.name in REDUCTIONS or (rows and _row_reduction(e))

    for i, e in enumerate(eqns):
        is_red = reduction(e)
        if not (_fusible(e, rows) or is_red):
            continue
        for p in preds[i]:
            if not _fusible(eqns[p], rows) and not reduction(eqns[p]):
                continue
            rp, ri = R.find(p), R.find(i)
            if rp == ri or rp in R.closed or (is_red and closes(e) and ri in R.closed):
                continue
            if closes(eqns[p]):
                continue  # a reduction's result leaves its region
            targets = set(R.members[rp]) | set(R.members[ri])
            if cycle_through_outside(targets):
                continue
            if accept is not None and not accept([eqns[m] for m in sorted(targets)]):
                continue
            r = R.union(rp, ri)
            if is_red and closes(e):
                R.closed.add(r)
    return R


def _body(graph: Graph, members: list[int], used_outside: set[int]) -> tuple[Graph, list, list]:
    """The region as a closed graph: its inputs, outputs (outer atoms) and the body."""
    eqns = [graph.eqns[i] for i in sorted(members)]
    inputs = free_inputs(eqns)
    env: dict[int, Var] = {x.id: Var(x.aval) for x in inputs}
    body_in = [env[x.id] for x in inputs]
    new_eqns = []
    for e in eqns:
        ins = tuple(x if isinstance(x, Literal) else env[x.id] for x in e.invars)
        outs = []
        for v in e.outvars:
            env[v.id] = Var(v.aval)
            outs.append(env[v.id])
        new_eqns.append(Eqn(e.primitive, ins, tuple(outs), e.params, e.source_info))
    outputs = [v for e in eqns for v in e.outvars if v.id in used_outside]
    body = Graph((), (), body_in, [env[v.id] for v in outputs], new_eqns)
    return body, inputs, outputs


def fuse(graph: Graph, *, min_size: int = 2, rows: bool = False,
         accept: Callable[[Sequence[Eqn]], bool] | None = None) -> Graph:
    """A new graph where maximal elementwise regions (plus trailing reductions) are `fused`
    equations; with `rows=True`, row regions (module doc), grown as far as `accept` allows.

    >>> import tgx, tgx.numpy as tnp
    >>> g = tgx.make_graph(lambda x: tnp.sum(tnp.exp(x) * 2.0 + x))(tgx.Spec(("N",)))
    >>> [e.primitive.name for e in tgx.fuse(g).eqns]
    ['fused']
    >>> sm = tgx.make_graph(lambda s: tgx.nn.softmax(s, axis=-1))(tgx.Spec((4, 8)))
    >>> [e.primitive.name for e in tgx.fuse(tgx.decompose(sm), rows=True).eqns]
    ['fused']
    """
    R = _regions(graph, rows, accept)
    eqns = graph.eqns
    roots = {R.find(i) for i in range(len(eqns))}
    regions = {r: sorted(R.members[r]) for r in roots if len(R.members[r]) >= min_size}
    region_of = {i: r for r, ms in regions.items() for i in ms}

    # Values read outside their region (or graph outputs) become region outputs.
    producer = {v.id: i for i, e in enumerate(eqns) for v in e.outvars}
    used_outside: set[int] = {v.id for v in graph.outvars if isinstance(v, Var)}
    for i, e in enumerate(eqns):
        for x in e.invars:
            if isinstance(x, Var) and x.id in producer:
                p = producer[x.id]
                if p in region_of and region_of.get(i) != region_of[p]:
                    used_outside.add(x.id)

    # Condensed graph: nodes are regions (keyed by root) or single equations; topological
    # order with ties broken by the first equation index keeps the graph's own order.
    node_of = {i: ("r", region_of[i]) if i in region_of else ("e", i) for i in range(len(eqns))}
    first = {}
    for i in range(len(eqns)):
        first.setdefault(node_of[i], i)
    deps: dict = {n: set() for n in first}
    for i, e in enumerate(eqns):
        for x in e.invars:
            if isinstance(x, Var) and x.id in producer:
                src = node_of[producer[x.id]]
                if src != node_of[i]:
                    deps[node_of[i]].add(src)
    order = _toposort(deps, first)

    with GraphBuilder() as b:
        args = [b.new_arg(v.aval, v.hint) for v in graph.invars]
        env: dict = {v.id: a for v, a in zip(graph.invars, args)}
        for v, c in zip(graph.constvars, graph.consts):
            env[v.id] = c

        def read(x):
            return x if isinstance(x, Literal) else env[x.id]

        for kind, key in order:
            if kind == "e":
                e = eqns[key]
                b.source_override = e.source_info
                outs = rebind(e, [read(x) for x in e.invars])
                for v, o in zip(e.outvars, outs):
                    env[v.id] = o
                continue
            members = regions[key]
            body, inputs, outputs = _body(graph, members, used_outside)
            b.source_override = eqns[members[0]].source_info
            outs = fused_p.bind(*[read(x) for x in inputs], graph=body)
            for v, o in zip(outputs, outs):
                env[v.id] = o
        b.source_override = None
        return b.build([a.variable for a in args], [read(v) for v in graph.outvars],
                       graph.in_tree, graph.out_tree)


def _toposort(deps: dict, first: dict) -> list:
    out = priority_toposort(deps, first.__getitem__)
    if len(out) != len(deps):
        raise AssertionError("fuse produced a cycle between regions")  # guarded by _regions
    return out
