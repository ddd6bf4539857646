"""`lower`: a backend-annotated graph and one kernel per equation → `CompiledGraph`.

Steps, each a plain function:
1. `schedule`: equations in order; maximal runs of consecutive jax equations (transfers
   excluded) become one `jax.jit` region, so a whole-graph-on-jax plan is one XLA call.
   `rebackend` already ordered the equations so that connected JAX work is consecutive
   (`schedule.region_order`).
2. slots: every value gets an index in one flat list; literals and constants are converted
   to their consumer's backend once, at lowering.
3. `buffer_requests` → `tgx.runtime.memory.plan_memory`: liveness over the schedule; values
   written by `out=` kernels on the CPU go into one 64-byte aligned workspace (in place of an
   elementwise input that dies there); other values are owned by their library (XLA, torch,
   NumPy allocations) and accounted on a pseudo-device `<device>/owned`. On a GPU `device`
   the torch and jax values are all library-owned (`cuda:0/owned`: torch's caching
   allocator, XLA); NumPy values keep the CPU workspace.
4. weights (`weights=`: argument indices): their `copy_to`s are not instructions; the runtime
   converts each weight to every backend that needs it once per bound array object
   (`CompiledGraph.bind_weights`), and the buffer plan accounts them as *persistent*.
5. state (`state=`: (input, output) index pairs): `tgx.lowering.state.plan_state` decides
   which `dynamic_update_slice`s write their window straight into the caller's state buffer
   (NumPy / torch, an in-place instruction) and orders the schedule so that every reader of
   the old value runs first; other state outputs are copied into the caller's array once at
   the end of the call. State buffers are accounted as *state*.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import sympy

from ..core import Graph, Literal, Var
from ..runtime.memory import BufferRequest, plan_memory
from ..runtime.compiled import CompiledGraph, Instruction, kernel_callable
from ..shapes import eval_dim, free_symbols, shapes_equal
from ..tracing import leaf_names
from ..transforms.evaluate import concretize
from .rebackend import graph_backends
from .state import inplace_fn, plan_state

OWNED = "cpu/owned"
HOST = "cpu"


def owned(device: str) -> str:
    """The pseudo-device of the values a library allocates on `device` (`"cuda:0/owned"`)."""
    return f"{device}/owned"


def _backend_device(backend: str, device: str) -> str:
    """Where `backend`'s values live in a plan for `device`: NumPy on the host, others there."""
    return HOST if backend == "numpy" else device


def _to_backend(value, backend: str, device: str = HOST):
    from ..backends.transfers import CONVERTERS

    return CONVERTERS[backend](value, device=_backend_device(backend, device))


def _params(eqn, dims):
    return {k: concretize(v, dims) for k, v in eqn.params.items()}


def _single(eqn, kernel, backend, device: str = HOST):
    def build(dims, out):
        params = _params(eqn, dims)
        if kernel.writes_out and out is None:  # not in the workspace: a fresh array per call
            return _fresh_out(kernel.fn, params, eqn.outvars[0].aval, dims, backend)
        fn = kernel_callable(kernel, params, out if kernel.writes_out else None)
        if not kernel.dtype_exact and not eqn.primitive.multiple_results:
            fn = _cast(fn, eqn.outvars[0].aval.dtype)
        if not eqn.invars and backend != "numpy" and device != HOST:
            # no input to take the device from (iota, dim_as_value): torch builds on the CPU
            fn = _moved(fn, backend, device)
        return fn
    return build


def _moved(fn, backend, device):
    """`fn` with its (single) result converted to `backend` on `device`."""
    from ..backends.transfers import CONVERTERS

    conv = CONVERTERS[backend]

    def run(*xs):
        return conv(fn(*xs), device=device)
    return run


def _cast(fn, dtype):
    def run(*xs):
        r = fn(*xs)
        return r if r.dtype == dtype else r.astype(dtype)
    return run


