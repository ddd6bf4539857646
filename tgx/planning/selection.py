"""Selection: one backend and kernel per equation, minimizing Σ kernel times + Σ transfer times.

Each equation's options are, per backend, its fastest accepted kernel there (tolerance
permitting) and, for a composite, its decomposition on that backend (cost: the best selection
of the decomposition graph with every sub-equation on that backend, recursively: a unit on one
backend, so the switch penalties at its borders are right).
A value produced on backend a and read on backends {b, c} costs one transfer per other
backend (copies are shared, as `rebackend` does); graph inputs live on NumPy, outputs go back.

0. Exact DP over the topological order whose state is the backend (and the copies made so
   far) of every live value: exact on chains and on DAGs whose live frontier is small (at most
   `MAX_STATES` states per step). Wider graphs fall back to 1-3.
1. DP over the topological order: ``f[i][b]`` = cost of equation i on b plus, per input, the
   cheapest way to have it on b (its producer's ``f`` plus the transfer). Exact on chains and
   trees (no value read twice).
2. Backtrack from the sinks: each producer takes the backend minimizing its ``f`` plus the
   transfers to every consumer's backend.
3. Local improvement, from that plan and from every one-backend plan: move single equations,
   then producer/consumer pairs, to other backends while that lowers the exact total.

>>> import tgx, tgx.numpy as tnp
>>> g = tgx.make_graph(lambda x: tnp.exp(x) * 2.0)(tgx.Spec((64,)))
>>> s = select(g, ["numpy"], CostModel(), {})
>>> [c.backend for c in s.choices], s.total > 0
(['numpy', 'numpy'], True)
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field

import ml_dtypes
import numpy as np

from ..backends import get_backend, host_name
from ..backends.registry import generation
from ..core import Graph, Literal, Var, equation_key
from ..errors import KernelError, TgxError
from ..transforms.decompose import decomposition_graph
from ..transforms.rewrite import eval_into, rebind, transform_graph
from .assignment import Assignment
from .candidates import Candidate, candidates, loop_declines
from .cost_model import CostModel, Estimate
from .kernel_patterns import is_generated
from .regions import offer_kernels

#: on a backend that compiles a plan's region as one program (XLA), a composite's kernel and
#: its decomposition are mostly one computation (`linear` and the `dot_general` it decomposes
#: into are one dot to XLA), and their figures, each timed as a one-op program, differ by
#: noise: an 18-layer prefill's jax `linear[library]` against `dot_general` was 39.6/34.5,
#: 4.18/3.19, 2.08/2.20, 1.34/1.14 ms. The decomposition is taken there only when cheaper by
#: more than this fraction; else the selection's plan was the heuristic jax plan with its
#: linears decomposed, timed whole as a second plan (an XLA compile of 2.5 s, 2026-11-25).
#: At 0.25 an explore still took 18 of the 126 projections decomposed (a one-op q projection
#: measured 2.06 and 1.20 ms in two sweeps), and raced that twin of the jax plan (session 16)
FUSED_DECOMPOSE_MARGIN = 0.5

#: an equation's decomposition graph with the pattern kernels and loops offered on it, by
#: (equation key, backends, patterns, fuse, registry generation): the same for every
#: selection of a process (EXPLORE selects a graph on each set of backends, for its
#: shortened graph and its whole one: building them again was ~1 s of an 18-layer
#: prefill's explore)
_SUBS: dict = {}
MAX_SUBS = 4096

# Above this many DP states per step (live values x backends x copies) the exact frontier DP
# gives way to DP + local improvement.
MAX_STATES = 300


@dataclass
class Choice:
    """A priced candidate: `candidate` (a kernel, or the decomposition) run on `backend`, its
    `estimate`, and for a decomposition `sub`, the `Selection` of its graph on `backend`."""

    backend: str
    candidate: Candidate
    estimate: Estimate
    sub: Selection | None = None

    @property
    def kernel(self):
        """The kernel (None for a decomposition)."""
        return self.candidate.kernel

    def __str__(self) -> str:
        what = repr(self.kernel) if self.kernel is not None else f"decomposition@{self.backend}"
        return f"{what}: {self.estimate.seconds * 1e6:.2f} µs ({self.estimate.source})"


@dataclass
class Selection:
    """Per-equation choices of `graph`, the predicted total (kernels + transfers, seconds)
    and the binding `dims` the figures are for."""

    graph: Graph
    choices: list[Choice]
    total: float
    transfer_s: float
    dims: dict = field(default_factory=dict)
    #: the backends it chose among
    backends: tuple = ()

    def sources(self) -> list[str]:
        return [c.estimate.source for c in self.choices]

    def __str__(self) -> str:
        lines = [f"Selection: {self.total * 1e6:.2f} µs predicted "
                 f"({self.transfer_s * 1e6:.2f} µs transfers)"]
        for e, c in zip(self.graph.eqns, self.choices):
            lines.append(f"  {e.primitive.name:<16} {c}")
        return "\n".join(lines)


def check_tolerance(graph: Graph, tolerance: float | None) -> None:
    """A tolerance below a result dtype's unit roundoff cannot be met: an error."""
    if tolerance is None:
        return
    seen = set()
    for e in graph.eqns:
        for v in e.outvars:
            dt = v.aval.dtype
            if dt in seen or not np.issubdtype(dt, np.floating) and dt.name != "bfloat16":
                continue
            seen.add(dt)
            eps = float(ml_dtypes.finfo(dt).eps) / 2
            if tolerance < eps:
                raise TgxError(f"tolerance {tolerance:g} cannot be met by {dt.name} results "
                               f"(unit roundoff {eps:.3g}), first at {e}")


