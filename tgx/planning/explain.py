"""`plan.explain()`: why each implementation was chosen — per equation that runs, the kernel
taken and every alternative with its figure (measured, or the cost model's), the kernels
that declined and why; and per pattern occurrence the pattern kernels against the op-by-op
form they would replace.

Figures are re-read from the store the plan was made with (and the cost model where nothing
is measured), at the plan's binding, so they are what the selection saw, not a new timing.
A measured whole plan (FASTEST's first choice) was taken as a whole, for its measured time:
its per-equation alternatives are shown all the same.

>>> import numpy as np, tgx, tgx.numpy as tnp
>>> plan = tgx.compile(lambda x: tnp.exp(x), backends=["numpy"], store=False).lower(
...     np.ones(4, np.float32))
>>> print(plan.explain().splitlines()[1].strip().split("  ")[0])
0 exp: exp[out]@numpy
"""

from __future__ import annotations

from ..backends import check_backends
from ..core import Eqn
from ..shapes import hint_binding
from ..store import as_store
from .candidates import accepted_kernels, candidates
from .cost_model import CostModel
from .kernel_patterns import pattern_name


def _us(est) -> str:
    return f"{est.seconds * 1e6:.2f} µs ({est.source})"


def _alternatives(eqn: Eqn, chosen, cm: CostModel, backends, dims) -> list[str]:
    lines = []
    cands = candidates(eqn, backends)
    for c in cands:
        if c.kind == "decomposition":
            lines.append("      decomposition: its equations, each chosen again")
            continue
        if c.kernel == chosen:
            continue
        why = cm.excluded(eqn, c.kernel, dims)
        est = cm.kernel(eqn, c.kernel, dims)
        lines.append(f"      {c.kernel!r}: {_us(est)}" + (f" — excluded: {why}" if why else ""))
    for k, reason in cands.declined:
        lines.append(f"      {k!r}: declined — {reason}")
    return lines


def _body_cost(eqn: Eqn, cm: CostModel, backend: str, dims) -> tuple[float, str]:
    """The op-by-op body of a pattern occurrence on one backend: Σ its equations' cheapest
    kernel there (a lower bound: no copies, nothing decomposed further)."""
    total, measured = 0.0, True
    for e in eqn.params["graph"].eqns:
        ests = [cm.kernel(e, k, dims) for k in accepted_kernels(e, backend)]
        if not ests:
            return float("inf"), "no kernel for " + e.primitive.name
        best = min(ests, key=lambda x: x.seconds)
        total += best.seconds
        measured &= best.source == "measured"
    return total, "measured" if measured else "cost model"


def explain(plan, store=None) -> str:
    """The text of `plan.explain()` (see the module doc); `store`: where the figures are
    read (default: the plan's own store; none for a plan made without one)."""
    options = plan.options
    backends = check_backends(options.backends, options.device)
    a = plan.assignment
    dims = dict(a.dims) or hint_binding(a.graph.in_avals)
    cm = CostModel(store if store is not None else _store_of(options),
                   tolerance=options.tolerance, lossy_below=options.lossy_below)
    lines = [f"why this plan (policy {plan.policy}); figures at "
             + (", ".join(f"{k}={v}" for k, v in dims.items()) or "static shapes")]
    for i, (e, k) in enumerate(zip(a.graph.eqns, a.kernels)):
        what = pattern_name(e) or e.primitive.name
        est = a.estimates[i] if a.estimates is not None else cm.kernel(e, k, dims)
        lines.append(f"  {i} {what}: {k!r}  {_us(est)}")
        lines.extend(_alternatives(e, k, cm, backends, dims))
    lines.extend(_patterns_section(plan, cm, backends, dims))
    return "\n".join(lines)


def _patterns_section(plan, cm, backends, dims) -> list[str]:
    g = dict(plan.stages).get("patterns")
    occ = [e for e in (g.eqns if g is not None else ()) if pattern_name(e) is not None]
    if not occ:
        return []
    used = {id(k) for k in plan.assignment.kernels if k is not None and k.pattern is not None}
    lines = ["pattern occurrences (the patterns stage), kernel against the op-by-op form:"]
    groups: dict = {}   # (name, input avals) -> [first occurrence, count], in graph order
    for e in occ:
        key = (pattern_name(e), tuple(str(x.aval) for x in e.invars))
        groups.setdefault(key, [e, 0])[1] += 1
    for e, n in groups.values():
        lines.append(f"  {pattern_name(e)} ×{n}, inputs "
                     + ", ".join(x.aval.str_short() for x in e.invars))
        for b in backends:
            for k in accepted_kernels(e, b):
                est = cm.kernel(e, k, dims)
                tag = "in the plan" if id(k) in used else "not in the plan"
                lines.append(f"      {k!r}: {_us(est)} — {tag}")
            body, src = _body_cost(e, cm, b, dims)
            lines.append(f"      op by op on {b} ({len(e.params['graph'].eqns)} eqns): "
                         f"{body * 1e6:.2f} µs ({src})")
    return lines


def _store_of(options):
    if options.store is None or options.policy == "heuristic":
        return None
    return as_store(options.store)
