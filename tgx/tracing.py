"""Tracing: pytrees, tracers, the graph builder, `make_graph`, and the user's source line.

A `Tracer` stands for an array inside a function being traced; every operation on it binds a
primitive, which appends an equation to the innermost `GraphBuilder`. Python control flow that
needs a concrete value (`if x.sum() > 0`) cannot be traced and raises with the user's line.
"""

from __future__ import annotations

import functools
import os
import sys
from collections import namedtuple
from collections.abc import Callable
from typing import Any

import numpy as np

from .core import Eqn, Graph, Literal, Params, Primitive, SourceInfo, Trace, Var
from .errors import DTypeError, TgxError, TracerControlFlowError
from .shapes import ShapedArray, aval_of, dim_str, is_concrete, shape_str

# ---------------------------------------------------------------------------------------------
# Source info: the first frame outside the tgx package

_TGX_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep


def user_frame(depth: int = 1) -> SourceInfo | None:
    """The caller's file:line, skipping frames inside tgx (so errors point at user code)."""
    f = sys._getframe(depth)
    while f is not None and f.f_code.co_filename.startswith(_TGX_DIR):
        f = f.f_back
    if f is None:
        return None
    return SourceInfo(f.f_code.co_filename, f.f_lineno, f.f_code.co_name)


def where(source_info: SourceInfo | None) -> str:
    return f" (at {source_info})" if source_info is not None else ""


# ---------------------------------------------------------------------------------------------
# Pytrees

_REGISTRY: dict[type, tuple[Callable, Callable]] = {}


def register_pytree_node(cls: type, flatten: Callable, unflatten: Callable) -> None:
    """Let `cls` hold arrays in traced arguments and results.

    `flatten(obj) -> (children, aux)`; `unflatten(aux, children) -> obj`; `aux` is hashable.

    >>> class Pair:
    ...     def __init__(self, a, b): self.a, self.b = a, b
    >>> register_pytree_node(Pair, lambda p: ((p.a, p.b), None), lambda _, c: Pair(*c))
    >>> tree_flatten(Pair(1, [2, 3]))[0]
    [1, 2, 3]
    """
    _REGISTRY[cls] = (flatten, unflatten)


register_pytree_node(tuple, lambda t: (t, None), lambda _, c: tuple(c))
register_pytree_node(list, lambda t: (t, None), lambda _, c: list(c))
register_pytree_node(dict, lambda d: (tuple(d[k] for k in sorted(d)), tuple(sorted(d))),
                     lambda keys, c: dict(zip(keys, c)))
register_pytree_node(type(None), lambda _: ((), None), lambda _, __: None)

TreeDef = namedtuple("TreeDef", "node_type aux children")
_NODES = {t: (t, _REGISTRY[t][1]) for t in (dict, tuple, list)}
_LEAF = TreeDef(None, None, ())


_NAMEDTUPLE_UNFLATTEN: dict[type, Callable] = {}


def _namedtuple_unflatten(t: type) -> Callable:
    # one function per class: TreeDefs of equal structure must compare (and hash) equal
    fn = _NAMEDTUPLE_UNFLATTEN.get(t)
    if fn is None:
        fn = _NAMEDTUPLE_UNFLATTEN[t] = lambda _, c: t(*c)
    return fn


def _flatten_rule(x):
    t = type(x)
    rule = _REGISTRY.get(t)
    if rule is None and isinstance(x, tuple) and hasattr(x, "_fields"):  # namedtuples
        return tuple(x), None, _namedtuple_unflatten(t)
    if rule is None:
        return None
    flatten, unflatten = rule
    children, aux = flatten(x)
    return children, aux, unflatten


def tree_flatten(x: Any) -> tuple[list, TreeDef]:
    """Leaves of a pytree and its structure.

    >>> tree_flatten({"b": 1, "a": (2, None)})[0]
    [2, 1]
    """
    leaves: list = []
    append = leaves.append
    # the containers every call passes, handled inline (this runs on every compiled call)
    dict_node, tuple_node, list_node = _NODES[dict], _NODES[tuple], _NODES[list]

    def rec(x):
        t = type(x)
        if t is dict:
            keys = tuple(sorted(x))
            return TreeDef(dict_node, keys, tuple([rec(x[k]) for k in keys]))
        if t is tuple:
            return TreeDef(tuple_node, None, tuple([rec(c) for c in x]))
        if t is list:
            return TreeDef(list_node, None, tuple([rec(c) for c in x]))
        if t is np.ndarray:
            append(x)
            return _LEAF
        r = _flatten_rule(x)
        if r is None:
            append(x)
            return _LEAF
        children, aux, unflatten = r
        return TreeDef((t, unflatten), aux, tuple([rec(c) for c in children]))

    return leaves, rec(x)


