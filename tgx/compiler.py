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

import functools
import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any


from .core import Graph
from .errors import BindingError, DTypeError, OutOfMemory, ShapeError, TgxError
from .lowering.lower import OWNED, lower, owned
from .lowering.rebackend import BackendGraph, rebackend
from .runtime.memory import format_bytes
from .planning.candidates import accepted_kernels
from .planning.policies import (
    HINT, assign_backends, check_backends, choose_kernels, decompose_unsupported, primary_backend,
)
from .runtime.compiled import Device
from .shapes import ShapedArray, Spec, aval_of, free_symbols, shape_str, shapes_provably_equal
from .tracing import (
    leaf_names, trace_to_graph, tree_flatten, tree_structure_str, tree_unflatten,
)

POLICIES = ("heuristic", "fastest", "explore")


def check_budget(memory, budget, dims: Mapping[str, int]) -> dict[str, int]:
    """Raise `OutOfMemory` (device, need, budget) before any kernel runs; returns the need."""
    need = estimate(memory, dims)
    for dev, nbytes in need.items():
        limit = budget.get(dev) if isinstance(budget, Mapping) else budget
        if limit is not None and nbytes > limit:
            at = ", ".join(f"{k}={v}" for k, v in dims.items())
            raise OutOfMemory(f"plan needs {format_bytes(nbytes)} on {dev}"
                              f"{f' at {at}' if at else ''} (workspace, library-owned "
                              f"intermediates and weights) but memory_budget is "
                              f"{format_bytes(limit)}")
    return need


def estimate(memory, dims: Mapping[str, int]) -> dict[str, int]:
    """Bytes per real device: workspace + library-owned live set + persistent buffers."""
    if memory is None:
        return {}
    per = memory.estimate_memory(**dims)
    out: dict[str, int] = {}
    for dev, nbytes in per.items():
        real = dev.split("/")[0]
        out[real] = out.get(real, 0) + nbytes
    return out