def offered_decomposition(eqn, backends, patterns: bool = True, fuse: bool = True) -> Graph:
    """`eqn`'s decomposition graph as the selection solves it: with the pattern kernels and
    regions it offers on `backends` (`regions.offer_kernels`; a fused region's body gets
    none again), kept until the kernel registry changes (EXPLORE sweeps the same graphs).
    """
    key = (equation_key(eqn), tuple(backends), patterns, fuse, generation())
    sub = _SUBS.get(key)
    if sub is None:
        sub = decomposition_graph(eqn)
        if eqn.primitive.name != "fused":  # inside a composite, not in a body again
            sub = offer_kernels(sub, list(backends), patterns=patterns, fuse=fuse)
        if len(_SUBS) >= MAX_SUBS:
            _SUBS.clear()
        _SUBS[key] = sub
    return sub


#: how far local moves look back and ahead for the equation that last woke, or next wakes, a
#: thread pool (`_Selector.pool_before`): looking through the whole graph for each move took
#: an 18-layer prefill's selections from 2.5 to 5.3 s
POOL_WINDOW = 64


class _Selector:
    def __init__(self, backends, cm: CostModel, dims, free=(), patterns: bool = False,
                 fuse: bool = False, written_back=()):
        self.backends = list(backends)
        #: value ids of outputs that are state: made on a backend whose arrays cannot be
        #: written (jax), each is copied into the caller's buffer every call
        self.written_back = frozenset(written_back)
        # decompositions are searched for pattern kernels and generatable regions of every
        # allowed backend
        self.patterns, self.fuse = patterns, fuse
        self.all_backends = list(backends)
        self.cm = cm
        self.dims = dims
        self.free = frozenset(free)  # value ids whose transfers are free (bound weights)
        self._decomp: dict = {}
        self._options: dict = {}  # equation key -> options (independent of where inputs live)
        self._bounds: dict = {}   # equation key -> lower bound of its decomposition's time
        self._switch_memo: dict = {}  # (src, dst, wakes, pool) -> switch penalty

    # -- options per equation --------------------------------------------------------------
    def options(self, eqn, depth: int = 0) -> dict[str, Choice]:
        # which operands are bound weights matters: kernels that prepare an operand once
        # (`Kernel.prepare`) are offered only where it is one
        key = (equation_key(eqn), tuple(self.backends),
               tuple(isinstance(a, Var) and a.id in self.free for a in eqn.invars))
        hit = self._options.get(key)
        if hit is None:
            hit = self._options[key] = self._compute_options(eqn, depth)
        return hit

    def _compute_options(self, eqn, depth: int) -> dict[str, Choice]:
        out: dict[str, Choice] = {}
        cands = candidates(eqn, self.backends, unchecked_loops=True)
        decomposes = any(c.kind == "decomposition" for c in cands)
        for b in self.backends:
            best, best_score = None, math.inf
            for c in cands:
                if c.backend != b or self.cm.excluded(eqn, c.kernel, self.dims) is not None:
                    continue
                if not self.held_once(eqn, c.kernel):
                    continue
                est = self.cm.kernel(eqn, c.kernel, self.dims)
                if is_generated(c.kernel) and (est.source != "measured"
                                               or loop_declines(eqn, c.kernel) is not None):
                    # Unmeasured, a generated loop is priced as its ops plus a call and
                    # only a measurement makes it win (`CostModel`): it is offered once
                    # explore has measured it, and checked (compiled) only then. Checking
                    # every region's loop here was 45 of a 48 s first compile of a
                    # 4-layer LM training step on a cold kernel cache.
                    continue
                # among one backend's kernels, one allocating its result pays for writing
                # it to fresh memory (`CostModel.fresh_output_s`); the estimate stays its own
                score = est.seconds + self.cm.fresh_output_s(eqn, c.kernel, self.dims)
                if best is None or score < best_score:
                    best, best_score = Choice(b, c, est), score
            if decomposes and depth < 8 and (
                    best is None or self.decomposition_bound(eqn, depth) < best.estimate.seconds):
                sub = self.decomposition(eqn, b, depth)
                margin = FUSED_DECOMPOSE_MARGIN if get_backend(b).fuses_regions else 0.0
                if sub is not None and (best is None
                                        or sub.total < best.estimate.seconds * (1 - margin)):
                    src = "measured" if all(s == "measured" for s in sub.sources()) else \
                        "cost model"
                    best = Choice(b, Candidate("decomposition"),
                                  Estimate(sub.total, src, "decomposition"), sub)
            if best is not None:
                out[b] = best
        if not out:
            raise KernelError(f"no kernel on {', '.join(self.backends)} runs {eqn} and "
                              f"{eqn.primitive.name} has no usable decomposition"
                              + (f"\n  at {eqn.source_info}" if eqn.source_info else ""))
        return out

    def held_once(self, eqn, kernel) -> bool:
        """Whether every operand `kernel` prepares is a bound weight (converted once, not
        per call: what its measured time assumes)."""
        return all(isinstance(eqn.invars[p.operand], Var)
                   and eqn.invars[p.operand].id in self.free for p in kernel.prepare)

    def _sub_graph(self, eqn):
        return offered_decomposition(eqn, self.all_backends, self.patterns, self.fuse)

    def decomposition_bound(self, eqn, depth: int) -> float:
        """A lower bound on the decomposition's time: each sub-equation at its cheapest, no
        transfers. When a kernel already beats it, the decomposition is not solved."""
        key = equation_key(eqn)
        if key not in self._bounds:
            try:
                self._bounds[key] = sum(
                    min(c.estimate.seconds for c in self.options(e, depth + 1).values())
                    for e in self._sub_graph(eqn).eqns)
            except KernelError:
                self._bounds[key] = float("inf")
        return self._bounds[key]

    def decomposition(self, eqn, home: str, depth: int) -> Selection | None:
        key = (equation_key(eqn), home)
        if key not in self._decomp:
            sub = self._sub_graph(eqn)
            saved, self.backends = self.backends, [home]  # the whole decomposition on `home`:
            try:  # a unit on one backend, so switch penalties at its borders are right
                self._decomp[key] = self.solve(sub, home, depth + 1)
            except KernelError:
                self._decomp[key] = None
            finally:
                self.backends = saved
        return self._decomp[key]

    # -- cost of an assignment -------------------------------------------------------------
    def prepare(self, graph: Graph, home: str, depth: int, opts=None):
        self.graph, self.home = graph, home
        self.opts = opts if opts is not None else [self.options(e, depth) for e in graph.eqns]
        self.producer = {v.id: i for i, e in enumerate(graph.eqns) for v in e.outvars}
        self.consumers: dict[int, list[int]] = {}
        for i, e in enumerate(graph.eqns):
            for a in e.invars:
                if not isinstance(a, Literal):
                    self.consumers.setdefault(a.id, []).append(i)
        self.outs = {v.id for v in graph.outvars if not isinstance(v, Literal)}
        self.fusing = [b for b in self.backends if get_backend(b).fuses_regions]
        # a decomposition's outputs stay in its parent's region when the parent is there too
        self.returned = self.outs if depth == 0 else set()
        self.aval = {v.id: v.aval for v in (*graph.invars, *graph.constvars)}
        for e in graph.eqns:
            for v in e.outvars:
                self.aval[v.id] = v.aval
        self._t: dict = {}
        self.wakes = [{b: self.cm.wakes(b, e, ch.kernel) for b, ch in o.items()}
                      for e, o in zip(graph.eqns, self.opts)]

    def T(self, vid, src, dst, output: bool = False) -> float:
        """Transfer time of value `vid` from backend `src` to `dst`."""
        if src == dst or vid in self.free:
            return 0.0
        key = (vid, src, dst, output)
        t = self._t.get(key)
        if t is None:
            t = self.cm.transfer(self.aval[vid], src, dst, self.dims).seconds
            if output and vid in self.written_back:
                t += self.cm.state_write_back(self.aval[vid], src, dst, self.dims)
            t = self._t[key] = t
        return t

    def S(self, a, idxs) -> float:
        """Switch penalties between consecutive equations k-1, k for k in `idxs` (the
        schedule keeps the equation order), each after the pool the last pool-waking
        equation before k left (`CostModel.switch`). A compiled function runs in a loop, so
        the last equation precedes the first (k = 0 wraps around)."""
        n = len(a)
        if n <= 1:
            return 0.0
        return sum(self.switch_into(a, k) for k in dict.fromkeys(i % n for i in idxs))

    def switch_into(self, a, k: int) -> float:
        """The switch penalty of running equation k on `a[k]` (its choice there) after
        equation k-1 of `a` (the pool looked up only where k wakes one: `CostModel.switch`)."""
        b = a[k]
        pool = self.pool_before(a, k) if self.wakes[k][b] else None
        return self.switch(a[k - 1], b, k, pool)

    def switch(self, src: str, dst: str, k: int, pool: str | None) -> float:
        """`CostModel.switch` into equation k's choice on `dst`, remembered by what it
        depends on (the backends, whether k wakes a pool, and then which pool is awake):
        an 18-layer prefill's selections priced ~150k switches."""
        wakes = self.wakes[k][dst]
        key = (src, dst, wakes, pool if wakes else None)
        t = self._switch_memo.get(key)
        if t is None:
            t = self._switch_memo[key] = self.cm.switch(
                src, dst, self.graph.eqns[k], self.opts[k][dst].kernel,
                pool=pool if wakes else None)
        return t

    def pool_before(self, a, k: int) -> str | None:
        """The backend of the last equation before k (wrapping around) that wakes a pool,
        looked for `POOL_WINDOW` equations back (None: not found; the previous equation's
        backend then stands for it)."""
        n = len(a)
        for j in range(k - 1, k - 1 - min(n, POOL_WINDOW), -1):
            if self.wakes[j % n][a[j % n]]:
                return a[j % n]
        return None

    def next_waking(self, a, i: int) -> int:
        """The first equation after i (wrapping around, within `POOL_WINDOW`) that wakes a
        pool: its penalty depends on where i runs (`pool_before`)."""
        n = len(a)
        for j in range(i + 1, i + 1 + min(n, POOL_WINDOW)):
            if self.wakes[j % n][a[j % n]]:
                return j
        return i + 1

    def switches(self, a) -> float:
        """Every switch penalty of `a`, in one pass carrying the pool the last pool-waking
        equation left (`S` over every equation, without looking back for each)."""
        n = len(a)
        if n <= 1:
            return 0.0
        pool = next((a[j] for j in range(n - 1, -1, -1) if self.wakes[j][a[j]]), None)
        total = 0.0
        for k in range(n):
            total += self.switch(a[k - 1], a[k], k, pool)
            if self.wakes[k][a[k]]:
                pool = a[k]
        return total

    def out_cost(self, vid, src, dsts) -> float:
        """A graph output's copy to the host, unless a consumer there already made it."""
        if vid in self.outs and self.home not in dsts:
            return self.T(vid, src, self.home, output=True)
        return 0.0

    def value_cost(self, vid, a) -> float:
        i = self.producer.get(vid)
        src = self.home if i is None else a[i]
        dsts = {a[j] for j in self.consumers.get(vid, ())}
        return sum(self.T(vid, src, d) for d in dsts) + self.out_cost(vid, src, dsts)

    def values(self):
        return list(self.aval)

    def total(self, a) -> tuple[float, float]:
        k = sum(self.opts[i][b].estimate.seconds for i, b in enumerate(a))
        t = sum(self.value_cost(v, a) for v in self.values()) + self.switches(a) + \
            self.region_values(a)
        return k + t, t

    def region_values(self, a) -> float:
        """What `a`'s regions of a backend that fuses them (jax: one compiled call each)
        pay for the values they return (`CostModel.region_value_s`): every value a region
        makes and anything outside it reads. Whole-plan only (`total`): the DP and the
        local moves do not see it, so `solve` compares their plans with the one-backend
        plans by `total`. Unpriced, an LM's training step was split into two jax regions
        around its loss, ~150 activations crossing between them, and ran 6.7 ms against
        5.9 as one region (2-core CPU, 2026-11-27)."""
        if not self.fusing:
            return 0.0
        region, r = [], 0
        for i, b in enumerate(a):
            r += b in self.fusing and (i == 0 or a[i - 1] != b)
            region.append(r)
        total = 0.0
        for vid, i in self.producer.items():
            b = a[i]
            if b in self.fusing and (vid in self.returned or any(
                    region[j] != region[i] or a[j] != b for j in self.consumers.get(vid, ()))):
                total += self.cm.region_value_s(b)
        return total

    def one_backend(self, b: str) -> list[str]:
        """Every equation on `b`; one that `b` cannot run, on its cheapest other backend."""
        return [b if b in o else min(o, key=lambda c, o=o: o[c].estimate.seconds)
                for o in self.opts]

    # -- DP, backtrack, local improvement --------------------------------------------------
    def dp(self) -> list[str]:
        eqns = self.graph.eqns
        f: list[dict[str, float]] = []
        for i, e in enumerate(eqns):
            row = {}
            for b, ch in self.opts[i].items():
                c = ch.estimate.seconds
                for a in e.invars:
                    if isinstance(a, Literal):
                        continue
                    j = self.producer.get(a.id)
                    if j is None:
                        c += self.T(a.id, self.home, b)
                    else:
                        c += min(f[j][p] + self.T(a.id, p, b) for p in f[j])
                row[b] = c
            f.append(row)
        assign: list[str | None] = [None] * len(eqns)
        for i in reversed(range(len(eqns))):
            def score(b, i=i):
                s = f[i][b]
                for v in eqns[i].outvars:
                    dsts = {assign[j] for j in self.consumers.get(v.id, ())}
                    s += sum(self.T(v.id, b, d) for d in dsts) + self.out_cost(v.id, b, dsts)
                return s
            assign[i] = min(f[i], key=score)
        return assign

    def frontier_dp(self, max_states: int | None = None) -> list[str] | None:
        """Exact DP over the topological order whose state is, per live value, its backend
        and the backends it was already copied to (copies are shared). None when the number
        of states exceeds `max_states` (wide graphs): then `dp` + `improve`."""
        max_states = MAX_STATES if max_states is None else max_states
        eqns = self.graph.eqns
        last: dict[int, int] = {}
        for i, e in enumerate(eqns):
            for x in e.invars:
                if not isinstance(x, Literal):
                    last[x.id] = i
        for vid in self.outs:
            last[vid] = len(eqns)
        start = tuple(sorted((v.id, self.home, frozenset())
                             for v in (*self.graph.invars, *self.graph.constvars)
                             if v.id in last))
        # state: (backend of the first equation, of the previous one, of the last one that
        # woke a pool, live values)
        states: dict[tuple, tuple[float, tuple]] = {(None, None, None, start): (0.0, ())}
        for i, e in enumerate(eqns):
            ins = list(dict.fromkeys(x.id for x in e.invars if not isinstance(x, Literal)))
            nxt: dict[tuple, tuple[float, tuple]] = {}
            for (first, prev, pool, key), (cost, path) in states.items():
                live = {vid: (h, c) for vid, h, c in key}
                for b, ch in self.opts[i].items():
                    c2 = cost + ch.estimate.seconds
                    if prev is not None:
                        c2 += self.switch(prev, b, i, pool)
                    new = dict(live)
                    for vid in ins:
                        h, copied = new[vid]
                        if b != h and b not in copied:
                            c2 += self.T(vid, h, b)
                            new[vid] = (h, copied | {b})
                    for v in e.outvars:
                        if v.id in last:
                            new[v.id] = (b, frozenset())
                    for vid in ins:
                        if last[vid] == i:
                            del new[vid]
                    k2 = (b if first is None else first, b, b if self.wakes[i][b] else pool,
                          tuple(sorted((vid, h, c) for vid, (h, c) in new.items())))
                    old = nxt.get(k2)
                    if old is None or c2 < old[0]:
                        nxt[k2] = (c2, (*path, b))
                        if len(nxt) > max_states:
                            return None
            states = nxt
        best, best_path = float("inf"), None
        for (first, prev, pool, key), (cost, path) in states.items():
            if len(eqns) > 1:  # the next call's first equation
                cost += self.switch(prev, first, 0, pool)
            for vid, h, copied in key:
                if vid in self.outs and h != self.home and self.home not in copied:
                    cost += self.T(vid, h, self.home, output=True)
            if cost < best:
                best, best_path = cost, path
        return list(best_path)

    def improve(self, a: list[str], sweeps: int = 20) -> list[str]:
        a = list(a)
        for _ in range(sweeps):
            changed = False
            for i, e in enumerate(self.graph.eqns):
                touched = [x.id for x in e.invars if not isinstance(x, Literal)] + \
                    [v.id for v in e.outvars]

                def local(b, i=i, touched=touched):
                    a[i] = b
                    return self.opts[i][b].estimate.seconds + sum(
                        self.value_cost(v, a) for v in dict.fromkeys(touched)) + \
                        self.S(a, (i, i + 1, self.next_waking(a, i)))
                cur = a[i]
                base = local(cur)
                best_b, best_c = cur, base
                for b in self.opts[i]:
                    c = local(b)
                    if c < best_c - 1e-15:
                        best_b, best_c = b, c
                a[i] = best_b
                changed |= best_b != cur
            changed |= self._pair_moves(a)
            if not changed:
                break
        return a

    def _pair_moves(self, a: list[str]) -> bool:
        """Move a producer and one consumer together to one backend (escapes single-move
        local optima where moving either alone would add a transfer). Moves to two
        backends, 2/3 of the pairs tried with three backends, changed no plan of
        bench_train.py's steps or the Gemma model and were 40% of a training step's
        selection (2026-11-24)."""
        changed = False
        for i, e in enumerate(self.graph.eqns):
            for v in e.outvars:
                for j in dict.fromkeys(self.consumers.get(v.id, ())):
                    touched = [x.id for k in (i, j) for x in self.graph.eqns[k].invars
                               if not isinstance(x, Literal)] + \
                        [o.id for k in (i, j) for o in self.graph.eqns[k].outvars]
                    touched = list(dict.fromkeys(touched))

                    def local(bi, bj, i=i, j=j, touched=touched):
                        a[i], a[j] = bi, bj
                        return (self.opts[i][bi].estimate.seconds
                                + self.opts[j][bj].estimate.seconds
                                + sum(self.value_cost(t, a) for t in touched)
                                + self.S(a, (i, i + 1, j, j + 1, self.next_waking(a, i),
                                             self.next_waking(a, j))))
                    cur = (a[i], a[j])
                    best, best_c = cur, local(*cur)
                    for b in self.opts[i]:
                        if b in self.opts[j]:
                            c = local(b, b)
                            if c < best_c - 1e-15:
                                best, best_c = (b, b), c
                    a[i], a[j] = best
                    changed |= best != cur
        return changed

    def solve(self, graph: Graph, home: str | None = None, depth: int = 0,
              brute: bool = False) -> Selection:
        home = home or host_name()
        saved = getattr(self, "graph", None), getattr(self, "home", None), \
            getattr(self, "opts", None), getattr(self, "producer", None), \
            getattr(self, "consumers", None), getattr(self, "outs", None), \
            getattr(self, "aval", None), getattr(self, "_t", None), \
            getattr(self, "wakes", None), getattr(self, "fusing", None), \
            getattr(self, "returned", None)
        self.prepare(graph, home, depth)
        try:
            if brute:
                a = min(itertools.product(*[list(o) for o in self.opts]),
                        key=lambda a: self.total(a)[0])
            else:
                a = self.frontier_dp()
                found = [a]
                if a is None:  # too wide: improve the DP's plan and every one-backend plan
                    seeds = [self.dp()] + [[b] * len(self.opts) for b in self.backends
                                           if all(b in o for o in self.opts)]
                    found = [self.improve(x) for x in seeds]
                # the plans of one region each, whose values crossing regions the DP and
                # the moves did not price (`region_values`)
                found += [self.one_backend(b) for b in self.fusing]
                a = min(found, key=lambda x: self.total(x)[0])
            total, tr = self.total(a)
            return Selection(graph, [self.opts[i][b] for i, b in enumerate(a)], total, tr,
                             dict(self.dims), tuple(self.backends))
        finally:
            (self.graph, self.home, self.opts, self.producer, self.consumers, self.outs,
             self.aval, self._t, self.wakes, self.fusing, self.returned) = saved


