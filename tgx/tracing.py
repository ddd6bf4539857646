"""Tracing: pytrees, tracers, the graph builder, `make_graph`, and the user's source line.

A `Tracer` stands for an array inside a function being traced; every operation on it binds a
primitive, which appends an equation to the innermost `GraphBuilder`. Python control flow that
needs a concrete value (`if x.sum() > 0`) cannot be traced and raises with the user's line.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from collections import OrderedDict, defaultdict, namedtuple
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .core import Eqn, Graph, Literal, Params, Primitive, SourceInfo, Trace, Var
from .errors import DTypeError, TgxError, TracerControlFlowError, user_code_frame
from .shapes import (
    ShapedArray,
    aval_of,
    check_one_symbol_per_name,
    dim_str,
    is_concrete,
    is_concrete_shape,
    shape_str,
    static_int_error,
    user_dims,
)

# ---------------------------------------------------------------------------------------------
# Source info: the first frame outside the tgx package

def user_frame(depth: int = 1) -> SourceInfo | None:
    """The caller's file:line, skipping frames inside tgx (so errors point at user code)."""
    f = user_code_frame(depth + 1)
    if f is None:
        return None
    return SourceInfo(f.f_code.co_filename, f.f_lineno, f.f_code.co_name)


def where(source_info: SourceInfo | None) -> str:
    return f" (at {source_info})" if source_info is not None else ""


# ---------------------------------------------------------------------------------------------
# Pytrees
#
# A pytree is a nest of containers whose leaves are arrays (or Python scalars, or avals). The
# containers: tuple, list, dict (children in sorted key order), OrderedDict (insertion order,
# as every torch `state_dict()`), defaultdict (sorted), None (no children), named tuples and
# dataclasses (fields in declaration order; frozen ones too), and any class registered with
# `register_pytree_node`. A `TreeDef` is (node_type, aux, children): `node_type` is
# (class, unflatten) or None for a leaf; for every kind of dict `aux` is its keys in child
# order. jit, vmap and serialize read these fields.

_REGISTRY: dict[type, tuple[Callable, Callable]] = {}
#: unflatten function -> (aux, number of children) -> the key path entry of each child
_KEYS: dict[Callable, Callable[[Any, int], list[str]]] = {}


def register_pytree_node(cls: type, flatten: Callable, unflatten: Callable) -> None:
    """Let `cls` hold arrays in traced arguments and results.

    `flatten(obj) -> (children, aux)`; `unflatten(aux, children) -> obj`; `aux` is hashable.
    (Named tuples and dataclasses need no registration; registering one replaces the automatic
    rule.)

    >>> class Pair:
    ...     def __init__(self, a, b): self.a, self.b = a, b
    >>> register_pytree_node(Pair, lambda p: ((p.a, p.b), None), lambda _, c: Pair(*c))
    >>> tree_flatten(Pair(1, [2, 3]))[0]
    [1, 2, 3]
    """
    _REGISTRY[cls] = (flatten, unflatten)


def _sorted_keys(d: dict) -> tuple:
    try:
        return tuple(sorted(d))
    except TypeError:  # keys of several types (1 and "a"): by type name, then value
        try:
            return tuple(sorted(d, key=lambda k: (type(k).__qualname__, k)))
        except TypeError:
            return tuple(d)


class _DefaultDictKeys(tuple):
    """The aux of a defaultdict: its sorted keys (as for every dict), plus the factory."""

    def __new__(cls, keys, factory):
        self = super().__new__(cls, keys)
        self.factory = factory
        return self

    def __eq__(self, other):
        return (type(other) is _DefaultDictKeys and self.factory == other.factory
                and tuple.__eq__(self, other))

    def __ne__(self, other):
        return not self == other

    def __hash__(self):
        return hash((tuple(self), self.factory))

    def __repr__(self):
        return f"defaultdict({getattr(self.factory, '__name__', self.factory)}, {tuple(self)})"


def _dict_flatten(d):
    keys = _sorted_keys(d)
    return tuple([d[k] for k in keys]), keys


def _defaultdict_flatten(d):
    children, keys = _dict_flatten(d)
    return children, _DefaultDictKeys(keys, d.default_factory)


def _dict_unflatten(keys, children):
    return dict(zip(keys, children))


def _ordered_unflatten(keys, children):
    return OrderedDict(zip(keys, children))


def _defaultdict_unflatten(keys, children):
    return defaultdict(keys.factory, zip(keys, children))


