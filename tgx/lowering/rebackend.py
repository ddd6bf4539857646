"""`tgx.rebackend`: assign a backend to every equation and insert `copy_to` at the boundaries.

The assignment is recorded on the result, a `BackendGraph` (a `Graph` with one backend name
per equation in `.backends`, aligned with `.eqns`). It is a typed field rather than a param
because params feed the shape rules, and rather than a side table keyed by object identity
because graphs are values; transforms that rebuild a graph drop it (run `rebackend` again).

Graph inputs and constants live on NumPy (host memory); outputs are copied back to NumPy
unless `outputs=None`. A value copied to a backend once is reused by every later consumer
there, and round trips that carry no work (`copy_to` back to where a value already is, or
`copy_to` equations already present in the input) are removed.

>>> import tgx, tgx.numpy as tnp
>>> g = tgx.make_graph(lambda x: tnp.exp(x) * 2.0)(tgx.Spec(("N",)))
>>> bg = tgx.rebackend(g, {0: "torch", 1: "torch"})
>>> [e.primitive.name for e in bg.eqns], bg.backends
(['copy_to', 'exp', 'mul', 'copy_to'], ('torch', 'torch', 'torch', 'numpy'))
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from ..core import Eqn, Graph, Literal, Var
from ..errors import KernelError
from ..primitives.transfer import copy_to_p
from ..tracing import GraphBuilder
from .schedule import region_order

HOST = "numpy"


class BackendGraph(Graph):
    """A graph whose equations each carry the backend that runs them (`.backends`)."""

    __slots__ = ("backends",)

    def __init__(self, *args, backends=(), **kw):
        super().__init__(*args, **kw)
        self.backends = tuple(backends)
        if len(self.backends) != len(self.eqns):
            raise KernelError(f"{len(self.eqns)} equations but {len(self.backends)} backends")

    def __str__(self) -> str:
        from ..core import pp_eqn, var_namer

        text = super().__str__().split("\n")
        name = var_namer(self)
        lines, k = [], 0
        for line in text:
            if k < len(self.eqns) and line.strip() == pp_eqn(self.eqns[k], name).strip():
                line = f"{line}  @{self.backends[k]}"
                k += 1
            lines.append(line)
        return "\n".join(lines)

    __repr__ = __str__


def _normalize(graph: Graph, assign, device: str = "cpu") -> list[str]:
    n = len(graph.eqns)
    if isinstance(assign, str):
        if assign in ("numpy", "torch", "jax"):
            return [assign] * n
        from ..planning.policies import assign_backends

        return assign_backends(graph, policy=assign, device=device)
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
              *, outputs: str | None = HOST, device: str = "cpu") -> BackendGraph:
    """A new graph running equation i on `assign[i]`, with `copy_to` at every boundary.

    `assign`: a dict eqn-index → backend, a function eqn → backend, a list, a backend name for
    every equation, or a policy name ("heuristic"). Equations of the input that are `copy_to`
    carry no work: they are dropped and re-inserted only where a consumer needs them.

    `device`: where the non-NumPy backends run (`"cpu"`, `"cuda:0"`): a `copy_to` to torch or
    jax carries it, a `copy_to` to NumPy always carries `"cpu"` (NumPy is host-only).
    """
    from ..runtime.compiled import Device

    device = str(Device.parse(device))
    names = _normalize(graph, assign, device)
    backends: list[str] = []
    with GraphBuilder() as b:
        args = [b.new_arg(v.aval, v.hint) for v in graph.invars]
        # value id (of the input graph) -> {backend: tracer or Literal}
        where: dict[int, dict[str, object]] = {}
        for v, t in zip(graph.invars, args):
            where[v.id] = {HOST: t}

        def on(a, backend: str):
            if isinstance(a, Literal):
                return a
            if a.id not in where:  # a constvar: becomes a constant of the new graph
                where[a.id] = {HOST: _const_of(graph, a)}
            copies = where[a.id]
            if backend not in copies:
                src = next(iter(copies.values()))
                copies[backend] = copy_to_p.bind(
                    src, backend=backend, device="cpu" if backend == HOST else device)
                backends.append(backend)
            return copies[backend]

        for eqn, be in zip(graph.eqns, names):
            if eqn.primitive is copy_to_p:  # no work: join the input's group of copies
                x = eqn.invars[0]
                if isinstance(x, Literal):
                    where[eqn.outvars[0].id] = {HOST: x}
                else:
                    on(x, HOST) if x.id not in where else None
                    where[eqn.outvars[0].id] = where[x.id]
                continue
            saved = b.source_override
            b.source_override = eqn.source_info
            try:
                outs = eqn.primitive.bind(*[on(a, be) for a in eqn.invars], **eqn.params)
            finally:
                b.source_override = saved
            backends.append(be)
            outs = outs if eqn.primitive.multiple_results else [outs]
            for v, o in zip(eqn.outvars, outs):
                where[v.id] = {be: o}
        out_leaves = [on(v, outputs) if outputs is not None else
                      (v if isinstance(v, Literal) else next(iter(where[v.id].values())))
                      for v in graph.outvars]
        g = b.build([t.variable for t in args], out_leaves, graph.in_tree, graph.out_tree)
    # the schedule: transfers of inputs and constants first, and JAX work kept together so
    # that each connected group of JAX equations lowers to one jax.jit (see schedule.py)
    roots = {v.id for v in (*g.invars, *g.constvars)}
    order = region_order(g.eqns, backends, roots)
    return BackendGraph(g.constvars, g.consts, g.invars, g.outvars, [g.eqns[i] for i in order],
                        g.in_tree, g.out_tree, backends=[backends[i] for i in order])


def _const_of(graph: Graph, v: Var):
    for cv, c in zip(graph.constvars, graph.consts):
        if cv is v:
            return c
    raise KernelError(f"rebackend: variable {v!r} is used before it is defined")


def graph_backends(graph: Graph, default: str = HOST) -> tuple[str, ...]:
    """The backend of every equation (`default` for a plain Graph)."""
    if isinstance(graph, BackendGraph):
        return graph.backends
    return (default,) * len(graph.eqns)