def _fresh_out(fn, params, aval, dims, backend):
    shape = tuple(eval_dim(d, dims) for d in aval.shape)
    if backend == "torch":
        import torch

        from ..backends.transfers import torch_dtype

        tdt = torch_dtype(aval.dtype)

        def run_torch(*xs):
            return fn(*xs, out=torch.empty(shape, dtype=tdt, device=xs[0].device), **params)
        return run_torch
    dtype = aval.dtype

    def run(*xs):
        return fn(*xs, out=np.empty(shape, dtype), **params)
    return run


def _jax_region(eqns, kernels, in_vars, out_vars):
    def build(dims, out):
        import jax
        import jax.numpy as jnp

        steps = [(k.fn, _params(e, dims), e) for e, k in zip(eqns, kernels)]

        def region(*xs):
            env = {v.id: x for v, x in zip(in_vars, xs)}
            for fn, params, e in steps:
                args = [jnp.asarray(a.val, a.aval.dtype) if isinstance(a, Literal) else env[a.id]
                        for a in e.invars]
                r = fn(*args, **params)
                if not e.primitive.multiple_results:
                    r = [r]
                for v, o in zip(e.outvars, r):
                    env[v.id] = o
            return tuple(env[v.id] for v in out_vars)

        return jax.jit(region)
    return build


def _is_transfer(eqn) -> bool:
    return eqn.primitive.name == "copy_to"


def _inplace_instruction(e, b, slot_of, lit_slot, index):
    """A `dynamic_update_slice` writing its window into its operand (a state buffer)."""
    fn = inplace_fn(e.primitive.name, b)
    ins = tuple(lit_slot(a, b) if isinstance(a, Literal) else slot_of(a) for a in e.invars)
    return Instruction(f"{e.primitive.name}[inplace]@{b}", b, lambda dims, out: fn, ins,
                       (slot_of(e.outvars[0]),), (e.outvars[0].aval,), (index,),
                       returns_view=True, view_of=(0,))


