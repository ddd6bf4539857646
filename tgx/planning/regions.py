"""The fuse stage: regions of elementwise ops become one `fused` equation where tgx can
generate a loop for them, so the selection can run the region as one generated kernel.

`tgx.fuse` groups connected elementwise equations; a region of at least two equations whose
body `tgx.backends.numba_codegen` supports stays fused, every other region is put back as it
was. A region's candidates are the generated loop (NumPy backend), NumPy's interpreter of the
body, and the body itself (each op on any backend): the selection takes the loop only where
it is priced lower, like any kernel. Without numba, or without NumPy among the backends, the
stage changes nothing.

>>> import tgx, tgx.numpy as tnp
>>> g = tgx.make_graph(lambda x: tnp.exp(x) * 2.0 + x)(tgx.Spec((8,)))
>>> [e.primitive.name for e in fuse_regions(g, ["numpy"]).eqns] == (
...     ["fused"] if HAVE_NUMBA else ["exp", "mul", "add"])
True
"""

from __future__ import annotations

from collections.abc import Sequence

from ..backends.numba_codegen import HAVE_NUMBA, unsupported
from ..core import Graph
from ..transforms.fuse import fuse
from ..transforms.rewrite import eval_into, transform_graph
from .kernel_patterns import is_region, match_patterns

#: the fewest equations a region must have to stay fused (one op gains nothing)
MIN_EQNS = 2


def fuse_regions(graph: Graph, backends: Sequence[str]) -> Graph:
    """`graph` with its generatable elementwise regions as `fused` equations (module doc)."""
    if not HAVE_NUMBA or "numpy" not in backends:
        return graph
    if sum(e.primitive.elementwise for e in graph.eqns) < MIN_EQNS:
        return graph

    def rule(eqn, ins):
        if is_region(eqn) and (len(eqn.params["graph"].eqns) < MIN_EQNS
                               or unsupported(eqn) is not None):
            return eval_into(eqn.params["graph"], ins)
        return None

    return transform_graph(fuse(graph), rule)


def offer_kernels(graph: Graph, backends: Sequence[str], *, patterns: bool = True,
                  fuse: bool = True) -> Graph:
    """The patterns stage, then this one (as in `tgx.compile`'s pipeline): what the
    selection and `tgx.paths` apply to the decomposition graphs they solve."""
    if patterns:
        graph = match_patterns(graph, backends)
    return fuse_regions(graph, backends) if fuse else graph