def _dict_keys(keys, n):
    return [f"[{k!r}]" for k in keys]


register_pytree_node(tuple, lambda t: (t, None), lambda _, c: tuple(c))
register_pytree_node(list, lambda t: (t, None), lambda _, c: list(c))
register_pytree_node(dict, _dict_flatten, _dict_unflatten)
register_pytree_node(OrderedDict, lambda d: (tuple(d.values()), tuple(d)), _ordered_unflatten)
register_pytree_node(defaultdict, _defaultdict_flatten, _defaultdict_unflatten)
register_pytree_node(type(None), lambda _: ((), None), lambda _, __: None)
for _f in (_dict_unflatten, _ordered_unflatten, _defaultdict_unflatten):
    _KEYS[_f] = _dict_keys

TreeDef = namedtuple("TreeDef", "node_type aux children")
_NODES = {t: (t, _REGISTRY[t][1]) for t in (dict, tuple, list)}
_LEAF = TreeDef(None, None, ())
_new = tuple.__new__  # TreeDef(...) without namedtuple's Python-level __new__ (hot path)


_AUTO_RULES: dict[type, tuple | None] = {}


def _auto_rule(t: type):
    """The rule of a named tuple or dataclass `t` (None for other classes), made once per
    class: TreeDefs of equal structure must compare, and hash, equal."""
    try:
        return _AUTO_RULES[t]
    except KeyError:
        pass
    rule = None
    if issubclass(t, tuple) and hasattr(t, "_fields"):
        fields = t._fields

        def flatten(x):
            return tuple(x), None

        def unflatten(_, children):
            return t(*children)

        rule = (flatten, unflatten)
        _KEYS[unflatten] = lambda aux, n: [f".{f}" for f in fields]
    elif dataclasses.is_dataclass(t) and not (hasattr(t, "shape") and hasattr(t, "dtype")):
        # dataclasses that look like arrays (tgx.Spec's ShapedArray) stay leaves
        rule = _dataclass_rule(t)
    _AUTO_RULES[t] = rule
    return rule


def _dataclass_rule(t: type):
    fs = dataclasses.fields(t)
    static = tuple(f.name for f in fs if f.metadata.get("static", False))
    data = tuple(f.name for f in fs if not f.metadata.get("static", False))

    def flatten(x):
        return (tuple([getattr(x, n) for n in data]),
                tuple([getattr(x, n) for n in static]) if static else None)

    def unflatten(aux, children):
        # rebuilt field by field, without __init__: the children may be tracers, avals or
        # plain indices, which a __post_init__ need not accept (frozen ones too)
        obj = object.__new__(t)
        for n, c in zip(data, children):
            object.__setattr__(obj, n, c)
        for n, v in zip(static, aux or ()):
            object.__setattr__(obj, n, v)
        return obj

    _KEYS[unflatten] = lambda aux, n: [f".{f}" for f in data]
    return flatten, unflatten


def _flatten_rule(x):
    """(children, aux, unflatten) of a container, or None for a leaf."""
    t = type(x)
    rule = _REGISTRY.get(t) or _auto_rule(t)
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
    ndarray = np.ndarray
    # the containers every call passes, handled inline (this runs on every compiled call)
    dict_node, tuple_node, list_node = _NODES[dict], _NODES[tuple], _NODES[list]

    def rec(x):
        t = type(x)
        if t is ndarray:
            append(x)
            return _LEAF
        if t is dict:
            try:
                keys = tuple(sorted(x))
            except TypeError:
                keys = _sorted_keys(x)
            children = []
            add = children.append
            for k in keys:
                c = x[k]
                if type(c) is ndarray:
                    append(c)
                    add(_LEAF)
                else:
                    add(rec(c))
            return _new(TreeDef, (dict_node, keys, tuple(children)))
        if t is tuple or t is list:
            children = []
            add = children.append
            for c in x:
                if type(c) is ndarray:
                    append(c)
                    add(_LEAF)
                else:
                    add(rec(c))
            return _new(TreeDef, (tuple_node if t is tuple else list_node, None,
                                  tuple(children)))
        r = _flatten_rule(x)
        if r is None:
            append(x)
            return _LEAF
        children, aux, unflatten = r
        return _new(TreeDef, ((t, unflatten), aux, tuple([rec(c) for c in children])))

    return leaves, rec(x)


