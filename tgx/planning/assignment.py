"""`Assignment`: the one hand-off from planning to lowering.

Every planner — HEURISTIC, FASTEST's selection, a measured whole plan from the store, a path
chosen in `tgx.paths` — returns an `Assignment`: the graph to run (decompositions the planner
chose expanded, pattern occurrences as `fused` equations, no `copy_to`s: those follow from the
backends) with one backend and one kernel per equation, and the estimates the choice was made
with. `tgx.lowering.lower_assignment` turns any of them into a `Plan`, so a plan that was
measured is exactly the plan that runs.

An assignment is stored as bytes (`to_bytes` / `from_bytes`: the graph, and per equation the
backend and kernel by name, variant and source hash); a kernel that is gone or changed makes
it unloadable (`SerializationError`), so a stale measured plan is skipped, never run.

>>> import tgx, tgx.numpy as tnp
>>> from tgx.backends.registry import kernels_for
>>> g = tgx.make_graph(lambda x: tnp.exp(x))(tgx.Spec((4,)))
>>> k = kernels_for("exp", "numpy")[0]
>>> a = Assignment(g, ("numpy",), (k,))
>>> Assignment.from_bytes(a.to_bytes()).kernels == a.kernels
True
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import msgpack

from ..backends.numba_codegen import generated_kernel
from ..backends.registry import Kernel, kernels_for
from ..core import Graph, pp_eqn, var_namer
from ..errors import TgxError
from ..serialize import SerializationError, graph_from_bytes, graph_to_bytes

PAYLOAD_KIND = "assignment"
PAYLOAD_FORMAT = 2


@dataclass(frozen=True, eq=False)
class Assignment:
    """`graph` with `backends[i]` and `kernels[i]` running equation i (see the module doc).

    `estimates[i]`: the `Estimate` the planner priced equation i with (None where it did not
    price, as HEURISTIC); `predicted_s`: the planner's total, transfers and switches included;
    `dims`: the binding the figures are for; `by`: which planner made it, and why this one
    (shown by `print(plan)`); `meta`: extra fields a planner stores with it (a path's decision
    tokens).
    """

    graph: Graph
    backends: tuple[str, ...]
    kernels: tuple[Kernel | None, ...]
    estimates: tuple | None = None
    predicted_s: float | None = None
    dims: Mapping[str, int] = field(default_factory=dict)
    by: str = ""
    meta: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self):
        set_ = object.__setattr__
        set_(self, "backends", tuple(self.backends))
        set_(self, "kernels", tuple(self.kernels))
        if self.estimates is not None:
            set_(self, "estimates", tuple(self.estimates))
        n = len(self.graph.eqns)
        if len(self.backends) != n or len(self.kernels) != n or (
                self.estimates is not None and len(self.estimates) != n):
            raise TgxError(f"an assignment needs one backend, kernel (and estimate) per "
                           f"equation: {n} equations, {len(self.backends)} backends, "
                           f"{len(self.kernels)} kernels")
        for e, b, k in zip(self.graph.eqns, self.backends, self.kernels):
            if k is None and e.primitive.name != "copy_to":
                raise TgxError(f"no kernel assigned to {e}")
            if k is not None and k.backend != b:
                raise TgxError(f"kernel {k!r} assigned to {e} runs on {k.backend}, not {b}")

    def replace(self, **kw) -> Assignment:
        return replace(self, **kw)

    def __len__(self) -> int:
        return len(self.graph.eqns)

    @property
    def lossy(self) -> bool:
        """Whether a kernel holds operands in a lower precision (`Kernel.lossy`): what only
        `tolerance=` admits."""
        return any(k is not None and k.lossy is not None for k in self.kernels)

    def summary(self) -> str:
        """"12 equations (8 on torch, 4 on numpy)"."""
        counts: dict[str, int] = {}
        for e, b in zip(self.graph.eqns, self.backends):
            if e.primitive.name != "copy_to":
                counts[b] = counts.get(b, 0) + 1
        per = ", ".join(f"{n} on {b}" for b, n in counts.items())
        return f"{sum(counts.values())} equations ({per})"

    def __str__(self) -> str:
        name = var_namer(self.graph)
        head = f"Assignment by {self.by or 'a planner'}: {self.summary()}"
        if self.predicted_s is not None:
            at = ", ".join(f"{k}={v}" for k, v in self.dims.items()) or "static shapes"
            head += f", predicted {self.predicted_s * 1e6:.1f} µs at {at}"
        lines = [head]
        for i, (e, k) in enumerate(zip(self.graph.eqns, self.kernels)):
            est = self.estimates[i] if self.estimates is not None else None
            fig = f"  # {est.seconds * 1e6:.2f} µs {est.source}" if est is not None else ""
            lines.append(f"  {i:>3} {k!r:<28} {pp_eqn(e, name)}{fig}")
        return "\n".join(lines)

    __repr__ = __str__

    # -- bytes --------------------------------------------------------------------------------
    def to_bytes(self, label: str = "") -> bytes:
        """The assignment as msgpack bytes (graph, backends, kernels by identity, `meta`)."""
        ks = [None if k is None else [k.name, k.variant, k.source_hash] for k in self.kernels]
        return msgpack.packb({"kind": PAYLOAD_KIND, "format": PAYLOAD_FORMAT, "label": label,
                              "graph": graph_to_bytes(self.graph),
                              "backends": list(self.backends), "kernels": ks,
                              "meta": dict(self.meta)}, use_bin_type=True)

    @staticmethod
    def from_bytes(payload: bytes, by: str = "") -> Assignment:
        """The assignment `to_bytes` wrote; `SerializationError` when the payload is of
        another kind or format, or a kernel it names is gone or changed since."""
        try:
            d = msgpack.unpackb(payload, raw=False)
        except Exception as e:  # noqa: BLE001 - any decoding failure: a bad payload
            raise SerializationError(f"not an assignment payload ({e})") from None
        if not isinstance(d, dict) or d.get("kind") != PAYLOAD_KIND or \
                d.get("format") != PAYLOAD_FORMAT:
            raise SerializationError(f"not an assignment payload of format {PAYLOAD_FORMAT}")
        g = graph_from_bytes(d["graph"])
        kernels = [None if k is None else _find_kernel(*k, backend=b, eqn=e)
                   for e, b, k in zip(g.eqns, d["backends"], d["kernels"])]
        return Assignment(g, tuple(d["backends"]), tuple(kernels), by=by or d.get("label", ""),
                          meta=d.get("meta") or {})


def payload_label(payload: bytes) -> str:
    """The label stored with an assignment payload ("" when there is none)."""
    try:
        return msgpack.unpackb(payload, raw=False).get("label", "")
    except Exception:  # noqa: BLE001
        return ""


def _find_kernel(name: str, variant: str, source_hash: str, *, backend: str, eqn) -> Kernel:
    ks = kernels_for(name, backend)
    if eqn.primitive.name == "fused" and name == "fused":  # a loop generated for the region
        gk = generated_kernel(eqn) if backend == "numpy" else None
        ks = ks + ([gk] if gk is not None else [])
    hit = [k for k in ks if k.variant == variant]
    if not hit:
        raise SerializationError(f"the stored plan runs {eqn.primitive.name} with kernel "
                                 f"{name}[{variant}]@{backend}, which is not registered here")
    if hit[0].source_hash != source_hash:
        raise SerializationError(f"kernel {hit[0]!r} changed since the plan was stored (source "
                                 f"hash {source_hash[:12]} stored, {hit[0].source_hash[:12]} "
                                 f"now): the plan is planned again")
    return hit[0]
