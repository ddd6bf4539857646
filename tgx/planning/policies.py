"""Selection policies. HEURISTIC (this module): no measurements, a few rules.

1. A dedicated kernel beats the decomposition: an equation is decomposed only when no allowed
   backend has a kernel that accepts it.
2. Stay on one backend (the *primary*: the first of torch, jax, numpy that is allowed) unless a
   kernel is missing there; then prefer the backend the inputs already live on.
3. Tiny tensors (every output at most `TINY` elements at the planning hint) stay on NumPy
   when their inputs are there: a torch/jax call costs microseconds, a NumPy one less.
4. Within a backend: library kernel > `out=` kernel > plain kernel.

Policies "fastest" and "explore" need the benchmark store and come later.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..core import Graph, Literal
from ..errors import KernelError
from ..interpreters.decompose import decomposition_graph
from ..interpreters.rewrite import eval_into, transform_graph
from ..lowerings import available_backends, unavailable_reason
from ..shapes import eval_dim
from .candidates import accepted_kernels

TINY = 4096
HINT = 64
PREFERENCE = ("torch", "jax", "numpy")


def _size_at_hint(aval) -> int:
    env = {s: HINT for d in aval.shape if type(d) is not int for s in d.free_symbols}
    n = 1
    for d in aval.shape:
        n *= eval_dim(d, env)
    return n


def check_backends(backends: Sequence[str] | None) -> list[str]:
    if backends is None:
        return available_backends()
    for b in backends:
        reason = unavailable_reason(b)
        if reason is not None:
            raise KernelError(reason)
    return list(backends)


def primary_backend(backends: Sequence[str]) -> str:
    for b in PREFERENCE:
        if b in backends:
            return b
    return backends[0]


def decompose_unsupported(graph: Graph, backends: Sequence[str],
                          primary: str | None = None) -> Graph:
    """Expand, level by level, every equation no allowed backend has an accepting kernel for,
    and (with `primary`) every composite the primary backend lacks a kernel for: staying on
    one backend beats a round trip for one dedicated kernel."""

    def rule(eqn, ins):
        if primary is not None and eqn.primitive.decomposition is not None:
            if accepted_kernels(eqn, primary):
                return None
        elif any(accepted_kernels(eqn, b) for b in backends):
            return None
        if eqn.primitive.decomposition is None:
            declined: list = []
            for b in backends:
                accepted_kernels(eqn, b, declined)
            why = "; ".join(f"{k!r}: {r}" for k, r in declined) or "no kernel registered"
            raise KernelError(f"no kernel on {', '.join(backends)} runs {eqn} and "
                              f"{eqn.primitive.name} has no decomposition ({why})"
                              + (f"\n  at {eqn.source_info}" if eqn.source_info else ""))
        return eval_into(decomposition_graph(eqn), ins, rule)

    return transform_graph(graph, rule)


def assign_backends(graph: Graph, backends: Sequence[str] | None = None,
                    policy: str = "heuristic") -> list[str]:
    """One backend per equation of `graph` by the heuristic rules (see the module doc)."""
    if policy != "heuristic":
        raise NotImplementedError(f"policy {policy!r} needs the benchmark store; only "
                                  f"'heuristic' is implemented for now")
    backends = check_backends(backends)
    primary = primary_backend(backends)
    where: dict[int, str] = {v.id: "numpy" for v in (*graph.invars, *graph.constvars)}
    out = []
    for eqn in graph.eqns:
        homes = [where[a.id] for a in eqn.invars if not isinstance(a, Literal)]
        tiny = all(_size_at_hint(v.aval) <= TINY for v in eqn.outvars) and all(
            _size_at_hint(a.aval) <= TINY for a in eqn.invars)
        order = []
        if tiny and "numpy" in backends and all(h == "numpy" for h in homes):
            order.append("numpy")
        order.append(primary)
        if homes:
            order.append(max(set(homes), key=homes.count))
        order += backends
        chosen = next((b for b in order if b in backends and accepted_kernels(eqn, b)), None)
        if chosen is None:
            raise KernelError(f"no kernel on {', '.join(backends)} runs {eqn}")
        out.append(chosen)
        for v in eqn.outvars:
            where[v.id] = chosen
    return out


def choose_kernels(graph: Graph, backends: Sequence[str]) -> list:
    """The best accepted kernel of each equation on its assigned backend."""
    out = []
    for eqn, b in zip(graph.eqns, backends):
        ks = accepted_kernels(eqn, b)
        if not ks:
            raise KernelError(f"no kernel on {b} accepts {eqn}")
        out.append(ks[0])
    return out
