"""The choice structure of `tgx.paths`: per graph (`Level`), a decision point (`Unit`) per
equation and per pattern occurrence, their candidates, every compatible set of pattern
occurrences, and lower bounds of their costs (for the A* search in `tgx.planning.paths`).
"""

from __future__ import annotations

import math

from ..core import Eqn, Graph, Literal, Var
from .candidates import Candidate

ANY = "*"  # the backend of a decomposition in `Level.backend_table`: its kernels may be anywhere
MAX_SUBSETS = 4096   # compatible sets of pattern occurrences explored per graph


# ---------------------------------------------------------------------------------------------
# the choice structure


class Unit:
    """A decision point of one graph: an equation, or an occurrence of a pattern (then `eqn`
    is a `fused` equation over the matched equations, `covers` their indices)."""

    __slots__ = ("eqn", "ins", "outs", "options", "sub", "covers", "index", "lb", "label")

    def __init__(self, eqn: Eqn, options: list, sub=None, covers=(), index=0, label=""):
        self.eqn = eqn
        self.ins = eqn.invars
        self.outs = eqn.outvars
        self.options = options
        self.sub = sub          # the decomposition's Level (when it is an option)
        self.covers = tuple(covers)
        self.index = index      # position in the level (the root equation for a pattern)
        self.lb = 0.0
        self.label = label or eqn.primitive.name


class Level:
    """The choices of one graph: a unit per equation (None for `copy_to`: no choice) and the
    pattern occurrences, with every compatible set of occurrences."""

    def __init__(self, graph: Graph, paths, depth: int, patterns: bool = True):
        self.graph = graph
        self.depth = depth
        self.consts = {v.id: c for v, c in zip(graph.constvars, graph.consts)}
        self.eqn_units: list[Unit | None] = [paths._eqn_unit(e, i, depth)
                                             for i, e in enumerate(graph.eqns)]
        self.matches: list[Unit] = \
            paths._pattern_units(graph) if paths.patterns and patterns else []
        self.subsets = _compatible_subsets([set(m.covers) for m in self.matches])
        self._units: dict = {}
        self._count: int | None = None
        self._paths = paths
        self._tables: dict = {}
        self.lb = 0.0

    def units(self, subset: tuple) -> tuple:
        hit = self._units.get(subset)
        if hit is None:
            chosen = [self.matches[i] for i in subset]
            covered = {j for m in chosen for j in m.covers}
            roots = {m.index: m for m in chosen}
            out = []
            for i, u in enumerate(self.eqn_units):
                if i in roots:
                    out.append(roots[i])
                elif i not in covered:
                    out.append(u if u is not None else ("alias", self.graph.eqns[i]))
            suffix = [0.0] * (len(out) + 1)
            outs = frozenset(v.id for v in self.graph.outvars if isinstance(v, Var))
            reads = [outs] * (len(out) + 1)
            for k in range(len(out) - 1, -1, -1):
                u = out[k]
                suffix[k] = suffix[k + 1] + (u.lb if isinstance(u, Unit) else 0.0)
                ins = u.ins if isinstance(u, Unit) else u[1].invars
                reads[k] = reads[k + 1] | {a.id for a in ins if isinstance(a, Var)}
            hit = self._units[subset] = (tuple(out), tuple(suffix), tuple(reads))
        return hit

    def backend_table(self, units: tuple) -> tuple:
        """table[k]: {backend: a lower bound of the cost from unit k on when unit k runs on
        that backend}, with the switch penalties between consecutive units counted (`ANY`: a
        decomposition, whose kernels may sit anywhere: no penalty around it). The A*
        heuristic (`_State.h`); transfers are left out, so it never overestimates."""
        hit = self._tables.get(id(units))
        if hit is None:
            paths = self._paths
            table: list = [None] * (len(units) + 1)
            table[len(units)] = {}
            fresh = self._first_reads(units)
            # copying graph inputs read first by unit k to backend b (b: seconds)
            copy_in: list = [{} for _ in units]
            nxt = None
            for k in range(len(units) - 1, -1, -1):
                u = units[k]
                if not isinstance(u, Unit):  # a copy_to alias: no kernel, no switch
                    table[k] = table[k + 1]
                    continue
                # values unit k hands straight to the next unit: on another backend they
                # must be copied when the next unit runs (nothing reads them in between)
                reads = {a.id for a in nxt.ins if isinstance(a, Var)} if nxt else set()
                handed = [v for v in u.outs if v.id in reads]
                here: dict = {}
                for o in u.options:
                    if o.kind == "decomposition":
                        c, b = u.sub.lb, ANY
                    else:
                        c, b = paths.estimate(u, o).seconds, o.backend
                    if b not in (ANY, paths.host) and k in fresh:  # inputs read here first
                        if b not in copy_in[k]:
                            copy_in[k][b] = sum(
                                paths.transfer_estimate(a.aval, paths.host, b).seconds
                                for a in fresh[k])
                        c += copy_in[k][b]
                    if c < here.get(b, math.inf):
                        here[b] = c
                rest = table[k + 1]
                row = {}
                for b, c in here.items():
                    best = 0.0
                    if rest:
                        best = min(r + (0.0 if b == ANY or b2 == ANY or b == b2 else
                                        paths.switch(b, b2)
                                        + sum(paths.transfer_estimate(v.aval, b, b2).seconds
                                              for v in handed))
                                   for b2, r in rest.items())
                    row[b] = c + best
                table[k] = row
                nxt = u
            hit = self._tables[id(units)] = (tuple(table), tuple(copy_in), units)  # id key
        return hit[0]

    def first_read_copies(self, units: tuple) -> tuple:
        """Per unit position, {backend: seconds} of copying the graph inputs it is the first
        to read there (included in `backend_table`)."""
        self.backend_table(units)
        return self._tables[id(units)][1]

    def _first_reads(self, units: tuple) -> dict:
        # Only the root graph's inputs are known to sit on the host alone at the start (a
        # decomposition's inputs are wherever its parent's operands are).
        if self.depth != 0:
            return {}
        host = {v.id for v in (*self.graph.invars, *self.graph.constvars)}
        alias: dict = {}
        out: dict = {}
        seen: set = set()
        for k, u in enumerate(units):
            if not isinstance(u, Unit):
                a = u[1].invars[0]
                if isinstance(a, Var):
                    alias[u[1].outvars[0].id] = alias.get(a.id, a.id)
                continue
            for a in u.ins:
                if not isinstance(a, Var):
                    continue
                vid = alias.get(a.id, a.id)
                if vid in host and vid not in seen:
                    seen.add(vid)
                    out.setdefault(k, []).append(a)
        return out

    @property
    def all_reads(self) -> frozenset:
        """Every value the graph reads (its equations' inputs and its outputs)."""
        return self.units(())[2][0]

    def count(self) -> int:
        if self._count is None:
            total = 0
            for s in self.subsets:
                n = 1
                for u in self.units(s)[0]:
                    if isinstance(u, Unit):
                        n *= _unit_count(u)
                        if n == 0:
                            break
                total += n
            self._count = total
        return self._count


