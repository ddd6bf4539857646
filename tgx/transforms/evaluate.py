"""The reference evaluator: run a graph with the NumPy implementation of every primitive.

Symbolic dims are bound from the arguments' shapes first; the same symbol bound to two values
is an error that names both arguments (`N = 3 from x, N = 4 from y`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import sympy

from ..core import Graph, Literal, Var
from ..errors import BindingError, DTypeError, KernelError
from ..shapes import (
    ShapedArray,
    aval_of,
    check_dim_value,
    concretize,
    dim_str,
    eval_dim,
    shape_str,
)
from ..tracing import leaf_names, tree_flatten, tree_unflatten, where


def bind_dims(avals: Sequence[ShapedArray], args: Sequence[Any],
              names: Sequence[str] | None = None) -> dict:
    """Bind each symbol in `avals` to the matching size of `args` → {symbol: int}; a size
    that violates a symbol's constraint (`Spec(..., constraints=["N >= 16"])`) is a
    `BindingError` naming the argument, the axis and the constraint.

    >>> from tgx.shapes import Spec, sym
    >>> bind_dims([Spec(("N", 3))], [np.zeros((5, 3))])
    {N: 5}
    >>> bind_dims([Spec(("N",), constraints="N % 4 == 0")], [np.zeros(6)], ["x"])
    Traceback (most recent call last):
    tgx.errors.BindingError: argument x: axis 0 is N = 6, but N was declared with N % 4 == 0
    """
    names = names or [f"#{i}" for i in range(len(avals))]
    env: dict = {}
    source: dict = {}
    deferred = []
    for name, aval, x in zip(names, avals, args):
        shape = tuple(int(d) for d in np.shape(x))
        if len(shape) != len(aval.shape):
            raise BindingError(f"argument {name}: expected rank {len(aval.shape)} "
                               f"{aval.str_short()}, got shape {shape}")
        for ax, (d, n) in enumerate(zip(aval.shape, shape)):
            if type(d) is int:
                if d != n:
                    raise BindingError(f"argument {name}: expected shape {shape_str(aval.shape)}, "
                                       f"got {shape} (axis {ax})")
            elif isinstance(d, sympy.Symbol):
                if d in env and env[d] != n:
                    raise BindingError(f"symbolic dim {d} gets two values: {d} = {env[d]} from "
                                       f"{source[d]}, {d} = {n} from {name}")
                if d not in env:
                    check_dim_value(d, n, f"argument {name}: axis {ax}")
                env[d] = n
                source.setdefault(d, name)
            else:
                deferred.append((name, ax, d, n))
    for name, ax, d, n in deferred:
        try:
            value = int(d.xreplace(env))
        except TypeError:
            raise BindingError(f"argument {name}: cannot bind dim {dim_str(d)} from a plain size; "
                               f"some symbol of it appears in no argument as a plain dim") from None
        if value != n:
            raise BindingError(f"argument {name}: axis {ax} is {dim_str(d)} = {value} with "
                               f"{_fmt_env(env)}, got {n}")
    return env


def _fmt_env(env: dict) -> str:
    return ", ".join(f"{k} = {v}" for k, v in env.items())


def _has_symbols(value: Any) -> bool:
    if isinstance(value, sympy.Basic):
        return True
    if isinstance(value, tuple):
        return any(_has_symbols(v) for v in value)
    return False


def coerce_arg(x: Any, aval: ShapedArray, name: str) -> np.ndarray:
    """An argument as a NumPy array of the graph's dtype (Python scalars adopt it)."""
    if isinstance(x, (bool, int, float)) and aval.shape == ():
        return np.asarray(x, dtype=aval.dtype)
    a = np.asarray(x)
    if a.dtype != aval.dtype:
        raise DTypeError(f"argument {name}: expected dtype {aval.dtype}, got {a.dtype} "
                         f"({aval_of(a).str_short()})")
    return a


def eval_graph_flat(graph: Graph, args: Sequence[Any], names: Sequence[str] | None = None,
                    env_dims: dict | None = None) -> list[np.ndarray]:
    """Evaluate on a flat list of arguments; returns the flat list of outputs."""
    if len(args) != len(graph.invars):
        raise BindingError(f"graph takes {len(graph.invars)} arguments, got {len(args)}")
    names = names or [f"#{i}" for i in range(len(args))]
    args = [coerce_arg(x, v.aval, n) for x, v, n in zip(args, graph.invars, names)]
    dims = env_dims if env_dims is not None else bind_dims(graph.in_avals, args, names)
    env: dict[int, Any] = {}
    for v, c in zip(graph.constvars, graph.consts):
        env[v.id] = np.asarray(c)
    for v, x in zip(graph.invars, args):
        env[v.id] = x

    def read(a):
        if isinstance(a, Literal):
            return np.asarray(a.val, dtype=a.aval.dtype)
        return env[a.id]

    for eqn in graph.eqns:
        params = eqn.params
        if any(_has_symbols(p) for p in params.values()):
            params = {k: concretize(p, dims) for k, p in params.items()}
        if "graph" in params and isinstance(params["graph"], Graph):
            outs = eval_graph_flat(params["graph"], [read(a) for a in eqn.invars])
        else:
            outs = eqn.primitive.impl(*[read(a) for a in eqn.invars], **params)
        if not eqn.primitive.multiple_results:
            outs = [outs]
        for v, o in zip(eqn.outvars, outs):
            o = np.asarray(o, dtype=v.aval.dtype)
            expected = tuple(eval_dim(d, dims) for d in v.aval.shape)
            if o.shape != expected:  # a reference implementation disagreeing with its rule
                raise KernelError(f"{eqn.primitive.name}: the NumPy reference returned shape "
                                  f"{o.shape} but the shape rule says {expected}"
                                  f"{where(eqn.source_info)}")
            env[v.id] = o
    return [read(v) if isinstance(v, Literal) else env[v.id] for v in graph.outvars]


def eval_graph(graph: Graph, *args, **kwargs) -> Any:
    """Evaluate `graph` with NumPy; arguments as the traced function took them (pytrees).

    >>> import tgx, tgx.numpy as tnp
    >>> g = tgx.make_graph(lambda x: tnp.sum(x * 2.0))(tgx.Spec(("N",)))
    >>> float(tgx.eval_graph(g, np.ones(3, np.float32)))
    6.0
    """
    if graph.in_tree is not None:
        leaves, _ = tree_flatten((args, kwargs))
    else:
        leaves = list(args)
    names = leaf_names(graph.in_tree, len(leaves))
    outs = eval_graph_flat(graph, leaves, names)
    if graph.out_tree is not None:
        return tree_unflatten(graph.out_tree, outs)
    return outs[0] if len(outs) == 1 else outs


def is_var(a) -> bool:
    return isinstance(a, Var)