def select(graph: Graph, backends, cost_model: CostModel, dims: dict,
           weights=(), patterns: bool = False, fuse: bool = False,
           home: str | None = None, state=()) -> Selection:
    """The cheapest choice per equation of `graph` on `backends` at binding `dims`.

    `weights`: indices of the inputs that are bound weights: converted once, not per call,
    so their transfers cost nothing. `patterns`: decompositions offer the pattern kernels
    that occur in them (`tgx.planning.kernel_patterns`; the graph itself went through the
    patterns stage already); `fuse`: so do generatable regions of elementwise ops (the fuse
    stage). `home`: the backend whose arrays the caller passes and gets back (default:
    NumPy's). `state`: (input, output) index pairs of state buffers, whose new values are
    written back into the caller's arrays (`CostModel.state_write_back`)."""
    check_tolerance(graph, cost_model.tolerance)
    free = [graph.invars[i].id for i in weights]
    return _Selector(backends, cost_model, dict(dims or {}), free, patterns, fuse,
                     state_values(graph, state)).solve(graph, home)


def state_values(graph: Graph, state) -> list[int]:
    """The value ids of `graph`'s state outputs (`state`: (input, output) index pairs)."""
    return [v.id for _, o in state for v in [graph.outvars[o]] if isinstance(v, Var)]


