"""`tgx.compile`: trace once per abstract signature, plan, and run a flat instruction list.

>>> import numpy as np, tgx, tgx.numpy as tnp
>>> @tgx.compile(backends=["numpy"], dynamic={"x": {0: "N"}})
... def f(x):
...     return tnp.sum(tnp.exp(x) * 2.0, axis=1)
>>> f(np.zeros((5, 3), np.float32)).shape, f(np.zeros((9, 3), np.float32)).shape
((5,), (9,))
>>> f.trace_count
1
"""

from __future__ import annotations

import builtins
import functools
import inspect
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from .backends import check_backends, owning_backend, to_callers_arrays
from .core import Graph, find_top_trace
from .devices import offset_of
from .errors import BindingError, DTypeError, OptionError, ShapeError, TgxError
from .pipeline import plan_graph
from .plan import Plan
from .precision import check_precision
from .planning.options import UNALIGNED_MIN_BYTES, PlanOptions
from .shapes import (
    ShapedArray,
    Spec,
    check_dim_value,
    constrained_symbols,
    shape_str,
    shapes_provably_equal,
)
from .tracing import (
    _REGISTRY,
    _auto_rule,
    arg_aval,
    leaf_names,
    leaf_paths,
    positional_names,
    trace_to_graph,
    tree_flatten,
    tree_structure_str,
    tree_unflatten,
)


