"""Selection policies. HEURISTIC (this module): no measurements, a few rules.

1. A dedicated kernel beats the decomposition: an equation is decomposed only when no allowed
   backend has a kernel that accepts it.
2. Stay on one backend (the *primary*: the first of torch, jax, numpy that is allowed) unless a
   kernel is missing there; then prefer the backend the inputs already live on.
3. On the CPU only: tiny tensors (every output at most `TINY` elements at the planning hint)
   stay on NumPy when their inputs are there: a torch/jax call costs microseconds, a NumPy one
   less. On a GPU device a NumPy equation is a host round trip (and a synchronisation), far
   dearer than a kernel launch, so there every equation stays on the device backends (the
   primary, then the other device backend) and goes to NumPy only when no device kernel
   accepts it.
4. Within a backend: library kernel > `out=` kernel > plain kernel.

FASTEST (`select_plan`): store first, cost model where unmeasured (see
`tgx.planning.selection`); unmeasured choices are flagged pending in the store for
``tgx profile --pending``. EXPLORE: profile every unmeasured candidate kernel now, then FASTEST.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..core import Graph, Literal
from ..errors import KernelError
from ..transforms.decompose import decomposition_graph
from ..transforms.rewrite import eval_into, transform_graph
from ..backends import available_backends, unavailable_reason
from ..shapes import eval_dim
from .candidates import accepted_kernels

TINY = 4096
HINT = 64
PREFERENCE = ("torch", "jax", "numpy")


def _size_at_hint(aval) -> int:
    env = {s: HINT for d in aval.shape if type(d) is not int for s in d.free_symbols}
    n = 1
    for d in aval.shape:
        n *= eval_dim(d, env)
    return n


def check_backends(backends: Sequence[str] | None, device: str = "cpu") -> list[str]:
    """The backends to plan with: `backends` after checking that each is installed (None:
    every available one). On a non-CPU `device` each backend but NumPy (host-only) must reach
    the device: an explicitly named one that cannot is a `KernelError` naming the device and
    why (``torch.cuda.is_available() is False``); by default those that cannot are left out,
    and an error is raised when none can."""
    from ..runtime.compiled import Device, device_unavailable_reason

    if backends is None:
        out = available_backends()
    else:
        for b in backends:
            reason = unavailable_reason(b)
            if reason is not None:
                raise KernelError(reason)
        out = list(backends)
    dev = Device.parse(device)
    if dev.kind == "cpu":
        return out
    why = {b: device_unavailable_reason(dev, b) for b in out if b != "numpy"}
    bad = {b: r for b, r in why.items() if r is not None}
    if backends is not None and bad:
        raise KernelError(f"device {dev} is not available to "
                          + "; ".join(f"{b}: {r}" for b, r in bad.items()))
    if len(bad) == len(why):
        raise KernelError(f"device {dev} is not available: "
                          + ("; ".join(f"{b}: {r}" for b, r in bad.items()) if bad
                             else f"no backend of {out} runs on it")
                          + " (numpy runs on the host only)")
    return [b for b in out if b not in bad]


def primary_backend(backends: Sequence[str]) -> str:
    for b in PREFERENCE:
        if b in backends:
            return b
    return backends[0]


def decompose_unsupported(graph: Graph, backends: Sequence[str],
                          primary: str | None = None) -> Graph:
    """Expand, level by level, every equation no allowed backend has an accepting kernel for,
    and (with `primary`) every composite the primary backend lacks a kernel for: staying on
    one backend beats a round trip for one dedicated kernel."""

    def rule(eqn, ins):
        if primary is not None and eqn.primitive.decomposition is not None:
            if accepted_kernels(eqn, primary):
                return None
        elif any(accepted_kernels(eqn, b) for b in backends):
            return None
        if eqn.primitive.decomposition is None:
            declined: list = []
            for b in backends:
                accepted_kernels(eqn, b, declined)
            why = "; ".join(f"{k!r}: {r}" for k, r in declined) or "no kernel registered"
            raise KernelError(f"no kernel on {', '.join(backends)} runs {eqn} and "
                              f"{eqn.primitive.name} has no decomposition ({why})"
                              + (f"\n  at {eqn.source_info}" if eqn.source_info else ""))
        return eval_into(decomposition_graph(eqn), ins, rule)

    return transform_graph(graph, rule)


def assign_backends(graph: Graph, backends: Sequence[str] | None = None,
                    policy: str = "heuristic", device: str = "cpu") -> list[str]:
    """One backend per equation of `graph` by the heuristic rules (see the module doc).

    `device`: where the non-NumPy backends run; the tiny-tensors-on-NumPy rule holds on the
    CPU only. Named `backends` are only checked to be installed (a pure function of the
    graph: it does not ask whether the device is present)."""
    if policy != "heuristic":
        raise NotImplementedError(f"policy {policy!r} needs the benchmark store; only "
                                  f"'heuristic' is implemented for now")
    from ..runtime.compiled import Device

    on_host = Device.parse(device).kind == "cpu"
    backends = check_backends(backends, "cpu" if backends is not None else device)
    primary = primary_backend(backends)
    # on a GPU: the device backends (primary first), NumPy last
    fallback = (list(backends) if on_host else
                sorted(backends, key=lambda b: (b == "numpy", b != primary,
                                                PREFERENCE.index(b) if b in PREFERENCE else 9)))
    where: dict[int, str] = {v.id: "numpy" for v in (*graph.invars, *graph.constvars)}
    out = []
    for eqn in graph.eqns:
        homes = [where[a.id] for a in eqn.invars if not isinstance(a, Literal)]
        tiny = all(_size_at_hint(v.aval) <= TINY for v in eqn.outvars) and all(
            _size_at_hint(a.aval) <= TINY for a in eqn.invars)
        order = []
        if on_host and tiny and "numpy" in backends and all(h == "numpy" for h in homes):
            order.append("numpy")
        order.append(primary)
        if homes and on_host:
            order.append(max(set(homes), key=homes.count))
        order += fallback
        chosen = next((b for b in order if b in backends and accepted_kernels(eqn, b)), None)
        if chosen is None:
            raise KernelError(f"no kernel on {', '.join(backends)} runs {eqn}")
        out.append(chosen)
        for v in eqn.outvars:
            where[v.id] = chosen
    return out


def choose_kernels(graph: Graph, backends: Sequence[str]) -> list:
    """The best accepted kernel of each equation on its assigned backend."""
    out = []
    for eqn, b in zip(graph.eqns, backends):
        ks = accepted_kernels(eqn, b)
        if not ks:
            raise KernelError(f"no kernel on {b} accepts {eqn}")
        out.append(ks[0])
    return out


# -- measured policies ------------------------------------------------------------------------

def _all_equations(graph: Graph, backends, dims):
    """Every equation of `graph` and of its decompositions, recursively (EXPLORE's scope)."""
    seen: set = set()
    stack = list(graph.eqns)
    while stack:
        e = stack.pop()
        key = (e.primitive.name, repr(sorted(e.params.items())),
               tuple(str(a.aval) for a in e.invars))
        if key in seen:
            continue
        seen.add(key)
        yield e
        if e.primitive.decomposition is not None:
            stack.extend(decomposition_graph(e).eqns)


def unmeasured(graph: Graph, backends, store, cost_model, dims) -> list[tuple]:
    """(equation, kernel) for every candidate kernel of `graph` and its decompositions that
    the store has no trace of at `dims` on this machine."""
    todo = []
    for e in _all_equations(graph, backends, dims):
        ghash, wkey = cost_model.keys(e, dims)
        for b in backends:
            for k in accepted_kernels(e, b):
                if not store.measured(ghash, cost_model.impl_key(k), wkey, cost_model.env_id):
                    todo.append((e, k))
    return todo


def explore(graph: Graph, backends, store, cost_model, dims, budget_s: float = 0.05, *,
            time_limit_s: float | None = None, progress: bool | None = False) -> int:
    """Profile every unmeasured candidate kernel at `dims` (random inputs, the NumPy reference
    as golden), for at most `time_limit_s` in all, with a progress bar on stderr when
    `progress`; returns how many were profiled. What the limit leaves out stays unmeasured
    (the cost model prices it) and a later call continues where this one stopped."""
    import time

    from ..profiling.pending import profile_kernel
    from ..profiling.progress import Progress

    # One backend after another, with a pause at each change: a library's worker threads
    # spin for up to ~0.1 s after its last call (OpenBLAS, torch's OpenMP pool), and a kernel
    # of another library timed meanwhile competes with them for the cores (a 256x256 torch
    # matmul right after NumPy ones was measured at 8 ms instead of 0.3 ms). Golden results
    # run with BLAS on one thread for the same reason (`profiling.accuracy.one_blas_thread`).
    todo = sorted(unmeasured(graph, backends, store, cost_model, dims),
                  key=lambda ek: ek[1].backend)
    bar = Progress(len(todo), enabled=progress)
    start, n, last = time.monotonic(), 0, None
    for e, k in todo:
        if time_limit_s is not None and time.monotonic() - start > time_limit_s:
            break
        if last is not None and k.backend != last:
            time.sleep(0.2)
        last = k.backend
        profile_kernel(e, k, dims, store, cost_model, budget_s)  # errors become traces
        n += 1
        bar.update(f"{e.primitive.name} on {k.backend}")
    bar.close()
    cost_model._measured.clear()
    return n


def flag_pending(store, cost_model, eqns, kernels, estimates, dims, backends=()) -> int:
    """Flag for the offline profiler every equation whose chosen kernel was priced without a
    measurement: each of its candidate kernels on `backends` (and the chosen one) that the
    store has not measured at `dims`. All candidates, not only the chosen one: once the
    chosen kernel is measured, a sibling priced by the cost model may look cheaper and be
    chosen next, so flagging one at a time would need a profiling run per variant."""
    from ..profiling.pending import Unencodable, describe_equation
    from ..store.schema import make_pending
    from .cost_model import kernel_name

    recs = []
    for e, k, est in zip(eqns, kernels, estimates):
        if est.source == "measured" or k is None:
            continue
        try:
            desc = describe_equation(e, dims)
        except Unencodable:
            continue
        ghash, wkey = cost_model.keys(e, dims)
        desc["axes"] = cost_model.workload(e, dims)[1]
        todo = [k] + [c for b in backends for c in accepted_kernels(e, b) if c != k]
        for c in todo:
            ikey = cost_model.impl_key(c)
            if c is not k and store.measured(ghash, ikey, wkey, cost_model.env_id):
                continue
            recs.append(make_pending(ghash, wkey, ikey, cost_model.env_id,
                                     {"name": c.name, "backend": c.backend,
                                      "variant": c.variant, "label": kernel_name(c)}, desc))
    return store.add_pending(recs) if recs else 0


def heuristic_cost(graph: Graph, backends, cost_model, dims, weights=()) -> float:
    """The HEURISTIC plan's predicted time by the cost model (FASTEST never does worse).

    `weights`: indices of the inputs that are bound weights (their transfers are free)."""
    from .selection import _Selector

    g = decompose_unsupported(graph, backends, primary_backend(backends))
    assign = assign_backends(g, backends)
    from .selection import Choice

    sel = _Selector(backends, cost_model, dims, [g.invars[i].id for i in weights])
    opts = []
    for e, b in zip(g.eqns, assign):
        k = accepted_kernels(e, b)[0]
        opts.append({b: Choice(b, k, cost_model.kernel(e, k, dims))})
    sel.prepare(g, "numpy", 0, opts)
    return sel.total(assign)[0]