class Plan:
    """One choice per equation, the transfers, the flat schedule and the buffer plan.

    `print(plan)` shows them; `plan.run(*args)` runs; `plan.estimate_memory(N=...)` gives
    bytes per device; `plan.memory` is the `MemoryPlan`.
    """

    def __init__(self, graph: Graph, bgraph: BackendGraph, kernels: list, compiled,
                 policy: str, memory_budget=None, return_backend_arrays: bool = False,
                 estimates: list | None = None, dims: Mapping | None = None,
                 predicted_s: float | None = None, device: str = "cpu"):
        self.source_graph = graph
        #: where the torch / jax equations run ("cpu", "cuda:0"); NumPy runs on the host
        self.device = str(Device.parse(device))
        #: per equation of `graph`: the `Estimate` the selection used (None for heuristic)
        self.estimates = estimates
        #: the concrete binding the estimates are for
        self.dims = dict(dims or {})
        self.predicted_s = predicted_s
        self.graph = bgraph
        self.kernels = kernels
        self.compiled = compiled
        self.policy = policy
        self.memory_budget = memory_budget
        self.return_backend_arrays = return_backend_arrays
        compiled.memory_budget = memory_budget
        compiled.state_backend_arrays = return_backend_arrays

    @property
    def memory(self):
        return self.compiled.memory

    @property
    def symbols(self) -> tuple:
        return self.compiled.symbols

    def estimate_memory(self, **dims: int) -> dict[str, int]:
        """Bytes per device at this binding of the symbolic dims (no allocation)."""
        return estimate(self.memory, dims)

    def check_budget(self, budget, **dims: int) -> dict[str, int]:
        return check_budget(self.memory, budget, dims)

    def transfers(self) -> list[tuple[int, str, object]]:
        """(equation index, destination backend, bytes) of every copy_to."""
        return [(i, e.params["backend"], e.invars[0].aval.nbytes)
                for i, e in enumerate(self.graph.eqns) if e.primitive.name == "copy_to"]

    def run(self, *args, **kwargs):
        """Run on arguments shaped like the traced function's (pytrees of arrays)."""
        g = self.graph
        leaves, _ = tree_flatten((args, kwargs)) if g.in_tree is not None else (list(args), None)
        return self.run_flat(leaves)

    def run_flat(self, leaves):
        outs = self.compiled.run_flat(leaves)
        if self.graph.out_tree is not None:
            return tree_unflatten(self.graph.out_tree, outs)
        return outs[0] if len(outs) == 1 else outs

    __call__ = run

    def summary(self) -> str:
        counts: dict[str, int] = {}
        for b in self.graph.backends:
            counts[b] = counts.get(b, 0) + 1
        per = ", ".join(f"{n} on {b}" for b, n in counts.items())
        return (f"{len(self.graph.eqns)} equations ({per}), {len(self.transfers())} transfers, "
                f"{len(self.compiled)} instructions")

    def __str__(self) -> str:
        from .core import pp_eqn, var_namer

        name = var_namer(self.graph)
        on = f", device {self.device}" if self.device != "cpu" else ""
        lines = [f"Plan (policy {self.policy}{on}): {self.summary()}"]
        if self.estimates is not None:
            at = ", ".join(f"{k}={v}" for k, v in self.dims.items()) or "static shapes"
            lines.append(f"predicted {self.predicted_s * 1e6:.1f} µs at {at}")
        lines.append("equations:")
        inplace = {j for ins in self.compiled.instructions if "[inplace]" in ins.label
                   for j in ins.eqns}
        for i, (e, k) in enumerate(zip(self.graph.eqns, self.kernels)):
            fig = ""
            if self.estimates is not None and self.estimates[i] is not None:
                est = self.estimates[i]
                fig = f"  # {est.seconds * 1e6:.2f} µs {est.source}" + (
                    f" ({est.detail})" if est.source == "measured" else "")
            if i in inplace:
                fig += ", in place (state)" if fig else "  # in place (state)"
            lines.append(f"  {i:>3} {k!r:<28} {pp_eqn(e, name)}{fig}")
        cg = self.compiled
        if cg.state:
            lines.append(f"state: {len(cg.state)} buffer(s), the caller's arrays")
            for (a, o, copy), why in zip(cg.state, cg.state_reasons):
                how = (f"copied in once per call ({why})" if copy else
                       "updated in place (the [inplace] instructions write only their window)")
                lines.append(f"  {cg.in_names[a]} -> output {o}: {how}")
        tr = self.transfers()
        total = sum((b for _, _, b in tr), 0)
        lines.append(f"transfers: {len(tr)}" + (f", {total} bytes in all" if tr else ""))
        for i, b, nbytes in tr:
            lines.append(f"  eqn {i}: → {b}, {nbytes} bytes")
        lines.append("schedule:")
        for t, ins in enumerate(self.compiled.instructions):
            lines.append(f"  {t:>3} {ins.label} ins={list(ins.ins)} outs={list(ins.outs)}"
                         + (" [workspace]" if ins.outs and ins.outs[0] in self.compiled.workspace
                            else ""))
        mem = self.memory
        if mem is not None:
            lines.append("buffer plan:")
            lines.extend("  " + line for line in str(mem).split("\n"))
            hint = {s: 64 for s in mem.symbols}
            est = self.estimate_memory(**hint)
            at = ", ".join(f"{k}={v}" for k, v in hint.items())
            lib = OWNED if self.device == "cpu" else f"{OWNED} and {owned(self.device)}"
            lines.append(f"  estimate{f' at {at}' if at else ''}: "
                         + ", ".join(f"{d}: {format_bytes(b)}" for d, b in est.items())
                         + f" (values on {lib} are owned by their library)")
        return "\n".join(lines)

    __repr__ = __str__


def _default_dims(graph: Graph) -> dict[str, int]:
    syms = set().union(*[free_symbols(v.aval.shape) for v in graph.invars]) if graph.invars \
        else set()
    return {s.name: HINT for s in sorted(syms, key=lambda s: s.name)}