class Compiled:
    """A function compiled by `tgx.compile`: call it, or `.lower(...)` it to see the `Plan`."""

    def __init__(self, fn: Callable, *, policy="fastest", backends=None, dynamic=None,
                 store=None, tolerance=None, memory_budget=None, return_backend_arrays=False,
                 weights=None, state=None, device="cpu", explore_budget=None,
                 patterns=True, fuse=True, static_argnums=(), static_argnames=(),
                 constraints=None, donate=True):
        functools.update_wrapper(self, fn)
        self.fn = fn
        self._kw = dict(policy=policy, backends=backends, dynamic=dynamic, store=store,
                        tolerance=tolerance, memory_budget=memory_budget,
                        return_backend_arrays=return_backend_arrays, weights=weights,
                        state=state, device=device, explore_budget=explore_budget,
                        patterns=patterns, fuse=fuse, constraints=constraints, donate=donate)
        #: whether jax arrays passed as `state=` are donated to XLA (see `compile`)
        self.donate = bool(donate)
        #: how every plan of this function is made (a new signature reuses them)
        self.options = PlanOptions.make(
            policy=policy, backends=backends, device=device, store=store, tolerance=tolerance,
            memory_budget=memory_budget, return_backend_arrays=return_backend_arrays,
            explore_budget=explore_budget, patterns=patterns, fuse=fuse)
        if backends is not None or self.device != "cpu":  # a missing GPU fails here
            check_backends(backends, self.device)
        self.dynamic = dict(dynamic or {})
        #: the constrained symbols of `dynamic` dims by name ("N >= 16" → N)
        self._constrained = constrained_symbols(constraints)
        named = {n for axes in self.dynamic.values() for n in axes.values()}
        unused = set(self._constrained) - named
        if unused:
            raise OptionError(f"constraints name {sorted(unused)}, which no axis in dynamic= "
                              f"does")
        self.trace_count = 0
        self._plans: dict[Any, Plan] = {}
        self._fast: dict[Any, Plan] = {}  # concrete (tree, shapes, dtypes) -> plan
        #: the signatures of the last calls, most recent first, each with the function that
        #: checks and flattens the arguments of such a call in one pass (`_FastCall`)
        self._guards: list[_FastCall] = []
        self._out_trees: dict[int, Any] = {}  # id(plan) -> the traced output structure
        self._weight_leaves: dict[Any, tuple] = {}  # tree -> indices of the weight leaves
        # tree -> per state argument: (name, its leaf indices, its tree structure)
        self._state_leaves: dict[Any, tuple] = {}
        try:
            self._signature = inspect.signature(fn)
        except (TypeError, ValueError):
            self._signature = None
        self._params = [] if self._signature is None else list(self._signature.parameters)
        unknown = set(self.dynamic) - set(self._params)
        if unknown and self._params:
            raise OptionError(f"dynamic names unknown arguments {sorted(unknown)} of "
                              f"{fn.__name__}{inspect.signature(fn)}")
        self.weights = self._weight_names(weights)
        #: names of the state arguments, in the order the new state is returned
        self.state = self._arg_names(state, "state")
        both = self.weights & set(self.state)
        if both:
            raise OptionError(f"arguments {sorted(both)} are named both weights (immutable) and "
                              f"state (updated in place)")
        #: arguments passed as Python values (part of the cache key), by name
        self.static = self._arg_names(tuple(_as_tuple(static_argnums))
                                      + tuple(_as_tuple(static_argnames)), "static")
        self._by_static: dict[tuple, Compiled] = {}

    # the options as given (read from `options`, the one copy)
    policy = property(lambda self: self.options.policy)
    #: where the device backends' equations run ("cpu", "cuda:0")
    device = property(lambda self: self.options.device)
    backends = property(lambda self: None if self.options.backends is None
                        else list(self.options.backends))
    store = property(lambda self: self.options.store)
    tolerance = property(lambda self: self.options.tolerance)
    memory_budget = property(lambda self: self.options.budget)
    return_backend_arrays = property(lambda self: self.options.return_backend_arrays)

    def _weight_names(self, weights) -> frozenset:
        """`weights` (a name, a position, or a tuple of them) as argument names."""
        return frozenset(self._arg_names(weights, "weights"))

    def _arg_names(self, spec, what: str) -> tuple:
        """`spec` (a name, a position, or a tuple of them) as argument names, in order."""
        if spec is None:
            return ()
        if isinstance(spec, (str, int)):
            spec = (spec,)
        names: list = []
        for w in spec:
            if isinstance(w, int):
                name = self._params[w] if w < len(self._params) else f"args[{w}]"
            elif self._params and w not in self._params:
                raise OptionError(f"{what} names an unknown argument {w!r} of "
                                  f"{getattr(self.fn, '__name__', self.fn)}"
                                  f"{inspect.signature(self.fn)}")
            else:
                name = w
            if name not in names:
                names.append(name)
        return tuple(names)

    # -- abstract signature -----------------------------------------------------------------
    def _abstract(self, args, kwargs):
        leaves, tree = tree_flatten((args, kwargs))
        owners, structure = [], {}
        for i, a in enumerate(args):
            sub, td = tree_flatten(a)
            owner = self._params[i] if i < len(self._params) else f"args[{i}]"
            owners += [owner] * len(sub)
            structure[owner] = td
        # keyword arguments flatten in sorted key order, whatever the call's order
        for k in tree.children[1].aux or ():
            sub, td = tree_flatten(kwargs[k])
            owners += [k] * len(sub)
            structure[k] = td
        names = leaf_names(tree, len(leaves),
                           arg_names=positional_names(self.fn, len(args)))
        avals = [self._aval(x, owner, name) for x, owner, name in zip(leaves, owners, names)]
        self._weight_leaves[tree] = tuple(i for i, o in enumerate(owners) if o in self.weights)
        if self.state:
            missing = [s for s in self.state if s not in structure]
            if missing:
                raise BindingError(f"state names {missing}, which this call of "
                                   f"{getattr(self.fn, '__name__', self.fn)} does not pass")
            self._state_leaves[tree] = tuple(
                (s, tuple(i for i, o in enumerate(owners) if o == s), structure[s])
                for s in self.state)
        return leaves, tree, tuple(avals), names

    def _aval(self, x, owner: str, name: str) -> ShapedArray:
        a = x if isinstance(x, ShapedArray) else arg_aval(x, name)
        dyn = self.dynamic.get(owner)
        if not dyn:
            return a
        shape = list(a.shape)
        for ax, sym in dyn.items():
            if not -len(shape) <= ax < len(shape):
                raise BindingError(f"argument {name}: dynamic axis {ax} ({sym}) out of range "
                                   f"for shape {shape_str(a.shape)}")
            shape[ax] = self._constrained.get(sym, sym)
        return Spec(tuple(shape), a.dtype)

    def _plan(self, tree, avals, names, leaves=None, args_on: str | None = None,
              arrays=None) -> Plan:
        """The plan for a signature, made on its first call (`leaves`: that call's
        arguments, whose binding it is chosen at) or by `lower` (`arrays`: its arguments,
        arrays or Specs; the binding is the hint)."""
        key = (tree, avals, args_on)
        plan = self._plans.get(key)
        if plan is None:
            graph = trace_to_graph(self.fn, tree_unflatten(tree, list(avals)))
            self.trace_count += 1
            dims = None
            if leaves is not None:  # choose at the first call's binding
                dims = {}
                for a, x, name in zip(avals, leaves, names):
                    for ax, (d, n) in enumerate(zip(a.shape, getattr(x, "shape", ()))):
                        if type(d) is not int and getattr(d, "is_Symbol", False):
                            check_dim_value(d, int(n), f"argument {name}: axis {ax}")
                            dims[d.name] = int(n)
            state = _state_pairs(graph, self._state_leaves.get(tree, ()),
                                 getattr(self.fn, "__name__", "the function"))
            weights = self._weight_leaves.get(tree, ())
            options = replace(self.options, in_names=names, dims=dims, weights=weights,
                              state=state, args_on=args_on,
                              in_offsets=_offsets(leaves if leaves is not None else arrays,
                                                  weights))
            # explore times whole plans on this call's own arguments
            plan = plan_graph(graph, options, given=leaves)
            # lossy kernels stay only if the whole plan's error on these arguments is
            # within the tolerance (tgx.precision)
            plan = check_precision(
                plan, leaves, lambda below: plan_graph(graph, replace(options, lossy_below=below),
                                                       given=leaves))
            self._plans[key] = plan
            # a plan rebuilt from a measured whole plan may not carry the output structure
            self._out_trees[id(plan)] = graph.out_tree
        return plan

    def _out_tree(self, plan: Plan):
        """The structure of `plan`'s results (as traced)."""
        return plan.graph.out_tree or self._out_trees.get(id(plan))

    def lower(self, *args, **kwargs) -> Plan:
        """The `Plan` for arguments given as arrays or `tgx.Spec`s (symbolic names allowed)."""
        if self.static:
            inner, dyn = self._with_static(args, kwargs)
            return inner.lower(**dyn)
        leaves, tree, avals, names = self._abstract(args, kwargs)
        return self._plan(tree, avals, names, args_on=_args_on(leaves), arrays=leaves)

    def _with_static(self, args, kwargs) -> tuple:
        """(the compiled function for these static values, the other arguments by name)."""
        sig = self._signature
        try:
            bound = sig.bind(*args, **kwargs)
        except TypeError as e:
            raise BindingError(f"{self.fn.__name__}{sig}: {e}") from None
        static, dyn = {}, {}
        for name, value in bound.arguments.items():
            (static if name in self.static else dyn)[name] = value
        key = tuple(sorted(static.items(), key=lambda kv: kv[0]))
        try:
            inner = self._by_static.get(key)
        except TypeError:
            raise BindingError(f"{self.fn.__name__}: static arguments must be hashable (they "
                               f"key the compiled plans), got "
                               f"{ {k: type(v).__name__ for k, v in static.items()} }") from None
        if inner is None:
            fn = self.fn

            def with_static(**traced):
                return fn(**traced, **static)

            with_static.__name__ = getattr(fn, "__name__", "fn")
            kw = dict(self._kw)
            kw["dynamic"] = {k: v for k, v in self.dynamic.items() if k in dyn}
            inner = self._by_static[key] = Compiled(with_static, **kw)
        return inner, dyn

    def __call__(self, *args, **kwargs):
        if self.static:
            inner, dyn = self._with_static(args, kwargs)
            return inner(**dyn)
        for fast in self._guards:  # the fast path: a signature seen before (its guard
            leaves = fast.flatten(args, kwargs)   # checks each leaf's type: no tracer passes)
            if leaves is not None:
                return fast(leaves)
        if find_top_trace(args) is not None:
            # Called inside a traced function (compile, make_graph, grad, vmap): inline it,
            # as jax.jit does, so compiled functions compose.
            return self.fn(*args, **kwargs)
        leaves, tree = tree_flatten((args, kwargs))
        try:  # a concrete signature seen before, that no guard serves
            key = (tree, tuple((type(x), x.shape, x.dtype) for x in leaves))
            plan = self._fast.get(key)
        except AttributeError:  # Python scalars among the leaves
            key, plan = None, None
        if plan is None:
            leaves, tree, avals, names = self._abstract(args, kwargs)
            on = _args_on(leaves)
            plan = self._plans.get((tree, avals, on)) or self._plan(tree, avals, names, leaves,
                                                                    on)
            if key is not None:
                self._fast[key] = plan
        else:
            avals = plan.compiled.in_avals
        fast = _FastCall.make(self, plan, tree, leaves, avals)
        if fast is not None:
            self._guards.insert(0, fast)
            del self._guards[_GUARDS:]
            return fast(leaves)
        outs = plan.compiled.run_flat(leaves, donate=self.donate)
        out_tree = self._out_tree(plan)
        out = (tree_unflatten(out_tree, outs) if out_tree is not None
               else outs[0] if len(outs) == 1 else outs)
        if self.return_backend_arrays:
            return out
        return _like_inputs(leaves, out, getattr(self.fn, "__name__", "the function"))

    def __repr__(self) -> str:
        return f"<tgx.compile {getattr(self.fn, '__name__', self.fn)!r}: {len(self._plans)} plans>"


