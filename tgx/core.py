"""The IR: `Var`, `Literal`, `Eqn`, `Graph`, and `Primitive` with `bind`.

Three small classes and one evaluation loop, as in JAX's core. A primitive is declared once
with its rules beside it (shape rule, NumPy reference, decomposition); transforms are
interpreters over `Graph` that build new graphs and never mutate their input.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any
from collections.abc import Callable, Sequence

import numpy as np

from .errors import GraphCheckError, TgxError
from .shapes import ShapedArray, aval_of, shapes_equal

# ---------------------------------------------------------------------------------------------
# Source info


@dataclass(frozen=True, slots=True)
class SourceInfo:
    """Where the user wrote the op: the first stack frame outside the tgx package."""

    file: str
    line: int
    function: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}"


# ---------------------------------------------------------------------------------------------
# Variables and literals

_var_ids = itertools.count()


class Var:
    """A value of the graph, defined once. Identity is the object; names come when printing."""

    __slots__ = ("aval", "id", "hint")

    def __init__(self, aval: ShapedArray, hint: str | None = None):
        self.aval = aval
        self.id = next(_var_ids)
        self.hint = hint

    def __repr__(self) -> str:
        return f"Var({self.id}:{self.aval.str_short()})"


class Literal:
    """A Python scalar constant used as an operand, printed inline (`1.0:f32[]`)."""

    __slots__ = ("val", "aval")

    def __init__(self, val: Any, aval: ShapedArray):
        self.val = val
        self.aval = aval

    def __repr__(self) -> str:
        return f"{self.val!r}:{self.aval.str_short()}"


Atom = Var | Literal


def _typed(v):
    # 1, 1.0 and True are == in Python; params that differ in type must not compare equal.
    if isinstance(v, tuple):
        return (tuple, tuple(_typed(x) for x in v))
    return (type(v), v)


class Params(dict):
    """Immutable, hashable equation parameters (values must be hashable: tuples, not lists).

    Equality is type-aware: `Params(axis=1) != Params(axis=True)`.
    """

    def _key(self):
        return tuple(sorted((k, _typed(v)) for k, v in self.items()))

    def __hash__(self):  # type: ignore[override]
        return hash(self._key())

    def __eq__(self, other):
        if isinstance(other, Params):
            return self._key() == other._key()
        return dict.__eq__(self, other)

    def __ne__(self, other):
        return not self == other

    def _immutable(self, *a, **k):
        raise TypeError("equation params are immutable; build a new Eqn instead")

    __setitem__ = __delitem__ = update = pop = popitem = clear = setdefault = _immutable  # type: ignore


@dataclass(frozen=True, slots=True)
class Eqn:
    """One equation: `outvars = primitive[params] invars`, with the user's source line."""

    primitive: "Primitive"
    invars: tuple
    outvars: tuple
    params: Params
    source_info: SourceInfo | None = None

    def __repr__(self) -> str:
        from .pretty import pp_eqn

        return pp_eqn(self)


class Graph:
    """A closed, typed program: `constvars` (bound to `consts`), `invars`, `eqns`, `outvars`.

    >>> import tgx, tgx.numpy as tnp
    >>> g = tgx.make_graph(lambda x: tnp.exp(x) + 1.0)(tgx.Spec(("N",), "float32"))
    >>> print(g)
    { lambda ; a:f32[N]. let
        b:f32[N] = exp a
        c:f32[N] = add b 1.0:f32[]
      in (c) }
    """

    __slots__ = ("constvars", "consts", "invars", "outvars", "eqns", "in_tree", "out_tree")

    def __init__(self, constvars: Sequence[Var], consts: Sequence[Any], invars: Sequence[Var],
                 outvars: Sequence[Atom], eqns: Sequence[Eqn], in_tree=None, out_tree=None):
        self.constvars = tuple(constvars)
        self.consts = tuple(consts)
        self.invars = tuple(invars)
        self.outvars = tuple(outvars)
        self.eqns = tuple(eqns)
        self.in_tree = in_tree
        self.out_tree = out_tree

    @property
    def in_avals(self) -> list[ShapedArray]:
        return [v.aval for v in self.invars]

    @property
    def out_avals(self) -> list[ShapedArray]:
        return [v.aval for v in self.outvars]

    def replace(self, **kw) -> Graph:
        fields = {s: getattr(self, s) for s in self.__slots__}
        fields.update(kw)
        return Graph(**fields)

    def __str__(self) -> str:
        from .pretty import pp_graph

        return pp_graph(self)

    __repr__ = __str__

    def __len__(self) -> int:
        return len(self.eqns)


# ---------------------------------------------------------------------------------------------
# Primitives

PRIMITIVES: dict[str, "Primitive"] = {}


