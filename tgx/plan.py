"""`Plan`: what the pipeline hands back — the assignment, the backend graph in run order, the
flat instruction list with its buffer plan, and the program after every stage.

`print(plan)` shows the choice per equation (with the figures it was made on), the copies,
the schedule and the buffer plan; `print(plan.stages)` shows the program after each named
stage of `tgx.pipeline` (traced, simplify, patterns, fuse, select, rebackend, schedule,
lower, buffers); `plan.run(*args)` runs it; `plan.estimate_memory(N=...)` gives bytes per device.

>>> import numpy as np, tgx, tgx.numpy as tnp
>>> plan = tgx.compile(lambda x: tnp.exp(x) * 2.0, policy="heuristic",
...                    backends=["numpy"]).lower(tgx.Spec(("N",)))
>>> [name for name, _ in plan.stages]
['traced', 'simplify', 'patterns', 'fuse', 'select', 'rebackend', 'schedule', 'lower', 'buffers']
>>> plan.run(np.zeros(3, np.float32))
array([2., 2., 2.], dtype=float32)
"""

from __future__ import annotations

from .backends import host_name
from .core import Var, pp_eqn, var_namer
from .devices import HOST, owned
from .errors import OptionError
from .planning.cost_model import Estimate
from .planning.explain import explain
from .planning.transfers import transfer_seconds
from .runtime.memory import format_bytes
from .shapes import HINT
from .tracing import tree_flatten, tree_unflatten


class Stages(list):
    """The program after each stage: a list of (name, program) that prints them in turn."""

    def __getitem__(self, key):
        if isinstance(key, str):
            for name, program in self:
                if name == key:
                    return program
            raise OptionError(f"no stage {key!r} (stages: {', '.join(n for n, _ in self)})")
        return list.__getitem__(self, key)

    def __str__(self) -> str:
        return "\n\n".join(f"== {name} ==\n{program}" for name, program in self)

    __repr__ = __str__


class Instructions(list):
    """The flat instruction list of a `CompiledGraph`, printable (the "lower" stage); the
    outputs written into the workspace are marked."""

    def __init__(self, instructions, workspace=()):
        super().__init__(instructions)
        self.workspace = workspace

    def __str__(self) -> str:
        return "\n".join(f"  {t:>3} {ins.label} ins={list(ins.ins)} outs={list(ins.outs)}"
                         + (" [workspace]" if ins.outs and ins.outs[0] in self.workspace
                            else "")
                         for t, ins in enumerate(self))