#: signatures served by the fast path at once, per compiled function
_GUARDS = 4


class _FastCall:
    """The fast path for calls of one signature (pytree structure, leaf types, dtypes and the
    static dims): `flatten(args, kwargs)` is a function generated for that signature that
    checks each container and leaf and returns the leaves, or None for any difference (the
    call then takes the slow path, which traces or finds the plan as before); calling the
    object runs the plan on the leaves and builds the results with an unflatten function
    generated for the output structure. No key is built or hashed, no key path is made (the
    slow path names them when an error needs them), and what the results need (whose array
    type they come back in) is decided once here.

    Measured on the MLP 2-64-2 training step (15 leaves): flatten, key and lookup took
    ~10 us before; the guard ~2 us."""

    __slots__ = ("flatten", "run", "unflatten", "out_backend", "convert", "fname",
                 "backend_arrays", "warn")

    @classmethod
    def make(cls, owner: Compiled, plan: Plan, tree, leaves: list, avals) -> _FastCall | None:
        out_tree = owner._out_tree(plan)
        if len(avals) != len(leaves) or out_tree is None:
            return None
        flatten = _guard_function(tree, leaves, avals)
        if flatten is None:
            return None
        self = cls()
        self.flatten = flatten
        self.unflatten = _unflatten_function(out_tree)
        self.fname = getattr(owner.fn, "__name__", "the function")
        self.backend_arrays = owner.return_backend_arrays
        lib = None if self.backend_arrays else _callers_library(leaves)
        self.out_backend = self.convert = None
        self.warn = False
        if lib is not None:
            b, device = self.convert = lib
            # results of b's kernels stay b's arrays (not copied to NumPy and back)
            self.out_backend = b.name if device == "cpu" else None
            self.warn = any(hasattr(x, "requires_grad") for x in leaves)
        c, donate, out_backend = plan.compiled, owner.donate, self.out_backend
        self.run = c.runner(leaves, donate=donate, out_backend=out_backend) or (
            lambda leaves: c.run_flat(leaves, donate=donate, out_backend=out_backend,
                                      checked=True))
        return self

    def __call__(self, leaves: list):
        outs = self.run(leaves)
        if self.convert is not None:
            b, device = self.convert
            if self.warn and any(getattr(x, "requires_grad", False) for x in leaves):
                _warn_grad(self.fname)
            to_callers_arrays(outs, leaves, b, device)
        return self.unflatten(outs)


