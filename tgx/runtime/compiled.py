"""Devices, workspaces and `CompiledGraph`: the flat instruction list and its run loop.

A `Device` is a memory space (`cpu`, `cuda:0`) that several backends share: NumPy and torch
CPU kernels both write into the one CPU workspace. On a CUDA device (`tgx.compile(device=)`)
the torch / jax values are owned by their library (torch's caching allocator, XLA) and only
host (NumPy) values use the CPU workspace. A `CompiledGraph` holds instructions
`(kernel, input slots, output slots)` over a flat list of slots; `run` binds the symbolic dims
from the argument shapes, fetches the *specialization* for that binding (kernels with their
params and workspace views baked in, built once per binding and cached) and calls its
generated function (`tgx.runtime.codegen`): straight-line Python, one call per instruction,
no dict look-ups, no loop, no re-planning. `source()` prints it.

>>> import numpy as np, tgx, tgx.numpy as tnp
>>> plan = tgx.compile(lambda x: tnp.exp(x) + 1.0, backends=["numpy"]).lower(tgx.Spec(("N",)))
>>> cg = plan.compiled
>>> cg.run_flat([np.zeros(3, np.float32)])[0]
array([2., 2., 2.], dtype=float32)
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from ..backends import backend_of, get_backend, start_to_host, to_host
from ..core import pp_eqn, var_namer
from ..devices import aligned_copy, aligned_empty
from ..errors import BindingError, DTypeError, KernelError
from ..shapes import ShapedArray, check_dim_value, eval_dim, shape_str
from ..transforms.evaluate import bind_dims
from .codegen import FOLDED, RunFunction, generate
from ..backends.threads import hold_one_blas_thread, release_blas_threads

# Bindings kept specialized at once (each owns a workspace sized for its dims).
MAX_SPECIALIZATIONS = 16


#: results computed once per binding (`CompiledGraph._fold_constants`) held at most, per binding
FOLD_MAX_BYTES = 64 << 20


def allocate_workspace(nbytes: int) -> np.ndarray:
    """A `uint8` array of `nbytes` whose first byte is 64-byte aligned."""
    return aligned_empty((nbytes,), np.uint8)


def workspace_view(ws: np.ndarray, offset: int, shape: tuple, dtype: np.dtype,
                   backend: str):
    """A view of `shape`/`dtype` at byte `offset` of workspace `ws`, in `backend`'s format."""
    n = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    return get_backend(backend).workspace_view(ws[offset:offset + n].view(dtype).reshape(shape))


@dataclass
class Instruction:
    """One step of the schedule before specialization.

    `build(dims, out) -> fn(*inputs)` bakes the binding (and the workspace view `out`, for
    kernels that write into one) into a plain callable.
    """

    label: str
    backend: str
    build: Callable[[dict, Any], Callable]
    ins: tuple
    outs: tuple
    out_avals: tuple
    eqns: tuple = ()
    writes_out: bool = False
    returns_view: bool = False
    inplace_ok: bool = False
    #: with `returns_view`: the inputs the result may be a view of (None: any of them)
    view_of: tuple | None = None
    #: the callable returns a tuple of results, one per output slot (a region)
    multi_out: bool = False
    #: a function of its inputs alone (False: it writes a state buffer)
    pure: bool = True


@dataclass
class Specialization:
    """Everything `run` needs for one binding of the dims: `run(args, bound weights)` is the
    generated function over `instrs` (`(fn, input slots, out slot(s), slots to free)` each);
    `template` holds the constants by slot."""

    dims: dict
    template: list
    instrs: tuple
    shapes: tuple
    run: RunFunction
    workspace: dict = field(default_factory=dict)