def select_brute_force(graph: Graph, backends, cost_model: CostModel, dims: dict) -> Selection:
    """Like `select`, by trying every combination (for tests: small graphs only)."""
    check_tolerance(graph, cost_model.tolerance)
    return _Selector(backends, cost_model, dict(dims or {})).solve(graph, brute=True)


def realize(selection: Selection, by: str = "fastest") -> Assignment:
    """The `Assignment` of a selection: its graph with the chosen decompositions expanded,
    and per equation the chosen backend, kernel and estimate."""
    table: dict[int, Choice] = {}

    def fill(sel: Selection) -> None:
        for e, c in zip(sel.graph.eqns, sel.choices):
            table[id(e)] = c
            if c.sub is not None:
                fill(c.sub)

    fill(selection)
    emitted: list[Choice] = []

    def rule(eqn, ins):
        c = table[id(eqn)]
        if c.sub is not None:
            return eval_into(c.sub.graph, ins, rule)
        emitted.append(c)
        return rebind(eqn, ins)

    g = transform_graph(selection.graph, rule)
    if len(emitted) != len(g.eqns):
        raise TgxError(f"realize: {len(g.eqns)} equations emitted for {len(emitted)} choices")
    return Assignment(g, tuple(c.backend for c in emitted), tuple(c.kernel for c in emitted),
                      tuple(c.estimate for c in emitted), selection.total,
                      dict(selection.dims), by)