def _guard_function(tree, leaves: list, avals) -> Callable | None:
    """`flatten(args, kwargs)` for calls of the signature of `leaves` (flattened from
    `((args), {kwargs})` into `tree`; `avals` their traced avals, symbolic dims free): the
    leaves of such a call, else None. Generated as straight-line code (None when a leaf is
    of a kind it does not check)."""
    ns: dict[str, Any] = {"ndarray": np.ndarray}
    lines = ["def flatten(args, kwargs):", "  try:"]
    out: list[str] = []
    counter = [0]

    def const(v) -> str:
        name = f"K{len(ns)}"
        ns[name] = v
        return name

    def new(expr: str) -> str:
        counter[0] += 1
        name = f"n{counter[0]}"
        lines.append(f"    {name} = {expr}")
        return name

    def fail_unless(cond: str) -> None:
        lines.append(f"    if not ({cond}): return None")

    def leaf(expr: str, x, aval) -> bool:
        name = new(expr)
        t = type(x)
        if t in (bool, int, float):  # its aval follows from its type alone
            fail_unless(f"type({name}) is {const(t)}")
        else:
            shape, dtype = getattr(x, "shape", None), getattr(x, "dtype", None)
            if shape is None or dtype is None:
                return False
            dims = [f"{name}.shape[{ax}] == {int(d)}" for ax, d in enumerate(aval.shape)
                    if type(d) is int]
            held = getattr(x, "aval", None)   # a jax array's (shape, dtype, weak type)
            if held is not None and len(dims) == len(aval.shape):
                # a jax array's shape and dtype are Python properties (0.1 us each), its
                # aval one property and a compare: 0.07 us (a training step's 87 leaves)
                fail_unless(f"type({name}) is {const(t)} and {name}.aval == {const(held)}")
                out.append(name)
                return True
            if len(dims) == len(aval.shape):
                shape_ok = f"{name}.shape == {const(tuple(int(n) for n in shape))}"
            else:  # symbolic dims: the run checks them against the binding
                shape_ok = " and ".join([f"len({name}.shape) == {len(aval.shape)}"] + dims)
            d = const(dtype)
            fail_unless(f"type({name}) is {const(t)} and ({name}.dtype is {d} or "
                        f"{name}.dtype == {d}) and {shape_ok}")
        out.append(name)
        return True

    it = iter(zip(leaves, avals))

    def node(td, expr: str) -> bool:
        if td.node_type is None:
            x, aval = next(it)
            return leaf(expr, x, aval)
        t, unflatten = td.node_type
        n = len(td.children)
        name = new(expr)
        if t is dict:
            fail_unless(f"type({name}) is dict and len({name}) == {n}")
            return all(node(c, f"{name}[{const(k)}]") for k, c in zip(td.aux, td.children))
        if t is tuple or t is list:
            fail_unless(f"type({name}) is {t.__name__} and len({name}) == {n}")
            return all(node(c, f"{name}[{i}]") for i, c in enumerate(td.children))
        if t is type(None):
            fail_unless(f"{name} is None")
            return True
        rule = _registered_flatten(t)
        if rule is None:
            return False
        fail_unless(f"type({name}) is {const(t)}")
        parts = new(f"{const(rule)}({name})")
        fail_unless(f"len({parts}[0]) == {n} and {parts}[1] == {const(td.aux)}")
        return all(node(c, f"{parts}[0][{i}]") for i, c in enumerate(td.children))

    if not node(tree, "(args, kwargs)"):
        return None
    lines.append(f"    return [{', '.join(out)}]")
    lines.append("  except Exception:")  # a missing key, a flatten rule that raised …
    lines.append("    return None")
    exec(builtins.compile("\n".join(lines) + "\n", "<tgx guard>", "exec"), ns)
    return ns["flatten"]


