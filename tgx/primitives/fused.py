"""`fused`: a region of equations kept together as one equation (built by `tgx.fuse`).

The body is a `Graph` in `params["graph"]`; the shape rule is the body's output avals, the
NumPy reference evaluates the body, and the decomposition inlines it (both are core's
`eval_graph_loop`: eager without a trace, staged into the current one otherwise). A fused
equation prints its body indented, hashes structurally (the body's hash), and evaluates to
the same numbers as the equations it replaced.
"""

from __future__ import annotations

from ..core import Graph, Primitive, eval_graph_loop

fused_p = Primitive("fused", multiple_results=True, family="fused")


@fused_p.def_shape
def _fused_shape(*avals, graph: Graph, name: str = "fused"):
    return list(graph.out_avals)


@fused_p.def_impl
def _fused_impl(*xs, graph: Graph, name: str = "fused"):
    return eval_graph_loop(graph, list(xs))


@fused_p.def_decomposition
def _fused_decomp(*xs, graph: Graph, name: str = "fused"):
    return eval_graph_loop(graph, list(xs))
