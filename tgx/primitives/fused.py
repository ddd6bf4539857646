"""`fused`: a region of equations kept together as one equation (built by `tgx.fuse`).

The body is a `Graph` in `params["graph"]`; the shape rule is the body's output avals, the
NumPy reference evaluates the body, and the decomposition inlines it (both are core's
`eval_graph_loop`: eager without a trace, staged into the current one otherwise). A fused
equation prints its body indented, hashes structurally (the body's hash), and evaluates to
the same numbers as the equations it replaced. An occurrence of a pattern kernel's pattern
(the patterns stage) is a `fused` equation named after the kernel, with the values it binds
to the pattern's wildcard params in `kernel_params` (what the kernel receives).
"""

from __future__ import annotations

import numpy as np
import sympy

from ..core import Graph, Literal, Primitive, eval_graph_loop
from ..shapes import concretize

fused_p = Primitive("fused", multiple_results=True, family="fused")


@fused_p.def_shape
def _fused_shape(*avals, graph: Graph, name: str = "fused", kernel_params=(), also=()):
    return list(graph.out_avals)


@fused_p.def_impl
def _fused_impl(*xs, graph: Graph, name: str = "fused", kernel_params=(), also=()):
    return reference_loop(graph, list(xs))


def reference_loop(graph: Graph, args: list) -> list:
    """The NumPy reference of `graph` on arrays, each equation by its primitive's reference
    implementation. Called on float64 copies of float inputs (the profiler's golden result,
    the check of a pattern kernel), it computes in float64 throughout: float literals are
    widened with them (binding would reject ``f64 + f32 literal``).

    >>> import tgx, tgx.numpy as tnp
    >>> g = tgx.make_graph(lambda x: x * 0.1)(tgx.Spec((1,), "float32"))
    >>> reference_loop(g, [np.ones(1)])[0].dtype
    dtype('float64')
    """
    widened = any(np.asarray(x).dtype == np.float64 and v.aval.dtype != np.float64
                  for v, x in zip(graph.invars, args))
    env: dict = {v.id: c for v, c in zip(graph.constvars, graph.consts)}
    env.update({v.id: x for v, x in zip(graph.invars, args)})

    def read(a):
        if not isinstance(a, Literal):
            return env[a.id]
        dt = a.aval.dtype
        if widened and (np.issubdtype(dt, np.floating) or dt.name == "bfloat16"):
            dt = np.float64
        return np.asarray(a.val, dtype=dt)

    # a body traced with symbolic dims: bind them from the arguments' shapes
    dims = {d: n for v, x in zip(graph.invars, args)
            for d, n in zip(v.aval.shape, np.shape(x)) if isinstance(d, sympy.Symbol)}
    for eqn in graph.eqns:
        params = {k: concretize(p, dims) for k, p in eqn.params.items()} if dims else eqn.params
        outs = eqn.primitive.impl(*[read(a) for a in eqn.invars], **params)
        outs = outs if eqn.primitive.multiple_results else [outs]
        for v, o in zip(eqn.outvars, outs):
            env[v.id] = np.asarray(o) if widened else np.asarray(o, dtype=v.aval.dtype)
    return [read(v) for v in graph.outvars]



@fused_p.def_decomposition
def _fused_decomp(*xs, graph: Graph, name: str = "fused", kernel_params=(), also=()):
    return eval_graph_loop(graph, list(xs))