def _registered_flatten(t: type):
    rule = _REGISTRY.get(t) or _auto_rule(t)
    return None if rule is None else rule[0]


def _unflatten_function(tree) -> Callable:
    """`unflatten(leaves)`: the pytree of structure `tree`, generated as one expression."""
    ns: dict[str, Any] = {}
    k = iter(range(1 << 30))

    def const(v) -> str:
        name = f"K{len(ns)}"
        ns[name] = v
        return name

    def expr(td) -> str:
        if td.node_type is None:
            return f"o[{next(k)}]"
        t, unflatten = td.node_type
        kids = [expr(c) for c in td.children]
        if t is dict:
            return "{" + ", ".join(f"{const(key)}: {e}" for key, e in zip(td.aux, kids)) + "}"
        if t is tuple:
            return "(" + "".join(f"{e}, " for e in kids) + ")"
        if t is list:
            return "[" + ", ".join(kids) + "]"
        return f"{const(unflatten)}({const(td.aux)}, [{', '.join(kids)}])"

    body = expr(tree)
    exec(builtins.compile(f"def unflatten(o):\n    return {body}\n", "<tgx unflatten>", "exec"), ns)
    return ns["unflatten"]


def _warn_grad(fname: str) -> None:
    if fname not in _WARNED_GRAD:
        _WARNED_GRAD.add(fname)
        warnings.warn(f"{fname} was called with torch tensors that require grad: tgx does not "
                      f"record torch autograd, so its results do not require grad (use "
                      f"tgx.grad / tgx.value_and_grad for gradients)", stacklevel=4)