class Primitive:
    """An operation of the IR, declared once with its rules beside it.

    - `shape_rule(*avals, **params) -> ShapedArray | list[ShapedArray]`
    - `impl(*numpy_arrays, **params) -> array | list[array]`: the NumPy reference
    - `decomposition(*tracers, **params)`: a traceable function in lower-level primitives
      (None for atomic primitives)

    >>> p = Primitive("my_double_example")
    >>> _ = p.def_shape(lambda x: x)
    >>> _ = p.def_impl(lambda x: 2 * x)
    >>> int(p.bind(np.int64(4)))
    8
    """

    def __init__(self, name: str, *, multiple_results: bool = False, commutative: bool = False,
                 elementwise: bool = False, family: str = "", atomic: bool = True):
        if name in PRIMITIVES:
            raise TgxError(f"primitive {name!r} is declared twice")
        self.name = name
        self.multiple_results = multiple_results
        self.commutative = commutative
        self.elementwise = elementwise
        self.family = family
        self.atomic = atomic
        self.shape_rule: Callable | None = None
        self.impl: Callable | None = None
        self.decomposition: Callable | None = None
        self.vjp: Callable | None = None
        # Parameters that must be normalised before binding (e.g. axes to tuples).
        self.param_rule: Callable | None = None
        PRIMITIVES[name] = self

    def __repr__(self) -> str:
        return self.name

    def __reduce__(self):  # pickles by name, so graphs cross process boundaries
        return (_primitive_by_name, (self.name,))

    # -- registration ------------------------------------------------------------------------
    def def_shape(self, f: Callable) -> Callable:
        _only_once(self, "shape_rule")
        self.shape_rule = f
        return f

    def def_impl(self, f: Callable) -> Callable:
        _only_once(self, "impl")
        self.impl = f
        return f

    def def_decomposition(self, f: Callable) -> Callable:
        _only_once(self, "decomposition")
        self.decomposition = f
        self.atomic = False
        return f

    # -- use ---------------------------------------------------------------------------------
    def abstract_eval(self, *avals: ShapedArray, **params) -> list[ShapedArray]:
        out = self.shape_rule(*avals, **params)
        return list(out) if self.multiple_results else [out]

    def bind(self, *args, **params):
        """Apply the primitive: traced when any argument is a tracer, else evaluated eagerly."""
        from .tracing import current_trace_for

        trace = current_trace_for(args)
        if trace is None:
            # Eager: validate with the shape rule (clear errors), then run the NumPy reference.
            arrays = [a if isinstance(a, (np.ndarray, np.generic)) else np.asarray(a)
                      for a in args]
            avals = self.abstract_eval(*[aval_of(a) for a in arrays], **params)
            outs = self.impl(*arrays, **params)
            if not self.multiple_results:
                return np.asarray(outs, dtype=avals[0].dtype)
            return [np.asarray(o, dtype=a.dtype) for o, a in zip(outs, avals)]
        return trace.process_primitive(self, args, Params(params))


def _primitive_by_name(name: str) -> Primitive:
    from . import primitives  # noqa: F401 - registers every primitive

    return PRIMITIVES[name]


def _only_once(p: Primitive, what: str) -> None:
    if getattr(p, what) is not None:
        raise TgxError(f"primitive {p.name!r} already has a {what.replace('_', ' ')}")


# ---------------------------------------------------------------------------------------------
# Checking


def check_graph(graph: Graph) -> None:
    """Single assignment, every variable bound before use, every shape rule re-run and matching.

    Raises `GraphCheckError` printing the bad equation with its neighbours.
    """
    defined: set[int] = set()

    def define(v, where):
        if not isinstance(v, Var):
            raise GraphCheckError(f"{where}: expected a Var as a binder, got {v!r}")
        if v.id in defined:
            raise GraphCheckError(f"{where}: variable {v!r} is assigned twice")
        defined.add(v.id)

    for v in graph.constvars:
        define(v, "constvars")
    for v in graph.invars:
        define(v, "invars")
    if len(graph.consts) != len(graph.constvars):
        raise GraphCheckError(f"{len(graph.constvars)} constvars but {len(graph.consts)} consts")
    for c, v in zip(graph.consts, graph.constvars):
        a = aval_of(c)
        if not shapes_equal(a.shape, v.aval.shape) or a.dtype != v.aval.dtype:
            raise GraphCheckError(f"constant for {v!r} has aval {a}")
    for i, eqn in enumerate(graph.eqns):
        where = lambda i=i: _context(graph, i)
        for x in eqn.invars:
            if isinstance(x, Var) and x.id not in defined:
                raise GraphCheckError(f"unbound variable {x!r} used in\n{where()}")
        try:
            out_avals = eqn.primitive.abstract_eval(*[x.aval for x in eqn.invars], **eqn.params)
        except TgxError as e:
            raise GraphCheckError(f"shape rule of {eqn.primitive} fails: {e}\n{where()}") from e
        if len(out_avals) != len(eqn.outvars):
            raise GraphCheckError(f"{eqn.primitive} returns {len(out_avals)} values, equation has "
                                  f"{len(eqn.outvars)}\n{where()}")
        for v, a in zip(eqn.outvars, out_avals):
            if not (shapes_equal(v.aval.shape, a.shape) and v.aval.dtype == a.dtype):
                raise GraphCheckError(f"{v!r} has aval {v.aval} but the shape rule of "
                                      f"{eqn.primitive} gives {a}\n{where()}")
            define(v, f"equation {i}")
        for sub in _subgraphs(eqn):
            check_graph(sub)
    for v in graph.outvars:
        if isinstance(v, Var) and v.id not in defined:
            raise GraphCheckError(f"output {v!r} is never defined")


def _subgraphs(eqn: Eqn):
    for p in eqn.params.values():
        if isinstance(p, Graph):
            yield p


def _context(graph: Graph, i: int, radius: int = 2) -> str:
    from .pretty import pp_eqn, var_namer

    names = var_namer(graph)
    lines = []
    for j in range(max(0, i - radius), min(len(graph.eqns), i + radius + 1)):
        mark = ">>" if j == i else "  "
        lines.append(f"  {mark} {pp_eqn(graph.eqns[j], names)}")
    return "\n".join(lines)
