"""The cost model: how long one equation takes on one kernel, and one transfer between backends.

Measured first: the median of the best PASSED store trace of (graph hash of the one-equation
graph, workload key of its concrete binding, implementation key, environment id). A binding
that was never measured borrows the *nearest measured binding* of the same graph,
implementation and environment: the workload whose total input elements are closest in
log-space, its time scaled by the ratio of input bytes above the backend's per-call overhead
(``overhead + (t - overhead) * bytes_now / bytes_then``). Otherwise a roofline guess:
``overhead + bytes moved / bandwidth + flops / peak`` with each backend's constants
(`Backend.cost`; see docs/selection.md for how they were chosen; `calibrate()` measures the
overheads here).

>>> import tgx, tgx.numpy as tnp
>>> g = tgx.make_graph(lambda x: tnp.exp(x))(tgx.Spec(("N",)))
>>> from tgx.backends.registry import kernels_for
>>> k = [k for k in kernels_for("exp", "numpy") if k.variant == "default"][0]
>>> CostModel().kernel(g.eqns[0], k, {"N": 1000}).source
'cost model'
"""

from __future__ import annotations

import copy
import math
import os
import time
import warnings
from dataclasses import dataclass

import numpy as np

from ..backends import available_backends, backend_available, get_backend
from ..backends.registry import kernels_for
from ..core import Literal, equation_key
from ..graph import structural_hash
from ..profiling.timing import measure
from ..shapes import concrete_shape, name_binding
from ..store.schema import implementation_key, workload_key
from ..tracing import one_equation_graph
from ..transforms.decompose import decomposition_graph
from .transfers import transfer_seconds

# The per-backend constants (per-call overhead, bandwidth, peak; transfer costs; switch
# penalties) live on the `Backend` objects (`tgx.backends.base`), each with how it was
# measured. A note on the switch penalties: only multi-threaded work after the switch really
# pays them (a small NumPy op runs on one thread), so they over-price plans that mix torch
# with small NumPy ops (a transformer block's torch plan: 9.7 ms predicted, 2.1 ms measured).
# Charging them per destination equation was tried and made the cost landscape so flat that
# `tgx.paths(...).ranked()` took 30-70 s for a Gemma block's first plan instead of ~1 s;
# FASTEST takes measured whole plans instead (recipes.py), which include the real contention.
#: the graph the calibration's figures are recorded under, named by how they are measured:
#: figures of an older way stay in the store, unread, and a store holding only those is
#: calibrated again (`-2`: each library timed after the others' threads stopped,
#: `CALIBRATION_PAUSE_S`; the figures before could be 7x off)
CALIBRATION_GRAPH = "tgx-calibration-2"
#: the calibration's GEMM (n x n times n x n) and elementwise add (elements): a GEMM's rate
#: and a pass over memory in the caches' sizes a model's tensors have (4 MB an operand)
CALIBRATION_GEMM = 512
CALIBRATION_ELEMENTS = 1 << 20
#: ``$TGX_CALIBRATE`` values (any case) that keep FASTEST from calibrating a store
CALIBRATE_OFF = ("off", "none", "0", "false", "no")
#: the calibration's pause before each library's figures, and each figure's spin-up: a
#: library's worker threads spin for ~0.1 s after its last call, and a GEMM timed meanwhile
#: competes with them for the cores. Without: torch's 512³ GEMM measured 8.0 ms (0.70
#: alone) in 3 of 4 calibrations, jax's 1.72 ms (0.90) in the 4th, and an LM training
#: step's FASTEST plan took its GEMMs off the library so priced (1.12x -> 1.5x jax.jit)
CALIBRATION_PAUSE_S = 0.2
CALIBRATION_SPIN_UP_S = 0.1


#: results this large or larger are priced for being written to fresh memory when a kernel
#: allocates them (`CostModel.fresh_output_s`): Gemma's 18-layer prefill on torch, one
#: process, with the out= kernels taken from 64 KiB up / 256 KiB up / never: 134.2 / 134.8 /
#: 136.2 ms (its k and v projections and k's RoPE are 128 KiB)
FRESH_OUTPUT_BYTES = 64 * 1024


