"""State buffers (`tgx.compile(state=...)`): which updates run in place, and the schedule.

A state pair is (graph input S, graph output O): O is the new value of S, written into the
caller's array. When O is reached from S through `dynamic_update_slice`s (their operand
chain) and zero-copy transfers only, on backends that can write in place (NumPy, torch), every
update of that chain writes just its window into S's buffer ("in place"). When O is the
result of an elementwise op of S's shape and dtype run by a kernel that writes into a given
buffer (an optimizer's `p - lr * u`, `b1 * m + (1 - b1) * g`), that op writes O straight into
S's buffer (the caller's array, or its zero-copy view on torch): an elementwise op may read
the very buffer it writes, index for index. Otherwise the result is copied into the caller's
array once, at the end of the call ("copy").

An in-place update destroys the value it overwrites, so every reader of an older *version* of
the buffer (S itself, a view of it, an earlier update of the chain) must run before it. The
schedule gets those orderings as extra dependencies (a stable topological sort: equations
keep their order unless a dependency moves them); a reader that cannot run before the update
(it also depends on the update, reads on jax whose dispatch is asynchronous, or is a graph
output) turns the pair to "copy". Aliasing is tracked conservatively: every `copy_to` and
every kernel that may return a view propagates it.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass, field

from ..backends import get_backend, host_name
from ..core import Graph, Var
from ..devices import HOST
from ..shapes import shapes_provably_equal


def inplace_fn(name: str, backend: str):
    """The backend's in-place update function for primitive `name` (`Backend.inplace`), or
    None where its arrays are immutable."""
    return get_backend(backend).inplace.get(name)


@dataclass
class StatePlan:
    """How the state outputs are produced (see the module doc)."""

    #: equation indices in schedule order
    order: list
    #: equations lowered as in-place updates of a state buffer
    inplace: frozenset = frozenset()
    #: per state pair: copy the result into the caller's array at the end of the call
    copy: tuple = ()
    #: per state pair: why it is copied ("" when in place)
    reasons: tuple = ()
    #: indices of graph outputs (not state outputs) that may share memory with a state
    #: buffer: copied before they are returned
    alias_outs: tuple = ()
    #: elementwise updates (equation index → {output position: the variable holding S's
    #: buffer on its backend}): the op writes those outputs into those buffers
    buffers: dict = field(default_factory=dict)
    #: ids of the values that may share memory with a buffer updated in place (the state
    #: argument, its updates, their copies and views)
    shared: frozenset = frozenset()


def _zero_copy_transfer(e, backend: str) -> bool:
    """A copy of a state buffer that shares its memory, on a backend that can update it in
    place: the chain from the state argument to its new value may pass through it."""
    b = get_backend(backend)
    return (e.primitive.name == "copy_to" and bool(b.inplace) and isinstance(e.invars[0], Var)
            and e.params.get("device", HOST) == HOST and b.zero_copy_from_host(HOST))


def _chain(graph, eqns, backends, producer, s_var, o_atom):
    """Equation indices from S to O (updates and zero-copy transfers), or (None, reason)."""
    if not isinstance(o_atom, Var):
        return None, "the new state is a constant"
    chain, v = [], o_atom
    while v.id != s_var.id:
        j = producer.get(v.id)
        if j is None:
            return None, "the new state is not computed from the state argument"
        e, b = eqns[j], backends[j]
        if _zero_copy_transfer(e, b):
            chain.append(j)
        elif e.primitive.name == "dynamic_update_slice" and isinstance(e.invars[0], Var):
            if inplace_fn("dynamic_update_slice", b) is None:
                return None, f"the update runs on {b}, whose arrays are immutable"
            chain.append(j)
        else:
            return None, (f"the new state comes from {e.primitive.name}, not from "
                          f"dynamic_update_slice of the state")
        v = e.invars[0]
    chain.reverse()
    return chain, ""


def _elementwise_update(eqns, backends, kernels, producer, s_var, o_atom, host: str):
    """(equation index, output position, S's buffer variable on its backend) when O is an
    elementwise op, or an output of the loops generated for an elementwise region
    (`Kernel.outs_into`), that can write into S's buffer (see the module doc), else None."""
    if not isinstance(o_atom, Var):
        return None
    x = o_atom
    j = producer.get(x.id)
    while j is not None and _zero_copy_transfer(eqns[j], backends[j]):  # back to the host
        x = eqns[j].invars[0]
        j = producer.get(x.id)
    if j is None:
        return None
    e, b, k = eqns[j], backends[j], kernels[j]
    if k is None or not k.dtype_exact or not get_backend(b).inplace:
        return None
    if not ((e.primitive.elementwise and len(e.outvars) == 1 and k.writes_out)
            or k.outs_into):
        return None
    pos = next(n for n, v in enumerate(e.outvars) if v.id == x.id)
    s, o = s_var.aval, o_atom.aval
    if s.dtype != o.dtype or not shapes_provably_equal(s.shape, o.shape):
        return None
    if b == host:
        return j, pos, s_var
    for te, tb in zip(eqns, backends):  # S's zero-copy view on b
        if (_zero_copy_transfer(te, tb) and te.invars[0].id == s_var.id
                and te.params.get("backend") == b):
            return j, pos, te.outvars[0]
    return None


def plan_state(graph: Graph, eqns: Sequence, backends: Sequence[str], kernels: Sequence,
               state: Sequence[tuple[int, int]]) -> StatePlan:
    """Decide in place / copy per state pair and the schedule (indices into `eqns`)."""
    n = len(eqns)
    identity = list(range(n))
    if not state:
        return StatePlan(identity)
    producer = {v.id: j for j, e in enumerate(eqns) for v in e.outvars}
    users: list[set] = [set() for _ in eqns]
    for j, e in enumerate(eqns):
        for a in e.invars:
            if isinstance(a, Var) and a.id in producer:
                users[producer[a.id]].add(j)

    chains: dict[int, list] = {}
    reasons = [""] * len(state)
    # elementwise update -> {pair: (its output position, S's buffer variable)}
    buffers: dict[int, dict] = {}
    taken: set = set()
    for p, (a, o) in enumerate(state):
        chain, why = _chain(graph, eqns, backends, producer, graph.invars[a], graph.outvars[o])
        if chain is None:
            hit = _elementwise_update(eqns, backends, kernels, producer, graph.invars[a],
                                      graph.outvars[o], host_name())
            if hit is not None and hit[:2] not in taken:  # one output, one buffer
                chain = [hit[0]]
                buffers.setdefault(hit[0], {})[p] = hit[1:]
                taken.add(hit[:2])
        if chain is None:
            reasons[p] = why
        else:
            chains[p] = chain

    # versions: alias[var id] = {pair: version}; an in-place update makes a new version
    alias: dict[int, dict] = {}
    updates: dict[int, list] = {p: [] for p in chains}  # pair -> its in-place updates, in order
    in_chain: dict[int, int] = {}
    for p, (a, _) in enumerate(state):
        alias.setdefault(graph.invars[a].id, {})[p] = 0
    for p, chain in chains.items():
        for j in chain:
            if j not in buffers:
                in_chain[j] = p
    readers: dict[int, list] = {p: [] for p in range(len(state))}  # pair -> [(eqn, version)]
    for j, e in enumerate(eqns):
        seen: dict[int, int] = {}
        for k, x in enumerate(e.invars):
            if not isinstance(x, Var) or x.id not in alias:
                continue
            for p, ver in alias[x.id].items():
                if p in buffers.get(j, ()):
                    # an elementwise update may read the buffer it writes, index for index
                    pos, buf = buffers[j][p]
                    if x.id not in (graph.invars[state[p][0]].id, buf.id) or \
                            not shapes_provably_equal(x.aval.shape, e.outvars[pos].aval.shape):
                        reasons[p] = reasons[p] or ("the update reads a view of the state "
                                                    "it overwrites")
                    seen[p] = min(ver, seen.get(p, ver))
                    continue
                if in_chain.get(j) == p and k == 0:
                    continue  # the chain's own operand
                if in_chain.get(j) == p:  # an update reads its own buffer as update/index
                    reasons[p] = reasons[p] or "an update reads the state it overwrites"
                seen[p] = min(ver, seen.get(p, ver))
        for p, ver in seen.items():
            readers[p].append((j, ver))
        if j in buffers:  # writes version 1 of its pairs' buffers
            for p, (pos, _) in buffers[j].items():
                updates[p].append(j)
                alias.setdefault(e.outvars[pos].id, {})[p] = 1
        elif j in in_chain:
            p = in_chain[j]
            ver = alias[e.invars[0].id][p]
            if e.primitive.name == "dynamic_update_slice":
                updates[p].append(j)
                ver += 1
            for v in e.outvars:
                alias.setdefault(v.id, {})[p] = ver
            for q, qv in seen.items():  # other pairs' views flowing through (conservative)
                if q != p and (getattr(kernels[j], "returns_view", True)
                               or e.primitive.name == "copy_to"):
                    for v in e.outvars:
                        alias[v.id][q] = min(qv, alias[v.id].get(q, qv))
        elif seen and (e.primitive.name == "copy_to" or getattr(kernels[j], "returns_view",
                                                                  True)):
            for v in e.outvars:
                d = alias.setdefault(v.id, {})
                for p, ver in seen.items():
                    d[p] = min(ver, d.get(p, ver))

    out_of = {o: p for p, (_, o) in enumerate(state)}
    alias_outs = []
    for i, v in enumerate(graph.outvars):
        if not isinstance(v, Var) or v.id not in alias:
            continue
        shares = {p: ver for p, ver in alias[v.id].items() if out_of.get(i) != p}
        if shares:
            alias_outs.append(i)
        for p, ver in shares.items():
            if p in chains and ver < len(updates[p]):
                reasons[p] = reasons[p] or "a graph output is a view of the old state"

    # readers of version v must run before update v (the one making version v + 1)
    edges: list[tuple[int, int]] = []
    for p in list(chains):
        if reasons[p]:
            continue
        for j, ver in readers[p]:
            if ver >= len(updates[p]) or j == updates[p][ver]:
                continue
            upd = updates[p][ver]
            if get_backend(backends[j]).reads_host_async:
                reasons[p] = f"the old state is read on {backends[j]} (asynchronous)"
                break
            if j in _descendants(upd, users):
                reasons[p] = ("a reader of the old state also depends on the update "
                              f"({eqns[j].primitive.name})")
                break
            edges.append((j, upd))
    for p in list(chains):
        if reasons[p]:
            del chains[p]
    buffers = {j: {p: pv for p, pv in d.items() if p in chains} for j, d in buffers.items()}
    buffers = {j: d for j, d in buffers.items() if d}
    edges = [(j, u) for j, u in edges if any(u in updates[p] for p in chains)]
    # an elementwise update reads S's buffer without naming it: after the view is made
    edges += [(producer[v.id], j) for j, d in buffers.items() for _, v in d.values()
              if v.id in producer]
    order = _stable_topo(eqns, producer, edges) if edges else identity
    if order is None:  # the orderings of several pairs contradict each other
        for p in chains:
            reasons[p] = "the updates of several state buffers cannot all run last"
        chains, order, buffers = {}, identity, {}
    inplace = frozenset(j for p in chains for j in updates[p])
    copy = tuple(p not in chains for p in range(len(state)))
    shared = frozenset(v for v, pairs in alias.items() if any(p in chains for p in pairs))
    buffers = {j: dict(d.values()) for j, d in buffers.items()}
    return StatePlan(order, inplace, copy, tuple(reasons), tuple(alias_outs), buffers, shared)


def _descendants(j: int, users: list) -> set:
    seen, stack = set(), [j]
    while stack:
        for u in users[stack.pop()]:
            if u not in seen:
                seen.add(u)
                stack.append(u)
    return seen


def _stable_topo(eqns, producer, edges) -> list | None:
    """Kahn's algorithm taking the lowest index first, with `edges` (before, after) added;
    None on a cycle."""
    n = len(eqns)
    preds: list[set] = [set() for _ in range(n)]
    for j, e in enumerate(eqns):
        for a in e.invars:
            if isinstance(a, Var) and a.id in producer:
                preds[j].add(producer[a.id])
    for before, after in edges:
        preds[after].add(before)
    succ: list[list] = [[] for _ in range(n)]
    missing = [len(p) for p in preds]
    for j, ps in enumerate(preds):
        for i in ps:
            succ[i].append(j)
    ready = [j for j in range(n) if missing[j] == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        j = heapq.heappop(ready)
        order.append(j)
        for u in succ[j]:
            missing[u] -= 1
            if missing[u] == 0:
                heapq.heappush(ready, u)
    return order if len(order) == n else None
