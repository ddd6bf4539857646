"""The one loop every graph-to-graph transform shares: walk the equations in order, re-emitting
each into a fresh builder through a rule that may replace it (decompose, simplify, rebackend …).

A rule gets the equation and its inputs as tracers/values of the new graph and returns the new
outputs, or None to keep the equation as it is. The input graph is never mutated.
"""

from __future__ import annotations

from collections.abc import Callable

from ..core import Eqn, Graph, Literal, find_top_trace
from ..tracing import GraphBuilder

Rule = Callable[[Eqn, list], "list | None"]


def rebind(eqn: Eqn, ins: list) -> list:
    """Emit `eqn` unchanged (same primitive and params) on new inputs."""
    outs = eqn.primitive.bind(*ins, **eqn.params)
    return outs if eqn.primitive.multiple_results else [outs]


def eval_into(graph: Graph, args: list, rule: Rule | None = None,
              consts: list | None = None) -> list:
    """Run `graph` inside the *current* builder on `args` (tracers), applying `rule`."""
    builder = find_top_trace(args)
    env: dict[int, object] = {}
    for v, c in zip(graph.constvars, consts if consts is not None else graph.consts):
        env[v.id] = c
    for v, a in zip(graph.invars, args):
        env[v.id] = a

    def read(a):
        return a if isinstance(a, Literal) else env[a.id]  # builders accept Literals as-is

    for eqn in graph.eqns:
        ins = [read(a) for a in eqn.invars]
        saved = builder.source_override
        builder.source_override = eqn.source_info or saved
        try:
            outs = rule(eqn, ins) if rule is not None else None
            if outs is None:
                outs = rebind(eqn, ins)
        finally:
            builder.source_override = saved
        for v, o in zip(eqn.outvars, outs):
            env[v.id] = o
    return [read(v) for v in graph.outvars]


def transform_graph(graph: Graph, rule: Rule | None = None) -> Graph:
    """A new graph with every equation passed through `rule` (None keeps it)."""
    with GraphBuilder() as b:
        args = [b.new_arg(v.aval, v.hint) for v in graph.invars]
        outs = eval_into(graph, args, rule)
        return b.build([t.variable for t in args], outs, graph.in_tree, graph.out_tree)