def lower(graph: Graph, kernels: Sequence, *, in_names: Sequence[str] | None = None,
          fuse_jax: bool = True, use_workspace: bool = True, device: str = "cpu",
          weights: Sequence[int] = (), state: Sequence[tuple[int, int]] = ()) -> CompiledGraph:
    """Lower `graph` (a `BackendGraph` or a plain graph on NumPy) with `kernels[i]` running
    equation i. `weights`: indices of the graph inputs that are weights (bound once, see
    `CompiledGraph.bind_weights`). `state`: (input index, output index) pairs of state
    buffers (the output is written into the caller's input array; see `tgx.compile`).

    `device`: where the torch and jax equations run (the `copy_to`s of `graph` say so too, see
    `rebackend`); literals and constants are converted there. On a GPU device their values
    are library-owned, never in the CPU workspace. This function does not check that the
    device exists (`tgx.compile` / `plan_graph` do)."""
    from ..runtime.compiled import Device

    device = str(Device.parse(device))
    backends = graph_backends(graph)
    # state: in-place updates, and a schedule running readers of an old value before them.
    # The state buffers are the caller's host arrays: only transfers on the host are zero-copy.
    sp = plan_state(graph, graph.eqns, backends, kernels, state, HOST)
    order = sp.order
    eqns = [graph.eqns[j] for j in order]
    backends = [backends[j] for j in order]
    kernels = [kernels[j] for j in order]
    inplace = {t for t, j in enumerate(order) if j in sp.inplace}
    slot: dict[int, int] = {}

    def slot_of(v: Var) -> int:
        s = slot.get(v.id)
        if s is None:
            s = slot[v.id] = len(slot)
        return s

    consts: dict[int, object] = {}
    lit_slots: dict[tuple, int] = {}
    const_value = {v.id: c for v, c in zip(graph.constvars, graph.consts)}

    const_dev: dict[int, str] = {}  # slot -> device of the constant

    def lit_slot(a: Literal, backend: str) -> int:
        key = (repr(a.val), a.aval.dtype.str, backend)
        s = lit_slots.get(key)
        if s is None:
            s = lit_slots[key] = 1_000_000_000 + len(lit_slots)  # renumbered below
            consts[s] = _to_backend(np.asarray(a.val, a.aval.dtype), backend, device)
            const_dev[s] = _backend_device(backend, device)
        return s

    # where each value lives: inputs and constants on the host, a copy_to's result where it
    # says, any other result where its backend runs
    dev_of: dict[int, str] = {v.id: HOST for v in (*graph.constvars, *graph.invars)}
    for e, b in zip(eqns, backends):
        d = e.params.get("device", HOST) if _is_transfer(e) else _backend_device(b, device)
        for v in e.outvars:
            dev_of[v.id] = d

    for v, c in zip(graph.constvars, graph.consts):
        consts[slot_of(v)] = np.asarray(c)
    in_slots = [slot_of(v) for v in graph.invars]
    weight_of = {graph.invars[i].id: i for i in weights}
    weight_copies: list[tuple[int, int, str, str]] = []  # (arg index, slot, backend, device)

    def fold(e) -> bool:
        """Fold a copy_to of a constant (converted now) or of a weight (at binding time)."""
        if not _is_transfer(e) or not isinstance(e.invars[0], Var):
            return False
        src = e.invars[0].id
        if src in const_value:
            from ..backends.transfers import CONVERTERS

            dev = e.params.get("device", HOST)
            consts[slot_of(e.outvars[0])] = CONVERTERS[e.params["backend"]](
                const_value[src], device=dev)
            const_dev[slot_of(e.outvars[0])] = dev
            return True
        if src in weight_of:
            weight_copies.append((weight_of[src], slot_of(e.outvars[0]), e.params["backend"],
                                  e.params.get("device", "cpu")))
            return True
        return False

    # -- schedule: single kernels and jax regions -------------------------------------------
    instrs: list[Instruction] = []
    i = 0
    while i < len(eqns):
        e, b, k = eqns[i], backends[i], kernels[i]
        if i in inplace:
            instrs.append(_inplace_instruction(e, b, slot_of, lit_slot, order[i]))
            i += 1
            continue
        if fuse_jax and b == "jax" and not _is_transfer(e):
            # a region runs over the jax equations from i on; folded copies do not break it
            j, members = i, []
            while j < len(eqns):
                if backends[j] == "jax" and not _is_transfer(eqns[j]):
                    members.append(j)
                elif not fold(eqns[j]):
                    break
                j += 1
            if len(members) > 1:
                instrs.append(_region_instruction(graph, eqns, [eqns[m] for m in members],
                                                  [kernels[m] for m in members], slot_of,
                                                  [order[m] for m in members], j))
                i = j
                continue
            if j > i + 1:  # one jax equation, then folded copies: emit it alone below
                i0 = i
                i = j
                e, b, k = eqns[i0], backends[i0], kernels[i0]
                ins = tuple(lit_slot(a, b) if isinstance(a, Literal) else slot_of(a)
                            for a in e.invars)
                instrs.append(Instruction(
                    repr(k), b, _single(e, k, b, device), ins,
                    tuple(slot_of(v) for v in e.outvars),
                    tuple(v.aval for v in e.outvars), (order[i0],),
                    k.writes_out and len(e.outvars) == 1,
                    k.returns_view, k.inplace_ok))
                continue
        if fold(e):
            i += 1
            continue
        ins = tuple(lit_slot(a, b) if isinstance(a, Literal) else slot_of(a) for a in e.invars)
        view = k.returns_view
        if _is_transfer(e):  # may share memory with its input when both are on one device
            x = e.invars[0]
            src = dev_of.get(x.id, HOST) if isinstance(x, Var) else HOST
            view = src == e.params.get("device", HOST)
        instrs.append(Instruction(
            repr(k), b, _single(e, k, b, device), ins, tuple(slot_of(v) for v in e.outvars),
            tuple(v.aval for v in e.outvars), (order[i],), k.writes_out and len(e.outvars) == 1,
            view, k.inplace_ok))
        i += 1

    out_slots = [lit_slot(v, "numpy") if isinstance(v, Literal) else slot_of(v)
                 for v in graph.outvars]
    # literal slots were numbered out of range; move them after the values
    remap = {s: len(slot) + n for n, s in enumerate(sorted(lit_slots.values()))}
    consts = {remap.get(s, s): c for s, c in consts.items()}
    const_dev = {remap.get(s, s): d for s, d in const_dev.items()}
    slot_dev = {slot[i]: d for i, d in dev_of.items() if i in slot}
    slot_dev.update(const_dev)
    for ins in instrs:
        ins.ins = tuple(remap.get(s, s) for s in ins.ins)
    out_slots = [remap.get(s, s) for s in out_slots]
    n_slots = len(slot) + len(lit_slots)

    symbols = sorted(set().union(*[free_symbols(v.aval.shape) for v in graph.invars]),
                     key=lambda s: s.name)
    # the caller's weight and state arrays are host (NumPy) arrays; copies live where they go
    persistent = [(f"w{a}", _nbytes(graph.invars[a].aval), HOST) for a in sorted(weights)]
    persistent += [(f"w{a}@{b}", _nbytes(graph.invars[a].aval), dev)
                   for a, _, b, dev in weight_copies if not _zero_copy(b, dev)]
    state_bufs = [(f"s{a}", _nbytes(graph.invars[a].aval), HOST) for a, _ in state]
    workspace, memory, dead = plan_buffers(graph, instrs, in_slots, out_slots, consts, slot,
                                           use_workspace, HOST, persistent, state_bufs,
                                           slot_dev)
    names = list(in_names) if in_names else leaf_names(graph.in_tree, len(graph.invars))
    return CompiledGraph(n_slots=n_slots, in_slots=in_slots, in_avals=graph.in_avals,
                         in_names=names, out_slots=out_slots, consts=consts,
                         instructions=instrs, dead=dead, workspace=workspace, memory=memory,
                         symbols=symbols, weight_args=sorted(weights),
                         weight_copies=weight_copies,
                         state=[(a, o, c) for (a, o), c in zip(state, sp.copy)],
                         state_reasons=sp.reasons, state_alias_outs=sp.alias_outs)


