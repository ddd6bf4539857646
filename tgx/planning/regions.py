"""The fuse stage: regions of elementwise ops (with reductions over their last axis) become one
`fused` equation where tgx can generate a kernel for them, so the selection can run the region
as one generated kernel.

`tgx.fuse(rows=True)` groups connected elementwise equations, the reductions over the last
axis they feed and the ops reading those (a residual add + RMSNorm, a softmax: one region;
`mean`, `var`, `std` and `logsumexp` over the last axis count as such reductions),
as far as the shared region analysis (`tgx.backends.region_ir`) accepts the group: one
iteration space of rows × columns, inputs broadcast against it, outputs per element or per
row. A region of at least two equations that a generator supports stays fused — a numba loop
on the NumPy backend (`tgx.backends.numba_codegen`), a Triton kernel on torch CUDA tensors
(`tgx.backends.triton_codegen`, where Triton and a GPU are there) — every other region is
put back as it was. A region's candidates are the generated kernels, NumPy's interpreter of
the body, and the body itself (each op on any backend): the selection takes a generated
kernel only where it is priced lower, like any kernel. Without a generator for the allowed
backends the stage changes nothing.

>>> import tgx, tgx.numpy as tnp
>>> g = tgx.make_graph(lambda x: tnp.exp(x) * 2.0 + x)(tgx.Spec((8,)))
>>> [e.primitive.name for e in fuse_regions(g, ["numpy"]).eqns] == (
...     ["fused"] if HAVE_NUMBA else ["exp", "mul", "add"])
True
"""

from __future__ import annotations

from collections.abc import Sequence

from ..backends import numba_codegen, triton_codegen
from ..backends.numba_codegen import HAVE_NUMBA
from ..backends.region_ir import analyze_eqns
from ..core import Eqn, Graph, Var, free_inputs
from ..transforms.decompose import decompose, decomposition_graph
from ..transforms.fuse import REDUCTIONS, ROW_COMPOSITES, fuse
from ..transforms.rewrite import eval_into, transform_graph
from .kernel_patterns import is_region, match_patterns

#: the fewest equations a region must have to stay fused (one op gains nothing)
MIN_EQNS = 2


def _fusible(e: Eqn) -> bool:
    return (e.primitive.elementwise and not e.primitive.multiple_results) or (
        e.primitive.name in REDUCTIONS or e.primitive.name in ROW_COMPOSITES)


def _generators(backends: Sequence[str]) -> list:
    """The `unsupported(eqn)` of each code generator usable with `backends`."""
    out = []
    if HAVE_NUMBA and "numpy" in backends:
        out.append(numba_codegen.unsupported)
    if "torch" in backends and triton_codegen.available() is None:
        out.append(triton_codegen.unsupported)
    return out


def _acceptor(graph: Graph):
    """`accept(eqns)` for `tgx.fuse`: whether a growing region still fits the region
    analysis, its outputs being the values read outside it."""
    users: dict[int, list[int]] = {}
    for e in graph.eqns:
        for x in e.invars:
            if isinstance(x, Var):
                users.setdefault(x.id, []).append(id(e))
    outs = {v.id for v in graph.outvars if isinstance(v, Var)}

    expanded: dict[int, list | None] = {}

    def atomic(e: Eqn) -> list | None:
        """A composite member as the atomic equations of its decomposition, on its own
        operands and results (None where that cannot be spliced)."""
        if e.primitive.name not in ROW_COMPOSITES:
            return [e]
        if id(e) not in expanded:
            dg = decompose(decomposition_graph(e))
            ok = all(isinstance(v, Var) and v not in dg.invars for v in dg.outvars) and (
                len(dg.outvars) == len(e.outvars)) and not dg.constvars
            sub = {**{a.id: b for a, b in zip(dg.invars, e.invars)},
                   **{a.id: b for a, b in zip(dg.outvars, e.outvars)}} if ok else {}
            expanded[id(e)] = [Eqn(q.primitive, tuple(sub.get(x.id, x) if isinstance(x, Var)
                                                      else x for x in q.invars),
                                   tuple(sub.get(v.id, v) for v in q.outvars), q.params,
                                   q.source_info) for q in dg.eqns] if ok else None
        return expanded[id(e)]

    def accept(eqns: Sequence[Eqn]) -> bool:
        inside = {id(e) for e in eqns}
        invars = free_inputs(eqns)
        outvars = [v for e in eqns for v in e.outvars
                   if v.id in outs or any(u not in inside for u in users.get(v.id, ()))]
        flat = [atomic(e) for e in eqns]
        if any(f is None for f in flat):
            return False
        return not isinstance(analyze_eqns([q for f in flat for q in f], invars, outvars,
                                           check_ops=False), str)

    return accept


def fuse_regions(graph: Graph, backends: Sequence[str]) -> Graph:
    """`graph` with its generatable regions as `fused` equations (module doc)."""
    gens = _generators(backends)
    if not gens:
        return graph
    if sum(_fusible(e) for e in graph.eqns) < MIN_EQNS:
        return graph

    def rule(eqn, ins):
        if is_region(eqn) and (len(eqn.params["graph"].eqns) < MIN_EQNS
                               or all(u(eqn) is not None for u in gens)):
            return eval_into(eqn.params["graph"], ins)
        return None

    return transform_graph(fuse(graph, rows=True, accept=_acceptor(graph)), rule)



def offer_kernels(graph: Graph, backends: Sequence[str], *, patterns: bool = True,
                  fuse: bool = True) -> Graph:
    """The patterns stage, then this one (as in `tgx.compile`'s pipeline): what the
    selection and `tgx.paths` apply to the decomposition graphs they solve."""
    if patterns:
        graph = match_patterns(graph, backends)
    return fuse_regions(graph, backends) if fuse else graph