def tree_unflatten(treedef: TreeDef, leaves) -> Any:
    it = iter(leaves)

    def rec(td):
        if td.node_type is None:
            return next(it)
        return td.node_type[1](td.aux, [rec(c) for c in td.children])

    return rec(treedef)


def tree_map(f: Callable, tree: Any) -> Any:
    leaves, td = tree_flatten(tree)
    return tree_unflatten(td, [f(x) for x in leaves])


def tree_structure_str(td: TreeDef) -> str:
    if td.node_type is None:
        return "*"
    name = td.node_type[0].__name__
    return f"{name}({', '.join(tree_structure_str(c) for c in td.children)})"


# ---------------------------------------------------------------------------------------------
# Tracers and the graph builder

class Tracer:
    """An array inside a traced function. Operators are installed by `tgx.numpy`."""

    __slots__ = ("builder", "variable")
    __array_priority__ = 1000  # so `np_array + tracer` defers to the tracer

    def __init__(self, builder: GraphBuilder, var: Var):
        self.builder = builder
        self.variable = var

    @property
    def aval(self) -> ShapedArray:
        return self.variable.aval

    @property
    def shape(self) -> tuple:
        return self.variable.aval.shape

    @property
    def dtype(self) -> np.dtype:
        return self.variable.aval.dtype

    @property
    def ndim(self) -> int:
        return len(self.variable.aval.shape)

    @property
    def size(self):
        return self.variable.aval.size

    def __repr__(self) -> str:
        return f"Tracer<{self.aval.str_short()}>"

    # Python control flow needs a concrete value that only exists at run time.
    def _concrete(self, what: str):
        info = user_frame(2)
        raise TracerControlFlowError(
            f"{what} was called on a traced value {self.aval.str_short()}{where(info)}: its value "
            f"is only known when the compiled function runs, so Python control flow (`if`, "
            f"`while`, `and`/`or`, `bool()`, `int()`, `float()`) cannot depend on it. Use "
            f"`tnp.where(cond, a, b)` to select values, or pass the value as a static Python "
            f"number.")

    def __bool__(self):
        self._concrete("bool()")

    def __int__(self):
        self._concrete("int()")

    def __float__(self):
        self._concrete("float()")

    def __index__(self):
        self._concrete("__index__ (use as a Python index or size)")

    def __complex__(self):
        self._concrete("complex()")

    def __array__(self, *a, **k):
        info = user_frame(2)
        raise TracerControlFlowError(
            f"np.asarray() was called on a traced value {self.aval.str_short()}{where(info)}: "
            f"use tgx.numpy (tnp) functions inside traced code, not numpy ones.")

    def __len__(self):
        if not self.shape:
            raise DTypeError("len() of a 0-d array")
        d = self.shape[0]
        if not is_concrete(d):
            info = user_frame(2)
            raise TracerControlFlowError(f"len() of an array whose leading dim is symbolic "
                                         f"({dim_str(d)}){where(info)}")
        return d

    def __iter__(self):
        n = len(self)
        return (self[i] for i in range(n))

    __hash__ = object.__hash__


class GraphBuilder(Trace):
    """Collects equations while a function is traced (one per nesting level): the `Trace`
    that stages every primitive bound while it is active (`with GraphBuilder() as b:`)."""

    def __init__(self):
        self.eqns: list[Eqn] = []
        self.constvars: list[Var] = []
        self.consts: list[Any] = []
        self._const_ids: dict[int, Var] = {}
        # Transforms re-emitting an equation keep the user's line of the original equation.
        self.source_override: SourceInfo | None = None

    def new_arg(self, aval: ShapedArray, hint: str | None = None) -> Tracer:
        return Tracer(self, Var(aval, hint))

    def to_atom(self, x: Any) -> Var | Literal:
        if isinstance(x, Tracer):
            if x.builder is not self:
                raise TgxError(
                    "a traced value from another trace leaked into this one (a tracer kept in a "
                    "global or a closure of an outer traced function); pass it as an argument")
            return x.variable
        if isinstance(x, Literal):
            return x
        if isinstance(x, (bool, int, float)) and not isinstance(x, np.generic):
            return Literal(x, aval_of(x))
        if isinstance(x, np.generic) or (isinstance(x, np.ndarray) and x.ndim == 0):
            a = aval_of(x)
            return Literal(np.asarray(x)[()], a)
        if isinstance(x, np.ndarray):
            v = self._const_ids.get(id(x))
            if v is None:
                v = Var(aval_of(x))
                self._const_ids[id(x)] = v
                self.constvars.append(v)
                self.consts.append(x)  # the reference also keeps id(x) from being reused
            return v
        if hasattr(x, "__array__") and hasattr(x, "shape") and hasattr(x, "dtype"):
            return self.to_atom(np.asarray(x))
        raise DTypeError(f"cannot use a value of type {type(x).__name__} in a traced function")

    def process_primitive(self, prim: Primitive, args, params: Params):
        atoms = [self.to_atom(a) for a in args]
        info = self.source_override or user_frame(3)
        try:
            out_avals = prim.abstract_eval(*[a.aval for a in atoms], **params)
        except TgxError as e:
            raise type(e)(_with_location(str(e), prim, atoms, info)) from None
        outvars = [Var(a) for a in out_avals]
        self.eqns.append(Eqn(prim, tuple(atoms), tuple(outvars), params, info))
        tracers = [Tracer(self, v) for v in outvars]
        return tracers if prim.multiple_results else tracers[0]

    def build(self, invars, out_leaves, in_tree=None, out_tree=None) -> Graph:
        outvars = [self.to_atom(x) for x in out_leaves]
        return Graph(self.constvars, self.consts, invars, outvars, self.eqns, in_tree, out_tree)


