"""The IR: `Var`, `Literal`, `Eqn`, `Graph`, and `Primitive` with `bind`.

Three small classes and one evaluation loop, as in JAX's core. A primitive is declared once
with its rules beside it (shape rule, NumPy reference, decomposition); transforms are
interpreters over `Graph` that build new graphs and never mutate their input.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .errors import DTypeError, GraphCheckError, TgxError, Unsupported
from .shapes import SHORT_NAMES, ShapedArray, aval_of, shapes_equal

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
        raise DTypeError("equation params are immutable; build a new Eqn instead")

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
        return pp_graph(self)

    __repr__ = __str__

    def __len__(self) -> int:
        return len(self.eqns)


# ---------------------------------------------------------------------------------------------
# The trace stack (JAX's `find_top_trace`): core owns dispatch, interpreters subclass `Trace`

_TRACE_STACK: list["Trace"] = []


class Trace:
    """An active interpretation of primitives; `bind` hands it every primitive applied while
    it is the innermost one. Subclasses implement `process_primitive` (the graph builder of
    `tgx.tracing` stages equations). Used as a context manager: `with trace: ...`."""

    level: int = 0

    def __enter__(self):
        self.level = len(_TRACE_STACK)
        _TRACE_STACK.append(self)
        return self

    def __exit__(self, *exc):
        assert _TRACE_STACK.pop() is self

    def process_primitive(self, prim: "Primitive", args, params: "Params"):
        raise Unsupported(f"{type(self).__name__} does not interpret {prim}")

    def bind_below(self, prim: "Primitive", *args, **params):
        """Apply `prim` as if this trace were not active: in the trace under it, or eagerly.

        Interpreters that wrap values (autodiff, batching) hand the unwrapped values down this
        way; traces above this one are set aside for the call, so a decomposition run below
        never reaches them (JAX's levels: no perturbation confusion between nested `grad`s)."""
        return self.run_below(lambda: prim.bind(*args, **params))

    def run_below(self, fn: Callable, *args):
        """Call `fn(*args)` with this trace and the ones above it set aside (see `bind_below`)."""
        above = _TRACE_STACK[self.level:]
        del _TRACE_STACK[self.level:]
        try:
            return fn(*args)
        finally:
            _TRACE_STACK.extend(above)


def find_top_trace(args) -> Trace | None:
    """The innermost active trace, or None to evaluate eagerly.

    Every op inside a trace is staged, even on NumPy constants (JAX's "omnistaging"): that
    keeps symbolic shapes symbolic and large constants out of the graph."""
    return _TRACE_STACK[-1] if _TRACE_STACK else None


# ---------------------------------------------------------------------------------------------
# Primitives

PRIMITIVES: dict[str, "Primitive"] = {}


class Primitive:
    """An operation of the IR, declared once with its rules beside it.

    - `shape_rule(*avals, **params) -> ShapedArray | list[ShapedArray]`
    - `impl(*numpy_arrays, **params) -> array | list[array]`: the NumPy reference
    - `decomposition(*tracers, **params)`: a traceable function in lower-level primitives
      (None for atomic primitives)
    - `vjp(ct, *primals, out, **params)`: the reverse-mode rule (`tgx.grad`, `tgx.vjp`)
    - `batch(args, dims, **params)`: the batching rule (`tgx.vmap`)
    - traits the planner reads: `is_view` (the result can be a view of an input: moves no
      bytes), `flops(in_shapes, out_shapes, **params) -> float` on concrete shapes (arithmetic
      work, for the cost model's roofline; None: negligible next to the bytes moved)

    >>> p = Primitive("my_double_example")
    >>> _ = p.def_shape(lambda x: x)
    >>> _ = p.def_impl(lambda x: 2 * x)
    >>> int(p.bind(np.int64(4)))
    8
    """

    def __init__(self, name: str, *, multiple_results: bool = False, commutative: bool = False,
                 elementwise: bool = False, family: str = "", atomic: bool = True,
                 is_view: bool = False):
        if name in PRIMITIVES:
            raise TgxError(f"primitive {name!r} is declared twice")
        self.name = name
        self.multiple_results = multiple_results
        self.commutative = commutative
        self.elementwise = elementwise
        self.family = family
        self.atomic = atomic
        self.is_view = is_view
        self.flops: Callable | None = None
        self.shape_rule: Callable | None = None
        self.impl: Callable | None = None
        self.decomposition: Callable | None = None
        self.vjp: Callable | None = None
        self.batch: Callable | None = None
        # Parameters that must be normalised before binding (e.g. axes to tuples).
        self.param_rule: Callable | None = None
        PRIMITIVES[name] = self

    def __repr__(self) -> str:
        return self.name

    def __reduce__(self):  # pickles by name, so graphs cross process boundaries
        return (primitive_by_name, (self.name,))

    # -- registration ------------------------------------------------------------------------
    def def_shape(self, f: Callable) -> Callable:
        _only_once(self, "shape_rule")
        self.shape_rule = f
        return f

    def def_flops(self, f: Callable) -> Callable:
        _only_once(self, "flops")
        self.flops = f
        return f

    def def_impl(self, f: Callable) -> Callable:
        _only_once(self, "impl")
        self.impl = f
        return f

    def def_vjp(self, f: Callable) -> Callable:
        """The reverse-mode rule `f(ct, *primals, out=..., **params) -> cotangent per input`
        (None: no gradient for that input); `ct` and `out` are lists for multiple results.
        A composite without one is differentiated through its decomposition."""
        _only_once(self, "vjp")
        self.vjp = f
        return f

    def def_batch(self, f: Callable) -> Callable:
        """The batching rule `f(args, dims, **params) -> (outs, out_dims)` of `tgx.vmap`."""
        _only_once(self, "batch")
        self.batch = f
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
        trace = find_top_trace(args)
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


def free_inputs(eqns: Sequence[Eqn]) -> list[Var]:
    """The variables `eqns` read but do not define, in order of first use: the inputs of a
    region cut out of a graph (fuse, the fuse stage, a lowered region).

    >>> import tgx, tgx.numpy as tnp
    >>> g = tgx.make_graph(lambda x, y: tnp.exp(x) * y)(tgx.Spec((2,)), tgx.Spec((2,)))
    >>> exp_x = g.eqns[0].outvars[0]
    >>> free_inputs(g.eqns) == list(g.invars), free_inputs(g.eqns[1:]) == [exp_x, g.invars[1]]
    (True, True)
    """
    defined = {v.id for e in eqns for v in e.outvars}
    out: dict[int, Var] = {}
    for e in eqns:
        for x in e.invars:
            if isinstance(x, Var) and x.id not in defined and x.id not in out:
                out[x.id] = x
    return list(out.values())


def equation_key(eqn: Eqn) -> tuple:
    """What identifies an equation's computation up to its variables: the primitive, the
    params, the input types and literal values (memo key of the cost model, the selection
    and the kernel sweep).

    >>> import tgx, tgx.numpy as tnp
    >>> g = tgx.make_graph(lambda x: (x * 2.0, x * 2.0, x * 3.0))(tgx.Spec((2,)))
    >>> [equation_key(e) == equation_key(g.eqns[0]) for e in g.eqns]
    [True, True, False]
    """
    return (eqn.primitive.name, repr(sorted(eqn.params.items())),
            tuple(str(a.aval) if not isinstance(a, Literal) else repr(a.val)
                  for a in eqn.invars))


def primitive_by_name(name: str) -> Primitive:
    """The primitive registered as `name` (`import tgx` registers every family); a
    `TgxError` naming it when there is none."""
    p = PRIMITIVES.get(name)
    if p is None:
        raise TgxError(f"no primitive named {name!r} is registered")
    return p


def _only_once(p: Primitive, what: str) -> None:
    if getattr(p, what) is not None:
        raise TgxError(f"primitive {p.name!r} already has a {what.replace('_', ' ')}")


# ---------------------------------------------------------------------------------------------
# The evaluation loop (JAX's `eval_jaxpr`)


def eval_graph_loop(graph: Graph, args: Sequence, consts: Sequence | None = None) -> list:
    """Run `graph` on `args` by binding each equation's primitive on the current values:
    eagerly on NumPy when no trace is active, staged into the current trace otherwise (so a
    body graph can be inlined, as `fused` does). `consts` replace `graph.consts`.

    >>> import tgx, tgx.numpy as tnp
    >>> g = tgx.make_graph(lambda x: tnp.exp(x) + 1.0)(tgx.Spec((2,), "float32"))
    >>> eval_graph_loop(g, [np.zeros(2, np.float32)])
    [array([2., 2.], dtype=float32)]
    """
    trace = find_top_trace(args)
    env: dict[int, Any] = {}

    def read(a):
        if isinstance(a, Literal):  # a trace takes it as it is (weak type kept)
            return a if trace is not None else np.asarray(a.val, dtype=a.aval.dtype)
        return env[a.id]

    for v, c in zip(graph.constvars, graph.consts if consts is None else consts):
        env[v.id] = c
    for v, x in zip(graph.invars, args):
        env[v.id] = x
    # A trace that records source lines (the graph builder) gives each staged equation the
    # user's line of the equation it copies.
    keeps_lines = hasattr(trace, "source_override")
    for eqn in graph.eqns:
        ins = [read(a) for a in eqn.invars]
        if keeps_lines:
            saved = trace.source_override
            trace.source_override = eqn.source_info or saved
        try:
            outs = eqn.primitive.bind(*ins, **eqn.params)
        finally:
            if keeps_lines:
                trace.source_override = saved
        outs = outs if eqn.primitive.multiple_results else [outs]
        for v, o in zip(eqn.outvars, outs):
            env[v.id] = o
    return [read(v) for v in graph.outvars]


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
    names = var_namer(graph)
    lines = []
    for j in range(max(0, i - radius), min(len(graph.eqns), i + radius + 1)):
        mark = ">>" if j == i else "  "
        lines.append(f"  {mark} {pp_eqn(graph.eqns[j], names)}")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# The text form, jaxpr-like, with symbolic dims:
#
#     { lambda ; a:f32[N,784] b:f32[784,128]. let
#         c:f32[N,128] = dot_general[contract=((1,), (0,)) batch=((), ())] a b
#       in (c) }


def _name(i: int) -> str:
    # a, b, …, z, ba, bb, … (base 26 with letters as digits, as jaxprs print)
    s = ""
    while True:
        s = chr(ord("a") + i % 26) + s
        i //= 26
        if i == 0:
            return s


def var_namer(graph: Graph | None = None) -> Callable[[Var | Literal], str]:
    names: dict[int, str] = {}

    def name(v):
        if isinstance(v, Literal):
            val = v.val
            if isinstance(val, (np.generic, np.ndarray)):
                val = val.item()
            return f"{val!r}:{v.aval.str_short()}"
        n = names.get(v.id)
        if n is None:
            n = names[v.id] = _name(len(names))
        return n

    if graph is not None:
        for v in (*graph.constvars, *graph.invars):
            name(v)
        for e in graph.eqns:
            for v in e.outvars:
                name(v)
    return name


def _fmt_param(v, indent: int) -> str:
    if isinstance(v, Graph):
        body = pp_graph(v, indent + 4)
        return "\n" + " " * (indent + 4) + body
    if isinstance(v, np.dtype):
        return SHORT_NAMES.get(v, str(v))
    if isinstance(v, tuple):
        inner = ", ".join(_fmt_param(x, indent) for x in v)
        return f"({inner}{',' if len(v) == 1 else ''})"
    if hasattr(v, "free_symbols"):
        return str(v).replace(" ", "")
    if callable(v) and hasattr(v, "__name__"):
        return v.__name__
    return repr(v) if isinstance(v, str) else str(v)


def pp_eqn(eqn: Eqn, name: Callable | None = None, indent: int = 0) -> str:
    name = name or var_namer()
    outs = " ".join(f"{name(v)}:{v.aval.str_short()}" for v in eqn.outvars)
    params = ""
    shown = dict(eqn.params)
    if eqn.primitive.name == "fused" and shown.get("name", "fused") != "fused":
        # a pattern occurrence (the patterns stage): its name says what the body is
        shown = {"name": shown["name"], "eqns": len(shown["graph"].eqns),
                 **dict(shown.get("kernel_params", ()))}
    if shown:
        params = "[" + " ".join(f"{k}={_fmt_param(v, indent)}"
                                for k, v in shown.items()) + "]"
    ins = " ".join(name(x) for x in eqn.invars)
    return f"{outs} = {eqn.primitive.name}{params} {ins}".rstrip()


def pp_graph(graph: Graph, indent: int = 0) -> str:
    name = var_namer()
    consts = " ".join(f"{name(v)}:{v.aval.str_short()}" for v in graph.constvars)
    ins = " ".join(f"{name(v)}:{v.aval.str_short()}" for v in graph.invars)
    pad = " " * indent
    lines = [f"{{ lambda {consts}{' ' if consts else ''}; {ins}. let"]
    for e in graph.eqns:
        lines.append(f"{pad}    {pp_eqn(e, name, indent + 4)}")
    outs = " ".join(name(v) for v in graph.outvars)
    lines.append(f"{pad}  in ({outs}) }}")
    return "\n".join(lines)