class CompiledGraph:
    """The flat instruction list, its slots and its buffer plan; `run_flat` runs it."""

    def __init__(self, *, n_slots: int, in_slots: Sequence[int], in_avals: Sequence[ShapedArray],
                 in_names: Sequence[str], out_slots: Sequence[int], consts: dict,
                 instructions: Sequence[Instruction], dead: Sequence[tuple],
                 workspace: dict | None = None, memory=None, symbols: Sequence = (),
                 weight_args: Sequence[int] = (), weight_copies: Sequence[tuple] = (),
                 state: Sequence[tuple] = (), state_reasons: Sequence[str] = (),
                 state_alias_outs: Sequence[int] = (), bind_instructions: Sequence = (),
                 graph=None):
        self.n_slots = n_slots
        self.in_slots = tuple(in_slots)
        self.in_avals = tuple(in_avals)
        self.in_names = tuple(in_names)
        self.out_slots = tuple(out_slots)
        self.consts = consts  # slot -> value, or callable(dims) -> value
        self.instructions = list(instructions)
        #: the graph whose equations the instructions' `eqns` indices refer to (for errors)
        self.graph = graph
        self.dead = list(dead)
        self.workspace = workspace or {}  # slot -> buffer name in `memory`
        self.memory = memory
        self.symbols = tuple(symbols)
        self._specs: dict[tuple, Specialization] = {}
        self._sources = self._dim_sources()
        self.memory_budget = None
        #: argument indices that are weights, and (arg index, slot, backend, device) of each
        #: conversion they need; see `bind_weights`
        self.weight_args = tuple(weight_args)
        self.weight_copies = tuple(weight_copies)
        self._bound_src: tuple = ()       # the argument objects bound last (kept alive)
        #: the converted value per weight copy, in `weight_copies` order (the run's `bound`)
        self._bound: tuple = ()
        #: weight conversions done so far (each bound array once per backend)
        self.weight_conversions = 0
        #: instructions computing from the weights alone (`1 + w` of a norm), run by
        #: `bind_weights` once per binding; their results read by the call are held in
        #: `_bound` after the weight copies, as `_bind_outs`
        self.bind_instructions = list(bind_instructions)
        read = {s for ins in self.instructions for s in ins.ins}
        self._bind_outs = tuple(s for ins in self.bind_instructions for s in ins.outs
                                if s in read)
        #: times the bind instructions ran (once per new weight binding)
        self.bind_runs = 0
        #: whether a call binds weights (converts them, or computes from them)
        self._binds = bool(self.weight_copies or self.bind_instructions)
        #: state buffers: (arg index, output index, copy) per state leaf; `copy`: the result
        #: is copied into the caller's array at the end of the call (else it was updated in
        #: place); `state_reasons[k]` says why a leaf is copied
        self.state = tuple(state)
        self.state_reasons = tuple(state_reasons) or ("",) * len(self.state)
        #: whether values live off the host (a device plan): copies back are started at once
        self._off_host = graph is not None and any(
            e.primitive.name == "copy_to" and e.params.get("device", "cpu") != "cpu"
            for e in graph.eqns)
        #: state leaves copied back each call, started at once on a device (`_write_state`)
        self._copied_state = sum(copy for _, _, copy in self.state) if self._off_host else 0
        #: outputs that may share memory with a state buffer: copied before they are returned
        self.state_alias_outs = tuple(state_alias_outs)
        #: instructions that may read only constants, in order (`_fold_constants`)
        self._foldable = self._foldable_instructions()
        #: outputs that may be an argument or a constant or a view of one (`x`,
        #: `x.reshape(...)`, `x[1:]`): copied before they are returned, so a result never
        #: shares memory with the caller's arrays (state results are the caller's arrays on
        #: purpose)
        self.input_alias_outs = self._input_alias_outs()
        #: whether torch tensors are accepted as state (set by the Plan: return_backend_arrays)
        self.state_backend_arrays = False
        #: BLAS threads while a call runs (None: as they are); 1 when kernels with a pool of
        #: their own run (`tgx.backends.threads`; only 1 is supported)
        self.blas_threads = None
        #: per argument: the backend of immutable arrays (jax) that alone reads it, or None.
        #: Such an argument is passed to its readers in that backend's format: a jax array
        #: as it is (not through a NumPy view that jax.jit would import again, ~3-5 us an
        #: argument), a NumPy array passed again as a jax array sharing its memory
        #: (`Backend.host_alias`, made once per array object)
        self._reader_map: dict | None = None
        #: the arguments with a symbolic dim (the others have one shape for every binding)
        self._symbolic_args = tuple(i for i, a in enumerate(self.in_avals)
                                    if any(type(d) is not int for d in a.shape))
        self._through = self._through_backends()
        self._through_idx = tuple((i, b) for i, b in enumerate(self._through) if b is not None)
        n = len(self.in_slots)
        self._seen = [0] * n                # id of the NumPy array passed last, per argument
        self._alias_src: list = [None] * n  # the array an alias was made of (kept alive)
        self._alias: list = [None] * n      # its alias (None: it has none; passed as it is)
        #: immutable state arguments XLA may take over (donation): arg index -> (the region
        #: instruction that alone reads it, its position among the region's arguments)
        self._donatable = self._donatable_args()
        self._donate_k = tuple((k, a) for k, (a, _, _) in enumerate(self.state)
                               if a in self._donatable)
        #: state leaves updated in place (not copied): an immutable one gets a private copy
        self._private_k = tuple(k for k, (_, _, copy) in enumerate(self.state) if not copy)
        self._variants: dict[tuple, Specialization] = {}  # (key, mode) -> Specialization
        self._host_copies: dict[str, frozenset] = {}      # backend -> copies left out

    # -- arguments in a backend's own format -------------------------------------------------
    def _readers(self, slot: int) -> list[int]:
        """The instructions reading `slot`."""
        if self._reader_map is None:
            self._reader_map = {}
            for t, ins in enumerate(self.instructions):
                for s in set(ins.ins):
                    self._reader_map.setdefault(s, []).append(t)
        return self._reader_map.get(slot, [])

    def _through_backends(self) -> tuple:
        out = []
        outs = set(self.out_slots)
        for s in self.in_slots:
            readers = self._readers(s)
            names = {self.instructions[t].backend for t in readers}
            b = get_backend(names.pop()) if len(names) == 1 and s not in outs else None
            out.append(b if b is not None and not b.host and not b.inplace else None)
        return tuple(out)

    def _const_backend(self, slot: int):
        """The immutable-array backend (jax) that alone reads constant `slot`, or None."""
        names = {self.instructions[t].backend for t in self._readers(slot)}
        if len(names) != 1 or slot in self.out_slots:
            return None
        b = get_backend(names.pop())
        return None if b.host or b.inplace else b

    def _donatable_args(self) -> dict:
        out = {}
        for a, _, copy in self.state:
            s = self.in_slots[a]
            readers = self._readers(s)
            if copy and self._through[a] is not None and len(readers) == 1:
                ins = self.instructions[readers[0]]
                if ins.multi_out and ins.ins.count(s) == 1:
                    out[a] = (readers[0], ins.ins.index(s))
        return out

    def _pass_through(self, args: list) -> None:
        """NumPy arguments read only by an immutable-array backend (jax), passed as the
        same array object as the last call: an alias sharing their memory, made once."""
        for i, b in self._through_idx:
            a = args[i]
            if type(a) is not np.ndarray:
                continue
            if self._alias_src[i] is a:
                alias = self._alias[i]
            elif self._seen[i] == id(a):  # passed twice: worth an alias (~30 us to make)
                alias = b.host_alias(a)
                self._alias_src[i], self._alias[i] = a, alias
            else:
                self._seen[i] = id(a)
                continue
            if alias is not None:
                args[i] = alias

    # -- weights ----------------------------------------------------------------------------
    def _foldable_instructions(self) -> tuple:
        """The instructions whose inputs are all constants or results of such instructions
        (an iota of a symbolic dim, the RoPE tables and masks made from it), none of whose
        results is returned: `specialize` runs them once per binding."""
        const = set(self.consts)
        outs = set(self.out_slots)
        found = []
        for t, ins in enumerate(self.instructions):
            if ins.pure and all(s in const for s in ins.ins) and not outs.intersection(ins.outs):
                found.append(t)
                const.update(ins.outs)
        return tuple(found)

    def _fold_constants(self, instrs: list, template: list, dims: dict) -> None:
        """Run the foldable instructions on the binding's constants, once: their results
        join `template` as constants and the instruction becomes `FOLDED` (left out of the
        run). One that raises is left to run (and fail, with its context) in the call; a
        binding whose folded results would pass `FOLD_MAX_BYTES` keeps the rest."""
        total = 0
        for t in self._foldable:
            ins = self.instructions[t]
            if any(template[s] is None for s in ins.ins):
                continue
            try:
                res = ins.build(dims, None)(*[template[s] for s in ins.ins])
            except Exception:  # noqa: BLE001 - the call reports it
                continue
            vals = tuple(res) if ins.multi_out or len(ins.outs) > 1 else (res,)
            nbytes = sum(int(getattr(v, "nbytes", 0)) for v in vals)
            if total + nbytes > FOLD_MAX_BYTES:
                continue
            total += nbytes
            for slot, v in zip(ins.outs, vals):
                template[slot] = self._held_const(slot, v)
            _, i, o, dead = instrs[t]
            instrs[t] = (FOLDED, i, o, dead)

    def _held_const(self, slot: int, value):
        """A binding's constant as the run holds it: one that jax alone reads converted once
        here, not imported by every jax.jit call."""
        b = self._const_backend(slot)
        return b.convert(value) if b is not None and type(value) is np.ndarray else value

    def _input_alias_outs(self) -> tuple:
        # constants too: a result sharing a closed-over array (or the plan's own constant, or
        # a result computed once per binding) would let the caller's writes reach it
        views = set(self.in_slots) | set(self.consts) | set(self._bind_outs)
        views.update(s for t in self._foldable for s in self.instructions[t].outs)
        for ins in self.instructions:
            if ins.returns_view:
                src = ins.ins if ins.view_of is None else [ins.ins[k] for k in ins.view_of]
                if any(s in views for s in src):
                    views.update(ins.outs)
        state_outs = {o for _, o, _ in self.state}
        return tuple(j for j, s in enumerate(self.out_slots)
                     if s in views and j not in state_outs and j not in self.state_alias_outs)

    def bind_weights(self, args: Sequence[Any]) -> None:
        """Convert the weight arguments to every backend the plan needs them on, once.

        Keyed by the identity of the argument objects: the same array objects as the last
        call reuse the converted copies; a new array object is converted again. In-place
        mutation of a bound array is not detected (NumPy arrays carry no version counter
        that could be checked cheaply): treat weights as immutable and pass new arrays.
        """
        src = tuple(args[i] for i in self.weight_args)
        old = dict(zip(self.weight_args, self._bound_src))
        reuse = len(self._bound) == len(self.weight_copies) + len(self._bind_outs)
        bound = []
        for j, (a, _, backend, device, *prep) in enumerate(self.weight_copies):
            x = args[a]
            if reuse and a in old and old[a] is x:
                bound.append(self._bound[j])
                continue
            if type(x) is not np.ndarray:
                x = _coerce(x, self.in_avals[a])
            x = get_backend(backend).convert(x, device)
            bound.append(prep[0].fn(x) if prep else x)  # a kernel's held form (Kernel.prepare)
            self.weight_conversions += 1
        if self.bind_instructions:
            bound += self._run_bind_instructions(args, bound)
        self._bound_src, self._bound = src, tuple(bound)

    def _run_bind_instructions(self, args: Sequence[Any], copies: list) -> list:
        """The values of the bind instructions the call reads, computed from the weights
        (`args`), their copies and the constants. A kernel failing raises the `KernelError`
        a call would."""
        env = {s: (c({}) if callable(c) else c) for s, c in self.consts.items()}
        for a in self.weight_args:
            x = args[a]
            env[self.in_slots[a]] = x if type(x) is np.ndarray else _coerce(x, self.in_avals[a])
        env.update(zip((c[1] for c in self.weight_copies), copies))
        for t, ins in enumerate(self.bind_instructions):
            inputs = [env[s] for s in ins.ins]
            try:
                res = ins.build({}, None)(*inputs)
            except Exception as e:
                raise self._instruction_error(
                    ins, f"bind instruction {t} of {len(self.bind_instructions)}",
                    inputs, e) from e
            vals = res if ins.multi_out or len(ins.outs) > 1 else (res,)
            env.update(zip(ins.outs, vals))
        self.bind_runs += 1
        return [env[s] for s in self._bind_outs]

    def _bind_new_weights(self, args: Sequence[Any]) -> None:
        """`bind_weights` when the weight arguments are not the objects bound last."""
        bs = self._bound_src
        if len(bs) != len(self.weight_args) or any(
                args[i] is not b for i, b in zip(self.weight_args, bs)):
            self.bind_weights(args)

    # -- binding ----------------------------------------------------------------------------
    def _dim_sources(self):
        """(arg index, axis) where each symbol appears as a plain dim, or None if some do not."""
        out = []
        for s in self.symbols:
            src = next(((i, ax) for i, a in enumerate(self.in_avals)
                        for ax, d in enumerate(a.shape) if d == s and type(d) is not int), None)
            if src is None:
                return None
            out.append(src)
        return tuple(out)

    def _key(self, args) -> tuple:
        if self._sources is None:
            env = bind_dims(self.in_avals, args, self.in_names)
            return tuple(env[s] for s in self.symbols)
        try:
            return tuple(args[i].shape[ax] for i, ax in self._sources)
        except IndexError:
            for (i, ax) in self._sources:
                if args[i].ndim <= ax:
                    raise BindingError(self._mismatch(i, args[i])) from None
            raise

    def _mismatch(self, i: int, a, shape=None) -> str:
        exp = self.in_avals[i]
        want = shape_str(shape) if shape is not None else shape_str(exp.shape)
        return (f"argument {self.in_names[i]}: expected {exp.dtype} {want}"
                + (f" ({shape_str(exp.shape)})" if shape is not None and self.symbols else "")
                + f", got {np.asarray(a).dtype} {tuple(np.shape(a))}")

    def specialize(self, key: tuple) -> Specialization:
        """The instruction list for one binding (built once, then cached)."""
        spec = self._specs.get(key)
        if spec is not None:
            return spec
        dims = dict(zip(self.symbols, key))
        if self._sources is not None:  # _key read the sizes without bind_dims' checks
            for s, v, (i, ax) in zip(self.symbols, key, self._sources):
                check_dim_value(s, v, f"argument {self.in_names[i]}: axis {ax}")
        names = {s.name: v for s, v in dims.items()}
        views: dict[int, Any] = {}
        workspace = {}
        if self.memory is not None:
            if self.memory_budget is not None:
                self.memory.check_budget(self.memory_budget, **names)
            if self.workspace:
                res = self.memory.resolve(**names)
                offsets = dict(zip((r.name for r in self.memory.requests), res.offsets))
                for dev, nbytes in res.workspace.items():
                    if dev == "cpu":
                        workspace[dev] = allocate_workspace(nbytes)
                # values at one offset with one shape and dtype (an in-place update and
                # its input) get one view object: NumPy runs `np.add(x, y, out=x)` in
                # place directly, but checks a distinct view of the same memory for
                # overlap (~0.5 us more per call on tiny arrays)
                same: dict[tuple, Any] = {}
                for ins in self.instructions:
                    for slot, aval in zip(ins.outs, ins.out_avals):
                        if slot in self.workspace:
                            shape = tuple(eval_dim(d, dims) for d in aval.shape)
                            k = (offsets[self.workspace[slot]], shape, aval.dtype, ins.backend)
                            if k not in same:
                                same[k] = workspace_view(workspace["cpu"], k[0], shape,
                                                         aval.dtype, ins.backend)
                            views[slot] = same[k]
        template: list[Any] = [None] * self.n_slots
        for slot, c in self.consts.items():
            template[slot] = self._held_const(slot, c(dims) if callable(c) else c)
        instrs = []
        to_host = self._copies_to_host()
        starts = self._starts_to_host(to_host)
        for t, (ins, dead) in enumerate(zip(self.instructions, self.dead)):
            out = views.get(ins.outs[0]) if ins.writes_out else None
            fn = to_host[t] if t in to_host else ins.build(dims, out)
            if t in starts:
                fn = _then_start_to_host(fn, starts[t])
            outs = ins.outs[0] if len(ins.outs) == 1 and not ins.multi_out else ins.outs
            instrs.append((fn, ins.ins, outs, dead))
        if self._foldable:
            self._fold_constants(instrs, template, dims)
        shapes = tuple((tuple(eval_dim(d, dims) for d in a.shape), a.dtype)
                       for a in self.in_avals)
        spec = Specialization(dims, template, tuple(instrs), shapes,
                              self._generate(instrs, template), workspace)
        if len(self._specs) >= MAX_SPECIALIZATIONS:  # each holds a workspace: drop the oldest
            dropped = next(iter(self._specs))
            del self._specs[dropped]
            for k in [k for k in self._variants if k[0] == dropped]:
                del self._variants[k]
        self._specs[key] = spec
        return spec

    def _generate(self, instrs: list, template: list) -> RunFunction:
        return generate(instrs, in_slots=self.in_slots, out_slots=self.out_slots,
                        bound_slots=[*(c[1] for c in self.weight_copies), *self._bind_outs],
                        consts={s: v for s, v in enumerate(template) if v is not None},
                        labels=[ins.label for ins in self.instructions])

    def _variant(self, key: tuple, spec: Specialization, mode: tuple) -> Specialization:
        """`spec` run another way: `mode` is (the backend whose results stay in its format,
        the immutable state arguments donated). Built once per binding and mode."""
        v = self._variants.get((key, mode))
        if v is not None:
            return v
        out_backend, donated = mode
        drops = self._copies_back(out_backend) if out_backend else frozenset()
        pairs: dict[int, list] = {}
        for a in donated:
            t, p = self._donatable[a]
            q = self._donation_result(t, a)
            if q is not None:
                pairs.setdefault(t, []).append((p, q))
        # the copies back still made in this mode are the ones started together
        starts = self._starts_to_host(self._copies_to_host(), drops) if self._off_host else {}
        instrs = []
        for t, (fn, ins, outs, dead) in enumerate(spec.instrs):
            fn = getattr(fn, "_starts_inner", fn)
            if t in drops:
                fn = None
            elif t in pairs and getattr(fn, "donating", None) is not None:
                fn = fn.donating(tuple(pairs[t]))
            if t in starts:
                fn = _then_start_to_host(fn, starts[t])
            instrs.append((fn, ins, outs, dead))
        v = replace(spec, instrs=tuple(instrs), run=self._generate(instrs, spec.template))
        self._variants[(key, mode)] = v
        return v

    def _donation_result(self, t: int, a: int) -> int | None:
        """The position among region `t`'s results of state argument `a`'s new value (what
        XLA should write into `a`'s donated buffer), following the copies that bring it back
        to the host; None where another instruction computes it."""
        o = next(o for arg, o, _ in self.state if arg == a)
        slot = self.out_slots[o]
        while slot in self._maker:
            k, i = self._maker[slot]
            if k == t:
                return i
            ins = self.instructions[k]
            if not self._is_copy(ins):
                return None
            slot = ins.ins[0]   # a copy back to the host (dropped in a donating variant)
        return None

    @functools.cached_property
    def _maker(self) -> dict[int, tuple[int, int]]:
        """slot -> (the instruction computing it, its position among that one's results)."""
        return {s: (t, i) for t, ins in enumerate(self.instructions)
                for i, s in enumerate(ins.outs)}

    def _made_on(self, slot: int) -> str | None:
        """The backend of the instruction computing `slot` (None: an argument or constant)."""
        hit = self._maker.get(slot)
        return None if hit is None else self.instructions[hit[0]].backend

    def _is_copy(self, ins: Instruction) -> bool:
        """Whether `ins` is one `copy_to` between backends."""
        return (self.graph is not None and len(ins.eqns) == 1 and len(ins.ins) == 1
                and len(ins.outs) == 1 and ins.eqns[0] < len(self.graph.eqns)
                and self.graph.eqns[ins.eqns[0]].primitive.name == "copy_to")

    def _copies_to_host(self) -> dict:
        """instruction -> the `to_host` of the immutable-array backend (jax) whose result it
        copies to NumPy, for the plain copies to the host: what `copy_to@numpy` does, called
        directly (it went through the NumPy backend's `convert` and `tgx.backends.to_host`
        first: ~1 us a leaf, 14 leaves for an MLP's Adam step)."""
        if self.graph is None:
            return {}
        out = {}
        for t, ins in enumerate(self.instructions):
            made_on = self._made_on(ins.ins[0]) if self._is_copy(ins) else None
            if made_on is not None and get_backend(ins.backend).host:
                src = get_backend(made_on)
                if not src.host and not src.inplace:  # jax: its results are its arrays
                    out[t] = src.to_host
        return out

    def _starts_to_host(self, to_host: dict, drops: frozenset = frozenset()) -> dict:
        """instruction -> the positions of its results that later instructions copy to the
        host (`to_host`, less the `drops` a variant leaves out), where a device plan copies
        two or more results of one instruction: it starts those copies as it returns
        (`tgx.backends.start_to_host`), so that each copy does not wait for the device on
        its own (a decode's 36 KV-cache leaves)."""
        if not self._off_host:
            return {}
        out: dict = {}
        for t in to_host:
            if t in drops:
                continue
            src, i = self._maker[self.instructions[t].ins[0]]
            if self.instructions[src].multi_out or len(self.instructions[src].outs) > 1:
                out.setdefault(src, []).append(i)
        return {t: tuple(ix) for t, ix in out.items() if len(ix) > 1}

    def _copies_back(self, backend: str) -> frozenset:
        """The instructions that only copy a result of `backend` to the host to return it
        (nothing else reads the copy): left out when the caller takes `backend`'s arrays."""
        drops = self._host_copies.get(backend)
        if drops is not None:
            return drops
        read = {s for ins in self.instructions for s in ins.ins}
        outs = set(self.out_slots)
        found = set()
        for t, ins in enumerate(self.instructions):
            if (self._is_copy(ins) and get_backend(ins.backend).host
                    and self._made_on(ins.ins[0]) == backend
                    and ins.outs[0] in outs and ins.outs[0] not in read):
                found.add(t)
        drops = self._host_copies[backend] = frozenset(found)
        return drops

    # -- state ------------------------------------------------------------------------------
    def _check_state(self, args: list) -> list:
        """The caller's state objects (returned as the new state), after checking them; None
        for an immutable array (jax), whose new value is returned as a new array."""
        objs = []
        for a, _, _ in self.state:
            x = args[a]
            if type(x) is np.ndarray:
                flags = x.flags
                if not (flags.writeable and flags.c_contiguous):
                    raise BindingError(
                        f"state {self.in_names[a]}: tgx writes the new state into the array "
                        f"in place, so it must be writable and C-contiguous; got a "
                        f"{'read-only' if not x.flags.writeable else 'non-contiguous'} array "
                        f"(pass np.ascontiguousarray(x) / x.copy())")
            elif type(x) in _IMMUTABLE_TYPES or _immutable(x):
                objs.append(None)
                continue
            elif not self._state_tensor_ok(x, a):
                raise BindingError(
                    f"state {self.in_names[a]}: expected a writable NumPy array (tgx updates it "
                    f"in place), got {type(x).__name__}"
                    + (" (torch tensors are accepted with return_backend_arrays=True)"
                       if type(x).__module__.startswith("torch") else ""))
            objs.append(x)
        if len({id(x) for x in args}) != len(args):
            ids = {id(x) for x in objs}
            for i, x in enumerate(args):
                if id(x) in ids and sum(y is x for y in args) > 1:
                    raise BindingError(f"argument {self.in_names[i]} is also passed as another "
                                       f"argument, and one of them is state (updated in place)")
            objs.append(False)  # marks a call passing one object twice (see `_donated`)
        return objs

    def _state_tensor_ok(self, x, a: int) -> bool:
        """A backend array as state (with return_backend_arrays): tgx writes the new state
        through NumPy, so it needs a writable host view sharing the array's memory."""
        b = backend_of(x)
        if b is None or not self.state_backend_arrays:
            return False
        if b.host_view(x) is None:
            raise BindingError(f"state {self.in_names[a]}: tgx writes the new state through a "
                               f"NumPy view of the array, and this {b.name} array has none "
                               f"(a {b.name} state array must be a contiguous CPU array, "
                               f"without requires_grad); got one on "
                               f"{getattr(x, 'device', '?')}")
        return True

    def _private_state(self, args: list, objs: list) -> None:
        """Immutable state arrays that the plan updates in place: a writable copy of each
        (aligned, so a JAX region reads it in place) takes the argument's place."""
        for (a, _, copy), obj in zip(self.state, objs):
            if obj is None and not copy:
                args[a] = aligned_copy(args[a])

    def _write_state(self, args: list, objs: list, outs: list) -> None:
        """Copy aliasing outputs, write copied state into the caller's arrays, and return the
        caller's objects as the new state (immutable ones: the new value)."""
        for j in self.state_alias_outs:
            outs[j] = _snapshot(outs[j])
        if self._copied_state > 1:  # a device plan's new state: all copies to the host at once
            start_to_host([outs[o] for (_, o, copy), obj in zip(self.state, objs)
                           if copy and obj is not None])
        for (a, o, copy), obj in zip(self.state, objs):
            if obj is None:  # immutable: the computed value, or the private copy updated
                if not copy:
                    outs[o] = args[a]
                continue
            if copy:
                dst, src = args[a], outs[o]
                if type(dst) is not np.ndarray:  # passed on as its alias: the array itself
                    dst = obj
                if src is not dst:
                    np.copyto(dst, to_host(src))
            outs[o] = obj

    # -- the hot path ------------------------------------------------------------------------
    def run_flat(self, args: Sequence[Any], *, donate: bool = False, out_backend=None,
                 checked: bool = False) -> list:
        """Run on a flat list of arguments (NumPy arrays); returns the flat list of outputs.

        State arguments (see `tgx.compile(state=)`) are updated in place and returned as the
        very objects passed in; immutable ones (jax arrays) are left as they are, and their
        new values returned, or with `donate` handed to XLA (JAX's donation: XLA writes the
        new value into their memory and the arrays passed in are deleted) where one XLA
        call is all that reads them. `out_backend` (a backend name): results of that
        backend come back in its format, not copied to NumPy. `checked`: the caller has
        checked that every argument has exactly the traced shape and dtype (the
        `tgx.compile` fast path), so that is not checked again where no dim is symbolic."""
        args = list(args)
        if len(args) != len(self.in_slots):
            raise BindingError(f"expected {len(self.in_slots)} arguments, got {len(args)}")
        objs = self._check_state(args) if self.state else None
        if self._binds:
            self._bind_new_weights(args)
        through = self._through
        for i, a in enumerate(args):
            if type(a) is not np.ndarray and (through[i] is None or
                                              _backend_of(a) is not through[i]):
                args[i] = _coerce(a, self.in_avals[i])
        if self._private_k and any(objs[k] is None for k in self._private_k):
            self._private_state(args, objs)
        key = self._key(args) if self.symbols else ()
        spec = self._specs.get(key) or self.specialize(key)
        if not checked:
            for a, (shape, dtype) in zip(args, spec.shapes):
                if a.shape != shape or a.dtype != dtype:
                    self._raise_mismatch(args, spec.shapes)
        elif self.symbols:  # the rest was checked exactly by the caller
            shapes = spec.shapes
            for i in self._symbolic_args:
                if args[i].shape != shapes[i][0]:
                    self._raise_mismatch(args, shapes)
        if self._through_idx:
            self._pass_through(args)
        donated = self._donated(args, objs) if donate and self._donate_k else ()
        if donated or out_backend is not None:
            spec = self._variant(key, spec, (out_backend, donated))
        outs = self._execute(spec, args)
        self._finish(args, objs, outs)
        return outs

    def _execute(self, spec: Specialization, args: list) -> list:
        """Run one specialization's instructions on the prepared arguments."""
        capped = self.blas_threads is not None
        if capped:
            hold_one_blas_thread()
        try:  # no cost on the hot path (zero-cost exceptions); the context on failure
            return spec.run.fn(args, self._bound)
        except Exception as e:
            err = self._deleted_argument(args) or self._kernel_error(spec, e)
            if err is None:
                raise
            raise err from e
        finally:
            if capped:
                release_blas_threads()

    def _finish(self, args: list, objs: list | None, outs: list) -> None:
        """The new state in place (or returned), and no result sharing the caller's memory."""
        if objs is not None:
            self._write_state(args, objs, outs)
        for j in self.input_alias_outs:
            outs[j] = _snapshot(outs[j])

    def runner(self, example: Sequence[Any], *, donate: bool = False,
               out_backend: str | None = None) -> Callable[[list], list] | None:
        """`run_flat(args, donate=, out_backend=, checked=True)` for calls whose arguments
        are of the types of `example`'s, their shapes and dtypes checked by the caller (the
        `tgx.compile` fast path, whose guard checks each leaf's type): what run_flat decides
        per call from the kinds of the arguments (which state is the caller's NumPy array and
        which immutable, which arguments are donated, which run variant) is decided here
        once, and a call does only what those kinds need. None where a binding has symbolic
        dims or an argument is of a kind run_flat converts; run_flat then serves the calls.

        Measured on the MLP 2-64-2 training step with jax state (15 arguments, 14 of them
        state): ~7 us of checks per call before, ~1 us with the runner.

        >>> run = plan.compiled.runner(leaves)          # doctest: +SKIP
        >>> outs = run(list(leaves))                    # doctest: +SKIP
        """
        if self.symbols or len(example) != len(self.in_slots):
            return None
        through = self._through
        for i, x in enumerate(example):
            if type(x) is not np.ndarray and (through[i] is None
                                              or _backend_of(x) is not through[i]):
                return None
        np_state, imm_k = [], []
        for k, (a, _, _) in enumerate(self.state):
            x = example[a]
            if type(x) is np.ndarray:
                np_state.append((k, a))
            elif type(x) in _IMMUTABLE_TYPES or _immutable(x):
                imm_k.append(k)
            else:  # a backend array as state: run_flat checks it
                return None
        n, n_state = len(self.in_slots), len(self.state)
        private = tuple(self.state[k][0] for k in self._private_k if k in imm_k)
        donated = (tuple(a for k, a in self._donate_k if k in imm_k and
                         type(example[a]) is not np.ndarray) if donate else ())
        spec = self._specs.get(()) or self.specialize(())
        if donated or out_backend is not None:
            spec = self._variant((), spec, (out_backend, donated))
        through_np = any(type(example[i]) is np.ndarray for i, _ in self._through_idx)
        # immutable state computed afresh is the result as it is: nothing to write back
        finish = bool(np_state or private or self.state_alias_outs or self.input_alias_outs)
        execute = self._execute
        prepare = bool(self._binds or private or through_np)

        def run(args: list) -> list:
            if len(set(map(id, args))) != n:  # one object passed twice: run_flat decides
                return self.run_flat(args, donate=donate, out_backend=out_backend,
                                     checked=True)
            objs = None
            if n_state:
                objs = [None] * n_state
                for k, a in np_state:
                    x = args[a]
                    flags = x.flags
                    if not (flags.writeable and flags.c_contiguous):
                        self._check_state(args)  # raises the error naming the argument
                    objs[k] = x
            if prepare:
                args = list(args)  # the caller's list keeps the objects it passed
                if self._binds:
                    self._bind_new_weights(args)
                for a in private:
                    args[a] = aligned_copy(args[a])
                if through_np:
                    self._pass_through(args)
            outs = execute(spec, args)
            if finish:
                self._finish(args, objs, outs)
            return outs

        return run

    def _donated(self, args: list, objs: list) -> tuple:
        """The immutable state arguments of this call that XLA may take over: passed on as
        they are (a NumPy argument left here was converted), and each passed once."""
        donated = tuple(a for k, a in self._donate_k
                        if objs[k] is None and type(args[a]) is not np.ndarray)
        if donated and len(objs) > len(self.state):  # an object passed twice (`_check_state`)
            donated = tuple(a for a in donated if sum(y is args[a] for y in args) == 1)
        return donated

    def _deleted_argument(self, args: list) -> BindingError | None:
        """The error for a call that failed on an argument whose array is deleted (a jax
        array donated to an earlier call), naming it; looked for only after a failure."""
        for i, x in enumerate(args):
            deleted = getattr(x, "is_deleted", None)
            if deleted is not None and deleted():
                what = ("was state donated to an earlier call: pass the new state that call "
                        "returned" if any(a == i for a, _, _ in self.state)
                        else "was deleted (donated to a call, or by .delete())")
                return BindingError(f"argument {self.in_names[i]}: its jax array {what}")
        return None

    def _kernel_error(self, spec, error: Exception) -> KernelError | None:
        """A `KernelError` naming the instruction that raised `error`, its kernel, the
        equations it runs (with the user's file:line) and its input shapes (FX's "While
        executing …"); None when `error` did not come from an instruction. The instruction
        is found from the line the generated function stopped at, its inputs in that
        frame's locals (`RunFunction.failure`)."""
        found = spec.run.failure(error)
        if found is None:
            return None
        t, inputs = found
        return self._instruction_error(self.instructions[t],
                                       f"instruction {t} of {len(self.instructions)}",
                                       inputs, error)

    def _instruction_error(self, instr: Instruction, where: str, inputs: list,
                           error: Exception) -> KernelError:
        """The `KernelError` for `instr` (`where` it is in the schedule) failing on `inputs`."""
        shapes = ", ".join(f"{getattr(x, 'dtype', type(x).__name__)}"
                           f"{list(getattr(x, 'shape', ()))}" for x in inputs)
        lines = [f"kernel {instr.label} ({where}, on {instr.backend}) failed: "
                 f"{type(error).__name__}: {error}",
                 f"  inputs: {shapes or 'none'}"]
        name = var_namer(self.graph) if self.graph is not None else var_namer()
        for j in instr.eqns[:4]:
            if self.graph is not None and j < len(self.graph.eqns):
                e = self.graph.eqns[j]
                lines.append(f"  while running {pp_eqn(e, name)}"
                             + (f"\n    at {e.source_info}" if e.source_info else ""))
        if len(instr.eqns) > 4:
            lines.append(f"  … and {len(instr.eqns) - 4} more equations of this region")
        return KernelError("\n".join(lines))

    def _raise_mismatch(self, args, shapes):
        """The error for the first argument whose shape or dtype differs from `shapes`."""
        i, a, (shape, dtype) = next((i, a, sd) for i, (a, sd) in enumerate(zip(args, shapes))
                                    if a.shape != sd[0] or a.dtype != sd[1])
        if a.dtype != dtype:
            raise DTypeError(self._mismatch(i, a, shape))
        raise BindingError(self._mismatch(i, a, shape))

    def source(self, *key: int, **dims: int) -> str:
        """The generated run function of one binding of the dims (by position in `symbols`
        order, or by name), as Python source; what `run_flat` calls.

        >>> import numpy as np, tgx, tgx.numpy as tnp
        >>> f = tgx.compile(lambda x: tnp.exp(x) * 2.0 + x, backends=["numpy"],
        ...                 policy="heuristic")
        >>> cg = f.lower(tgx.Spec(("N",))).compiled
        >>> print(cg.source(N=3))
        def run(args, bound):
            a0, = args
            v1 = k0(a0, out=k0_out)  # 0: exp[out]@numpy
            v2 = k1(v1, c4, out=k1_out)  # 1: mul[out]@numpy
            v3 = k2(v2, a0)  # 2: add[out]@numpy
            return [v3]
        """
        if dims:
            key = tuple(dims[s.name] for s in self.symbols)
        return self.specialize(tuple(key)).run.source

    def hand_loop(self, key: tuple) -> list[tuple]:
        """The specialized (fn, input slots, output slot) list, for overhead comparisons."""
        return [(fn, ins, out) for fn, ins, out, _ in self.specialize(key).instrs]

    def __len__(self) -> int:
        return len(self.instructions)


