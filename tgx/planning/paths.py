"""`tgx.paths`: every valid plan of a traced graph, lazily — count, enumerate, rank, run.

A *path* picks, for every equation of the graph: a kernel on one of the allowed backends (every
accepted variant), or the primitive's decomposition (whose sub-graph then gets its own
choices, recursively), or — for a set of equations matching a pattern kernel's `pattern`
(`tgx.backends.patterns`, found with `tgx.find_pattern` in the graph and in every
decomposition) — that one pattern kernel. Running a kernel on another backend than the one
holding its inputs is a detour through `copy_to`: transfers are implied by the backends, as
`tgx.rebackend` inserts them (a value is copied to a backend once and reused there; outputs
return to NumPy). Pointless round trips never arise: `copy_to` equations already in the graph
carry no choice, and a value is never copied back to where it already is.

- `paths.count()`: exact, from the choice structure (sum over options, product over
  equations, sum over compatible sets of pattern occurrences) — no enumeration; with
  `max_transfers`, by dynamic programming over the partial plans' signatures.
- `iter(paths)`: `PathPlan`s, lazily, depth first.
- `paths.ranked()`: best predicted first, by A* over the decisions in topological order.
  A plan costs Σ kernels + Σ transfers + Σ backend-switch penalties (`CostModel.switch`
  between consecutive kernels, and from the last back to the first: what selection charges);
  the heuristic (Σ of each remaining equation's cheapest choice, transfers and penalties
  (≥ 0) left out) never overestimates, so plans come out in non-decreasing predicted cost
  without enumerating. By default one plan per backend assignment and decomposition/pattern
  choices (its kernels' best variants); `ranked(distinct=False)` yields every variant.
- filters: `backends=`, `max_transfers=`, `decompose=False` (decompose only equations no kernel
  accepts), `patterns=False`, `kernels_only=` (kernel names/reprs, or a predicate on `Kernel`).

Each `PathPlan` carries its predicted cost with, per step, where the figure came from
("measured" in the store, "cost model", or "unknown"); `summary()`, `run(*args)`,
`profile(*args, store=)`, `save(store)`.

>>> import tgx, tgx.numpy as tnp
>>> ps = tgx.paths(lambda x: tnp.exp(x) * 2.0)(tgx.Spec((8,)), backends=["numpy"])
>>> ps.count(), len(list(ps))
(4, 4)
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from ..backends import check_backends, host_name, load_backend
from ..backends import patterns as _patterns  # noqa: F401 - registers the pattern kernels
from ..backends.registry import Kernel, all_kernels
from ..core import Eqn, Graph, Literal, Params, Var
from ..errors import TgxError
from ..graph.pattern import find_pattern
from ..primitives.fused import fused_p
from ..serialize import SerializationError
from ..shapes import hint_binding
from ..tracing import GraphBuilder
from ..transforms.decompose import decomposition_graph
from .assignment import Assignment
from .candidates import Candidate, candidates
from .cost_model import CostModel
from .transfers import copy_source

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

    def __init__(self, graph: Graph, paths: Paths, depth: int):
        self.graph = graph
        self.depth = depth
        self.consts = {v.id: c for v, c in zip(graph.constvars, graph.consts)}
        self.eqn_units: list[Unit | None] = [paths._eqn_unit(e, i, depth)
                                             for i, e in enumerate(graph.eqns)]
        self.matches: list[Unit] = paths._pattern_units(graph) if paths.patterns else []
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


# ---------------------------------------------------------------------------------------------
# the decision process: a state is a stack of frames (one per graph being walked)


@dataclass(frozen=True)
class Step:
    """One kernel of a plan: the unit, the option taken, its estimate, the transfers it
    implies (aval, src, dst, estimate) and its depth in the decomposition tree."""

    unit: Unit
    option: Candidate
    estimate: Any
    transfers: tuple
    depth: int
    switch: float = 0.0       # backend-switch penalty paid entering this step (seconds)


@dataclass
class _Frame:
    level: Level
    units: tuple | None       # None until the set of pattern occurrences is chosen
    suffix: tuple | None
    pos: int
    parent: Unit | None       # the decomposed unit of the frame below
    reads: tuple | None = None  # reads[pos]: the values read from unit `pos` on

    def key(self) -> tuple:
        return (id(self.level), None if self.units is None else id(self.units), self.pos,
                id(self.parent))

    def live(self) -> frozenset:
        return self.level.all_reads if self.units is None else self.reads[self.pos]


@dataclass
class _State:
    frames: tuple
    alias: dict               # var id -> var id | Literal (decomposition boundaries)
    loc: dict                 # value id -> backends holding it (producer first)
    cost: float = 0.0
    ntransfers: int = 0
    history: Any = None       # linked list of events (event, previous)
    final: tuple = ()         # transfers of the outputs back to NumPy
    done: bool = False
    first: str | None = None  # backend of the first kernel (the wrap-around's target)
    prev: str | None = None   # backend of the last kernel so far
    wrap: float = 0.0         # switch penalty from the last kernel back to the first

    def copy(self) -> _State:
        return _State(self.frames, dict(self.alias), dict(self.loc), self.cost, self.ntransfers,
                      self.history, self.final, self.done, self.first, self.prev)

    def h(self) -> float:
        """A consistent lower bound of the cost still to pay: per frame below the top, the
        cheapest rest of its graph (`Level.backend_table`, any backend); for the top frame,
        the rest from the next unit on each backend plus what running it there costs now:
        the switch from the last kernel's backend and copying its inputs from where they are
        (both exactly what `_apply` will charge)."""
        total = 0.0
        top = len(self.frames) - 1
        for i, f in enumerate(self.frames):
            if f.units is None:
                total += f.level.lb
                continue
            row = f.level.backend_table(f.units)[f.pos]
            if not row:
                continue
            u = f.units[f.pos] if f.pos < len(f.units) else None
            if i == top and isinstance(u, Unit):
                # the table's first-read copies of this unit are in `_entry`, exactly
                paths = f.level._paths
                first = f.level.first_read_copies(f.units)[f.pos]
                total += min(r - first.get(b, 0.0) + self._entry(paths, u, b)
                             for b, r in row.items())
            else:
                total += min(row.values())
        return total

    def _entry(self, paths, u, b) -> float:
        """Switch penalty and input copies of running unit `u` on backend `b` next."""
        if b == ANY:
            return 0.0
        t = paths.switch(self.prev, b) if self.prev is not None else 0.0
        return t + sum(paths.transfer_estimate(aval, locs[0], b).seconds
                       for _, aval, locs in paths._copies(self, u, b))

    def events(self) -> list:
        out, node = [], self.history
        while node is not None:
            out.append(node[0])
            node = node[1]
        return out[::-1]


class Paths:
    """Every valid plan of `graph` (see the module docstring). Build with `tgx.paths(fn)(...)`
    or `Paths(graph, ...)`."""

    #: the class of the plans it yields (`tgx.explore` uses one that can also run them)
    plan_type: type

    def __init__(self, graph: Graph, *, backends: Sequence[str] | None = None, store=None,
                 dims: dict | None = None, max_transfers: int | None = None,
                 decompose: bool = True, patterns: bool = True,
                 kernels_only: Iterable[str] | Callable[[Kernel], bool] | None = None,
                 cost_model=None, name: str | None = None):
        self.graph = graph
        self.name = name or "graph"
        self.backends = check_backends(backends)
        #: where graph inputs live and outputs go (the host backend)
        self.host = host_name()
        self.store = store
        self.dims = hint_binding(graph.in_avals)
        self.dims.update({str(k): int(v) for k, v in (dims or {}).items()})
        self.max_transfers = max_transfers
        self.decompose = decompose
        self.patterns = patterns
        if kernels_only is None or callable(kernels_only):
            self._keep = kernels_only
        else:
            names = set(kernels_only)
            self._keep = lambda k: k.name in names or repr(k) in names
        self.cost = cost_model if cost_model is not None else CostModel(store=store)
        self._switch = getattr(self.cost, "switch", None)  # None: no switch penalties
        self._estimates: dict = {}
        self._best_variants: dict = {}
        self._pattern_kernels = self._load_pattern_kernels() if patterns else []
        self.root = Level(graph, self, 0)
        _lower_bounds(self.root, self)

    # -- building ---------------------------------------------------------------------------
    def _load_pattern_kernels(self) -> list[Kernel]:
        for b in self.backends:
            load_backend(b)
        return [k for k in all_kernels() if k.pattern is not None and k.backend in self.backends
                and (self._keep is None or self._keep(k))]

    def _eqn_unit(self, eqn: Eqn, index: int, depth: int) -> Unit | None:
        if eqn.primitive.name == "copy_to":
            return None
        opts = [c for c in candidates(eqn, self.backends) if c.kind == "kernel"
                and (self._keep is None or self._keep(c.kernel))]
        sub = None
        if eqn.primitive.decomposition is not None and (self.decompose or not opts):
            sub = Level(decomposition_graph(eqn), self, depth + 1)
            opts.append(Candidate("decomposition"))
        return Unit(eqn, opts, sub, (index,), index)

    def _pattern_units(self, graph: Graph) -> list[Unit]:
        by_pattern: dict[int, list[Kernel]] = {}
        for k in self._pattern_kernels:
            by_pattern.setdefault(id(k.pattern), []).append(k)
        units = []
        for ks in by_pattern.values():
            for m in find_pattern(graph, ks[0].pattern):
                eqn = _fused_eqn(graph, m, ks[0].name)
                avals = [x.aval for x in m.inputs]
                opts = [Candidate("pattern", k.backend, k) for k in ks
                        if k.check(avals, {}) is None]
                if opts:
                    units.append(Unit(eqn, opts, None, m.eqns, m.root,
                                      f"{ks[0].name}[{len(m.eqns)} eqns]"))
        return units

    # -- estimates --------------------------------------------------------------------------
    def estimate(self, unit: Unit, option: Candidate):
        key = (id(unit), option)
        e = self._estimates.get(key)
        if e is None:
            e = self._estimates[key] = self.cost.kernel(unit.eqn, option.kernel, self.dims)
        return e

    def switch(self, src: str | None, dst: str) -> float:
        """Penalty for a kernel on `dst` right after one on `src` (`CostModel.switch`; 0 when
        the cost model has none, or at the start)."""
        if src is None or src == dst or self._switch is None:
            return 0.0
        key = ("s", src, dst)
        e = self._estimates.get(key)
        if e is None:
            e = self._estimates[key] = float(self._switch(src, dst))
            if e < 0:
                raise TgxError(f"switch penalty {src}→{dst} is negative ({e}): the ranking's "
                               "heuristic needs penalties ≥ 0")
        return e

    def transfer_estimate(self, aval, src: str, dst: str):
        key = ("t", aval, src, dst)
        e = self._estimates.get(key)
        if e is None:
            e = self._estimates[key] = self.cost.transfer(aval, src, dst, self.dims)
        return e

    # -- the decision process ---------------------------------------------------------------
    def _start(self) -> _State:
        loc = {v.id: (self.host,) for v in (*self.graph.invars, *self.graph.constvars)}
        st = _State((_Frame(self.root, None, None, 0, None),), {}, loc)
        return self._advance(st)

    def _key(self, st: _State, a):
        return a if isinstance(a, Literal) else _resolve(st.alias, a.id)

    def _advance(self, st: _State) -> _State:
        """Run the steps that need no decision: `copy_to` aliases, finished graphs."""
        while st.frames:
            f = st.frames[-1]
            if f.units is None:
                if len(f.level.subsets) == 1:
                    self._set_units(st, ())
                    continue
                return st
            if f.pos < len(f.units):
                u = f.units[f.pos]
                if isinstance(u, Unit):
                    return st
                eqn = u[1]  # copy_to: the output is the input
                st.alias[eqn.outvars[0].id] = self._key(st, eqn.invars[0])
                st.history = (("alias", eqn), st.history)
                st.frames = st.frames[:-1] + (_Frame(f.level, f.units, f.suffix, f.pos + 1,
                                                     f.parent, f.reads),)
                continue
            st.frames = st.frames[:-1]
            if f.parent is not None:
                for pv, sv in zip(f.parent.outs, f.level.graph.outvars):
                    st.alias[pv.id] = self._key(st, sv)
                st.history = (("pop", f.parent, f.level), st.history)
        # every output back on the host
        final, seen = [], set()
        for v in self.graph.outvars:
            k = self._key(st, v)
            if isinstance(k, Literal) or k in seen:
                continue
            seen.add(k)
            locs = st.loc.get(k, (self.host,))
            if self.host not in locs:
                est = self.transfer_estimate(_aval_of_key(v), locs[0], self.host)
                final.append((v.aval, locs[0], self.host, est))
                st.cost += est.seconds
                st.ntransfers += 1
        st.final = tuple(final)
        # the function runs in a loop: the next call's first kernel follows the last one
        # (as `selection` charges it)
        if st.prev is not None:
            st.wrap = self.switch(st.prev, st.first)
            st.cost += st.wrap
        st.done = True
        return st

    def _set_units(self, st: _State, subset: tuple) -> None:
        f = st.frames[-1]
        units, suffix, reads = f.level.units(subset)
        st.frames = st.frames[:-1] + (_Frame(f.level, units, suffix, 0, f.parent, reads),)
        if subset:
            st.history = (("patterns", f.level, subset), st.history)

    def _choices(self, st: _State, distinct: bool = False) -> list:
        f = st.frames[-1]
        if f.units is None:
            return [("subset", s) for s in f.level.subsets]
        u = f.units[f.pos]
        return [("option", o) for o in (self._variants(u) if distinct else u.options)]

    def _variants(self, u: Unit) -> list:
        """`u`'s options with one kernel per (kind, name, backend): the cheapest variant
        (the first listed on a tie). Variants differ only in their own estimate — transfers
        and switch penalties depend on the backend alone — so the best plan of every
        (backend assignment, decomposition/pattern choices) class uses these only."""
        hit = self._best_variants.get(id(u))
        if hit is None:
            best: dict = {}
            for o in u.options:
                if o.kind == "decomposition":
                    best[("decomposition",)] = o
                    continue
                k = (o.kind, o.kernel.name, o.backend)
                if k not in best or (self.estimate(u, o).seconds
                                     < self.estimate(u, best[k]).seconds):
                    best[k] = o
            hit = self._best_variants[id(u)] = list(best.values())
        return hit

    def _copies(self, st: _State, u: Unit, b: str) -> list:
        """(value, aval, its locations) of each distinct input of `u` not yet on backend `b`:
        the copies running `u` there makes, from the first location (its producer's)."""
        out, seen = [], set()
        for a in u.ins:
            k = self._key(st, a)
            if isinstance(k, Literal) or k in seen:
                continue
            seen.add(k)
            locs = st.loc.get(k, (self.host,))
            if copy_source(locs, b) is not None:
                out.append((k, a.aval, locs))
        return out

    def _apply(self, st: _State, choice) -> _State | None:
        st = st.copy()
        what, c = choice
        f = st.frames[-1]
        if what == "subset":
            self._set_units(st, c)
            st.history = (("token", {"d": "patterns", "m": list(c)}), st.history)
            return self._advance(st)
        u: Unit = f.units[f.pos]
        st.frames = st.frames[:-1] + (_Frame(f.level, f.units, f.suffix, f.pos + 1, f.parent,
                                             f.reads),)
        st.history = (("token", c.token()), st.history)
        if c.kind == "decomposition":
            sub = u.sub
            for sv, a in zip(sub.graph.invars, u.ins):
                st.alias[sv.id] = self._key(st, a)
            for cv in sub.graph.constvars:
                st.loc[cv.id] = (self.host,)
            st.frames = st.frames + (_Frame(sub, None, None, 0, u),)
            st.history = (("push", u, sub), st.history)
            return self._advance(st)
        b = c.backend
        transfers = []
        for k, aval, locs in self._copies(st, u, b):
            est = self.transfer_estimate(aval, locs[0], b)
            transfers.append((aval, locs[0], b, est))
            st.cost += est.seconds
            st.ntransfers += 1
            st.loc[k] = locs + (b,)
        if self.max_transfers is not None and st.ntransfers > self.max_transfers:
            return None
        est = self.estimate(u, c)
        sw = self.switch(st.prev, b)
        st.cost += est.seconds + sw
        if st.first is None:
            st.first = b
        st.prev = b
        for v in u.outs:
            st.loc[v.id] = (b,)
        st.history = (("step", Step(u, c, est, tuple(transfers), len(st.frames) - 1, sw)),
                      st.history)
        st = self._advance(st)
        if self.max_transfers is not None and st.ntransfers > self.max_transfers:
            return None
        return st

    # -- public -----------------------------------------------------------------------------
    def count(self) -> int:
        """The exact number of plans, never by enumerating them. Without `max_transfers` it
        comes from the choice structure alone; with it, by dynamic programming over the
        decision process (`_count_limited`)."""
        if self.max_transfers is None:
            return self.root.count()
        return self._count_limited()

    def _count_limited(self) -> int:
        """The number of plans within `max_transfers`: Σ over choices of the completions of
        each child state, memoized by `_count_key` (partial plans with equal keys have equally
        many completions). Options that differ only in their variant (same kind of choice,
        same backend) lead to states with equal keys, so each group is applied once and
        counted with its size. Depth first with an explicit stack (no Python recursion, so
        long graphs are fine); the memo holds one integer per distinct key, and a state is
        stripped to its live values before it is expanded (`_count_compact`), so the work
        per state is O(live values), not O(graph). A state whose remaining budget covers every
        transfer the rest of the plan could make (`_count_rest`) is not expanded: all its
        completions count, from the choice structure."""
        start = self._start()
        if start.done:
            return 1
        groups: dict = {}
        rest: dict = {}
        n_outs = sum(isinstance(v, Var) for v in self.graph.outvars)

        def unlimited(st: _State) -> int | None:
            """The completions of `st` when no completion can pass the limit, else None."""
            bound, n = n_outs, 1
            for f in st.frames:
                b, c = self._count_rest(f, rest)
                bound += b
                n *= c
            return n if st.ntransfers + bound <= self.max_transfers else None

        n = unlimited(start)
        if n is not None:
            return n

        def choices(st: _State) -> list:
            f = st.frames[-1]
            if f.units is None:
                return [(1, ("subset", s)) for s in f.level.subsets]
            u = f.units[f.pos]
            hit = groups.get(id(u))
            if hit is None:
                by: dict = {}
                for o in u.options:
                    k = ("decomposition",) if o.kind == "decomposition" else (o.kind, o.backend)
                    if k in by:
                        by[k][0] += 1
                    else:
                        by[k] = [1, ("option", o)]
                hit = groups[id(u)] = [(n, c) for n, c in by.values()]
            return hit

        memo: dict = {}
        fronts: dict = {}
        interned: dict = {}
        # entries: [key, state, pending choices, completions so far, multiplicity of the
        # child being counted]
        stack = [[None, start, iter(choices(start)), 0, 0]]
        while True:
            top = stack[-1]
            st = top[1]
            for mult, c in top[2]:
                child = self._apply(st, c)
                if child is None:
                    continue
                if child.done:
                    top[3] += mult
                    continue
                n = unlimited(child)
                if n is not None:
                    top[3] += mult * n
                    continue
                key = self._count_key(child, fronts, interned)
                n = memo.get(key)
                if n is not None:
                    top[3] += mult * n
                    continue
                top[4] = mult
                self._count_compact(child, fronts)
                stack.append([key, child, iter(choices(child)), 0, 0])
                break
            else:
                stack.pop()
                if not stack:
                    return top[3]
                memo[top[0]] = top[3]
                parent = stack[-1]
                parent[3] += parent[4] * top[3]

    @staticmethod
    def _count_rest(f: _Frame, cache: dict) -> tuple[int, int]:
        """For frame `f` from its position on: (at most how many transfers its units can
        imply, how many ways there are to run them with no limit). A kernel transfers each of
        its inputs at most once, a decomposition at most what its sub-graph's units do (a
        level's bound sums every equation's and every pattern occurrence's, more than any set
        of occurrences takes); the outputs' copies back to NumPy are counted by the caller."""
        def unit_bound(u) -> int:
            if not isinstance(u, Unit):
                return 0
            hit = cache.get(id(u))
            if hit is None:
                hit = 0
                for o in u.options:
                    if o.kind == "decomposition":
                        hit = max(hit, level_bound(u.sub))
                    else:
                        hit = max(hit, len({a.id for a in u.ins if isinstance(a, Var)}))
                cache[id(u)] = hit
            return hit

        def level_bound(level: Level) -> int:
            hit = cache.get(id(level))
            if hit is None:
                hit = cache[id(level)] = (
                    sum(unit_bound(u) for u in level.eqn_units if u is not None)
                    + sum(unit_bound(m) for m in level.matches))
            return hit

        if f.units is None:
            return level_bound(f.level), f.level.count()
        per = cache.get(id(f.units))
        if per is None:
            per = [(0, 1)]
            for u in reversed(f.units):
                b, n = per[-1]
                per.append((b + unit_bound(u), n * (_unit_count(u) if isinstance(u, Unit)
                                                    else 1)))
            per = cache[id(f.units)] = per[::-1]
        return per[f.pos]

    @staticmethod
    def _frontier(f: _Frame, fronts: dict) -> tuple:
        """The values of frame `f` still to be read that exist already (sorted ids): `live()`
        less the values produced from `pos` on. Values not produced yet have no location and
        no alias (a variable is produced once per plan), so they add nothing to a key."""
        units = f.units if f.units is not None else f.level.units(())[0]
        per = fronts.get(id(units))
        if per is None:
            reads = f.level.units(())[2] if f.units is None else f.reads
            outs = [(u.outs if isinstance(u, Unit) else u[1].outvars) for u in units]
            produced = {v.id for o in outs for v in o}
            cur = {v for v in reads[0] if v not in produced}
            per = [tuple(sorted(cur))]
            for k, o in enumerate(outs):
                nxt = reads[k + 1]
                cur = {v for v in cur if v in nxt}
                cur.update(v.id for v in o if v.id in nxt)
                per.append(tuple(sorted(cur)))
            fronts[id(units)] = per
        return per[f.pos]

    def _count_key(self, st: _State, fronts: dict, interned: dict) -> tuple:
        """What the number of completions of `st` depends on (for `_count_limited`): the
        frames (level, chosen units, position, decomposed parent unit), the transfers still
        allowed, and for every value still to be read — in each frame, the inputs of the
        units from `pos` on and the graph's outputs (`live()`), which covers every value a
        later transfer, alias or output copy can touch; of those, the ones that exist already
        (`_frontier`) — the set of backends holding the value it resolves to, and which of
        these values are the same one (a transfer of one is a transfer of all). The frames
        fix which values these are, so an entry needs no variable: it is the set of
        backends, with the position of the first entry resolving to the same value when that
        is an earlier one (so states reached through different decompositions, whose values
        resolve to different variables, share a key). Left out on purpose: costs, the
        first/previous backend (penalties only) and the order of a value's copies (it picks
        a transfer's source, which changes its cost, not whether it happens). `interned` interns
        the positions and the sets of backends."""
        where = tuple(f.key() for f in st.frames)
        at = interned.get(where)  # interned: many keys share a position, so keep one small int
        if at is None:
            at = interned[where] = len(interned)
        parts: list = [at, self.max_transfers - st.ntransfers]
        alias, loc = st.alias, st.loc
        first: dict = {}
        i = 0
        for f in st.frames:
            for vid in self._frontier(f, fronts):
                k = _resolve(alias, vid)
                if isinstance(k, Literal):
                    parts.append(None)
                else:
                    j = first.setdefault(k, i)
                    locs = loc.get(k, (self.host,))
                    held = interned.get(locs)
                    if held is None:
                        held = interned[locs] = frozenset(locs)
                    parts.append(held if j == i else (j, held))
                i += 1
        return tuple(parts)

    def _count_compact(self, st: _State, fronts: dict) -> None:
        """Keep in `st` only the aliases and locations of values still to be read that exist
        (`_frontier`): nothing else is read again, so copying a state costs O(live values),
        not O(values so far), and counting a long graph stays linear in its length."""
        alias, loc = st.alias, st.loc
        new_alias: dict = {}
        new_loc: dict = {}
        for f in st.frames:
            for vid in self._frontier(f, fronts):
                k = _resolve(alias, vid)
                if k != vid:
                    new_alias[vid] = k
                if not isinstance(k, Literal) and k in loc:
                    new_loc[k] = loc[k]
        st.alias, st.loc = new_alias, new_loc

    def __len__(self) -> int:
        return self.count()

    def _walk(self) -> Iterator[_State]:
        stack = [self._start()]
        while stack:
            st = stack.pop()
            if st.done:
                yield st
                continue
            children = [self._apply(st, c) for c in self._choices(st)]
            stack.extend(c for c in reversed(children) if c is not None)

    def __iter__(self) -> Iterator[PathPlan]:
        for st in self._walk():
            yield self.plan_type(self, st)

    def _signature(self, st: _State) -> tuple:
        """What the rest of the search depends on: where the walk is, and where every value
        still to be read lives (by the value it resolves to)."""
        parts: list = [f.key() for f in st.frames]
        if self._switch is not None:  # the penalties still to pay depend on these
            parts.append((st.first, st.prev))
        if self.max_transfers is not None:
            parts.append(st.ntransfers)
        for f in st.frames:
            for vid in sorted(f.live()):
                k = _resolve(st.alias, vid)
                if isinstance(k, Literal):
                    parts.append((vid, "lit"))
                    continue
                # copies are made from the first location (the producer's): the order of
                # the others changes nothing that follows
                locs = st.loc.get(k)
                parts.append((vid, k, locs if locs is None or len(locs) < 3
                              else (locs[0], frozenset(locs[1:]))))
        return tuple(parts)

    def ranked(self, distinct: bool = True) -> Iterator[PathPlan]:
        """Plans best predicted first (A*; see the module docstring).

        `distinct=True` (default): one plan per (backend assignment, decomposition and
        pattern choices) — the one with each kernel's cheapest variant — so plans differing
        only in a variant (`add[out]@torch` vs `add@torch`) do not flood the top.
        `distinct=False`: every plan.

        Partial plans with the same signature (same position, same locations of every value
        still needed) have the same completions, so each signature is expanded at most
        (plans yielded so far + 1) times — the k-shortest-paths rule — and later arrivals
        wait ("parked") until another plan has been yielded. The heuristic is consistent, so
        the order stays exact.
        """
        tie = itertools.count()
        start = self._start()
        heap = [(start.cost + start.h(), 0, next(tie), start)]
        pops: dict = {}
        parked: list = []
        yielded = 0
        while heap:
            entry = heapq.heappop(heap)
            st = entry[3]
            if st.done:
                yield self.plan_type(self, st)
                yielded += 1
                for e in parked:
                    heapq.heappush(heap, e)
                parked.clear()
                continue
            sig = self._signature(st)
            n = pops.get(sig, 0)
            if n > yielded:
                parked.append(entry)
                continue
            pops[sig] = n + 1
            depth = _depth(st)
            for c in self._choices(st, distinct):
                child = self._apply(st, c)
                if child is not None:
                    heapq.heappush(heap, (child.cost + child.h(), -depth - 1, next(tie), child))

    def best(self) -> PathPlan:
        """The plan with the lowest predicted cost."""
        for p in self.ranked():
            return p
        raise TgxError("no valid plan: every path was filtered out")

    def plan_from_tokens(self, tokens: list) -> PathPlan:
        """Replay saved decisions (`PathPlan.tokens()`); raises `SerializationError` when a
        kernel is missing or its source hash changed."""
        st = self._start()
        for t in tokens:
            if st.done:
                raise SerializationError("saved plan has more decisions than this graph")
            choices = self._choices(st)
            chosen = None
            for c in choices:
                if c[0] == "subset" and t.get("d") == "patterns" and list(c[1]) == t["m"]:
                    chosen = c
                elif c[0] == "option":
                    tok = c[1].token()
                    same = all(tok.get(k) == t.get(k) for k in ("d", "name", "backend",
                                                                "variant"))
                    if same and tok.get("source_hash") != t.get("source_hash"):
                        raise SerializationError(
                            f"kernel {c[1].kernel!r} changed since the plan was saved (source "
                            f"hash {t.get('source_hash', '')[:12]} saved, "
                            f"{tok['source_hash'][:12]} now): re-plan")
                    if same:
                        chosen = c
                if chosen is not None:
                    break
            if chosen is None:
                have = ", ".join(str(c[1]) for c in choices)
                raise SerializationError(f"saved plan chooses {_token_str(t)}, which is not "
                                         f"available here (choices: {have})")
            st = self._apply(st, chosen)
            if st is None:
                raise SerializationError("saved plan exceeds max_transfers")
        if not st.done:
            raise SerializationError("saved plan stops before every equation has a choice")
        return self.plan_type(self, st)

    def __repr__(self) -> str:
        return (f"<tgx.Paths of {self.name}: {len(self.graph.eqns)} equations, backends "
                f"{', '.join(self.backends)}>")


def _resolve(alias: dict, vid: int):
    """The value `vid` stands for through `copy_to` and decomposition aliases (an id, or a
    Literal)."""
    k = vid
    while k in alias:
        k = alias[k]
        if isinstance(k, Literal):
            break
    return k


def _token_str(t: dict) -> str:
    if t.get("d") in ("kernel", "pattern"):
        v = "" if t.get("variant") == "default" else f"[{t.get('variant')}]"
        return f"{t['d']} {t.get('name')}{v}@{t.get('backend')}"
    return str(t.get("d"))


def _depth(st: _State) -> int:
    return sum(f.pos for f in st.frames) + 1000 * len(st.frames)


def _aval_of_key(v):
    return v.aval


def _lower_bounds(level: Level, paths: Paths) -> float:
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


def _fused_eqn(graph: Graph, match, name: str) -> Eqn:
    """A `fused` equation standing for the matched equations (body: those equations)."""
    consts = {v.id: c for v, c in zip(graph.constvars, graph.consts)}
    with GraphBuilder() as b:
        args, env = [], {}
        for x in match.inputs:
            t = b.new_arg(x.aval, getattr(x, "hint", None))
            args.append(t)
            if isinstance(x, Var):
                env[x.id] = t

        def read(a):
            if isinstance(a, Literal):
                return a
            return env[a.id] if a.id in env else consts[a.id]

        for i in match.eqns:
            e = graph.eqns[i]
            outs = e.primitive.bind(*[read(a) for a in e.invars], **e.params)
            outs = outs if e.primitive.multiple_results else [outs]
            for v, o in zip(e.outvars, outs):
                env[v.id] = o
        body = b.build([t.variable for t in args], [read(o) for o in match.outputs])
    return Eqn(fused_p, tuple(match.inputs), tuple(match.outputs),
               Params(graph=body, name=name), graph.eqns[match.root].source_info)


# ---------------------------------------------------------------------------------------------
# one plan


class PathPlan:
    """One path: its steps (kernels with estimates and implied transfers) and predicted cost.

    `summary()` prints a table; `assignment()` is the hand-off to lowering (`tgx.paths`'
    plans also `run`, `profile` and `save`; see `tgx.explore`).
    """

    def __init__(self, paths: Paths, state: _State):
        self.paths = paths
        self._events = state.events()
        self.steps: list[Step] = [e[1] for e in self._events if e[0] == "step"]
        self.final_transfers = state.final
        self.cost = state.cost
        self.ntransfers = state.ntransfers
        self.wrap_s = state.wrap
        # backend-switch penalties (between consecutive kernels, and last → first)
        self.switch_s = sum(s.switch for s in self.steps) + state.wrap
        self.measured_s: float | None = None
        self._plan = None

    def tokens(self) -> list[dict]:
        """The decisions, in order (stored with the plan's assignment)."""
        return [e[1] for e in self._events if e[0] == "token"]

    @property
    def sources(self) -> dict[str, int]:
        """How many figures came from each source ("measured", "cost model", "unknown")."""
        out: dict[str, int] = {}
        for s in self.steps:
            out[s.estimate.source] = out.get(s.estimate.source, 0) + 1
            for *_, est in s.transfers:
                out[est.source] = out.get(est.source, 0) + 1
        for *_, est in self.final_transfers:
            out[est.source] = out.get(est.source, 0) + 1
        return out

    def backends(self) -> list[str]:
        return sorted({s.option.backend for s in self.steps})

    def summary(self) -> str:
        """A table: step, primitive, choice, backend, predicted time, source."""
        rows = [("step", "primitive", "choice", "backend", "predicted", "source")]
        n = 0
        for s in self.steps:
            for aval, src, dst, est in s.transfers:
                rows.append(("", "  copy_to", f"{aval.str_short()} {src}→{dst}", dst,
                             _fmt_s(est.seconds), est.source))
            if s.switch:
                rows.append(("", "  switch", f"→ {s.option.backend}", s.option.backend,
                             _fmt_s(s.switch), "cost model"))
            rows.append((str(n), "  " * s.depth + s.unit.label, f"{s.option.kind} "
                         f"{s.option.kernel!r}", s.option.backend, _fmt_s(s.estimate.seconds),
                         s.estimate.source))
            n += 1
        for aval, src, dst, est in self.final_transfers:
            rows.append(("", "copy_to", f"{aval.str_short()} {src}→{dst}", dst,
                         _fmt_s(est.seconds), est.source))
        if self.wrap_s:
            rows.append(("", "switch", f"{self.steps[-1].option.backend}→"
                         f"{self.steps[0].option.backend} (next call)",
                         self.steps[0].option.backend, _fmt_s(self.wrap_s), "cost model"))
        widths = [max(len(r[i]) for r in rows) for i in range(6)]
        lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
        head = (f"PathPlan: {len(self.steps)} kernels, {self.ntransfers} transfers, predicted "
                f"{_fmt_s(self.cost)}"
                + (f" ({_fmt_s(self.switch_s)} backend switches)" if self.switch_s else "")
                + (f", measured {_fmt_s(self.measured_s)}" if self.measured_s else ""))
        return "\n".join([head, *lines])

    def __repr__(self) -> str:
        return (f"<PathPlan {len(self.steps)} kernels on {', '.join(self.backends())}, "
                f"{self.ntransfers} transfers, predicted {_fmt_s(self.cost)}>")

    # -- the hand-off ------------------------------------------------------------------------
    def assignment(self) -> Assignment:
        """The plan as an `Assignment`: its graph (decompositions expanded, patterns as
        `fused` equations) with the backend, kernel and estimate of each equation, and its
        decisions (`tokens`) in `meta`, so a stored plan can be replayed here."""
        g = self.paths.graph
        backends, kernels, estimates = [], [], []
        with GraphBuilder() as b:
            args = [b.new_arg(v.aval, v.hint) for v in g.invars]
            env: dict[int, Any] = {v.id: t for v, t in zip(g.invars, args)}
            env.update({v.id: c for v, c in zip(g.constvars, g.consts)})

            def read(a):
                return a if isinstance(a, Literal) else env[a.id]

            for ev in self._events:
                if ev[0] == "alias":
                    env[ev[1].outvars[0].id] = read(ev[1].invars[0])
                elif ev[0] == "push":
                    u, sub = ev[1], ev[2]
                    for sv, a in zip(sub.graph.invars, u.ins):
                        env[sv.id] = read(a)
                    env.update(sub.consts)
                elif ev[0] == "pop":
                    u, sub = ev[1], ev[2]
                    for pv, sv in zip(u.outs, sub.graph.outvars):
                        env[pv.id] = read(sv)
                elif ev[0] == "step":
                    s: Step = ev[1]
                    u, e = s.unit, s.unit.eqn
                    saved = b.source_override
                    b.source_override = e.source_info or saved
                    try:
                        ins = [read(a) for a in u.ins]
                        if s.option.kind == "pattern":
                            outs = fused_p.bind(*ins, **e.params)
                        else:
                            outs = e.primitive.bind(*ins, **e.params)
                    finally:
                        b.source_override = saved
                    outs = outs if e.primitive.multiple_results else [outs]
                    for v, o in zip(u.outs, outs):
                        env[v.id] = o
                    backends.append(s.option.backend)
                    kernels.append(s.option.kernel)
                    estimates.append(s.estimate)
            outs = [read(v) for v in g.outvars]
            rg = b.build([t.variable for t in args], outs, g.in_tree, g.out_tree)
        return Assignment(rg, tuple(backends), tuple(kernels), tuple(estimates), self.cost,
                          dict(self.paths.dims), "paths", {"tokens": self.tokens()})


def _fmt_s(s: float | None) -> str:
    if s is None:
        return "-"
    if s < 1e-3:
        return f"{s * 1e6:.1f} µs"
    if s < 1:
        return f"{s * 1e3:.2f} ms"
    return f"{s:.2f} s"


Paths.plan_type = PathPlan
