"""`canonicalize`: one representative per structural-hash class, so equal graphs print alike.

Equations are put in topological order with ties broken by the structural digest of each node,
commutative operands are sorted by digest, constants are sorted by content digest, and every
variable is a fresh `Var` named by position when printed.
"""

from __future__ import annotations

import heapq

from ..core import Eqn, Graph, Literal, Var
from .hashing import _Encoder, _h, array_digest, literal_key, value_digests


def canonicalize(graph: Graph) -> Graph:
    """A new graph equal to `graph` up to renaming, in canonical equation and operand order.

    >>> import tgx, tgx.numpy as tnp
    >>> g1 = tgx.make_graph(lambda x, y: (tnp.exp(x), y * x))(tgx.Spec("N"), tgx.Spec("N"))
    >>> g2 = tgx.make_graph(lambda x, y: (tnp.exp(x), x * y))(tgx.Spec("N"), tgx.Spec("N"))
    >>> str(tgx.canonicalize(g1)) == str(tgx.canonicalize(g2))
    True
    """
    enc = _Encoder(graph)
    digests, nodes = value_digests(graph, enc)

    def key(x) -> str:
        return literal_key(x, enc) if isinstance(x, Literal) else digests.get(x.id, "?")

    up = _use_digests(graph, nodes)
    rank = [(nodes[i], up[i]) for i in range(len(graph.eqns))]

    # Kahn's algorithm over equations; the ready set is a heap keyed by node digest, then by
    # how the results are used (so twin equations are told apart by their consumers).
    producer: dict[int, int] = {}
    for i, e in enumerate(graph.eqns):
        for v in e.outvars:
            producer[v.id] = i
    deps = {i: {producer[x.id] for x in e.invars if isinstance(x, Var) and x.id in producer}
            for i, e in enumerate(graph.eqns)}
    order = priority_toposort(deps, lambda i: rank[i])

    const_order = sorted(range(len(graph.consts)), key=lambda k: array_digest(graph.consts[k]))
    env: dict[int, Var] = {}

    position: dict[int, int] = {}

    def fresh(v: Var) -> Var:
        position[v.id] = len(position)
        env[v.id] = Var(v.aval)
        return env[v.id]

    def read(x):
        return x if isinstance(x, Literal) else env[x.id]

    constvars = [fresh(graph.constvars[k]) for k in const_order]
    consts = [graph.consts[k] for k in const_order]
    invars = [fresh(v) for v in graph.invars]
    eqns = []
    for i in order:
        e = graph.eqns[i]
        ins = list(e.invars)
        if e.primitive.commutative:
            ins.sort(key=lambda x: (key(x), position.get(getattr(x, "id", None), -1)))
        eqns.append(Eqn(e.primitive, tuple(read(x) for x in ins),
                        tuple(fresh(v) for v in e.outvars), e.params, e.source_info))
    outvars = [read(v) for v in graph.outvars]
    return Graph(constvars, consts, invars, outvars, eqns, graph.in_tree, graph.out_tree)


def _use_digests(graph: Graph, nodes: list) -> list:
    """Per equation, a digest of how its results are used (consumers and operand slots),
    computed from the outputs backwards."""
    uses: dict[int, list] = {}
    for k, v in enumerate(graph.outvars):
        if isinstance(v, Var):
            uses.setdefault(v.id, []).append(f"out{k}")
    out = [""] * len(graph.eqns)
    for i in range(len(graph.eqns) - 1, -1, -1):
        e = graph.eqns[i]
        ups = [_h("|".join(sorted(uses.get(v.id, ())))) for v in e.outvars]
        out[i] = _h(",".join(ups))
        ctx = _h(f"{nodes[i]}:{out[i]}")
        for slot, x in enumerate(e.invars):
            if isinstance(x, Var):
                tag = "c" if e.primitive.commutative else str(slot)
                uses.setdefault(x.id, []).append(f"{ctx}@{tag}")
    return out


def priority_toposort(deps: dict, priority) -> list:
    """Kahn's algorithm over `deps` ({node: nodes it depends on}); among the nodes ready at
    each step, the one with the smallest `priority(node)` comes first.

    >>> priority_toposort({"a": set(), "b": set(), "c": {"a", "b"}}, {"a": 2, "b": 1, "c": 0}.get)
    ['b', 'a', 'c']
    """
    users: dict = {n: [] for n in deps}
    missing = {n: len(d) for n, d in deps.items()}
    for n, d in deps.items():
        for s in d:
            users[s].append(n)
    ready = [(priority(n), i, n) for i, (n, k) in enumerate(missing.items()) if k == 0]
    heapq.heapify(ready)
    tie = len(ready)
    out = []
    while ready:
        *_, n = heapq.heappop(ready)
        out.append(n)
        for u in users[n]:
            missing[u] -= 1
            if missing[u] == 0:
                tie += 1
                heapq.heappush(ready, (priority(u), tie, u))
    return out
