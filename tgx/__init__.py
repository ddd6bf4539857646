"""tgx: trace Python functions into a typed IR with symbolic shapes, transform it, and run it
on the fastest measured kernels.

>>> import tgx, tgx.numpy as tnp
>>> g = tgx.make_graph(lambda x: tnp.sum(x * 2.0, axis=1))(tgx.Spec(("N", 4), "float32"))
>>> g.out_avals
[f32[N]]
"""

import importlib

from . import (
    numpy,  # noqa: F401  (installs the operators of traced arrays)
    primitives,  # noqa: F401  (registers every primitive)
)
from .core import Eqn, Graph, Literal, Primitive, SourceInfo, Var, check_graph
from .errors import (
    BindingError,
    DTypeError,
    GraphCheckError,
    IndexingError,
    KernelError,
    OptionError,
    OutOfMemory,
    ShapeError,
    SymbolicShapeError,
    TgxError,
    TracerControlFlowError,
    Unsupported,
)
from .shapes import ShapedArray, Spec
from .tracing import make_graph, register_pytree_node, tree_flatten, tree_map, tree_unflatten
from .transforms.decompose import decompose
from .transforms.evaluate import eval_graph

__version__ = "0.1.0"

# Heavier parts load on first use, so `import tgx` stays fast and imports no torch or jax.
_LAZY = {
    "nn": "tgx.nn",
    "random": "tgx.random",
    "lax": "tgx.lax",
    "structural_hash": "tgx.graph",
    "canonicalize": "tgx.graph",
    "equivalent": "tgx.graph",
    "find_pattern": "tgx.graph",
    "replace_pattern": "tgx.graph",
    "simplify": "tgx.transforms.simplify",
    "fuse": "tgx.transforms.fuse",
    "unroll": "tgx.transforms.unroll",
    "rebackend": "tgx.lowering.rebackend",
    "compile": "tgx.jit",   # a module named `compile` would shadow the function
    "Plan": "tgx.plan",
    "PlanOptions": "tgx.planning.options",
    "Assignment": "tgx.planning.assignment",
    "plan_graph": "tgx.pipeline",
    "candidates": "tgx.planning.candidates",
    "Device": "tgx.devices",
    "CompiledGraph": "tgx.runtime.compiled",
    "aligned": "tgx.io",
    "Backend": "tgx.backends",
    "register_backend": "tgx.backends",
    "BenchmarkStore": "tgx.store",
    "profile": "tgx.profiling",
    "paths": "tgx.explore",
    "register_kernel": "tgx.kernels",
    "unregister_kernel": "tgx.kernels",
    "vmap": "tgx.transforms.vmap",
    "optim": "tgx.optim",
    **{name: "tgx.transforms.ad" for name in (
        "grad", "value_and_grad", "vjp", "jvp", "jacrev", "jacfwd", "stop_gradient",
        "custom_vjp")},
}


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'tgx' has no attribute {name!r}")
    mod = importlib.import_module(module)
    is_module = module.endswith("." + name) and name in ("nn", "random", "lax", "optim")
    value = mod if is_module else getattr(mod, name)
    globals()[name] = value
    return value


__all__ = [
    "BindingError", "DTypeError", "Eqn", "Graph", "GraphCheckError", "IndexingError",
    "KernelError", "Literal", "OptionError", "OutOfMemory", "Primitive", "ShapeError",
    "ShapedArray", "SourceInfo", "Spec", "SymbolicShapeError", "TgxError",
    "TracerControlFlowError", "Unsupported", "Var", "check_graph", "decompose", "eval_graph",
    "make_graph", "register_pytree_node", "tree_flatten", "tree_map", "tree_unflatten", *_LAZY,
]
