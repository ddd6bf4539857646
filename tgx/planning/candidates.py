"""`tgx.candidates`: every way to run one equation.

For an equation: each backend's kernels whose checker accepts it, the primitive's
decomposition (when it has one), and every other backend reached through `copy_to` (the
equation runs there, its inputs and outputs are transferred). Declined kernels are listed with
the checker's reason in `declined`.

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
from ..backends.registry import Kernel, kernels_for
from ..core import Eqn
from ..transforms.evaluate import concretize

# Variants in the order the heuristic prefers them: a library's dedicated kernel, then a
# kernel writing into the workspace, then the plain kernel.
VARIANT_RANK = {"library": 0, "out": 1, "default": 2}


@dataclass(frozen=True)
class Candidate:
    """One way to run an equation.

    kind: "kernel" (run `kernel` on `backend`), "decomposition" (expand the primitive into its
    decomposition and choose again per equation), or "transfer" (copy the inputs to `backend`,
    run `kernel` there, copy the results back to `home`).
    """

    kind: str
    backend: str | None = None
    kernel: Kernel | None = None
    home: str | None = None

    def __str__(self) -> str:
        if self.kind == "kernel":
            return f"kernel {self.kernel!r}"
        if self.kind == "transfer":
            return f"copy_to {self.backend} → kernel {self.kernel!r} → copy_to {self.home}"
        return "decomposition"


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
                     dims: dict | None = None) -> list[Kernel]:
    """The kernels of `backend` that accept `eqn`, best variant first."""
    if not backend_available(backend):
        if declined is not None:
            declined.append((backend, unavailable_reason(backend)))
        return []
    avals = [x.aval for x in eqn.invars]
    params = dict(eqn.params)
    if dims:
        params = {k: concretize(v, dims) for k, v in params.items()}
    out = []
    for k in kernels_for(eqn.primitive.name, backend):
        reason = k.check(avals, params)
        if reason is None:
            out.append(k)
        elif declined is not None:
            declined.append((k, reason))
    out.sort(key=lambda k: VARIANT_RANK.get(k.variant, 3))
    return out


def candidates(eqn: Eqn, backends: Sequence[str] | None = None, *,
               home: str = "numpy") -> Candidates:
    """Every way to run `eqn` on `backends` (default: every available backend).

    Kernels on `home` (where the inputs live) come first; kernels elsewhere appear twice: as a
    plain kernel and as a transfer candidate (copy in, run, copy back).
    """
    backends = list(backends) if backends is not None else available_backends()
    declined: list = []
    out: list[Candidate] = []
    transfers: list[Candidate] = []
    for b in backends:
        for k in accepted_kernels(eqn, b, declined):
            out.append(Candidate("kernel", b, k))
            if b != home:
                transfers.append(Candidate("transfer", b, k, home))
    if eqn.primitive.decomposition is not None:
        out.append(Candidate("decomposition"))
    return Candidates(out + transfers, declined)