def plan_graph(graph: Graph, *, policy: str = "fastest", backends: Sequence[str] | None = None,
               memory_budget=None, return_backend_arrays: bool = False,
               in_names: Sequence[str] | None = None, store=None,
               tolerance: float | None = None, dims: Mapping[str, int] | None = None,
               weights: Sequence[int] = (), state: Sequence[tuple[int, int]] = (),
               device: str = "cpu") -> Plan:
    """Choose a kernel per equation of `graph`, insert transfers, lower: a `Plan`.

    `weights`: indices of the graph inputs that are weights (converted to their backends once
    per bound array object, accounted as persistent; see `Compiled`). `state`: (input index,
    output index) pairs: the output is the input's new value, written into the caller's array
    (in place where the lowering can; see `tgx.compile`).

    "fastest" and "explore" choose at the concrete binding `dims` (default: every symbol at
    64) with `store` (default: `BenchmarkStore()`).

    `device` ("cpu", "cuda:0"): where the torch and jax equations run (NumPy's stay on the
    host); a device no allowed backend can reach is a `KernelError` naming it and why. On a
    GPU the measured policies fall back to the heuristic plan (the profiler and the store's
    figures are CPU-only), and `plan.policy` says so.
    """
    if policy not in POLICIES:
        raise ValueError(f"unknown policy {policy!r} (expected one of {POLICIES})")
    device = str(Device.parse(device))
    backends = check_backends(backends, device)
    if policy != "heuristic" and device != "cpu":
        plan = plan_graph(graph, policy="heuristic", backends=backends,
                          memory_budget=memory_budget,
                          return_backend_arrays=return_backend_arrays, in_names=in_names,
                          weights=weights, state=state, device=device)
        plan.policy = (f"heuristic (device {device}: the benchmark store's selection is "
                       f"CPU-only, so {policy!r} falls back)")
        return plan
    if policy != "heuristic":
        plan = _measured_plan(graph, policy, backends, memory_budget, return_backend_arrays,
                              in_names, store, tolerance, dims, weights)
        if state:  # the measured selection lowers without state: lower its choice again
            plan.compiled = lower(plan.graph, plan.kernels, in_names=in_names, weights=weights,
                                  state=state)
            plan.compiled.memory_budget = memory_budget
            plan.compiled.state_backend_arrays = return_backend_arrays
        return plan
    g = decompose_unsupported(graph, backends, primary_backend(backends))
    assign = assign_backends(g, backends, device=device)
    bg = rebackend(g, assign, outputs=None if return_backend_arrays else "numpy", device=device)
    kernels = choose_kernels(bg, bg.backends)
    cg = lower(bg, kernels, in_names=in_names, weights=weights, state=state, device=device)
    return Plan(graph, bg, kernels, cg, policy, memory_budget, return_backend_arrays,
                device=device)


def _measured_plan(graph, policy, backends, memory_budget, return_backend_arrays, in_names,
                   store, tolerance, dims, weights=()) -> Plan:
    from .planning.cost_model import CostModel
    from .planning.policies import explore, heuristic_cost
    from .planning.recipes import (
        candidate_plans, measure_plans, measured_plans, plan_from_payload,
    )
    from .planning.selection import select
    from .serialize import SerializationError
    from .store import BenchmarkStore

    dims = dict(dims) if dims else _default_dims(graph)
    store = BenchmarkStore() if store is None else store
    cm = CostModel(store, tolerance=tolerance)
    kw = dict(in_names=in_names, weights=weights, memory_budget=memory_budget,
              return_backend_arrays=return_backend_arrays)
    if policy == "explore":
        explore(graph, backends, store, cm, dims)
        cm = CostModel(store, tolerance=tolerance)  # with what explore just measured
        measure_plans(graph, candidate_plans(graph, backends, cm, dims, weights=weights),
                      store, dims, env_id=cm.env_id, weights=weights)
    # Whole plans measured as a whole beat any sum of per-equation figures (recipes.py).
    # With a tolerance the per-kernel errors decide, so measured plans are not used.
    for m in measured_plans(graph, backends, store, dims, cm.env_id, weights) \
            if tolerance is None else ():
        try:
            plan = plan_from_payload(m.payload, graph, policy=policy, **kw)
        except SerializationError:  # a kernel changed since: the next one
            continue
        at = ", ".join(f"{k}={v}" for k, v in m.dims.items())
        near = "" if m.dims == {str(k): int(v) for k, v in dims.items()} else \
            " (the nearest measured binding)"
        plan.policy = (f"{policy} (measured plan {m.label}: {m.median_s * 1e6:.0f} us"
                       + (f" at {at}{near}" if at else "") + ")")
        plan.predicted_s, plan.dims = m.median_s, dict(m.dims)
        return plan
    sel = select(graph, backends, cm, dims, weights=weights)
    h_cost = heuristic_cost(graph, backends, cm, dims, weights) if tolerance is None else None
    if h_cost is not None and h_cost < sel.total * (1 - 1e-9):
        plan = plan_graph(graph, policy="heuristic", backends=backends,
                          memory_budget=memory_budget,
                          return_backend_arrays=return_backend_arrays, in_names=in_names,
                          weights=weights)
        plan.policy = f"{policy} (heuristic plan: cheaper by the cost model)"
        plan.predicted_s, plan.dims = h_cost, dims
        return plan
    return selection_plan(graph, sel, cm, dims, policy, store=store, **kw)


