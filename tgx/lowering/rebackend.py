"""`tgx.rebackend`: run every equation on its backend, with `copy_to` at every boundary.

The result is a `BackendGraph`: a `Graph` whose equations each carry the backend that runs
them (`.backends`) and, when lowered from an `Assignment`, the kernel (`.kernels`; a copy's
kernel is its destination backend's `copy_to` kernel). The backend is a typed field rather
than a param because params feed the shape rules, and rather than a side table keyed by object
identity because graphs are values; transforms that rebuild a graph drop it.

The copies are exactly those `tgx.planning.transfers.implied_copies` prices: inputs and
constants live on the host backend, a value is copied to a backend once and shared by every
later reader there (from the backend that produced it), outputs go back to the host unless
`outputs=None`, and `copy_to` equations already in the input carry no work (dropped, then
re-inserted only where a reader needs them). The equations keep their order, each copy right
before its first reader; `tgx.lowering.schedule` orders them for running.

>>> import tgx, tgx.numpy as tnp
>>> g = tgx.make_graph(lambda x: tnp.exp(x) * 2.0)(tgx.Spec(("N",)))
>>> bg = tgx.rebackend(g, {0: "torch", 1: "torch"})
>>> [e.primitive.name for e in bg.eqns], bg.backends
(['copy_to', 'exp', 'mul', 'copy_to'], ('torch', 'torch', 'torch', 'numpy'))
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from ..backends import get_backend, host_name
from ..core import Eqn, Graph, Literal, Var, pp_eqn, var_namer
from ..devices import device_name
from ..errors import KernelError
from ..planning.assignment import Assignment
from ..planning.candidates import accepted_kernels
from ..planning.heuristic import assign_backends
from ..planning.transfers import implied_copies
from ..primitives.transfer import copy_to_p
from ..tracing import GraphBuilder


class BackendGraph(Graph):
    """A graph whose equations each carry the backend that runs them (`.backends`) and, once
    lowered from an assignment, their kernels (`.kernels`, else None)."""

    __slots__ = ("backends", "kernels", "origins")

    def __init__(self, *args, backends=(), kernels=None, origins=None, **kw):
        super().__init__(*args, **kw)
        self.backends = tuple(backends)
        self.kernels = None if kernels is None else tuple(kernels)
        #: per equation: its index in the graph it was rebuilt from (None for a copy)
        self.origins = tuple(origins) if origins is not None else (None,) * len(self.eqns)
        if len(self.backends) != len(self.eqns) or (
                self.kernels is not None and len(self.kernels) != len(self.eqns)):
            raise KernelError(f"{len(self.eqns)} equations but {len(self.backends)} backends"
                              + ("" if self.kernels is None else
                                 f" and {len(self.kernels)} kernels"))

    def reordered(self, order: Sequence[int]) -> BackendGraph:
        """The same graph with its equations (and their backends and kernels) in `order`."""
        return BackendGraph(self.constvars, self.consts, self.invars, self.outvars,
                            [self.eqns[i] for i in order], self.in_tree, self.out_tree,
                            backends=[self.backends[i] for i in order],
                            kernels=None if self.kernels is None else
                            [self.kernels[i] for i in order],
                            origins=[self.origins[i] for i in order])

    def __str__(self) -> str:
        text = super().__str__().split("\n")
        name = var_namer(self)
        lines, k = [], 0
        for line in text:
            if k < len(self.eqns) and line.strip() == pp_eqn(self.eqns[k], name).strip():
                line += (f"  # {self.kernels[k]!r}" if self.kernels is not None
                         else f"  @{self.backends[k]}")
                k += 1
            lines.append(line)
        return "\n".join(lines)

    __repr__ = __str__


def _normalize(graph: Graph, assign, device: str) -> list[str]:
    n = len(graph.eqns)
    if isinstance(assign, str):
        if assign == "heuristic":
            return assign_backends(graph, device=device)
        get_backend(assign)  # a backend name: checked
        return [assign] * n
    if isinstance(assign, Mapping):
        missing = [i for i in range(n) if i not in assign]
        if missing:
            raise KernelError(f"rebackend: no backend for equations {missing[:8]} "
                              f"(first: {graph.eqns[missing[0]]})")
        return [assign[i] for i in range(n)]
    if callable(assign):
        return [assign(e) for e in graph.eqns]
    return list(assign)


def rebackend(graph: Graph, assign: Mapping[int, str] | Callable[[Eqn], str] | str | list,
              *, outputs: str | None = "host", device: str = "cpu") -> BackendGraph:
    """A new graph running equation i on `assign[i]`, with `copy_to` at every boundary.

    `assign`: a dict eqn-index → backend, a function eqn → backend, a list, a backend name for
    every equation, or "heuristic" (HEURISTIC's rules). `outputs`: where results end ("host",
    a backend name, or None to leave each where it is computed). `device`: where the
    device backends run (`"cpu"`, `"cuda:0"`): a `copy_to` carries the device its result is
    on (the host for host-only backends)."""
    device = device_name(device)
    return _rebuild(graph, _normalize(graph, assign, device), None, outputs, device)


def insert_copies(assignment: Assignment, *, outputs: str | None = "host",
                  device: str = "cpu") -> BackendGraph:
    """The `BackendGraph` of an assignment: its equations with their kernels, and a
    `copy_to` (with its destination's copy kernel) for every copy it implies."""
    return _rebuild(assignment.graph, list(assignment.backends), list(assignment.kernels),
                    outputs, device_name(device))


def copy_kernel(eqn: Eqn, backend: str):
    """The kernel of a `copy_to` equation: its destination backend's copy."""
    ks = accepted_kernels(eqn, backend)
    if not ks:
        raise KernelError(f"backend {backend} has no copy_to kernel for {eqn}")
    return ks[0]


def _rebuild(graph: Graph, backends: list, kernels: list | None, outputs: str | None,
             device: str) -> BackendGraph:
    host = host_name()
    outputs = host if outputs == "host" else outputs
    copies = implied_copies(graph, backends, home=host, outputs=outputs)
    before: dict[int, list] = {}
    for c in copies:
        before.setdefault(c.before, []).append(c)
    out_backends: list[str] = []
    out_kernels: list = []
    origins: list = []
    with GraphBuilder() as b:
        args = [b.new_arg(v.aval, v.hint) for v in graph.invars]
        # value id (of the input graph) -> {backend: tracer or constant}
        where: dict[int, dict[str, object]] = {v.id: {host: t}
                                               for v, t in zip(graph.invars, args)}
        where.update({v.id: {host: c} for v, c in zip(graph.constvars, graph.consts)})
        alias: dict[int, object] = {}

        def key(a):
            while isinstance(a, Var) and a.id in alias:
                a = alias[a.id]
            return a

        def emit_copies(i: int) -> None:
            for c in before.get(i, ()):
                held = where[c.var.id]
                dev = get_backend(c.dst).value_device(device)
                held[c.dst] = copy_to_p.bind(held[c.src], backend=c.dst, device=dev)
                out_backends.append(c.dst)
                origins.append(None)
                if kernels is not None:
                    out_kernels.append(copy_kernel(b.eqns[-1], c.dst))

        def on(a, backend: str):
            a = key(a)
            return a if isinstance(a, Literal) else where[a.id][backend]

        for i, (eqn, be) in enumerate(zip(graph.eqns, backends)):
            if eqn.primitive is copy_to_p:  # no work: its output is its input
                alias[eqn.outvars[0].id] = eqn.invars[0]
                continue
            emit_copies(i)
            saved = b.source_override
            b.source_override = eqn.source_info
            try:
                outs = eqn.primitive.bind(*[on(a, be) for a in eqn.invars], **eqn.params)
            finally:
                b.source_override = saved
            out_backends.append(be)
            origins.append(i)
            if kernels is not None:
                out_kernels.append(kernels[i])
            outs = outs if eqn.primitive.multiple_results else [outs]
            for v, o in zip(eqn.outvars, outs):
                where[v.id] = {be: o}
        emit_copies(len(graph.eqns))

        def result(v):
            v = key(v)
            if isinstance(v, Literal):
                return v
            held = where[v.id]
            return held[outputs] if outputs is not None else next(iter(held.values()))

        g = b.build([t.variable for t in args], [result(v) for v in graph.outvars],
                    graph.in_tree, graph.out_tree)
    return BackendGraph(g.constvars, g.consts, g.invars, g.outvars, g.eqns, g.in_tree,
                        g.out_tree, backends=out_backends,
                        kernels=out_kernels if kernels is not None else None, origins=origins)


def graph_backends(graph: Graph, default: str | None = None) -> tuple[str, ...]:
    """The backend of every equation (`default`, the host backend, for a plain Graph)."""
    if isinstance(graph, BackendGraph):
        return graph.backends
    return (default or host_name(),) * len(graph.eqns)