def _as_tuple(x) -> tuple:
    return () if x is None else (x,) if isinstance(x, (int, str)) else tuple(x)


_WARNED_GRAD: set = set()


def _callers_library(leaves: list) -> tuple | None:
    """(the backend whose arrays are among `leaves`, the device of the first: "cpu" or its
    name), or None when there are none (NumPy's, Specs) or several libraries'."""
    foreign = [x for x in leaves if type(x) not in _HOST_TYPES]
    owners = {owning_backend(x) for x in foreign}
    owners.discard(None)
    if len(owners) != 1:
        return None
    (owner,) = owners
    first = next(x for x in foreign if owning_backend(x) is owner)
    device = str(getattr(first, "device", "cpu"))
    return owner, "cpu" if device.startswith(("cpu", "TFRT_CPU", "CpuDevice")) else device


def _offsets(leaves, weights) -> tuple[int, ...] | None:
    """`PlanOptions.in_offsets` of a call's arguments: where each NumPy array of at least
    `UNALIGNED_MIN_BYTES` that is not a weight (weights are converted once, when bound)
    starts past an alignment boundary; None when all of them start on one."""
    if leaves is None:
        return None
    out = tuple(offset_of(x) if type(x) is np.ndarray and i not in weights
                and x.nbytes >= UNALIGNED_MIN_BYTES else 0 for i, x in enumerate(leaves))
    return out if any(out) else None


def _args_on(leaves: list) -> str | None:
    """The backend whose CPU arrays the caller passed (None: NumPy's, a mix, Specs or a
    device): measured plans are keyed by it (`recipes.recipe_name`)."""
    lib = _callers_library(leaves)
    if lib is None or lib[0].host or lib[1] != "cpu":
        return None
    return lib[0].name


def _like_inputs(leaves: list, out: Any, fname: str) -> Any:
    """Results in the array type of the arguments, whichever backend computed them: torch
    tensors in → torch tensors out (on the device of the first one), jax arrays in → jax
    arrays out, NumPy otherwise (also for a mix of torch and jax). State results stay the
    caller's objects."""
    lib = _callers_library(leaves)
    if lib is None:
        return out
    owner, device = lib
    if any(getattr(x, "requires_grad", False) for x in leaves) and fname not in _WARNED_GRAD:
        _WARNED_GRAD.add(fname)
        warnings.warn(f"{fname} was called with torch tensors that require grad: tgx does not "
                      f"record torch autograd, so its results do not require grad (use "
                      f"tgx.grad / tgx.value_and_grad for gradients)", stacklevel=3)
    out_leaves, tree = tree_flatten(out)
    return tree_unflatten(tree, to_callers_arrays(out_leaves, leaves, owner, device))