def selection_plan(graph, sel, cm, dims, policy: str, *, store=None, in_names=None,
                   weights=(), memory_budget=None, return_backend_arrays: bool = False) -> Plan:
    """The `Plan` of a `Selection` (per-equation choices), with each step's estimate.
    Under "fastest", unmeasured choices are flagged in `store` for the offline profiler."""
    from .planning.policies import flag_pending
    from .planning.selection import realize

    g, assign, chosen, ests = realize(sel)
    if policy == "fastest" and store is not None:
        flag_pending(store, cm, g.eqns, chosen, ests, dims, sel.backends)
    bg = rebackend(g, assign, outputs=None if return_backend_arrays else "numpy")
    it = iter(zip(chosen, ests))
    kernels, estimates = [], []
    home = {e.outvars[0].id: b for e, b in zip(bg.eqns, bg.backends)}  # producer's backend
    for e, b in zip(bg.eqns, bg.backends):
        if e.primitive.name == "copy_to":
            kernels.append(accepted_kernels(e, b)[0])
            src = home.get(getattr(e.invars[0], "id", None), "numpy")
            estimates.append(cm.transfer(e.invars[0].aval, src, b, dims))
        else:
            k, est = next(it)
            kernels.append(k)
            estimates.append(est)
    cg = lower(bg, kernels, in_names=in_names, weights=weights)
    return Plan(graph, bg, kernels, cg, policy, memory_budget, return_backend_arrays,
                estimates, dims, sel.total)