def _zero_copy(backend: str, dev: str) -> bool:
    """Whether converting a host NumPy array to `backend` on `dev` shares its memory."""
    return dev == HOST and backend in ("numpy", "torch")


def _region_instruction(graph, schedule, eqns, kernels, slot_of, idx, end):
    """One `jax.jit` over `eqns`; `schedule[end:]` are the equations after the region."""
    defined = {v.id for e in eqns for v in e.outvars}
    in_vars, seen = [], set()
    for e in eqns:
        for a in e.invars:
            if isinstance(a, Var) and a.id not in defined and a.id not in seen:
                seen.add(a.id)
                in_vars.append(a)
    later = {a.id for e in schedule[end:] for a in e.invars if isinstance(a, Var)}
    later |= {v.id for v in graph.outvars if isinstance(v, Var)}
    out_vars = [v for e in eqns for v in e.outvars if v.id in later]
    label = f"jax.jit[{len(eqns)} eqns: " + " ".join(e.primitive.name for e in eqns[:6]) + (
        " …]" if len(eqns) > 6 else "]")
    return Instruction(label, "jax", _jax_region(eqns, kernels, in_vars, out_vars),
                       tuple(slot_of(v) for v in in_vars), tuple(slot_of(v) for v in out_vars),
                       tuple(v.aval for v in out_vars), tuple(idx))


def _nbytes(aval):
    n = aval.nbytes
    return n if type(n) is int else sympy.expand(n)


