"""Precision as a candidate: a path-level error budget for kernels that hold weights in a lower
precision.

Under `tolerance=`, FASTEST may choose lossy kernels (`Kernel.lossy`: a GEMV streaming its
weight as bfloat16 or int8, converted once per bound weight). Their errors compound along the
path, so they are not judged one by one: on the first call `tgx.compile` runs the chosen plan
on the caller's own arguments and compares every output with the reference evaluator (NumPy
references; composites in float64). The error of an output is its largest absolute error over
its largest magnitude (the error "relative to the logits' scale"); the plan is kept when every
output is within `tolerance`, else it is planned again with less lossy kernels (bfloat16
after int8, then none). `plan.precision` records what was held in which form and the error
measured.

>>> import numpy as np, tgx, tgx.nn as tnn
>>> f = tgx.compile(lambda w, x: tnn.linear(x, w), weights="w", policy="heuristic")
>>> w, x = np.ones((4, 3), np.float32), np.ones((1, 3), np.float32)
>>> f(w, x).tolist(), f.lower(w, x).precision is None
([[3.0, 3.0, 3.0, 3.0]], True)
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from .backends.base import to_host
from .transforms.evaluate import eval_graph_flat


@dataclass(frozen=True)
class PrecisionReport:
    """What a plan holds in a lower precision and the error that was measured.

    `held`: (weight argument name, held form, kernel label) per prepared weight use;
    `error`: the largest output error relative to that output's largest magnitude, on the
    first call's arguments; `tolerance`; `kept`: whether the lossy plan was kept (else the
    plan was chosen again in full precision, and `held` says what was last tried)."""

    held: tuple[tuple[str, str, str], ...]
    error: float
    tolerance: float
    kept: bool

    def __str__(self) -> str:
        verdict = "kept" if self.kept else "rejected: planned again in full precision"
        lines = [f"precision: error {self.error:.3g} of each output's scale against the "
                 f"reference (tolerance {self.tolerance:g}): {verdict}"]
        lines += [f"  {name} held as {form} for {label}" for name, form, label in self.held]
        return "\n".join(lines)


def held_weights(plan) -> tuple[tuple[str, str, str], ...]:
    """(argument name, held form, kernel) for each weight a lossy kernel of `plan` holds in a
    lower precision."""
    cg = plan.compiled
    out = []
    for k, e in zip(plan.kernels, plan.graph.eqns):
        if k is None or k.lossy is None:
            continue
        for p in k.prepare:
            a = e.invars[p.operand]
            idx = next((i for i, v in enumerate(plan.graph.invars) if v is a), None)
            name = cg.in_names[idx] if idx is not None else "a computed value"
            out.append((name, p.label, repr(k)))
    return tuple(out)


def path_error(plan, leaves: Sequence, reference: Sequence | None = None) -> float:
    """The largest error of `plan`'s outputs on `leaves` (the flat arguments), each relative
    to its output's largest magnitude, against the reference evaluator of the plan's source
    graph. State arguments are copied first: the check leaves the caller's arrays as they
    were."""
    state = {a for a, _, _ in plan.compiled.state}
    args = [np.array(x, copy=True) if i in state else x for i, x in enumerate(leaves)]
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        outs = plan.compiled.run_flat(args)
        if reference is None:
            reference = eval_graph_flat(plan.source_graph, list(leaves))
    err = 0.0
    for got, ref in zip(outs, reference):
        got = np.asarray(to_host(got), np.float64)
        ref = np.asarray(ref, np.float64)
        if ref.size == 0 or not np.issubdtype(ref.dtype, np.floating):
            continue
        scale = float(np.max(np.abs(ref[np.isfinite(ref)]), initial=0.0)) or 1.0
        diff = np.abs(got - ref)
        diff[~np.isfinite(ref) & (got == ref)] = 0.0
        err = max(err, float(np.max(diff)) / scale)
    return err


def check_precision(plan, leaves: Sequence, replan: Callable[[float], object]):
    """`plan` with its `precision` report when it holds weights in a lower precision and its
    error on `leaves` is within the tolerance. Otherwise `replan(below)` plans again with
    only the lossy kernels promising less error than those just tried (bfloat16 after int8),
    and so on until a plan passes or holds nothing in a lower precision; that plan carries
    the report of the last one rejected. Plans without lossy kernels, or planned without the
    caller's arguments, come back unchanged."""
    tol = plan.options.tolerance
    if tol is None or leaves is None:
        return plan
    reference = None
    rejected = None
    while True:
        held = held_weights(plan)
        if not held:
            plan.precision = rejected
            return plan
        if reference is None:
            reference = eval_graph_flat(plan.source_graph, list(leaves))
        err = path_error(plan, leaves, reference)
        if err <= tol:
            plan.precision = PrecisionReport(held, err, tol, True)
            return plan
        rejected = PrecisionReport(held, err, tol, False)
        plan = replan(min(k.lossy for k in plan.kernels if k is not None and k.lossy))
