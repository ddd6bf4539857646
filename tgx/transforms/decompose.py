"""`decompose`: expand composite primitives into their decompositions, level by level."""

from __future__ import annotations

from collections.abc import Iterable

from ..core import Eqn, Graph
from ..tracing import trace_to_graph
from .rewrite import eval_into, transform_graph


def decompose(graph: Graph, *, level: int | None = None, only: Iterable[str] | None = None,
              keep: Iterable[str] | None = None) -> Graph:
    """Expand composites all the way to atomic primitives (default), `level` levels deep, only
    the primitives named in `only`, or all but those in `keep`.

    >>> import tgx, tgx.numpy as tnp
    >>> g = tgx.make_graph(lambda x: tnp.mean(x))(tgx.Spec(("N",)))
    >>> all(e.primitive.atomic for e in tgx.decompose(g).eqns)
    True
    """
    only = None if only is None else set(only)
    keep = set(keep or ())

    def wanted(eqn: Eqn) -> bool:
        p = eqn.primitive
        return (p.decomposition is not None and p.name not in keep
                and (only is None or p.name in only))

    def rule_at(depth: int):
        def rule(eqn: Eqn, ins: list):
            if (level is not None and depth >= level) or not wanted(eqn):
                return None
            sub = decomposition_graph(eqn)
            return eval_into(sub, ins, rule_at(depth + 1))
        return rule

    return transform_graph(graph, rule_at(0))


def decomposition_graph(eqn: Eqn) -> Graph:
    """The decomposition of one equation, traced on its input avals (one level)."""
    p = eqn.primitive
    params = dict(eqn.params)

    def body(*xs):
        out = p.decomposition(*xs, **params)
        return list(out) if p.multiple_results else out

    return trace_to_graph(body, ([x.aval for x in eqn.invars], {}), source_info=eqn.source_info)