def tree_unflatten(treedef: TreeDef, leaves) -> Any:
    """The pytree of structure `treedef` with `leaves` in flattening order.

    >>> leaves, td = tree_flatten({"b": 1, "a": (2, None)})
    >>> tree_unflatten(td, [10, 20])
    {'a': (10, None), 'b': 20}
    """
    it = iter(leaves)
    nxt = it.__next__

    def rec(td):
        node = td[0]
        if node is None:
            return nxt()
        unflatten = node[1]
        if unflatten is _dict_unflatten:
            return dict(zip(td[1], [rec(c) for c in td[2]]))
        return unflatten(td[1], [rec(c) for c in td[2]])

    return rec(treedef)


def tree_map(f: Callable, tree: Any) -> Any:
    """`f` applied to every leaf, in a pytree of the same structure.

    >>> tree_map(lambda x: x * 2, {"w": 1, "b": [2, 3]})
    {'b': [4, 6], 'w': 2}
    """
    leaves, td = tree_flatten(tree)
    return tree_unflatten(td, [f(x) for x in leaves])


def tree_structure_str(td: TreeDef) -> str:
    if td.node_type is None:
        return "*"
    name = td.node_type[0].__name__
    return f"{name}({', '.join(tree_structure_str(c) for c in td.children)})"


def child_keys(td: TreeDef) -> list[str]:
    """The key path entry of each child of node `td`: `['w']` for a dict, `.w` for a named
    tuple or dataclass field, `[0]` otherwise."""
    keys = _KEYS.get(td.node_type[1])
    if keys is not None:
        return keys(td.aux, len(td.children))
    return [f"[{i}]" for i in range(len(td.children))]


def leaf_paths(td: TreeDef, root: str = "") -> list[str]:
    """The key path of every leaf, in flattening order, as Python would spell it.

    >>> leaf_paths(tree_flatten({"layers": [{"w": 1}], "b": 2})[1], "params")
    ["params['b']", "params['layers'][0]['w']"]
    """
    out: list[str] = []

    def rec(td, path):
        if td.node_type is None:
            out.append(path)
            return
        for k, c in zip(child_keys(td), td.children):
            rec(c, path + k)

    rec(td, root)
    return out


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
        # symbolic dims as SymDim: comparisons that depend on the binding raise, never guess
        return user_dims(self.variable.aval.shape)

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
            f"`tnp.where(cond, a, b)` to select values; if the value is an argument of a "
            f"compiled function that should be a Python number (an axis, a length, a flag), "
            f"mark it static: `tgx.compile(f, static_argnames=(\"name\",))`.")

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

    def item(self, *args):
        self._concrete(".item()")

    def tolist(self):
        self._concrete(".tolist()")

    def __array_function__(self, func, types, args, kwargs):
        # np.sum(tracer) and friends: NumPy would call tracer.sum(out=...) or convert it
        info = user_frame(2)
        name = getattr(func, "__name__", str(func))
        raise TracerControlFlowError(
            f"numpy.{name}() was called on a traced value {self.aval.str_short()}"
            f"{where(info)}: NumPy functions need concrete arrays; use tgx.numpy.{name} "
            f"(`import tgx.numpy as tnp`) inside traced code.")

    def __array__(self, *a, **k):
        info = user_frame(2)
        raise TracerControlFlowError(
            f"np.asarray() was called on a traced value {self.aval.str_short()}{where(info)}: "
            f"use tgx.numpy (tnp) functions inside traced code, not numpy ones.")

    def __len__(self):
        if not self.shape:  # mostly a traced length given as a shape: `tnp.zeros(n)`
            raise static_int_error("a shape or length", self, "len()")
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


def arg_aval(x: Any, path: str) -> ShapedArray:
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
    if any(isinstance(a, ShapedArray) and not is_concrete_shape(a.shape) for a in leaves):
        names = leaf_names(in_tree, len(leaves), arg_names=positional_names(f, len(leaves)))
        check_one_symbol_per_name([a for a in leaves if isinstance(a, ShapedArray)],
                                  [n for a, n in zip(leaves, names) if isinstance(a, ShapedArray)])
    with GraphBuilder() as b:
        b.source_override = source_info
        tracers = [b.new_arg(a, (hints or [None] * len(leaves))[i]) for i, a in enumerate(leaves)]
        args, kwargs = tree_unflatten(in_tree, tracers)
        out = f(*args, **kwargs)
        out_leaves, out_tree = tree_flatten(out)
        for i, x in enumerate(out_leaves):
            if not isinstance(x, (Tracer, np.ndarray, np.generic, int, float, bool)):
                path = leaf_paths(out_tree, "output")[i]
                raise DTypeError(f"traced function returned a {type(x).__name__} at {path}; "
                                 f"outputs must be arrays or pytrees of arrays")
        return b.build([t.variable for t in tracers], out_leaves, in_tree, out_tree)