def _then_start_to_host(fn: Callable, positions: tuple) -> Callable:
    """`fn` (an instruction with several results), then the copies of the results at
    `positions` to the host started together. `_starts_inner` is `fn`, which a variant
    (`CompiledGraph._variant`: donation, results left on the device) starts from."""
    def run(*args):
        outs = fn(*args)
        start_to_host([outs[i] for i in positions])
        return outs
    run._starts_inner = fn
    return run


def _snapshot(x):
    """A copy of an output that may share memory with a state buffer (jax arrays are
    immutable and never share it)."""
    if isinstance(x, np.ndarray):
        return x.copy()
    clone = getattr(x, "clone", None)
    return clone() if clone is not None else x


def _immutable(x) -> bool:
    """Whether `x` is an array of a backend whose arrays cannot be written (jax)."""
    b = _backend_of(x)
    if b is not None and not b.host and not b.inplace:
        _IMMUTABLE_TYPES.add(type(x))
        return True
    return False


_IMMUTABLE_TYPES: set[type] = set()


#: array type -> its backend, for the types seen (a type no loaded backend owned is asked
#: again: its backend may load later)
_TYPE_BACKEND: dict[type, Any] = {}


def _backend_of(x):
    """`backend_of(x)`, one dict look-up per call once the type is known."""
    b = _TYPE_BACKEND.get(type(x))
    if b is None:
        b = backend_of(x)
        if b is not None:
            _TYPE_BACKEND[type(x)] = b
    return b


def _coerce(x, aval: ShapedArray):
    if isinstance(x, (bool, int, float)):
        return np.asarray(x, dtype=aval.dtype)
    return to_host(x)