def _unit_count(u: Unit) -> int:
    return sum(o_count(u, o) for o in u.options)


def o_count(u: Unit, o: Candidate) -> int:
    return u.sub.count() if o.kind == "decomposition" else 1


def _compatible_subsets(covers: list[set]) -> list[tuple]:
    out: list[tuple] = []

    def rec(i, chosen, taken):
        if len(out) >= MAX_SUBSETS:
            return
        if i == len(covers):
            out.append(tuple(chosen))
            return
        rec(i + 1, chosen, taken)
        if taken.isdisjoint(covers[i]):
            rec(i + 1, chosen + [i], taken | covers[i])

    rec(0, [], set())
    return out


def resolve_alias(alias: dict, vid: int):
    """The value `vid` stands for through `copy_to` and decomposition aliases (an id, or a
    Literal)."""
    k = vid
    while k in alias:
        k = alias[k]
        if isinstance(k, Literal):
            break
    return k


def _lower_bounds(level: Level, paths) -> float:
    """Cheapest-choice lower bounds of every unit (bottom up); a level's bound shares each
    pattern kernel's cost out over the equations it covers, so it never overestimates."""
    per_eqn = []
    for u in level.eqn_units:
        if u is None:
            per_eqn.append(0.0)
            continue
        best = math.inf
        for o in u.options:
            if o.kind == "decomposition":
                best = min(best, _lower_bounds(u.sub, paths))
            else:
                best = min(best, paths.estimate(u, o).seconds)
        u.lb = best
        per_eqn.append(best)
    for m in level.matches:
        m.lb = min(paths.estimate(m, o).seconds for o in m.options)
        share = m.lb / len(m.covers)
        for i in m.covers:
            per_eqn[i] = min(per_eqn[i], share)
    level.lb = sum(per_eqn)
    return level.lb