_HOST_TYPES = {np.ndarray, np.generic, int, float, bool} | {
    t for t in np.sctypeDict.values() if isinstance(t, type)}


def _same_tree(a, b) -> bool:
    if (a.node_type is None) != (b.node_type is None):
        return False
    if a.node_type is None:
        return True
    return (a.node_type[0] is b.node_type[0] and a.aux == b.aux
            and len(a.children) == len(b.children)
            and all(_same_tree(x, y) for x, y in zip(a.children, b.children)))


def _state_pairs(graph: Graph, info: tuple, fname: str) -> tuple:
    """(input index, output index) per state leaf, after checking that the function returns
    `(outputs, new_state)` with `new_state` shaped like the state arguments."""
    if not info:
        return ()
    names = ", ".join(repr(s) for s, _, _ in info)
    out = tree_unflatten(graph.out_tree, list(range(len(graph.outvars))))
    if not isinstance(out, (tuple, list)) or len(out) < 2:
        raise TgxError(f"{fname} is compiled with state={names}: it must return "
                       f"(outputs, new_state), got one value of structure "
                       f"{tree_structure_str(graph.out_tree)}")
    new = out[-1]
    if len(info) > 1:
        if not isinstance(new, (tuple, list)) or len(new) != len(info):
            raise TgxError(f"{fname} is compiled with state=({names}): its last return value "
                           f"must be a tuple of {len(info)} new states, in that order")
        parts = list(new)
    else:
        parts = [new]
    pairs = []
    for (name, leaves, td), part in zip(info, parts):
        got, got_td = tree_flatten(part)
        if not _same_tree(td, got_td):
            raise TgxError(f"{fname}: the new state of {name} has structure "
                           f"{tree_structure_str(got_td)}, but {name} is "
                           f"{tree_structure_str(td)}")
        for path, i, j in zip(leaf_paths(td, name), leaves, got):
            want, have = graph.invars[i].aval, graph.outvars[j].aval
            if want.dtype != have.dtype:
                raise DTypeError(f"{fname}: the new state {path} is {have.str_short()}, but the "
                                 f"state argument is {want.str_short()}")
            if not shapes_provably_equal(want.shape, have.shape):
                raise ShapeError(f"{fname}: the new state {path} is {have.str_short()}, but the "
                                 f"state argument is {want.str_short()}")
            pairs.append((i, j))
    return tuple(pairs)