@dataclass(frozen=True)
class Estimate:
    """A predicted time, where it came from ("measured" | "cost model" | "unknown"), and a
    detail (store workload used, or the formula)."""

    seconds: float
    source: str
    detail: str = ""


def _nbytes(aval, env) -> int:
    return math.prod(concrete_shape(aval.shape, env)) * aval.dtype.itemsize


def _flops(eqn, env) -> float:
    """The primitive's arithmetic work at the binding (its `flops` rule; 0 without one)."""
    rule = eqn.primitive.flops
    if rule is None:
        return 0.0
    return rule([concrete_shape(a.aval.shape, env) for a in eqn.invars],
                [concrete_shape(v.aval.shape, env) for v in eqn.outvars], **eqn.params)


# Ops a fusing compiler (XLA) merges into the loop of their neighbours: their operands and
# results stay in registers, so inside a region they cost their arithmetic, not a pass over
# memory. Pricing them by bytes (as NumPy runs them) made every JAX region look as slow as op
# by op and let one NumPy pattern kernel (`rms_norm`) split a training step's region in 9
# (lm-small: 11.0 ms against 8.0 as one region, 2026-11-24). Reductions, contractions,
# gathers and scatters still pay their bytes (they read their fused producers once).
LOOP_FUSIBLE = frozenset({"broadcast_in_dim", "iota", "slice", "pad", "concatenate", "rev",
                          "dynamic_slice"})


def is_loop_fusible(eqn) -> bool:
    """Whether a fusing backend runs `eqn` inside the loop of its neighbours (see above)."""
    p = eqn.primitive
    return p.elementwise or p.is_view or p.name in LOOP_FUSIBLE


def priced_by_arithmetic(eqn, kernel) -> bool:
    """Whether the cost model prices `kernel` on `eqn` by its arithmetic whatever the store
    holds: a loop-fusible op on a backend that fuses regions. Timed alone, such a kernel
    is a one-op XLA program making a pass over memory, which the region it runs in does
    not make; so its figure is not used, and explore does not measure it (compiling and
    timing them was ~4 s of an 18-layer prefill's 15 s kernel sweep)."""
    return get_backend(kernel.backend).fuses_regions and is_loop_fusible(eqn)