class Plan:
    """One choice per equation, the transfers, the flat schedule and the buffer plan.

    Built by `tgx.lowering.lower_assignment` from an `Assignment` (the one route from every
    planner). Attributes: `assignment`, `graph` (the `BackendGraph` in run order),
    `kernels` (per equation of `graph`), `compiled` (the `CompiledGraph`), `options`
    (`PlanOptions`), `stages`, `policy` (which planner chose, and why).
    """

    def __init__(self, assignment, bgraph, compiled, options, source_graph=None,
                 stages=None):
        self.assignment = assignment
        self.graph = bgraph
        self.kernels = list(bgraph.kernels)
        self.compiled = compiled
        self.options = options
        self.source_graph = source_graph if source_graph is not None else assignment.graph
        self.stages = Stages(stages or ())
        self.policy = assignment.by or options.policy
        #: where the device backends' equations run ("cpu", "cuda:0"); host-only ones stay
        self.device = options.device
        self.dims = dict(assignment.dims)
        self.predicted_s = assignment.predicted_s
        self.memory_budget = options.budget
        self.return_backend_arrays = options.return_backend_arrays
        #: what the plan holds in a lower precision and the error measured on the first call
        #: (`tgx.precision.PrecisionReport`), or None
        self.precision = None
        compiled.memory_budget = options.budget
        compiled.state_backend_arrays = options.return_backend_arrays

    @property
    def estimates(self) -> list | None:
        """Per equation of `graph`: the `Estimate` the selection used (a copy's from the
        transfer costs); None for a plan chosen without figures (HEURISTIC)."""
        a = self.assignment
        if a.estimates is None:
            return None
        host = host_name()
        home = {}
        for e, b in zip(self.graph.eqns, self.graph.backends):
            for v in e.outvars:
                home[v.id] = b
        out = []
        for e, b, i in zip(self.graph.eqns, self.graph.backends, self.graph.origins):
            if i is not None:
                out.append(a.estimates[i])
                continue
            x = e.invars[0]
            src = home.get(x.id, host) if isinstance(x, Var) else host
            out.append(Estimate(transfer_seconds(x.aval, src, b, self.dims), "cost model",
                                f"{src}→{b} transfer"))
        return out

    @property
    def memory(self):
        return self.compiled.memory

    @property
    def symbols(self) -> tuple:
        return self.compiled.symbols

    def estimate_memory(self, **dims: int) -> dict[str, int]:
        """Bytes per device at this binding of the symbolic dims (no allocation): workspace,
        library-owned live values and persistent/state buffers."""
        return {} if self.memory is None else self.memory.device_needs(**dims)

    def check_budget(self, budget, **dims: int) -> dict[str, int]:
        """Raise `tgx.OutOfMemory` naming the device when a device needs more than
        `budget` (bytes, or {device: bytes}) at `dims`; else the bytes per device."""
        return {} if self.memory is None else self.memory.check_budget(budget, **dims)

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

    def explain(self, store=None) -> str:
        """Why each implementation was chosen: per equation the kernel taken, every
        alternative with its figure (measured or modelled) and why kernels declined; per
        pattern occurrence its kernels against the op-by-op form (`tgx.planning.explain`).

        >>> import numpy as np, tgx, tgx.numpy as tnp
        >>> plan = tgx.compile(tnp.exp, backends=["numpy"], store=False).lower(np.ones(2))
        >>> "exp[out]@numpy" in plan.explain()
        True
        """
        return explain(self, store)

    def summary(self) -> str:
        counts: dict[str, int] = {}
        for b in self.graph.backends:
            counts[b] = counts.get(b, 0) + 1
        per = ", ".join(f"{n} on {b}" for b, n in counts.items())
        return (f"{len(self.graph.eqns)} equations ({per}), {len(self.transfers())} transfers, "
                f"{len(self.compiled)} instructions")

    def __str__(self) -> str:
        name = var_namer(self.graph)
        on = f", device {self.device}" if self.device != HOST else ""
        lines = [f"Plan (policy {self.policy}{on}): {self.summary()}"]
        estimates = self.estimates
        if estimates is not None and self.predicted_s is not None:
            at = ", ".join(f"{k}={v}" for k, v in self.dims.items()) or "static shapes"
            lines.append(f"predicted {self.predicted_s * 1e6:.1f} µs at {at}")
        lines.append("equations:")
        inplace = {j for ins in self.compiled.instructions if "[inplace]" in ins.label
                   for j in ins.eqns}
        for i, (e, k) in enumerate(zip(self.graph.eqns, self.kernels)):
            fig = ""
            if estimates is not None and estimates[i] is not None:
                est = estimates[i]
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
        if self.precision is not None:
            lines.append(str(self.precision))
        tr = self.transfers()
        total = sum((b for _, _, b in tr), 0)
        lines.append(f"transfers: {len(tr)}" + (f", {total} bytes in all" if tr else ""))
        for i, b, nbytes in tr:
            lines.append(f"  eqn {i}: → {b}, {nbytes} bytes")
        if cg.bind_instructions:
            lines.append("once per weight binding (values of the weights alone):")
            lines.append(str(Instructions(cg.bind_instructions)))
        lines.append("schedule:")
        if cg.instructions:
            lines.append(str(Instructions(cg.instructions, cg.workspace)))
        mem = self.memory
        if mem is not None:
            lines.append("buffer plan:")
            lines.extend("  " + line for line in str(mem).split("\n"))
            hint = {s: HINT for s in mem.symbols}
            est = self.estimate_memory(**hint)
            at = ", ".join(f"{k}={v}" for k, v in hint.items())
            lib = owned(HOST) if self.device == HOST else \
                f"{owned(HOST)} and {owned(self.device)}"
            lines.append(f"  estimate{f' at {at}' if at else ''}: "
                         + ", ".join(f"{d}: {format_bytes(b)}" for d, b in est.items())
                         + f" (values on {lib} are owned by their library)")
        return "\n".join(lines)

    __repr__ = __str__
