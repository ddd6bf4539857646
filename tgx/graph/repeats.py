"""`find_repeats` and `shorten`: a graph built of identical blocks in a row (a model's decoder
layers) and the same graph with fewer of them, to measure one repeated block instead of all.

A block is a run of equations that recurs, equation for equation (primitive, params, input
and output types), and whose data flow recurs too: each block reads its predecessor's values
as the previous block read its own predecessor's, and may read anything before the run (the
graph's inputs, a prologue's tables) freely. What follows the run may read only the last
block. Such a graph with `keep` blocks is the same program with `count - keep` layers fewer:
`shorten` builds it, dropping the removed blocks' inputs (their weights, their state) and
outputs, so EXPLORE can time its whole plans at a fraction of the cost (`tgx.explore`).

>>> import tgx, tgx.numpy as tnp
>>> def f(ws, x):
...     for w in ws:
...         x = tnp.tanh(x @ w) + x
...     return x
>>> g = tgx.make_graph(f)([tgx.Spec((4, 4))] * 5, tgx.Spec((2, 4)))
>>> r = find_repeats(g)
>>> r.count, r.length
(5, 3)
>>> short = shorten(g, r, keep=2)
>>> len(short.graph.invars), len(short.graph.eqns)
(3, 6)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from ..core import Graph, Literal, check_graph
from ..errors import OptionError
from ..transforms.simplify import dead_code_elimination
from .hashing import _Encoder, literal_key


@dataclass(frozen=True)
class Repeats:
    """`count` blocks of `length` equations each, the first starting at equation `start`."""

    start: int
    length: int
    count: int

    def block(self, i: int) -> int | None:
        """The block equation `i` belongs to (None: before or after the run)."""
        j = i - self.start
        return j // self.length if 0 <= j < self.length * self.count else None


@dataclass(frozen=True)
class Shortened:
    """`graph` with fewer blocks; `invars[i]` / `outvars[j]`: the index in the whole graph of
    the shortened graph's input i / output j."""

    graph: Graph
    invars: tuple[int, ...]
    outvars: tuple[int, ...]

    def inputs(self, indices: Sequence[int]) -> tuple[int, ...]:
        """Indices of the whole graph's inputs, as indices into the shortened graph's (those
        it dropped left out)."""
        where = {old: new for new, old in enumerate(self.invars)}
        return tuple(where[i] for i in indices if i in where)

    def pairs(self, pairs: Sequence[tuple[int, int]]) -> tuple[tuple[int, int], ...]:
        """(input, output) index pairs of the whole graph (its state buffers) that survive,
        renumbered."""
        ins = {old: new for new, old in enumerate(self.invars)}
        outs = {old: new for new, old in enumerate(self.outvars)}
        return tuple((ins[i], outs[o]) for i, o in pairs if i in ins and o in outs)


def _signatures(graph: Graph) -> np.ndarray:
    """One small integer per equation, equal for equations alike in all but their operands."""
    enc, ids = _Encoder(graph), {}
    sigs = []
    for e in graph.eqns:
        ins = tuple(literal_key(x, enc) if isinstance(x, Literal) else enc.aval(x.aval)
                    for x in e.invars)
        key = (e.primitive.name, enc.params(e.params), ins,
               tuple(enc.aval(v.aval) for v in e.outvars))
        sigs.append(ids.setdefault(key, len(ids)))
    return np.asarray(sigs, dtype=np.int64)


def _longest_run(same: np.ndarray) -> tuple[int, int]:
    """(length, start) of the longest run of True in a boolean vector."""
    padded = np.concatenate(([0], same.astype(np.int8), [0]))
    edges = np.flatnonzero(np.diff(padded))
    if not len(edges):
        return 0, 0
    starts, ends = edges[::2], edges[1::2]
    i = int(np.argmax(ends - starts))
    return int(ends[i] - starts[i]), int(starts[i])