class CostModel:
    """Kernel and transfer time estimates from `store` (measured) and the roofline constants.

    `store`: a `BenchmarkStore` or None (cost model only). `env_id`: the environment to read
    (default: this machine's). `tolerance`: kernels whose measured max relative error exceeds
    it are `excluded`; lossy kernels (weights held in a lower precision) are excluded without
    it, and with it when they promise an error of `lossy_below` or more. `own_pools=False`:
    kernels with a thread pool of their own (`Kernel.own_pool`) are excluded too
    (`without_own_pools`).
    """

    def __init__(self, store=None, env_id=None, tolerance=None, lossy_below: float = math.inf,
                 own_pools: bool = True):
        self.store = store
        self.own_pools = own_pools
        self.tolerance = tolerance
        #: lossy kernels (`Kernel.lossy`) promising an error below this may be chosen under
        #: `tolerance`
        self.lossy_below = lossy_below
        #: calibrated overrides: backend -> (overhead s, bandwidth B/s, peak flop/s)
        self.backend_costs: dict[str, tuple[float, float, float]] = {}
        #: calibrated overrides: (src, dst) -> seconds of contention
        self.switch_penalty: dict[tuple[str, str], float] = {}
        self._env_id = env_id
        self._keys: dict = {}
        self._impl: dict = {}
        self._measured: dict = {}
        self._decomposed: dict = {}  # (primitive, params, avals) -> its decomposition
        self._parts: dict = {}       # ... and backend, fusion, binding -> its parts' seconds
        if store is not None and len(store):
            self._load_calibration()

    def without_own_pools(self) -> CostModel:
        """This cost model (sharing its figures) with the kernels that run on a thread pool of
        their own excluded. Such a kernel caps BLAS at one thread for the whole plan that
        holds it (`tgx.backends.threads`), which no per-kernel figure shows: a training step
        of a 4-layer LM (d=256) selected on NumPy with numba's parallel loops was predicted
        at 115.9 ms and ran 188 ms; selected without them (the serial loops, BLAS on two
        threads), 133 ms (2026-11-24, session 14).

        >>> CostModel().without_own_pools().own_pools
        False
        """
        other = copy.copy(self)
        other.own_pools = False
        return other

    @property
    def env_id(self) -> str | None:
        if self._env_id is None and self.store is not None:
            self._env_id = self.store.environment_id()
        return self._env_id

    def costs(self, backend: str) -> tuple[float, float, float]:
        """(per-call overhead s, bandwidth B/s, peak flop/s) of `backend`: calibrated on this
        machine when the store has it, else the backend's defaults."""
        hit = self.backend_costs.get(backend)
        return hit if hit is not None else get_backend(backend).cost

    # -- keys ------------------------------------------------------------------------------
    def keys(self, eqn, dims) -> tuple[str, str]:
        """(graph_hash, workload_key) of the one-equation graph at this binding."""
        ghash, axes, inputs = self.workload(eqn, dims)
        return ghash, workload_key(ghash, axes, inputs)

    def workload(self, eqn, dims) -> tuple[str, dict, list]:
        """(graph_hash, axes, input descriptors): symbols named s0, s1 … in order of first
        appearance in the inputs (as the structural hash renames them)."""
        env = name_binding(dims)
        ghash, syms = self._graph_key(eqn)
        inputs = [(concrete_shape(a.aval.shape, env), a.aval.dtype.name) for a in eqn.invars
                  if not isinstance(a, Literal)]
        return ghash, {f"s{i}": env[s] for i, s in enumerate(syms)}, inputs

    def _graph_key(self, eqn):
        key = equation_key(eqn)
        hit = self._keys.get(key)
        if hit is None:
            g = one_equation_graph(eqn)
            syms: list[str] = []
            for v in g.invars:
                for d in v.aval.shape:
                    if type(d) is not int:
                        for s in sorted(d.free_symbols, key=lambda s: s.name):
                            if s.name not in syms:
                                syms.append(s.name)
            hit = self._keys[key] = (structural_hash(g), tuple(syms))
        return hit

    def impl_key(self, kernel) -> str:
        """The store implementation key of `kernel` (name[variant]@backend#hash)."""
        key = self._impl.get(kernel)
        if key is None:
            key = self._impl[kernel] = implementation_key(
                "KERNEL", kernel_name(kernel), kernel.backend, kernel.source_hash)
        return key

    # -- measured --------------------------------------------------------------------------
    def _best(self, ghash, wkey, ikey):
        """Best PASSED trace of this implementation on this workload, else None."""
        recs = self.store.traces(graph_hash=ghash, workload=wkey, env_id=self.env_id,
                                 impl=ikey)
        ok = [r for r in recs if r["status"] == "PASSED" and r["median_s"] is not None]
        return min(ok, key=lambda r: r["median_s"]) if ok else None

    def _lookup(self, eqn, kernel, dims):
        """(trace, workload record or None if exact, scale) or None."""
        if self.store is None or self.env_id is None:
            return None
        if not self.store.workloads_for(self._graph_key(eqn)[0], self.env_id):
            return None  # never measured here: no workload key to compute
        ghash, wkey = self.keys(eqn, dims)
        ikey = self.impl_key(kernel)
        memo = (ghash, wkey, ikey)
        if memo in self._measured:
            return self._measured[memo]
        found = None
        rec = self._best(ghash, wkey, ikey)
        if rec is not None:
            found = (rec, None, 1.0)
        else:
            env = name_binding(dims)
            here = sum(_nbytes(a.aval, env) for a in eqn.invars if not isinstance(a, Literal))
            n_here = max(1, sum(math.prod(concrete_shape(a.aval.shape, env)) for a in eqn.invars
                                if not isinstance(a, Literal)))
            best = None
            for wl in self.store.workloads_for(ghash, self.env_id):
                if wl["inputs"] is None or wl["key"] == wkey:
                    continue
                r = self._best(ghash, wl["key"], ikey)
                if r is None:
                    continue
                n = max(1, sum(math.prod(s) for s, _ in wl["inputs"]))
                dist = abs(math.log(n) - math.log(n_here))
                if best is None or dist < best[0]:
                    there = sum(math.prod(s) * np.dtype(d).itemsize for s, d in wl["inputs"])
                    best = (dist, r, wl, here / max(1, there))
            if best is not None:
                found = best[1:]
        self._measured[memo] = found
        return found

    def kernel(self, eqn, kernel, dims: dict) -> Estimate:
        """Time of `eqn` run by `kernel` at the binding `dims`.

        JAX equations are priced *inside a region*: the lowering runs a group of JAX
        equations as one `jax.jit` call, so each pays its work but not a call's dispatch
        (the per-call overhead, measured by `calibrate()`); entering JAX from another backend
        pays one dispatch instead (see `switch`). A single measured JAX kernel is a one-op
        region, so measured figures lose the same overhead they were measured with."""
        if not get_backend(kernel.backend).fuses_regions:
            return self._kernel(eqn, kernel, dims)
        est = self._kernel(eqn, kernel, dims, in_region=True)
        ovh = self.costs(kernel.backend)[0]
        # floor: a measured op is never free, even when its median dipped under the overhead
        t = max(est.seconds - ovh, 0.05 * est.seconds)
        return Estimate(t, est.source, est.detail + f"; in a {kernel.backend} region "
                                                    f"(-{ovh * 1e6:.1f} µs dispatch)")

    def fresh_output_s(self, eqn, kernel, dims: dict) -> float:
        """What writing `kernel`'s results into memory it allocates costs in a plan beyond
        what its measurement shows: one pass over them at the backend's bandwidth, where a
        kernel writing into the plan's buffers (`writes_out`, `outs_into`) or returning a
        view pays none. Timed alone in a loop, the allocator hands a kernel back the same
        warm memory; in a plan, fresh memory. Measured in bench_train's lm-large step on
        torch (torch's profiler, per GEMM): (512, 256) x (256, 1024) 1150 µs allocating its
        2 MiB result against 712 for torch.compile's `mm(out=)`, (512, 1024) x (1024, 256)
        840 against 747, (256, 512) x (512, 1024) 1054 against 815: 9 ms of a 69 ms step.
        Only used to choose among one backend's kernels of an equation (`_Selector`), only
        for results of `FRESH_OUTPUT_BYTES` or more, and only on backends that ask for it
        (`Backend.prices_fresh_outputs`: torch).

        >>> import tgx
        >>> from tgx.backends.registry import kernels_for
        >>> g = tgx.make_graph(lambda a, b: a + b)(tgx.Spec((256, 1024)), tgx.Spec((256, 1024)))
        >>> ks = {k.writes_out: k for k in kernels_for("add", "torch")}
        >>> cm = CostModel()
        >>> cm.fresh_output_s(g.eqns[0], ks[True], {})
        0.0
        >>> round(cm.fresh_output_s(g.eqns[0], ks[False], {}) * 1e6)   # 1 MiB at 10 GB/s
        105
        """
        if kernel.writes_out or kernel.outs_into or kernel.returns_view or \
                not get_backend(kernel.backend).prices_fresh_outputs:
            return 0.0
        env = name_binding(dims)
        nbytes = sum(_nbytes(v.aval, env) for v in eqn.outvars)
        if nbytes < FRESH_OUTPUT_BYTES:
            return 0.0
        return nbytes / self.costs(kernel.backend)[1]

    def _kernel(self, eqn, kernel, dims: dict, in_region: bool = False) -> Estimate:
        if in_region and is_loop_fusible(eqn):  # see `priced_by_arithmetic`
            return self.roofline(eqn, kernel.backend, dims, moves_bytes=False)
        hit = self._lookup(eqn, kernel, dims)
        ovh = self.costs(kernel.backend)[0]
        if hit is not None:
            rec, wl, scale = hit
            if wl is None:
                return Estimate(rec["median_s"], "measured", f"workload {rec['workload']}")
            t = ovh + max(rec["median_s"] - ovh, 0.0) * scale
            shapes = " ".join("x".join(map(str, s)) for s, _ in wl["inputs"])
            return Estimate(t, "measured", f"nearest binding {wl['key']} (inputs {shapes}), "
                                           f"scaled x{scale:.3g}")
        if eqn.primitive.name == "fused" and eqn.params.get("name", "fused") == "fused":
            # a region of `tgx.fuse`: a loop generated from it (`tgx.backends.numba_codegen`)
            # runs its ops a scalar at a time, which may beat NumPy's passes or lose to its
            # vectorized transcendentals (a tanh region: 0.95 ms against 0.30 op by op);
            # NumPy's interpreter of the body runs them op by op. Unmeasured, either is
            # priced as its ops plus a call, so only a measurement makes it win.
            t = ovh + sum(self.roofline(e, kernel.backend, dims).seconds
                          for e in eqn.params["graph"].eqns)
            return Estimate(t, "cost model", "generated loop, unmeasured: priced as its ops")
        p = eqn.primitive
        if p.decomposition is not None and not p.elementwise and p.name != "fused":
            # A library's kernel for a composite (attention, softmax, linear) is priced as
            # one call doing its parts' work: only dot_general declares its flops, so a
            # composite's own roofline counted bytes alone (an unmeasured 128x640x2048
            # `linear` was 0.8 ms of memory traffic and no arithmetic) and NumPy's attention
            # at 4x128x256 was 0.20 ms against 1.17 measured: an unmeasured FASTEST plan ran
            # it between XLA regions (18-layer prefill 356 ms, against 203 on jax alone).
            # An elementwise composite (tanh) is one pass of a ufunc, and a pattern's kernel
            # (`fused`) is written to make one pass: their own roofline prices them.
            try:
                parts = self._parts_seconds(eqn, kernel.backend, dims, in_region)
            except Exception:  # noqa: BLE001 - a decomposition that does not trace here
                return self.roofline(eqn, kernel.backend, dims)
            return Estimate(ovh + parts, "cost model",
                            "unmeasured composite: one call doing its parts' work")
        return self.roofline(eqn, kernel.backend, dims)

    def _parts_seconds(self, eqn, backend: str, dims: dict, in_region: bool,
                       depth: int = 0) -> float:
        """The work of `eqn`'s decomposition on `backend` (composite parts recursively),
        without per-call overheads; `in_region`: as a fusing backend runs it (loop-fusible
        parts cost their arithmetic only)."""
        key = (eqn.primitive.name, eqn.params, tuple(a.aval for a in eqn.invars))
        # memoized: a path search prices each composite many times
        memo = (key, backend, in_region, tuple(sorted((str(k), v) for k, v in dims.items())))
        hit = self._parts.get(memo)
        if hit is not None:
            return hit
        graph = self._decomposed.get(key)
        if graph is None:
            graph = self._decomposed[key] = decomposition_graph(eqn)
        ovh = self.costs(backend)[0]
        total = 0.0
        for e in graph.eqns:
            if e.primitive.decomposition is not None and depth < 4:
                total += self._parts_seconds(e, backend, dims, in_region, depth + 1)
            else:
                moves = not (in_region and is_loop_fusible(e))
                total += self.roofline(e, backend, dims, moves_bytes=moves).seconds - ovh
        self._parts[memo] = total
        return total

    def roofline(self, eqn, backend, dims, moves_bytes: bool = True) -> Estimate:
        """``overhead + bytes/bandwidth + flops/peak`` of `eqn` on `backend`; with
        `moves_bytes=False`, the flops only (an op fused into its neighbours)."""
        env = name_binding(dims)
        ovh, bw, peak = self.costs(backend)
        nbytes = 0 if eqn.primitive.is_view or not moves_bytes else sum(  # a view moves none
            _nbytes(a.aval, env) for a in (*eqn.invars, *eqn.outvars)
            if not isinstance(a, Literal))
        t = ovh + nbytes / bw + _flops(eqn, env) / peak
        return Estimate(t, "cost model", "overhead + bytes/bandwidth + flops/peak"
                        if moves_bytes else "overhead + flops/peak (fused: moves no bytes)")

    def transfer(self, aval, src: str, dst: str, dims: dict) -> Estimate:
        """Time of a `copy_to` of a value of `aval` from backend `src` to `dst`."""
        if src == dst:
            return Estimate(0.0, "cost model", "same backend")
        return Estimate(transfer_seconds(aval, src, dst, dims), "cost model",
                        f"{src}→{dst} transfer")

    def region_value_s(self, backend: str) -> float:
        """What a value a region of `backend` makes costs for being returned from its call
        to a reader outside it (`Backend.region_value_s`; `_Selector.region_values`)."""
        return get_backend(backend).region_value_s

    def state_write_back(self, aval, src: str, dst: str, dims: dict) -> float:
        """What returning a new state value made on `src` costs beyond its transfer to `dst`
        (the caller's library): where `src`'s arrays cannot be written (jax), the plan copies
        the value into the caller's array every call, one pass reading and writing it at
        `dst`'s bandwidth; where they can, the kernel wrote it in place. Unpriced, an MLP's
        Adam step (13 state leaves, 4.8 MB a step) chose jax on an empty store and ran 1.53x
        jax.jit, where the plan explore measured ran 1.07x.

        >>> import tgx
        >>> a, cm = tgx.Spec((1024, 256)), CostModel()
        >>> cm.state_write_back(a, "torch", "numpy", {})   # written in place
        0.0
        >>> round(cm.state_write_back(a, "jax", "numpy", {}) * 1e6)   # 2 MiB at 8 GB/s
        262
        """
        if get_backend(src).inplace or not get_backend(dst).host:
            return 0.0
        return 2 * _nbytes(aval, name_binding(dims)) / self.costs(dst)[1]

    def switch(self, src: str, dst: str, eqn=None, kernel=None, pool: str | None = None
               ) -> float:
        """Extra time when an equation on `dst` runs right after one on `src`: thread-pool
        contention, plus, entering a backend that fuses regions (jax), the dispatch of the
        one call the following equations share (see `kernel`).

        Without `eqn`: `dst`'s `switch_in[src]` (or the calibrated figure). With the next
        equation `eqn`, run by `kernel`: where it wakes `dst`'s pool (`Backend.wakes_pool`)
        it pays `switch_in` from `pool`, the backend of the last equation that woke a pool
        (default `src`): torch's workers still spin through the NumPy ufuncs and numba loops
        between a torch GEMM and a NumPy BLAS call; where it does not, `switch_in_light`
        from `src`.

        >>> cm = CostModel(None)
        >>> import tgx
        >>> mm, add = tgx.make_graph(lambda x: (x @ x) + 1.0)(tgx.Spec((4, 4))).eqns
        >>> [cm.switch("torch", "numpy", add), cm.switch("numpy", "numpy", mm, pool="torch")]
        [1e-05, 0.0078]
        """
        b = get_backend(dst)
        enter = self.costs(dst)[0] if b.fuses_regions and src != dst else 0.0
        if eqn is not None and not b.wakes_pool(eqn, kernel):
            return (b.switch_in_light.get(src, 0.0) if src != dst else 0.0) + enter
        src = src if pool is None else pool
        if src == dst:
            return enter
        return self.switch_penalty.get((src, dst), b.switch_in.get(src, 0.0)) + enter

    def wakes(self, dst: str, eqn, kernel=None) -> bool:
        """Whether `eqn` run by `kernel` on `dst` wakes a thread pool (`switch`)."""
        return get_backend(dst).wakes_pool(eqn, kernel)

    def excluded(self, eqn, kernel, dims) -> str | None:
        """Why `tolerance` rules `kernel` out for `eqn` (measured error too large), else None.
        A lossy kernel needs `tolerance=`; its error is then judged on the whole plan (a
        path-level budget, `tgx.compile`), not here: per kernel it is bounded by the
        profiler's pass criterion (`Kernel.lossy`)."""
        if kernel.own_pool and not self.own_pools:
            return f"{kernel!r} runs on a thread pool of its own (a selection without them)"
        if kernel.lossy is not None:
            if self.tolerance is None:
                return f"{kernel!r} holds operands in a lower precision: only under tolerance="
            if kernel.lossy >= self.lossy_below:
                return f"{kernel!r} holds operands in a lower precision: a plan's error " \
                       f"exceeded tolerance {self.tolerance:g} with kernels this lossy"
        if self.tolerance is None or self.store is None or self.env_id is None:
            return None
        ghash, wkey = self.keys(eqn, dims)
        recs = self.store.traces(graph_hash=ghash, workload=wkey, env_id=self.env_id,
                                 impl=self.impl_key(kernel))
        if not recs:
            return None
        if all(r["status"] != "PASSED" for r in recs):
            return f"{kernel!r} has no PASSED trace ({recs[-1]['status']})"
        errs = [r["max_rel_err"] for r in recs if r["status"] == "PASSED"]
        err = min((e for e in errs if e is not None), default=None)
        if err is not None and err > self.tolerance and kernel.lossy is None:
            return (f"{kernel!r}: measured max relative error {err:.3g} exceeds tolerance "
                    f"{self.tolerance:g}")
        return None

    # -- calibration -----------------------------------------------------------------------
    def _load_calibration(self) -> None:
        env = self.env_id
        for rec in self.store.traces(graph_hash=CALIBRATION_GRAPH, env_id=env,
                                     status="PASSED"):
            kind, _, what = rec["impl"].partition("@")
            t = rec["median_s"]
            if kind in ("overhead", "peak", "bandwidth") and backend_available(what) and t:
                ovh, bw, peak = self.costs(what)
                if kind == "overhead":
                    ovh = t
                elif kind == "peak":
                    peak = 2 * CALIBRATION_GEMM ** 3 / t
                else:   # an add reads two operands and writes one
                    bw = 12 * CALIBRATION_ELEMENTS / t
                self.backend_costs[what] = (ovh, bw, peak)
            elif kind == "switch":
                src, _, dst = what.partition("->")
                self.switch_penalty[(src, dst)] = rec["median_s"]


