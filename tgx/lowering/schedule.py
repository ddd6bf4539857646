"""The schedule of a backend-annotated graph: a topological order that keeps JAX work together.

The lowering turns every maximal run of consecutive JAX equations into one `jax.jit` call
(XLA fuses it; one call costs ~5 µs whatever it does). A connected group of JAX equations is
only one run if nothing else is scheduled in between, so the order matters: `region_order`
is Kahn's algorithm that, once it has started JAX work, keeps taking ready JAX equations, and
otherwise takes everything else that is ready first (transfers of graph inputs first of all),
so JAX equations wait until the work they depend on is done and then run as one region.

A run only ever holds equations whose inputs are all computed before it, so a region is
convex by construction: no value leaves the region and comes back. Two independent JAX
components that become ready together share one call, which is cheaper still.

>>> import tgx, tgx.numpy as tnp
>>> from tgx.lowering.rebackend import rebackend
>>> g = tgx.make_graph(lambda x: (tnp.exp(x) + 1.0, tnp.sin(x) * 2.0))(tgx.Spec((4,)))
>>> bg = rebackend(g, ["jax", "numpy", "jax", "numpy"])
>>> [e.primitive.name for e in bg.eqns if e.primitive.name != "copy_to"]
['exp', 'sin', 'add', 'mul']
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

from ..core import Eqn, Var


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

    def is_jax(i: int) -> bool:
        return backends[i] == "jax" and eqns[i].primitive.name != "copy_to"

    def rank(i: int) -> tuple[int, int]:
        e = eqns[i]
        root_copy = (e.primitive.name == "copy_to" and isinstance(e.invars[0], Var)
                     and e.invars[0].id in roots)
        return (0 if root_copy else 1, i)

    jax_ready: list = []
    other_ready: list = []

    def push(i: int) -> None:
        heapq.heappush(jax_ready if is_jax(i) else other_ready, (rank(i), i))

    for i in range(len(eqns)):
        if missing[i] == 0:
            push(i)
    order: list[int] = []
    in_jax = False
    while jax_ready or other_ready:
        if jax_ready and (in_jax or not other_ready):
            _, i = heapq.heappop(jax_ready)
            in_jax = True
        else:
            _, i = heapq.heappop(other_ready)
            in_jax = False
        order.append(i)
        for u in users[i]:
            missing[u] -= 1
            if missing[u] == 0:
                push(u)
    return order
