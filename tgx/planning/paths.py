"""`tgx.paths`: every valid plan of a traced graph, lazily — count, enumerate, rank, run.

A *path* picks, for every equation of the graph: a kernel on one of the allowed backends (every
accepted variant), or the primitive's decomposition (whose sub-graph then gets its own
choices, recursively), or — for a set of equations matching a pattern kernel's `pattern` —
that one pattern kernel. The graph is the one `tgx.compile` plans: its pattern occurrences are
one `fused` equation each (the patterns stage, `tgx.planning.kernel_patterns`, applied to the
graph and to every decomposition), whose options are the pattern kernels and the op-by-op
body; other occurrences (a pattern kernel kept by `kernels_only` that the stage left out) are
chosen as sets of compatible occurrences. Running a kernel on another backend than the one
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
  accepts), `patterns=False` (the graph as traced: no pattern occurrences, no generated
  region loops), `kernels_only=` (kernel names/reprs, or a predicate on `Kernel`).

Each `PathPlan` carries its predicted cost with, per step, where the figure came from
("measured" in the store, "cost model", or "unknown"); `summary()`, `run(*args)`,
`profile(*args, store=)`, `save(store)`.

>>> import tgx, tgx.numpy as tnp
>>> ps = tgx.paths(lambda x: tnp.exp(x) * 2.0)(tgx.Spec((8,)), backends=["numpy"],
...                                            patterns=False)
>>> ps.count(), len(list(ps))
(4, 4)
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from ..backends import check_backends, host_name, load_backend
from ..backends import patterns as _patterns  # noqa: F401 - registers the pattern kernels
from ..backends.registry import Kernel, all_kernels
from ..core import Eqn, Graph, Literal
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
from .path_count import count_within_transfers
from .kernel_patterns import declines, fused_equation
from .path_space import ANY, Level, Unit, _lower_bounds
from .regions import offer_kernels
from .path_space import resolve_alias as _resolve
from .transfers import copy_source

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
        self.name = name or "graph"
        self.backends = check_backends(backends)
        # the graph `tgx.compile` plans: each pattern occurrence one `fused` equation whose
        # options are its kernels and its op-by-op body (a product of choices; all subsets
        # of overlapping occurrences made the search for a Gemma block's second-best plan
        # run for minutes)
        # (and its generatable elementwise regions one `fused` equation each, the fuse stage)
        if patterns:
            graph = offer_kernels(graph, self.backends)
        self.graph = graph
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
        occurrence = eqn.primitive.name == "fused"   # the op-by-op body is always an option
        if eqn.primitive.decomposition is not None and (self.decompose or not opts
                                                        or occurrence):
            sub_graph = decomposition_graph(eqn)
            if self.patterns and eqn.primitive.name != "fused":  # a body is not searched again
                sub_graph = offer_kernels(sub_graph, self.backends)
            sub = Level(sub_graph, self, depth + 1, patterns=not occurrence)
            opts.append(Candidate("decomposition"))
        return Unit(eqn, opts, sub, (index,), index)

    def _pattern_units(self, graph: Graph) -> list[Unit]:
        by_pattern: dict[int, tuple] = {}
        for k in self._pattern_kernels:
            for form in k.forms:
                by_pattern.setdefault(id(form), (form, []))[1].append(k)
        units = []
        for form, ks in by_pattern.values():
            for m in find_pattern(graph, form):
                eqn = fused_equation(graph, m, ks[0].name)
                opts = [Candidate("pattern", k.backend, k) for k in ks
                        if declines(k, eqn) is None]
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
        decision process (`tgx.planning.path_count`)."""
        if self.max_transfers is None:
            return self.root.count()
        return count_within_transfers(self)

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

    def ranked(self, distinct: bool = True,
               max_expansions: int | None = None) -> Iterator[PathPlan]:
        """Plans best predicted first (A*; see the module docstring).

        `max_expansions`: stop (yield no more) after expanding this many partial plans. The
        search is exact, so where many partial plans predict about the same time it expands
        many: a 2-layer Gemma block on a freshly profiled store took 340K expansions (36 s)
        to its first plan.

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
        yielded = expanded = 0
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
            expanded += 1
            if max_expansions is not None and expanded > max_expansions:
                return
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


def _token_str(t: dict) -> str:
    if t.get("d") in ("kernel", "pattern"):
        v = "" if t.get("variant") == "default" else f"[{t.get('variant')}]"
        return f"{t['d']} {t.get('name')}{v}@{t.get('backend')}"
    return str(t.get("d"))


def _depth(st: _State) -> int:
    return sum(f.pos for f in st.frames) + 1000 * len(st.frames)


def _aval_of_key(v):
    return v.aval


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