def kernel_name(kernel) -> str:
    return kernel.label


def calibrate(store=None, backends=None, budget_s: float = 0.2, *,
              overheads: bool = True) -> dict[str, float]:
    """Measure with the profiler, per backend, a GEMM (`CALIBRATION_GEMM`³: its rate is the
    roofline's peak, ``peak@<backend>``) and an add of `CALIBRATION_ELEMENTS` float32 (its
    bandwidth, ``bandwidth@<backend>``); with `overheads`, also the per-call overhead (a
    1-element add, ``overhead@<backend>``) and each pair's switch penalty (a 256x256 matmul
    on dst right after an add on src, minus both alone, at least 0: ``switch@<src>-><dst>``).
    Records them in `store` (graph `CALIBRATION_GRAPH`, this environment) and returns
    {name: seconds}. A `CostModel` on that store prices with them; FASTEST measures the
    first two itself on a store without them (`ensure_calibrated`).

    The defaults price every library's GEMM at 40 GFLOP/s and its passes over memory at
    8-10 GB/s; measured on the 2-core development machine: GEMMs 216 (XLA), 226 (NumPy),
    303 (torch) GFLOP/s, adds 27, 38 and 58 GB/s. With the defaults an LM training step
    chose a jax plan predicted at 358 ms that ran 125 ms, over a torch plan predicted at
    413 ms that ran 70; with the measured figures they are predicted at 81 and 63 ms."""
    backends = list(backends or available_backends())
    out: dict[str, float] = {}
    add, mm = {}, {}
    rng = np.random.default_rng(0)

    def alone(fn, args, sync, spin_up_s: float = 0.0) -> float:
        return measure(fn, args, sync=sync, budget_s=budget_s, warmup_s=spin_up_s).median_s

    for i, b in enumerate(backends):
        backend = get_backend(b)
        conv, sync = backend.convert, backend.sync_fn()
        k = next(k for k in kernels_for("add", b) if not k.writes_out)
        fn = k.bind({})
        dk = next(k for k in kernels_for("dot_general", b) if not k.writes_out)
        dot = dk.bind({"dimension_numbers": (((1,), (0,)), ((), ()))})
        n = CALIBRATION_GEMM
        g = conv(rng.standard_normal((n, n)).astype(np.float32))
        x = conv(rng.standard_normal(CALIBRATION_ELEMENTS).astype(np.float32))
        if i:  # the other libraries' threads stop spinning, then this one's settle
            time.sleep(CALIBRATION_PAUSE_S)
        out[f"peak@{b}"] = alone(dot, (g, g), sync, CALIBRATION_SPIN_UP_S)
        out[f"bandwidth@{b}"] = alone(fn, (x, x), sync)
        if not overheads:
            continue
        one = conv(np.ones(1, np.float32))
        out[f"overhead@{b}"] = alone(fn, (one, one), sync)
        a = conv(rng.standard_normal((256, 256)).astype(np.float32))
        add[b] = (lambda fn=fn, a=a, s=sync: s(fn(a, a)) if s else fn(a, a))
        mm[b] = (lambda dot=dot, a=a, s=sync: s(dot(a, a)) if s else dot(a, a))
    for src in add:
        for dst in mm:
            if src != dst:
                both = measure(lambda s=src, d=dst: (add[s](), mm[d]()), budget_s=budget_s)
                apart = (measure(add[src], budget_s=budget_s).median_s
                         + measure(mm[dst], budget_s=budget_s).median_s)
                out[f"switch@{src}->{dst}"] = max(0.0, both.median_s - apart)
    if store is not None:
        env = store.environment_id()
        wkey = store.add_workload(CALIBRATION_GRAPH, {}, [((1,), "float32")])
        store.add_traces([{"impl": name, "median_s": t, "graph_hash": CALIBRATION_GRAPH,
                           "workload": wkey, "env_id": env, "status": "PASSED"}
                          for name, t in out.items()])
    return out


