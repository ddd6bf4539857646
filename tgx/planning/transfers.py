"""The copies an assignment implies, and what they cost: written once, used by every planner
and by `rebackend`.

The rule: graph inputs and constants live on the host backend; an equation running on backend
b reads each input on b, so a value not yet there is copied to b — from the backend that
produced it — once: every later reader on b shares that copy. Outputs go back to the host
(unless results stay in their backends' formats). `copy_to` equations already in a graph carry
no work: their output is their input. Selection and `tgx.paths` apply the same rule one
equation at a time (`copy_source`); `implied_copies` applies it to a whole assignment, and
`rebackend` inserts exactly those copies, so the copies priced are the copies that run.

A copy costs the destination backend's `transfer_in[src]` (overhead, and bandwidth, or None
for a zero-copy view).

>>> import tgx, tgx.numpy as tnp
>>> g = tgx.make_graph(lambda x: tnp.exp(x) * 2.0)(tgx.Spec((4,)))
>>> [(c.src, c.dst, c.before) for c in implied_copies(g, ["torch", "torch"])]
[('numpy', 'torch', 0), ('torch', 'numpy', 2)]
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from ..backends import get_backend, host_name
from ..core import Graph, Literal, Var
from ..shapes import ShapedArray, concrete_shape


@dataclass(frozen=True)
class Copy:
    """A `copy_to` of `var` from backend `src` to `dst`, made right before equation `before`
    (the first to read it there; `len(graph.eqns)` for a copy of an output)."""

    var: Var
    src: str
    dst: str
    before: int


def copy_source(locations: Sequence[str], backend: str) -> str | None:
    """Where a value held on `locations` (its producer's backend first, then the backends it
    was copied to) is copied from to be read on `backend`, or None when it is there."""
    return None if backend in locations else locations[0]


def implied_copies(graph: Graph, backends: Sequence[str], *, home: str | None = None,
                   outputs: str | None = "host") -> list[Copy]:
    """Every copy running equation i of `graph` on `backends[i]` implies, in order.

    `home`: where inputs and constants live (the host backend); `outputs`: where outputs must
    end ("host", a backend name, or None to leave them where they are)."""
    home = home or host_name()
    outputs = home if outputs == "host" else outputs
    where: dict[int, list[str]] = {v.id: [home] for v in (*graph.invars, *graph.constvars)}
    alias: dict[int, object] = {}

    def key(a):
        while isinstance(a, Var) and a.id in alias:
            a = alias[a.id]
        return a

    out: list[Copy] = []
    for i, (e, b) in enumerate(zip(graph.eqns, backends)):
        if e.primitive.name == "copy_to":  # no work: its output is its input
            alias[e.outvars[0].id] = e.invars[0]
            continue
        for a in dict.fromkeys(key(a) for a in e.invars):
            if isinstance(a, Literal):
                continue
            locs = where[a.id]
            src = copy_source(locs, b)
            if src is not None:
                out.append(Copy(a, src, b, i))
                locs.append(b)
        for v in e.outvars:
            where[v.id] = [b]
    if outputs is not None:
        seen: set = set()
        for v in graph.outvars:
            v = key(v)
            if isinstance(v, Literal) or v.id in seen:
                continue
            seen.add(v.id)
            src = copy_source(where[v.id], outputs)
            if src is not None:
                out.append(Copy(v, src, outputs, len(graph.eqns)))
    return out


def _nbytes(aval: ShapedArray, dims) -> int:
    return math.prod(concrete_shape(aval.shape, dims)) * aval.dtype.itemsize


def transfer_seconds(aval: ShapedArray, src: str, dst: str, dims=None) -> float:
    """The cost model's time for one copy of a value of `aval` from backend `src` to `dst`
    at the binding `dims` (0 on one backend)."""
    if src == dst:
        return 0.0
    ovh, bw = get_backend(dst).transfer_in.get(src, get_backend(dst).DEFAULT_TRANSFER)
    return ovh + (0.0 if bw is None else _nbytes(aval, dims) / bw)


def copies_seconds(copies: Sequence[Copy], dims=None, free: frozenset = frozenset()) -> float:
    """The total time of `copies` (values in `free`, bound weights, copy for nothing)."""
    return sum(transfer_seconds(c.var.aval, c.src, c.dst, dims) for c in copies
               if c.var.id not in free)
