"""`tgx.candidates`: every way to run one equation.

For an equation: each backend's kernels whose checker accepts it and the primitive's
decomposition (when it has one). A kernel on another backend than the one holding the inputs
is a detour through `copy_to`: the copies follow from the backends. Declined kernels are
listed with the checker's reason in `declined`. The selection (FASTEST) and `tgx.paths`
choose among exactly these candidates.

>>> import tgx, tgx.numpy as tnp
>>> g = tgx.make_graph(lambda x: tnp.exp(x))(tgx.Spec(("N",)))
>>> cs = tgx.candidates(g.eqns[0], backends=["numpy"])
>>> [str(c) for c in cs]
['kernel exp[out]@numpy', 'kernel exp@numpy']
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from ..backends import available_backends, backend_available, unavailable_reason
from ..backends.numba_codegen import parallel_applies
from ..backends.registry import Kernel, kernels_for
from ..core import Eqn
from ..shapes import concretize
from .kernel_patterns import (accepting_pattern_kernels, declines, generated_kernels,
                              is_generated, is_region, pattern_name)

# Variants in the order the heuristic prefers them: a library's dedicated kernel, then a
# kernel writing into the workspace, then the plain kernel.
VARIANT_RANK = {"library": 0, "out": 1, "default": 2}


@dataclass(frozen=True)
class Candidate:
    """One way to run an equation (or, kind "pattern", a matched set of equations) — the one
    option type every planner chooses among.

    kind: "kernel" (run `kernel` on `backend`), "pattern" (a pattern kernel for several
    equations), or "decomposition" (expand the primitive into its decomposition and choose
    again per equation). A kernel on another backend than the one holding the inputs is a
    detour: the copies follow from the backends (`tgx.planning.transfers`).
    """

    kind: str
    backend: str | None = None
    kernel: Kernel | None = None

    def token(self) -> dict:
        """What a stored plan records of this choice (kernels by name, variant and source
        hash: a kernel that changed makes the plan unloadable)."""
        if self.kind == "decomposition":
            return {"d": "decomposition"}
        k = self.kernel
        return {"d": self.kind, "name": k.name, "backend": k.backend, "variant": k.variant,
                "source_hash": k.source_hash}

    def __str__(self) -> str:
        return "decomposition" if self.kind == "decomposition" else f"{self.kind} {self.kernel!r}"


@dataclass
class Candidates(list):
    """A list of `Candidate`s with the kernels that declined: `declined = [(kernel, reason)]`."""

    declined: list = field(default_factory=list)

    def __init__(self, items=(), declined=None):
        list.__init__(self, items)
        self.declined = declined or []

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"Candidates({list.__repr__(self)}, declined={self.declined})"


def accepted_kernels(eqn: Eqn, backend: str, declined: list | None = None,
                     dims: dict | None = None, *, unchecked_loops: bool = False) -> list[Kernel]:
    """The kernels of `backend` that accept `eqn`, best variant first. A region's generated
    loop is checked against the region's reference before it is offered (which compiles
    it); with `unchecked_loops`, it is offered unchecked, for a caller that checks it only
    if it may choose it (`is_generated`, `tgx.planning.kernel_patterns.declines`)."""
    if not backend_available(backend):
        if declined is not None:
            declined.append((backend, unavailable_reason(backend)))
        return []
    if pattern_name(eqn) is not None:  # an occurrence of a pattern (the patterns stage)
        return accepting_pattern_kernels(eqn, backend, declined)
    avals = [x.aval for x in eqn.invars]
    params = dict(eqn.params)
    if dims:
        params = {k: concretize(v, dims) for k, v in params.items()}
    out = []
    for k in kernels_for(eqn.primitive.name, backend):
        if k.pattern is not None:  # a pattern kernel runs only an occurrence of its pattern
            continue
        if unchecked_loops and is_generated(k):
            reason = parallel_applies(avals, params)
        else:
            reason = k.check(avals, params)
        if reason is None:
            out.append(k)
        elif declined is not None:
            declined.append((k, reason))
    out.sort(key=lambda k: VARIANT_RANK.get(k.variant, 3))
    if is_region(eqn):  # a region of elementwise ops: the loop numba generates from it
        out = generated_kernels(eqn, backend, declined, checked=not unchecked_loops) + out
    return out


def loop_declines(eqn: Eqn, kernel: Kernel) -> str | None:
    """The check `accepted_kernels(unchecked_loops=True)` left out for generated `kernel`:
    None when its loops agree with the region's reference, else why not."""
    if kernel.variant == "numba-parallel":
        return kernel.check([x.aval for x in eqn.invars], dict(eqn.params))
    return declines(kernel, eqn)


def candidates(eqn: Eqn, backends: Sequence[str] | None = None, *,
               unchecked_loops: bool = False) -> Candidates:
    """Every way to run `eqn` on `backends` (default: every available backend): each
    backend's accepting kernels (best variant first), then the decomposition; the selection
    and `tgx.paths` choose among exactly these (`unchecked_loops`: see `accepted_kernels`)."""
    backends = list(backends) if backends is not None else available_backends()
    declined: list = []
    out = [Candidate("kernel", b, k) for b in backends
           for k in accepted_kernels(eqn, b, declined, unchecked_loops=unchecked_loops)]
    if eqn.primitive.decomposition is not None:
        out.append(Candidate("decomposition"))
    return Candidates(out, declined)