def compile(fn: Callable | None = None, *, policy: str = "fastest",  # noqa: A001
            backends: Sequence[str] | None = None, dynamic: Mapping | None = None,
            store=None, tolerance: float | None = None, memory_budget=None,
            return_backend_arrays: bool = False, weights=None, state=None,
            device: str = "cpu", explore_budget: float | None = None,
            patterns: bool = True, fuse: bool = True, static_argnums=(), static_argnames=(),
            constraints=None, donate: bool = True):
    """Compile `fn`: trace per abstract signature, choose kernels, plan buffers, run flat.

    Usable as `@tgx.compile` or `@tgx.compile(backends=["torch"], dynamic={"x": {0: "N"}})`.
    `static_argnums` / `static_argnames` name arguments passed as Python values (an axis, a
    length, a flag): hashable, part of the cache key (each new value traces and plans anew),
    as in `jax.jit`.
    Axes declared in `dynamic` (argument name → {axis: symbol}) stay symbolic, so new sizes
    reuse the plan; `constraints` (["N >= 16", "N % 8 == 0"], as `tgx.Spec` takes them) narrow
    the values of those symbols: shape comparisons use them at trace time, and a call that
    violates one raises `tgx.BindingError`. `memory_budget` (bytes, or {device: bytes})
    raises `tgx.OutOfMemory` before any kernel runs. `policy`: "fastest" (default: benchmark
    store, else cost model),
    "explore" (profile unmeasured candidates now), "heuristic" (rules, no store);
    `store`: a `BenchmarkStore`, a path or a store URL; None (the default) is the default
    store (`$TGX_STORE`, else the user cache); False or "off" (or `TGX_STORE=off`) plans
    without one. `tolerance` (max measured relative error).
    `explore_budget` (seconds) bounds what "explore" spends measuring (half on kernels, the
    rest on whole plans; a later explore measures what was left out); it shows a progress
    bar on a terminal. `patterns=False` turns off the patterns stage: no pattern kernel
    (`tgx.register_kernel`, tgx's pattern library) is offered; `fuse=False` the fuse stage: no
    loop generated from a region of elementwise ops is offered.

    `weights` names the arguments (parameter names or positions, one or a tuple) whose leaves
    are weights: each is converted to every backend the plan needs it on once, cached by the
    identity of the leaf array, and accounted as persistent memory. A new array object is
    bound again (no re-planning); in-place mutation of a bound NumPy array is NOT detected
    (NumPy has no cheap version counter): treat weights as immutable, pass new arrays.

    `state` names the arguments (names or positions, one or a tuple) whose leaves are *state*
    buffers, such as a KV cache. `fn` must return `(outputs, new_state)`: its last return value
    has the structure, shapes and dtypes of the state arguments (with several, a tuple of new
    states in the order `state` lists them); a mismatch is an error at trace time. tgx writes
    each new state leaf into the caller's array and returns that very array object, so
    `y, cache = step(x, cache, pos)` reads the same with or without tgx (JAX's buffer
    donation, but the caller's array keeps its identity). A new state made by
    `tgx.lax.dynamic_update_slice` of the state argument (a chain of them) on NumPy or torch
    writes only its window, in place; readers of the old value are scheduled before it.
    Otherwise (on jax, or another op made the new state) the result is copied into the
    caller's array once per call. State arrays must be writable, C-contiguous NumPy arrays
    (CPU torch tensors with `return_backend_arrays=True`), and are accounted as *state* memory.
    Or jax arrays, the JAX way: the new state comes back as new jax arrays, and with `donate`
    (the default) the arrays passed in are donated to the XLA call that alone reads them, as
    `jax.jit(donate_argnums=...)` does: XLA writes the new state into their buffers and they
    are deleted (keep only what the call returns). `donate=False` leaves them valid.

    `device` ("cpu", the default; "cuda:0", "cuda:1" …): where the torch and jax equations
    run (NumPy equations always run on the host). Checked at once: a CUDA device that torch
    cannot see (`torch.cuda.is_available()` is False), or that jax has no gpu for when only
    jax is allowed, raises a `tgx.KernelError` naming the device and why. On a GPU the
    HEURISTIC rules keep every equation on the device backends (torch first), device values
    are owned by torch's caching allocator / XLA (`plan.estimate_memory()` reports them under
    "cuda:0"; `memory_budget={"cuda:0": n}` limits them), weights are copied to the device
    once, results come back as NumPy arrays (device tensors with `return_backend_arrays`),
    and "fastest"/"explore" fall back to the heuristic plan (the store's figures are CPU
    timings; `plan.policy` says so). State arrays are then copied to the device and back
    every call.

    >>> import numpy as np, tgx, tgx.numpy as tnp
    >>> @tgx.compile(state="cache", policy="heuristic", backends=["numpy"])
    ... def step(x, cache, pos):
    ...     cache = tgx.lax.dynamic_update_slice(cache, x[None], (pos, 0))
    ...     return tnp.sum(cache), cache
    >>> cache = np.zeros((4, 2), np.float32)
    >>> y, new = step(np.ones(2, np.float32), cache, np.int32(1))
    >>> float(y), new is cache, cache[1].tolist()
    (2.0, True, [1.0, 1.0])
    """
    kw = dict(policy=policy, backends=backends, dynamic=dynamic, store=store,
              tolerance=tolerance, memory_budget=memory_budget,
              return_backend_arrays=return_backend_arrays, weights=weights, state=state,
              device=device, explore_budget=explore_budget, patterns=patterns, fuse=fuse,
              static_argnums=static_argnums, static_argnames=static_argnames,
              constraints=constraints, donate=donate)
    if fn is None:
        return lambda f: Compiled(f, **kw)
    return Compiled(fn, **kw)
