"""The schedule: the order a plan's equations run in.

Two concerns decide it (`schedule`):
1. Regions. The lowering turns every maximal run of consecutive equations on a backend that
   fuses regions (jax: one `jax.jit` call, which XLA fuses; one call costs ~5 µs whatever it
   does) into one call. A connected group of such equations is only one run if nothing else
   is scheduled in between, so the order matters: `region_order` is Kahn's algorithm that,
   once it has started region work, keeps taking ready region equations, and otherwise takes
   everything else that is ready first (transfers of graph inputs first of all), so region
   equations wait until the work they depend on is done and then run as one region.
2. State (`tgx.lowering.state`): an update written in place into a state buffer runs after
   every reader of the value it overwrites.

A run only ever holds equations whose inputs are all computed before it, so a region is
convex by construction: no value leaves the region and comes back. Two independent JAX
components that become ready together share one call, which is cheaper still.

>>> import tgx, tgx.numpy as tnp
>>> from tgx.lowering.rebackend import rebackend
>>> g = tgx.make_graph(lambda x: (tnp.exp(x) + 1.0, tnp.sin(x) * 2.0))(tgx.Spec((4,)))
>>> bg, _ = schedule(rebackend(g, ["jax", "numpy", "jax", "numpy"]))
>>> [e.primitive.name for e in bg.eqns if e.primitive.name != "copy_to"]
['exp', 'sin', 'add', 'mul']
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

from ..backends import get_backend
from ..core import Eqn, Var
from .state import StatePlan, plan_state


def schedule(bg, state: Sequence[tuple[int, int]] = ()) -> tuple:
    """(`bg` in run order, its `StatePlan`): regions kept together, then every reader of a
    state buffer's old value before the update that overwrites it in place. The
    `StatePlan`'s equation indices refer to the returned graph."""
    roots = {v.id for v in (*bg.invars, *bg.constvars)}
    bg = bg.reordered(region_order(bg.eqns, bg.backends, roots))
    sp = plan_state(bg, bg.eqns, bg.backends, bg.kernels or [None] * len(bg.eqns), state)
    if sp.order != list(range(len(bg.eqns))):
        pos = {j: t for t, j in enumerate(sp.order)}
        sp = StatePlan(list(range(len(bg.eqns))), frozenset(pos[j] for j in sp.inplace),
                       sp.copy, sp.reasons, sp.alias_outs,
                       {pos[j]: v for j, v in sp.buffers.items()}, sp.shared)
        bg = bg.reordered([j for j in sorted(pos, key=pos.get)])
    return bg, sp


def region_order(eqns: Sequence[Eqn], backends: Sequence[str], roots: set[int]) -> list[int]:
    """Indices of `eqns` in schedule order. `roots`: ids of graph inputs and constants (their
    transfers come first). Ties keep the traced order, so a graph without JAX work keeps it."""
    producer: dict[int, int] = {}
    for i, e in enumerate(eqns):
        for v in e.outvars:
            producer[v.id] = i
    users: list[list[int]] = [[] for _ in eqns]
    missing = [0] * len(eqns)
    for i, e in enumerate(eqns):
        deps = {producer[a.id] for a in e.invars if isinstance(a, Var) and a.id in producer}
        missing[i] = len(deps)
        for d in deps:
            users[d].append(i)

    fuses = {b: get_backend(b).fuses_regions for b in set(backends)}

    def in_region(i: int) -> bool:  # region work: on a backend that fuses regions
        return fuses[backends[i]] and eqns[i].primitive.name != "copy_to"

    def rank(i: int) -> tuple[int, int]:
        e = eqns[i]
        root_copy = (e.primitive.name == "copy_to" and isinstance(e.invars[0], Var)
                     and e.invars[0].id in roots)
        return (0 if root_copy else 1, i)

    region_ready: list = []
    other_ready: list = []

    def push(i: int) -> None:
        heapq.heappush(region_ready if in_region(i) else other_ready, (rank(i), i))

    for i in range(len(eqns)):
        if missing[i] == 0:
            push(i)
    order: list[int] = []
    in_run = False
    while region_ready or other_ready:
        if region_ready and (in_run or not other_ready):
            _, i = heapq.heappop(region_ready)
            in_run = True
        else:
            _, i = heapq.heappop(other_ready)
            in_run = False
        order.append(i)
        for u in users[i]:
            missing[u] -= 1
            if missing[u] == 0:
                push(u)
    return order