def uncalibrated(store, backends) -> list[str]:
    """Those of `backends` (on this machine) whose GEMM rate or bandwidth `store` lacks."""
    env = store.environment_id()
    have = {r["impl"] for r in store.traces(graph_hash=CALIBRATION_GRAPH, env_id=env,
                                            status="PASSED")}
    return [b for b in backends if backend_available(b)
            and not {f"peak@{b}", f"bandwidth@{b}"} <= have]


def ensure_calibrated(store, backends, budget_s: float = 0.05) -> list[str]:
    """Measure the GEMM rate and bandwidth of those of `backends` that `store` has not
    measured on this machine (`calibrate(overheads=False)`: ~0.25 s a backend, once per
    machine and store); returns the backends measured. Not where ``$TGX_CALIBRATE`` is
    ``off``; a store that cannot be written only costs the figures (a warning is the
    store's own)."""
    if store is None or os.environ.get("TGX_CALIBRATE", "").strip().lower() in CALIBRATE_OFF:
        return []
    try:
        todo = uncalibrated(store, backends)
        if todo:
            calibrate(store, todo, budget_s, overheads=False)
    except Exception as e:  # noqa: BLE001 - the defaults still price every plan
        warnings.warn(f"tgx: calibrating the cost model failed ({type(e).__name__}: {e}); "
                      f"planning with its defaults", stacklevel=2)
        return []
    return todo