def plan_buffers(graph, instrs, in_slots, out_slots, consts, slot, use_workspace, device,
                 persistent=(), state=(), slot_dev=None):
    """Liveness, workspace requests, in-place aliases → (slot→buffer, MemoryPlan, dead lists).

    `device`: the device of the workspace (the host); `slot_dev`: slot → device of its value
    (default: all on `device`); only values on `device` written by `out=` kernels go into
    the workspace, the others are library-owned (`<their device>/owned`).
    `persistent`: (name, bytes, device) of bound weights, accounted as persistent buffers;
    `state`: (name, bytes, device) of state buffers (the caller's arrays), accounted as state."""
    slot_dev = slot_dev or {}
    aval_of = {}
    for v in (*graph.constvars, *graph.invars):
        aval_of[slot[v.id]] = v.aval
    for ins in instrs:
        for s, a in zip(ins.outs, ins.out_avals):
            aval_of[s] = a
    n = len(instrs)
    last: dict[int, int] = {}
    for t, ins in enumerate(instrs):
        for s in ins.ins:
            last[s] = t
    for s in out_slots:
        last[s] = n
    # roots[s]: the values whose storage `s` may share (itself, or its inputs' roots for
    # kernels that may return views); a root stays alive as long as any value sharing it.
    roots: dict[int, frozenset] = {}
    for ins in instrs:
        for s in ins.outs:
            if ins.returns_view and ins.ins:
                src = ins.ins if ins.view_of is None else [ins.ins[j] for j in ins.view_of]
                roots[s] = frozenset().union(*[roots.get(i, frozenset((i,))) for i in src])
            else:
                roots[s] = frozenset((s,))
    end: dict[int, int] = {}
    for s, rs in roots.items():
        for r in rs:
            end[r] = max(end.get(r, -1), last.get(s, -1))
    protected = set()
    for s in out_slots:
        protected |= roots.get(s, frozenset((s,)))
    for r in protected:
        end[r] = n + 1  # reaches an output: never in the workspace

    reqs, workspace = [], {}
    for t, ins in enumerate(instrs):
        for s in ins.outs:
            if roots[s] != frozenset((s,)):
                continue
            nbytes = _nbytes(aval_of[s])
            dev = slot_dev.get(s, device)
            in_ws = (use_workspace and ins.writes_out and ins.backend in ("numpy", "torch")
                     and dev == device and s not in protected)
            inplace = None
            if in_ws and ins.inplace_ok and ins.ins:
                x = ins.ins[0]
                xa = aval_of.get(x)
                if (x in workspace and end.get(x) == t and xa is not None
                        and shapes_equal(xa.shape, aval_of[s].shape)
                        and xa.dtype == aval_of[s].dtype
                        and all(x not in roots.get(o, ()) or o == x for o in ins.ins[1:])):
                    inplace = workspace[x]
            e = max(end.get(s, t), t)
            if in_ws:
                workspace[s] = f"v{s}"
                reqs.append(BufferRequest(f"v{s}", nbytes, t, e, device, inplace_of=inplace))
            else:
                reqs.append(BufferRequest(f"v{s}", nbytes, t, min(e, n), owned(dev)))
    for s, c in consts.items():
        nb = int(getattr(c, "nbytes", 0))
        reqs.append(BufferRequest(f"c{s}", nb, -1, n, slot_dev.get(s, device),
                                  kind="persistent"))
    for name, nb, dev in persistent:
        reqs.append(BufferRequest(name, nb, -1, n, dev, kind="persistent"))
    for name, nb, dev in state:
        reqs.append(BufferRequest(name, nb, -1, n, dev, kind="state"))
    memory = plan_memory(reqs) if reqs else None
    # slots to clear after each instruction: owned values whose last use it is
    keep = set(out_slots) | set(consts) | set(in_slots)
    dead: list[list[int]] = [[] for _ in instrs]
    for s, t in last.items():
        if s not in keep and t < n and s not in workspace and end.get(s, t) <= t:
            dead[t].append(s)
    return workspace, memory, [tuple(d) for d in dead]


