"""tgx: trace Python functions into a typed IR with symbolic shapes, transform it, and run it
on the fastest measured kernels.

>>> import tgx, tgx.numpy as tnp
>>> g = tgx.make_graph(lambda x: tnp.sum(x * 2.0, axis=1))(tgx.Spec(("N", 4), "float32"))
>>> g.out_avals
[f32[N]]
"""

from . import primitives  # noqa: F401  (registers every primitive)
from .core import Eqn, Graph, Literal, Primitive, SourceInfo, Var, check_graph
from .errors import (
    BindingError, DTypeError, GraphCheckError, KernelError, OutOfMemory, ShapeError,
    SymbolicShapeError, TgxError, TracerControlFlowError,
)
from .interpreters.evaluate import eval_graph
from .shapes import ShapedArray, Spec
from .tracing import make_graph, register_pytree_node, tree_flatten, tree_map, tree_unflatten

__version__ = "0.1.0"

__all__ = [
    "BindingError", "DTypeError", "Eqn", "Graph", "GraphCheckError", "KernelError", "Literal",
    "OutOfMemory", "Primitive", "ShapeError", "ShapedArray", "SourceInfo", "Spec",
    "SymbolicShapeError", "TgxError", "TracerControlFlowError", "Var", "check_graph",
    "eval_graph", "make_graph", "register_pytree_node", "tree_flatten", "tree_map",
    "tree_unflatten",
]
