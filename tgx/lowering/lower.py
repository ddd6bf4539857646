"""Lowering: an `Assignment` → a `Plan` (`lower_assignment`, the one route every planner takes),
and a backend graph with its kernels → a `CompiledGraph` (`lower`).

Stages, each a plain function whose output `plan.stages` prints:
1. rebackend (`insert_copies`): the copies the assignment implies, as `copy_to` equations with
   their destination's copy kernel.
2. schedule (`tgx.lowering.schedule`): the run order — each connected group of equations on a
   backend that fuses regions kept together, readers of a state buffer's old value before the
   update that overwrites it in place (`tgx.lowering.state`).
3. lower: slots (every value gets an index in one flat list; literals and constants are
   converted to their consumer's backend once, here) and instructions (a maximal run of
   equations on a backend that fuses regions is one instruction: one `jax.jit`); weights
   (`PlanOptions.weights`): their copies are not instructions, the runtime converts each
   weight once per bound array object (`CompiledGraph.bind_weights`), and the equations
   computing from weights alone run there too, once per binding (`_bind_time`); state
   (`PlanOptions.state`): the updates chosen to run in place write their window straight into
   the caller's buffer, other state outputs are copied into it at the end of the call.
4. buffers (`tgx.lowering.buffers`): liveness, the workspace and the `MemoryPlan`.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import sympy

from ..backends import get_backend, host_name
from ..core import Graph, Literal, Var, free_inputs
from ..devices import HOST, device_name
from ..plan import Instructions, Plan
from ..planning.assignment import Assignment
from ..planning.options import PlanOptions
from ..runtime.compiled import CompiledGraph, Instruction
from ..shapes import concretize, eval_dim, free_symbols
from ..tracing import leaf_names
from .buffers import plan_buffers
from .rebackend import BackendGraph, copy_kernel, insert_copies
from .schedule import schedule
from .state import inplace_fn


def lower_assignment(assignment: Assignment, options: PlanOptions, *, source_graph=None,
                     stages: Sequence = ()) -> Plan:
    """The `Plan` running `assignment` with `options` (state, weights, device, budget,
    whether results stay in their backends' formats). `stages`: the (name, program) pairs of
    the stages before this one; the lowering's own are appended."""
    stages = list(stages)
    bg = insert_copies(assignment, outputs=options.outputs, device=options.device)
    stages.append(("rebackend", bg))
    bg, sp = schedule(bg, options.state)
    stages.append(("schedule", bg))
    cg = _lower_scheduled(bg, sp, in_names=options.in_names, device=options.device,
                          weights=options.weights, state=options.state)
    stages.append(("lower", Instructions(cg.instructions, cg.workspace)))
    stages.append(("buffers", cg.memory))
    return Plan(assignment, bg, cg, options, source_graph, stages)


def lower(graph: Graph, kernels: Sequence | None = None, *,
          in_names: Sequence[str] | None = None, fuse_regions: bool = True,
          use_workspace: bool = True, device: str = "cpu", weights: Sequence[int] = (),
          state: Sequence[tuple[int, int]] = ()) -> CompiledGraph:
    """Lower `graph` (a `BackendGraph`, or a plain graph on the host backend) with
    `kernels[i]` running equation i (default: the graph's own `.kernels`). `weights`:
    indices of the graph inputs that are weights (bound once, see
    `CompiledGraph.bind_weights`). `state`: (input index, output index) pairs of state
    buffers (the output is written into the caller's input array; see `tgx.compile`).

    `device`: where the device backends' equations run (the `copy_to`s of `graph` say so
    too, see `rebackend`); literals and constants are converted there. On a GPU device their
    values are library-owned, never in the CPU workspace. This function does not check that
    the device exists (`tgx.compile` / `plan_graph` do)."""
    device = device_name(device)
    if not isinstance(graph, BackendGraph):
        graph = BackendGraph(graph.constvars, graph.consts, graph.invars, graph.outvars,
                             graph.eqns, graph.in_tree, graph.out_tree,
                             backends=[host_name()] * len(graph.eqns))
    kernels = list(kernels) if kernels is not None else list(graph.kernels)
    kernels = [copy_kernel(e, b) if k is None and _is_transfer(e) else k
               for e, b, k in zip(graph.eqns, graph.backends, kernels)]
    bg = BackendGraph(graph.constvars, graph.consts, graph.invars, graph.outvars, graph.eqns,
                      graph.in_tree, graph.out_tree, backends=graph.backends, kernels=kernels,
                      origins=graph.origins)
    bg, sp = schedule(bg, state)
    return _lower_scheduled(bg, sp, in_names=in_names, fuse_regions=fuse_regions,
                            use_workspace=use_workspace, device=device, weights=weights,
                            state=state)


# -- instructions -------------------------------------------------------------------------------

def _params(eqn, dims):
    return {k: concretize(v, dims) for k, v in eqn.params.items()}


def _single(eqn, kernel, backend: str, device: str):
    b = get_backend(backend)

    def build(dims, out):
        params = _params(eqn, dims)
        if kernel.writes_out and out is None:  # not in the workspace: a fresh array per call
            return _fresh_out(kernel, params, eqn.outvars[0].aval, dims, b)
        fn = kernel.bind(params, out if kernel.writes_out else None)
        if not kernel.dtype_exact and not eqn.primitive.multiple_results:
            fn = _cast(fn, eqn.outvars[0].aval.dtype)
        if not eqn.invars and b.value_device(device) != HOST:
            # no input to take the device from (iota, dim_as_value): built on the host
            fn = _moved(fn, b, b.value_device(device))
        if eqn.primitive.multiple_results and len(eqn.outvars) == 1 and kernel.pattern is None:
            fn = _only(fn)  # a one-output region run by NumPy's interpreter returns [y]
        return fn
    return build


def _only(fn):
    def run(*xs):
        r = fn(*xs)
        return r[0] if isinstance(r, (list, tuple)) else r
    return run


def _moved(fn, backend, device):
    """`fn` with its (single) result converted to `backend` on `device`."""
    def run(*xs):
        return backend.convert(fn(*xs), device)
    return run


def _cast(fn, dtype):
    def run(*xs):
        r = fn(*xs)
        return r if r.dtype == dtype else r.astype(dtype)
    return run


def _fresh_out(kernel, params, aval, dims, backend):
    shape = tuple(eval_dim(d, dims) for d in aval.shape)
    fn, dtype = kernel.fn, aval.dtype
    if kernel.pattern is not None:   # as `Kernel.bind`: its wildcard params, not its body
        params = kernel.pattern_params(params)

    def run(*xs):
        return fn(*xs, out=backend.empty(shape, dtype, xs[0] if xs else None), **params)
    return run


def _region(backend: str, eqns, kernels, in_vars, out_vars):
    def build(dims, out):
        # a pattern kernel takes the matched inputs only (`Kernel.bind`)
        steps = [(k.fn, k.pattern_params(e.params) if k.pattern is not None
                  else _params(e, dims), e)
                 for e, k in zip(eqns, kernels)]
        return get_backend(backend).region(steps, [v.id for v in in_vars],
                                           [v.id for v in out_vars])
    return build


def _is_transfer(eqn) -> bool:
    return eqn.primitive.name == "copy_to"


def _inplace_instruction(e, b, slot_of, lit_slot, index):
    """A state update writing its window into its operand (a state buffer)."""
    fn = inplace_fn(e.primitive.name, b)
    ins = tuple(lit_slot(a, b) if isinstance(a, Literal) else slot_of(a) for a in e.invars)
    return Instruction(f"{e.primitive.name}[inplace]@{b}", b, lambda dims, out: fn, ins,
                       (slot_of(e.outvars[0]),), (e.outvars[0].aval,), (index,),
                       returns_view=True, view_of=(0,), pure=False)


def _into_state_instruction(e, kernel, b, buffers, slot_of, lit_slot, index):
    """An elementwise op writing its result into a state buffer, or the loops of an
    elementwise region writing some of theirs into state buffers (`buffers`: {output
    position: S's buffer variable}; the buffers are its first inputs): `fn(*bufs, *operands)`
    calls the kernel with `out=buf` (`outs={position: buf}`)."""
    pos = tuple(buffers)
    ins = tuple(slot_of(buffers[n]) for n in pos) + tuple(
        lit_slot(a, b) if isinstance(a, Literal) else slot_of(a) for a in e.invars)
    n_buf = len(pos)

    def build(dims, out):
        fn = kernel.bind(_params(e, dims), None)
        if kernel.outs_into:
            return lambda *a: fn(*a[n_buf:], outs=dict(zip(pos, a[:n_buf])))
        return lambda buf, *xs: fn(*xs, out=buf)

    return Instruction(f"{kernel!r}[into state]", b, build, ins,
                       tuple(slot_of(v) for v in e.outvars), tuple(v.aval for v in e.outvars),
                       (index,), returns_view=True, view_of=tuple(range(n_buf)), pure=False,
                       multi_out=len(e.outvars) > 1)


def _lower_scheduled(graph: BackendGraph, sp, *, in_names=None, fuse_regions: bool = True,
                     use_workspace: bool = True, device: str = "cpu",
                     weights: Sequence[int] = (), state: Sequence[tuple[int, int]] = ()
                     ) -> CompiledGraph:
    """`graph` already in run order (`schedule`), with its `StatePlan` `sp`."""
    eqns, backends, kernels = graph.eqns, graph.backends, graph.kernels
    objs = {b: get_backend(b) for b in set(backends) | {host_name()}}
    host = host_name()
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
            b = objs[backend]
            consts[s] = b.convert(np.asarray(a.val, a.aval.dtype), b.value_device(device))
            const_dev[s] = b.value_device(device)
        return s

    # where each value lives: inputs and constants on the host, a copy_to's result where it
    # says, any other result where its backend runs
    dev_of: dict[int, str] = {v.id: HOST for v in (*graph.constvars, *graph.invars)}
    for e, b in zip(eqns, backends):
        d = e.params.get("device", HOST) if _is_transfer(e) else objs[b].value_device(device)
        for v in e.outvars:
            dev_of[v.id] = d

    for v, c in zip(graph.constvars, graph.consts):
        consts[slot_of(v)] = np.asarray(c)
    in_slots = [slot_of(v) for v in graph.invars]
    weight_of = {graph.invars[i].id: i for i in weights}
    # (arg index, slot, backend, device[, Prepare]): a copy of a weight to a backend, or its
    # held form for a kernel that prepares it
    weight_copies: list[tuple] = []

    def fold(e) -> bool:
        """Fold a copy_to of a constant (converted now) or of a weight (at binding time)."""
        if not _is_transfer(e) or not isinstance(e.invars[0], Var):
            return False
        src = e.invars[0].id
        dev = e.params.get("device", HOST)
        if src in const_value:
            consts[slot_of(e.outvars[0])] = objs[e.params["backend"]].convert(
                const_value[src], dev)
            const_dev[slot_of(e.outvars[0])] = dev
            return True
        if src in weight_of:
            weight_copies.append((weight_of[src], slot_of(e.outvars[0]), e.params["backend"],
                                  dev))
            return True
        return False

    # A region that takes host arrays (`Backend.region_takes_host`) reads a host value it
    # would get through a copy_to as the host value itself; the copy goes when nothing else
    # reads it. Not for weights (bound once) or constants (converted once), and not for a
    # value sharing memory with a state buffer updated in place: an update could land between
    # the copy and the region.
    home = {v.id: host for v in (*graph.invars, *graph.constvars)}
    for e, b in zip(eqns, backends):
        for v in e.outvars:
            home[v.id] = b
    no_pass = set(weight_of) | set(const_value) | sp.shared
    through: dict[int, Var] = {}
    for e, b in zip(eqns, backends):
        if (_is_transfer(e) and isinstance(e.invars[0], Var) and fuse_regions
                and objs[b].fuses_regions
                and objs[b].region_takes_host(e.params.get("device", HOST))
                and home[e.invars[0].id] == host and e.invars[0].id not in no_pass):
            through[e.outvars[0].id] = e.invars[0]
    passed: list[Instruction] = []   # copies a region may no longer need

    prepared: dict[tuple, int] = {}  # (weight var id, Prepare) -> slot of its held form

    def prepared_slot(a, p) -> int | None:
        """The slot of bound weight `a` held as `p` prepares it (converted once per bound
        array, like the weight's copies), or None when `a` is not a bound weight."""
        if not isinstance(a, Var) or a.id not in weight_of:
            return None
        key = (a.id, p)
        if key not in prepared:
            prepared[key] = 2_000_000_000 + len(prepared)  # renumbered below
            weight_copies.append((weight_of[a.id], prepared[key], host, HOST, p))
        return prepared[key]

    def single(i: int) -> Instruction:
        e, b, k = eqns[i], backends[i], kernels[i]
        ins = tuple(lit_slot(a, b) if isinstance(a, Literal) else slot_of(a) for a in e.invars)
        build = _single(e, k, b, device)
        if k is not None and k.prepare:
            ins, build = _with_prepared(e, k, ins, build, prepared_slot)
        view = k.returns_view
        if _is_transfer(e):  # may share memory with its input when both are on one device
            x = e.invars[0]
            src = dev_of.get(x.id, HOST) if isinstance(x, Var) else HOST
            view = src == e.params.get("device", HOST)
        return Instruction(repr(k), b, build, ins,
                           tuple(slot_of(v) for v in e.outvars),
                           tuple(v.aval for v in e.outvars), (i,),
                           k.writes_out and len(e.outvars) == 1, view, k.inplace_ok)

    def in_region(j: int) -> bool:
        return fuse_regions and objs[backends[j]].fuses_regions and not _is_transfer(eqns[j])

    at_bind = _bind_time(graph, weights, sp)
    # equations of the weights alone run once per weight binding (`CompiledGraph.bind_weights`):
    # they read nothing a call computes, so they leave the schedule, and a region around
    # them stays one region
    bind_instrs: list[Instruction] = []

    def hoisted(j: int) -> bool:
        if j not in at_bind:
            return False
        bind_instrs.append(single(j))
        return True

    instrs: list[Instruction] = []
    i = 0
    while i < len(eqns):
        if hoisted(i):
            i += 1
            continue
        if i in sp.buffers:
            instrs.append(_into_state_instruction(eqns[i], kernels[i], backends[i],
                                                  sp.buffers[i], slot_of, lit_slot, i))
            i += 1
            continue
        if i in sp.inplace:
            instrs.append(_inplace_instruction(eqns[i], backends[i], slot_of, lit_slot, i))
            i += 1
            continue
        if in_region(i):
            # a region runs over this backend's equations from i on; folded copies do not
            # break it
            j, members = i, []
            while j < len(eqns):
                if j in at_bind:
                    hoisted(j)
                elif in_region(j) and backends[j] == backends[i]:
                    members.append(j)
                elif not fold(eqns[j]):
                    break
                j += 1
            instrs.append(_region_instruction(graph, eqns, kernels, backends[i], members,
                                              slot_of, through)
                          if len(members) > 1 else single(i))
            i = j
            continue
        if not fold(eqns[i]):
            instrs.append(single(i))
            if eqns[i].outvars[0].id in through:
                passed.append(instrs[-1])
        i += 1

    out_slots = [lit_slot(v, host) if isinstance(v, Literal) else slot_of(v)
                 for v in graph.outvars]
    read = {s for ins in instrs for s in ins.ins} | set(out_slots)
    unread = {id(ins) for ins in passed if ins.outs[0] not in read}
    instrs = [ins for ins in instrs if id(ins) not in unread]
    # literal and prepared-weight slots were numbered out of range; move them after the values
    remap = {s: len(slot) + n for n, s in enumerate(sorted((*lit_slots.values(),
                                                           *prepared.values())))}
    consts = {remap.get(s, s): c for s, c in consts.items()}
    const_dev = {remap.get(s, s): d for s, d in const_dev.items()}
    slot_dev = {slot[i]: d for i, d in dev_of.items() if i in slot}
    slot_dev.update(const_dev)
    for ins in (*bind_instrs, *instrs):
        ins.ins = tuple(remap.get(s, s) for s in ins.ins)
    out_slots = [remap.get(s, s) for s in out_slots]
    n_slots = len(slot) + len(lit_slots) + len(prepared)
    weight_copies = [(a, remap.get(s, s), b, dev, *rest) for a, s, b, dev, *rest in weight_copies]

    symbols = sorted(set().union(*[free_symbols(v.aval.shape) for v in graph.invars]),
                     key=lambda s: s.name)
    # the caller's weight and state arrays are host arrays; copies live where they go
    persistent = [(f"w{a}", _nbytes(graph.invars[a].aval), HOST) for a in sorted(weights)]
    persistent += [(f"w{a}@{b}", _nbytes(graph.invars[a].aval), dev)
                   for a, _, b, dev, *prep in weight_copies
                   if not prep and not objs[b].zero_copy_from_host(dev)]
    persistent += [(f"w{a}:{prep[0].label}",
                    _scaled(_nbytes(graph.invars[a].aval), prep[0].nbytes_ratio), dev)
                   for a, _, b, dev, *prep in weight_copies if prep]
    # values of the weights alone that calls read, held from one binding to the next
    call_reads = {s for ins in instrs for s in ins.ins}
    persistent += [(f"b{s}", _nbytes(a), slot_dev.get(s, HOST)) for ins in bind_instrs
                   for s, a in zip(ins.outs, ins.out_avals) if s in call_reads]
    state_bufs = [(f"s{a}", _nbytes(graph.invars[a].aval), HOST) for a, _ in state]
    workspace, memory, dead = plan_buffers(graph, instrs, in_slots, out_slots, consts, slot,
                                           use_workspace, HOST, persistent, state_bufs,
                                           slot_dev)
    names = list(in_names) if in_names else leaf_names(graph.in_tree, len(graph.invars))
    cg = CompiledGraph(n_slots=n_slots, in_slots=in_slots, in_avals=graph.in_avals,
                         in_names=names, out_slots=out_slots, consts=consts,
                         instructions=instrs, dead=dead, workspace=workspace, memory=memory,
                         symbols=symbols, weight_args=sorted(weights),
                         weight_copies=weight_copies, bind_instructions=bind_instrs,
                         state=[(a, o, c) for (a, o), c in zip(state, sp.copy)],
                         state_reasons=sp.reasons, state_alias_outs=sp.alias_outs,
                         graph=graph)
    if any(k is not None and k.own_pool for k in kernels):
        cg.blas_threads = 1  # the thread budget (tgx.backends.threads)
    return cg


def _bind_time(graph, weights: Sequence[int], sp) -> set[int]:
    """The equations computing from bound weights (and constants) alone: every input a weight,
    a constant, a literal or such an equation's result, at least one of them of a weight;
    every shape concrete; no result returned or written into state. `1 + w` of a norm's
    weight, `w.T`, a dequantization `w_int8 * scale`: computed once per binding, as
    `torch.jit.freeze` folds a frozen module's parameters."""
    bound = {graph.invars[i].id for i in weights}
    if not bound:
        return set()
    known = set(bound)
    consts = {v.id for v in graph.constvars}
    returned = {v.id for v in graph.outvars if isinstance(v, Var)}
    found = set()
    for i, e in enumerate(graph.eqns):
        ins = [a for a in e.invars if isinstance(a, Var)]
        if _is_transfer(e) and ins and ins[0].id in consts:
            consts.update(v.id for v in e.outvars)  # converted once (`fold`)
            continue
        if (i in sp.buffers or i in sp.inplace or not ins
                or not all(a.id in known or a.id in consts for a in ins)
                or not any(a.id in known for a in ins)
                or any(v.id in returned for v in e.outvars)
                or any(free_symbols(a.aval.shape) for a in (*ins, *e.outvars))):
            continue
        known.update(v.id for v in e.outvars)
        if not (_is_transfer(e) and ins[0].id in bound):
            found.add(i)  # (a weight's own copy is converted at binding: `weight_copies`)
    return found


def _with_prepared(e, kernel, ins, build, prepared_slot):
    """The inputs and builder of an instruction whose kernel prepares operands
    (`Kernel.prepare`): a bound weight is read in its held form (converted once, at binding);
    any other operand is converted on every call."""
    ins = list(ins)
    per_call = []
    for p in kernel.prepare:
        s = prepared_slot(e.invars[p.operand], p)
        if s is None:
            per_call.append(p)
        else:
            ins[p.operand] = s
    if not per_call:
        return tuple(ins), build

    def build_per_call(dims, out):
        fn = build(dims, out)

        def run(*xs):
            xs = list(xs)
            for p in per_call:
                xs[p.operand] = p.fn(xs[p.operand])
            return fn(*xs)
        return run
    return tuple(ins), build_per_call


def _region_instruction(graph, eqns, kernels, backend, members, slot_of, through):
    """One compiled call of `backend` over the equations `members` of the schedule; an input
    in `through` (a copy's result -> the host value copied) is read as the host value."""
    region = [eqns[m] for m in members]
    in_vars = free_inputs(region)
    end = members[-1] + 1
    later = {a.id for e in eqns[end:] for a in e.invars if isinstance(a, Var)}
    later |= {v.id for v in graph.outvars if isinstance(v, Var)}
    out_vars = [v for e in region for v in e.outvars if v.id in later]
    label = f"{backend}.jit[{len(region)} eqns: " + " ".join(
        e.primitive.name for e in region[:6]) + (" …]" if len(region) > 6 else "]")
    return Instruction(label, backend,
                       _region(backend, region, [kernels[m] for m in members], in_vars,
                               out_vars),
                       tuple(slot_of(through.get(v.id, v)) for v in in_vars),
                       tuple(slot_of(v) for v in out_vars),
                       tuple(v.aval for v in out_vars), tuple(members), multi_out=True)


def _scaled(nbytes, ratio: float):
    return int(nbytes * ratio) if type(nbytes) is int else nbytes * sympy.Rational(ratio)


def _nbytes(aval):
    n = aval.nbytes
    return n if type(n) is int else sympy.expand(n)