def find_repeats(graph: Graph, min_count: int = 3) -> Repeats | None:
    """The longest run of at least `min_count` identical blocks in `graph` (the one covering
    the most equations; the shortest block among equals), or None. Equations must recur in
    the same order and with the same data flow (see the module doc)."""
    sigs = _signatures(graph)
    n = len(sigs)
    where = {v.id: i for i, e in enumerate(graph.eqns) for v in e.outvars}  # var -> producer
    found = []
    for length in range(1, n // min_count + 1):
        run, start = _longest_run(sigs[:-length] == sigs[length:])
        count = (run + length) // length
        # the run, and the run without some blocks at either end (an epilogue may read an
        # early block, which then cannot be in the run)
        for fewer in range(count - min_count + 1):
            for front in range(fewer + 1):
                found.append(((count - fewer) * length, -length, -front,
                              Repeats(start + front * length, length, count - fewer)))
    found.sort(key=lambda f: f[:3], reverse=True)
    for *_, r in found:
        if _flows_alike(graph, r, where):
            return r
    return None


def _flows_alike(graph: Graph, r: Repeats, where: dict[int, int]) -> bool:
    """Blocks 1.. read their predecessor as block 1 reads block 0, and what follows the run
    reads only the last block (values before the run may be read by anyone); `where`: the
    equation producing each variable."""

    def ref(i: int, x) -> tuple | None:
        """How equation i of a block reads x: (blocks back, position in its block, which
        output), or None (from before the run, an input, a constant or a literal)."""
        if isinstance(x, Literal) or x.id not in where:
            return None
        b = r.block(where[x.id])
        if b is None:
            return None
        p = where[x.id]
        return (r.block(i) - b, (p - r.start) % r.length, graph.eqns[p].outvars.index(x))

    end = r.start + r.length * r.count
    for i in range(r.start + r.length, end):
        e = graph.eqns[i]
        refs = [ref(i, x) for x in e.invars]
        if any(f is not None and f[0] > 1 for f in refs):
            return False  # reads a block further back
        if r.block(i) >= 2:
            first = graph.eqns[i - (r.block(i) - 1) * r.length]  # its twin in block 1
            if refs != [ref(i - (r.block(i) - 1) * r.length, x) for x in first.invars]:
                return False
    last = r.count - 1
    for i in range(end, len(graph.eqns)):
        for x in graph.eqns[i].invars:
            if not isinstance(x, Literal) and x.id in where:
                b = r.block(where[x.id])
                if b is not None and b != last:
                    return False
    return True


def shorten(graph: Graph, r: Repeats, keep: int = 2) -> Shortened:
    """`graph` with only the first `keep` blocks of `r`: what followed the last block reads
    block `keep - 1` instead; the dropped blocks' inputs and outputs go, and so does what
    only they used."""
    if not 1 <= keep <= r.count:
        raise OptionError(f"shorten: keep={keep}, but a run of {r.count} blocks keeps 1 to "
                          f"{r.count}")
    end = r.start + r.length * r.count
    shift = (r.count - keep) * r.length
    sub: dict[int, object] = {}  # the last block's values -> block keep-1's
    for i in range(end - r.length, end) if shift else ():
        for old, new in zip(graph.eqns[i].outvars, graph.eqns[i - shift].outvars):
            sub[old.id] = new
    kept = [e for i, e in enumerate(graph.eqns)
            if r.block(i) is None or r.block(i) < keep]
    tail = len(kept) - (len(graph.eqns) - end)
    kept[tail:] = [e if not any(not isinstance(x, Literal) and x.id in sub for x in e.invars)
                   else replace(e, invars=tuple(x if isinstance(x, Literal) else sub.get(x.id, x)
                                                for x in e.invars))
                   for e in kept[tail:]]
    made = {v.id for e in kept for v in e.outvars} | {v.id for v in graph.invars} | {
        v.id for v in graph.constvars}
    returned = {v.id for v in graph.outvars if not isinstance(v, Literal)}
    outs, outvars = [], []
    for j, v in enumerate(graph.outvars):
        if not isinstance(v, Literal) and v.id in sub:
            # the last block's result, returned: block keep-1's instead (once: a value the
            # graph returns already, as a kept layer's state, is not returned twice)
            v = sub[v.id]
            if v.id in returned:
                continue
        if isinstance(v, Literal) or v.id in made:
            outs.append(j)
            outvars.append(v)
    # what nothing kept reads goes, and then so do the inputs only that read
    short = dead_code_elimination(Graph(graph.constvars, graph.consts, graph.invars, outvars,
                                        kept))
    read = {x.id for e in short.eqns for x in e.invars if not isinstance(x, Literal)}
    read |= {v.id for v in outvars if not isinstance(v, Literal)}
    ins = [i for i, v in enumerate(graph.invars) if v.id in read]
    short = short.replace(invars=tuple(graph.invars[i] for i in ins))
    check_graph(short)
    return Shortened(short, tuple(ins), tuple(outs))