def _with_location(msg: str, prim: Primitive, atoms, info) -> str:
    if not msg.startswith(prim.name):
        msg = f"{prim.name}: {msg}"
    operands = ", ".join(a.aval.str_short() for a in atoms)
    at = f"\n  at {info}" if info is not None else ""
    return f"{msg}\n  operands: {operands}{at}"


# ---------------------------------------------------------------------------------------------
# make_graph


def _arg_aval(x: Any, path: str) -> ShapedArray:
    if isinstance(x, Tracer):
        return x.aval
    try:
        return aval_of(x)
    except TypeError:
        raise DTypeError(
            f"argument {path} has type {type(x).__name__}; traced arguments are arrays, Python "
            f"scalars or tgx.Spec (use functools.partial or a closure for static values)"
        ) from None


def trace_to_graph(f: Callable, in_avals_tree: Any, hints: list | None = None,
                   source_info: SourceInfo | None = None) -> Graph:
    """Trace `f` on a pytree of avals (the leaves) into a Graph; `source_info`, when given,
    is recorded on every equation instead of the caller's line (decompositions keep the line of
    the equation they expand)."""
    leaves, in_tree = tree_flatten(in_avals_tree)
    with GraphBuilder() as b:
        b.source_override = source_info
        tracers = [b.new_arg(a, (hints or [None] * len(leaves))[i]) for i, a in enumerate(leaves)]
        args, kwargs = tree_unflatten(in_tree, tracers)
        out = f(*args, **kwargs)
        out_leaves, out_tree = tree_flatten(out)
        for x in out_leaves:
            if not isinstance(x, (Tracer, np.ndarray, np.generic, int, float, bool)):
                raise DTypeError(f"traced function returned a {type(x).__name__}; outputs must be "
                                 f"arrays or pytrees of arrays")
        return b.build([t.variable for t in tracers], out_leaves, in_tree, out_tree)


def abstractify(args: tuple, kwargs: dict) -> tuple:
    """The pytree (args, kwargs) with every leaf replaced by its aval."""
    leaves, tree = tree_flatten((args, kwargs))
    avals = [_arg_aval(x, f"#{i}") for i, x in enumerate(leaves)]
    return tree_unflatten(tree, avals)


def make_graph(f: Callable) -> Callable[..., Graph]:
    """Trace `f` into a `Graph` for arguments given as arrays, Python scalars or `Spec`s.

    >>> import tgx, tgx.numpy as tnp
    >>> g = tgx.make_graph(lambda x, w: x @ w)(tgx.Spec(("N", 784)), tgx.Spec((784, 128)))
    >>> g.out_avals
    [f32[N,128]]
    """

    @functools.wraps(f)
    def traced(*args, **kwargs) -> Graph:
        return trace_to_graph(f, abstractify(args, kwargs))

    return traced


def describe_arg_mismatch(name: str, expected: ShapedArray, actual: ShapedArray) -> str:
    return (f"argument {name}: expected {expected.str_short()} {shape_str(expected.shape)}, "
            f"got {actual.str_short()}")


def leaf_names(tree: TreeDef | None, n: int, root: str = "args") -> list[str]:
    """Readable paths of the leaves of ((args), {kwargs}) trees: `params['w1']`, `x`, `#0`."""
    if tree is None:
        return [f"#{i}" for i in range(n)]
    names: list[str] = []

    def rec(td, path):
        if td.node_type is None:
            names.append(path)
            return
        t = td.node_type[0]
        for i, c in enumerate(td.children):
            key = repr(td.aux[i]) if t is dict else str(i)
            rec(c, f"{path}[{key}]")

    # The top level is (args_tuple, kwargs_dict): name positional args "args[0]", kwargs by name.
    if tree.node_type is not None and tree.node_type[0] is tuple and len(tree.children) == 2:
        args_td, kw_td = tree.children
        for i, c in enumerate(args_td.children):
            rec(c, f"args[{i}]")
        for k, c in zip(kw_td.aux or (), kw_td.children):
            rec(c, k)
    else:
        rec(tree, root)
    return names if len(names) == n else [f"#{i}" for i in range(n)]
