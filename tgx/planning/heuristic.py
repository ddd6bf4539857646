"""HEURISTIC: an assignment from a few rules, no measurements.

1. A dedicated kernel beats the decomposition: an equation is decomposed only when no allowed
   backend has a kernel that accepts it, or when the *primary* backend lacks one for a
   composite (staying on one backend beats a round trip for one dedicated kernel).
2. Stay on one backend (the primary: the allowed backend with the lowest `preference`, torch
   before jax before NumPy) unless a kernel is missing there; then prefer the backend the
   inputs already live on.
3. On the host only: tiny tensors (every value at most `TINY` elements at the planning hint)
   stay on the host backend when their inputs are there: a torch or jax call costs
   microseconds, a NumPy one less. On a GPU device a host equation is a round trip (and a
   synchronisation), far dearer than a kernel launch, so there every equation stays on the
   device backends (the primary first) and goes to the host only when no device kernel
   accepts it.
4. Within a backend: library kernel > `out=` kernel > plain kernel.
5. On a GPU device the primary is a backend that runs a region as one compiled program (XLA:
   `fuses_regions`) when one reaches the device, and a fused region whose generated kernel
   the primary accepts (Triton, on torch) is kept rather than decomposed. There the host's
   dispatch of each op, not the op, is the cost: on an H200 a Gemma-3-270m decode ran 20.4
   ms as 784 torch launches against 2.1 ms as one XLA program (docs/gpu.md). On the host a
   generated loop is taken on a measurement only.

>>> import tgx, tgx.numpy as tnp
>>> g = tgx.make_graph(lambda x: tnp.exp(x) * 2.0)(tgx.Spec((4,)))
>>> heuristic_assignment(g, ["numpy"]).backends
('numpy', 'numpy')
"""

from __future__ import annotations

from collections.abc import Sequence

from ..backends import check_backends, get_backend, host_name, preference, primary_backend
from ..core import Graph, Literal
from ..devices import Device
from ..errors import KernelError
from ..shapes import HINT, eval_dim
from ..transforms.decompose import decomposition_graph
from ..transforms.rewrite import eval_into, transform_graph
from .assignment import Assignment
from .candidates import accepted_kernels
from .kernel_patterns import is_region
from .options import TINY


def _size_at_hint(aval) -> int:
    env = {s: HINT for d in aval.shape if type(d) is not int for s in d.free_symbols}
    n = 1
    for d in aval.shape:
        n *= eval_dim(d, env)
    return n


def heuristic_primary(backends: Sequence[str], device: str = "cpu") -> str:
    """The backend HEURISTIC prefers among `backends` on `device`: the lowest `preference` on
    the host; on a GPU, device backends before host-only ones and, among them, one running a
    region as one compiled program (rule 5).

    >>> heuristic_primary(["numpy", "torch"])
    'torch'
    """
    if Device.parse(device).is_host:
        return primary_backend(backends)
    return min(backends, key=lambda b: (get_backend(b).host_only,
                                        not get_backend(b).fuses_regions, preference(b)))


def decompose_unsupported(graph: Graph, backends: Sequence[str],
                          primary: str | None = None, keep_regions: bool = False) -> Graph:
    """Expand, level by level, every equation no allowed backend has an accepting kernel for,
    and (with `primary`) every composite the primary backend lacks a kernel for. A fused
    region is expanded too, unless `keep_regions` and the primary accepts it (rule 5)."""

    def rule(eqn, ins):
        if is_region(eqn):  # on the host a generated loop is taken on a measurement only
            if keep_regions and primary is not None and accepted_kernels(eqn, primary):
                return None
            return eval_into(decomposition_graph(eqn), ins, rule)
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
                    device: str = "cpu") -> list[str]:
    """One backend per equation of `graph` by the rules (see the module doc).

    `device`: where the device backends run; the tiny-tensors-on-the-host rule holds on the
    host only. Named `backends` are only checked to be installed (a pure function of the
    graph: it does not ask whether the device is present)."""
    on_host = Device.parse(device).is_host
    backends = check_backends(backends, "cpu" if backends is not None else device)
    primary = heuristic_primary(backends, device)
    host = host_name()

    # on a GPU: the device backends (primary first), host-only ones last
    fallback = (list(backends) if on_host else
                sorted(backends, key=lambda b: (get_backend(b).host_only, b != primary,
                                                preference(b))))
    where: dict[int, str] = {v.id: host for v in (*graph.invars, *graph.constvars)}
    out = []
    for eqn in graph.eqns:
        homes = [where[a.id] for a in eqn.invars if not isinstance(a, Literal)]
        tiny = all(_size_at_hint(v.aval) <= TINY for v in eqn.outvars) and all(
            _size_at_hint(a.aval) <= TINY for a in eqn.invars)
        order = []
        if on_host and tiny and host in backends and all(h == host for h in homes):
            order.append(host)
        order.append(primary)
        if homes and on_host:
            order.append(max(set(homes), key=homes.count))
        order += fallback
        chosen = next((b for b in order if b in backends and accepted_kernels(eqn, b)), None)
        if chosen is None:
            raise KernelError(f"no kernel on {', '.join(backends)} runs {eqn}")
        out.append(chosen)
        for v in eqn.outvars:
            where[v.id] = chosen
    return out


def choose_kernels(graph: Graph, backends: Sequence[str]) -> list:
    """The best accepted kernel of each equation on its assigned backend (rule 4)."""
    out = []
    for eqn, b in zip(graph.eqns, backends):
        if eqn.primitive.name == "copy_to":
            out.append(None)  # no work: the copies follow from the backends
            continue
        ks = accepted_kernels(eqn, b)
        if not ks:
            raise KernelError(f"no kernel on {b} accepts {eqn}")
        out.append(ks[0])
    return out


def heuristic_assignment(graph: Graph, backends: Sequence[str] | None = None,
                         device: str = "cpu") -> Assignment:
    """The HEURISTIC `Assignment` of `graph` on `backends` for `device`."""
    backends = check_backends(backends, device) if backends is None else list(backends)
    on_device = not Device.parse(device).is_host
    g = decompose_unsupported(graph, backends, heuristic_primary(backends, device),
                              keep_regions=on_device)
    assign = assign_backends(g, backends, device=device)
    return Assignment(g, tuple(assign), tuple(choose_kernels(g, assign)), by="heuristic")