class Compiled:
    """A function compiled by `tgx.compile`: call it, or `.lower(...)` it to see the `Plan`."""

    def __init__(self, fn: Callable, *, policy="fastest", backends=None, dynamic=None,
                 store=None, tolerance=None, memory_budget=None, return_backend_arrays=False,
                 weights=None, state=None, device="cpu"):
        if policy not in POLICIES:
            raise ValueError(f"unknown policy {policy!r} (expected one of {POLICIES})")
        functools.update_wrapper(self, fn)
        self.fn = fn
        self.policy = policy
        #: where the torch / jax equations run; checked now, so a missing GPU fails here
        self.device = str(Device.parse(device))
        self.backends = None if backends is None else list(backends)
        if self.backends is not None or self.device != "cpu":
            check_backends(self.backends, self.device)
        self.dynamic = dict(dynamic or {})
        self.store = store          # kept for the selection policies ("fastest", "explore")
        self.tolerance = tolerance  # idem
        self.memory_budget = memory_budget
        self.return_backend_arrays = return_backend_arrays
        self.trace_count = 0
        self._plans: dict[Any, Plan] = {}
        self._fast: dict[Any, Plan] = {}  # concrete (tree, shapes, dtypes) -> plan
        self._weight_leaves: dict[Any, tuple] = {}  # tree -> indices of the weight leaves
        # tree -> per state argument: (name, its leaf indices, its tree structure)
        self._state_leaves: dict[Any, tuple] = {}
        try:
            self._params = list(inspect.signature(fn).parameters)
        except (TypeError, ValueError):
            self._params = []
        unknown = set(self.dynamic) - set(self._params)
        if unknown and self._params:
            raise ValueError(f"dynamic names unknown arguments {sorted(unknown)} of "
                             f"{fn.__name__}{inspect.signature(fn)}")
        self.weights = self._weight_names(weights)
        #: names of the state arguments, in the order the new state is returned
        self.state = self._arg_names(state, "state")
        both = self.weights & set(self.state)
        if both:
            raise ValueError(f"arguments {sorted(both)} are named both weights (immutable) and "
                             f"state (updated in place)")

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
                raise ValueError(f"{what} names an unknown argument {w!r} of "
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
        for k, v in kwargs.items():
            sub, td = tree_flatten(v)
            owners += [k] * len(sub)
            structure[k] = td
        names = leaf_names(tree, len(leaves))
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
        a = x if isinstance(x, ShapedArray) else aval_of(x)
        dyn = self.dynamic.get(owner)
        if not dyn:
            return a
        shape = list(a.shape)
        for ax, sym in dyn.items():
            if not -len(shape) <= ax < len(shape):
                raise BindingError(f"argument {name}: dynamic axis {ax} ({sym}) out of range "
                                   f"for shape {shape_str(a.shape)}")
            shape[ax] = sym
        return Spec(tuple(shape), a.dtype)

    def _plan(self, tree, avals, names, leaves=None) -> Plan:
        key = (tree, avals)
        plan = self._plans.get(key)
        if plan is None:
            graph = trace_to_graph(self.fn, tree_unflatten(tree, list(avals)))
            self.trace_count += 1
            dims = None
            if leaves is not None:  # choose at the first call's binding
                dims = {}
                for a, x in zip(avals, leaves):
                    for d, n in zip(a.shape, getattr(x, "shape", ())):
                        if type(d) is not int and getattr(d, "is_Symbol", False):
                            dims[d.name] = int(n)
            state = _state_pairs(graph, self._state_leaves.get(tree, ()),
                                 getattr(self.fn, "__name__", "the function"))
            plan = plan_graph(graph, policy=self.policy, backends=self.backends,
                              memory_budget=self.memory_budget,
                              return_backend_arrays=self.return_backend_arrays, in_names=names,
                              store=self.store, tolerance=self.tolerance, dims=dims,
                              weights=self._weight_leaves.get(tree, ()), state=state,
                              device=self.device)
            self._plans[key] = plan
        return plan

    def lower(self, *args, **kwargs) -> Plan:
        """The `Plan` for arguments given as arrays or `tgx.Spec`s (symbolic names allowed)."""
        _, tree, avals, names = self._abstract(args, kwargs)
        return self._plan(tree, avals, names)

    def __call__(self, *args, **kwargs):
        leaves, tree = tree_flatten((args, kwargs))
        try:  # fast path: the concrete signature seen before
            key = (tree, tuple((x.shape, x.dtype) for x in leaves))
            plan = self._fast.get(key)
        except AttributeError:  # Python scalars among the leaves
            key, plan = None, None
        if plan is None:
            leaves, tree, avals, names = self._abstract(args, kwargs)
            plan = self._plans.get((tree, avals)) or self._plan(tree, avals, names, leaves)
            if key is not None:
                self._fast[key] = plan
        return plan.run_flat(leaves)

    def __repr__(self) -> str:
        return f"<tgx.compile {getattr(self.fn, '__name__', self.fn)!r}: {len(self._plans)} plans>"


def _leaf_paths(td, path: str) -> list[str]:
    if td.node_type is None:
        return [path]
    t = td.node_type[0]
    return [p for i, c in enumerate(td.children)
            for p in _leaf_paths(c, f"{path}[{td.aux[i]!r}]" if t is dict else f"{path}[{i}]")]


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
        for path, i, j in zip(_leaf_paths(td, name), leaves, got):
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
            device: str = "cpu"):
    """Compile `fn`: trace per abstract signature, choose kernels, plan buffers, run flat.

    Usable as `@tgx.compile` or `@tgx.compile(backends=["torch"], dynamic={"x": {0: "N"}})`.
    Axes declared in `dynamic` (argument name → {axis: symbol}) stay symbolic, so new sizes
    reuse the plan. `memory_budget` (bytes, or {device: bytes}) raises `tgx.OutOfMemory`
    before any kernel runs. `policy`: "fastest" (default: benchmark store, else cost model),
    "explore" (profile unmeasured candidates now), "heuristic" (rules, no store);
    `store` (default `BenchmarkStore()`), `tolerance` (max measured relative error).

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
              device=device)
    if fn is None:
        return lambda f: Compiled(f, **kw)
    return Compiled(fn, **kw)