def one_equation_graph(eqn) -> Graph:
    """A graph holding only `eqn`, with fresh inputs for its non-literal operands.

    >>> g = make_graph(lambda x: x * 2.0)(ShapedArray((3,), np.dtype("float32")))
    >>> len(one_equation_graph(g.eqns[0]).invars)
    1
    """
    with GraphBuilder() as b:
        args, ins = [], []
        for a in eqn.invars:
            if isinstance(a, Literal):
                ins.append(a)
            else:
                t = b.new_arg(a.aval)
                args.append(t)
                ins.append(t)
        outs = eqn.primitive.bind(*ins, **eqn.params)
        outs = list(outs) if eqn.primitive.multiple_results else [outs]
        return b.build([t.variable for t in args], outs)


def abstractify(args: tuple, kwargs: dict, arg_names: Sequence[str] | None = None) -> tuple:
    """The pytree (args, kwargs) with every leaf replaced by its aval; `arg_names` (the
    positional parameters' names) name a bad leaf in the error (`params['layers'][3]['w']`)."""
    leaves, tree = tree_flatten((args, kwargs))
    names = leaf_names(tree, len(leaves), arg_names=arg_names)
    avals = [arg_aval(x, name) for x, name in zip(leaves, names)]
    return tree_unflatten(tree, avals)


def positional_names(fn: Callable, n: int) -> list[str]:
    """The names of `fn`'s first `n` positional parameters (`xs[0]`, `xs[1]` for `*xs`), as
    far as its signature tells."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return []
    names: list[str] = []
    for p in params:
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
            names.append(p.name)
        elif p.kind is p.VAR_POSITIONAL:
            names += [f"{p.name}[{j}]" for j in range(n - len(names))]
            break
        else:
            break
    return names[:n]


def make_graph(f: Callable) -> Callable[..., Graph]:
    """Trace `f` into a `Graph` for arguments given as arrays, Python scalars or `Spec`s.

    >>> import tgx, tgx.numpy as tnp
    >>> g = tgx.make_graph(lambda x, w: x @ w)(tgx.Spec(("N", 784)), tgx.Spec((784, 128)))
    >>> g.out_avals
    [f32[N,128]]
    """

    @functools.wraps(f)
    def traced(*args, **kwargs) -> Graph:
        return trace_to_graph(f, abstractify(args, kwargs, positional_names(f, len(args))))

    return traced


def describe_arg_mismatch(name: str, expected: ShapedArray, actual: ShapedArray) -> str:
    return (f"argument {name}: expected {expected.str_short()} {shape_str(expected.shape)}, "
            f"got {actual.str_short()}")


def leaf_names(tree: TreeDef | None, n: int, root: str = "args",
               arg_names: Sequence[str] | None = None) -> list[str]:
    """Readable paths of the leaves of ((args), {kwargs}) trees, for error messages:
    `params['layers'][3]['w']`, `state.h`, `x`. Positional argument i is `arg_names[i]` when
    given, else `args[i]`; keyword arguments go by their names.

    >>> leaf_names(tree_flatten((({"w": 1}, 2), {"y": 3}))[1], 3, arg_names=["params"])
    ["params['w']", 'args[1]', 'y']
    """
    if tree is None:
        return [f"#{i}" for i in range(n)]
    names: list[str] = []
    if (tree.node_type is not None and tree.node_type[0] is tuple and len(tree.children) == 2
            and tree.children[0].node_type is not None
            and tree.children[0].node_type[0] is tuple
            and tree.children[1].node_type is not None
            and tree.children[1].node_type[0] is dict):
        args_td, kw_td = tree.children
        for i, c in enumerate(args_td.children):
            names += leaf_paths(c, arg_names[i] if arg_names and i < len(arg_names)
                                else f"args[{i}]")
        for k, c in zip(kw_td.aux, kw_td.children):
            names += leaf_paths(c, str(k))
    else:
        names = leaf_paths(tree, root)
    return names if len(names) == n else [f"#{i}" for i in range(n)]
