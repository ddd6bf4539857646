"""`PlanOptions`: everything that shapes a plan, in one frozen value, and the planning defaults.

`tgx.compile(...)` and `plan_graph(graph, ...)` take the same keywords; each builds one
`PlanOptions` and hands it down the pipeline, so no stage threads options by hand.

>>> o = PlanOptions(policy="heuristic", backends=("numpy",))
>>> o.policy, o.device, replace(o, device="cuda:0").device
('heuristic', 'cpu', 'cuda:0')
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from ..devices import device_name
from ..errors import OptionError

#: the selection policies: rules only; store + cost model; profile what is unmeasured first
POLICIES = ("heuristic", "fastest", "explore")
#: HEURISTIC keeps an equation on NumPy when none of its values exceeds this many elements
#: at the planning hint: a torch or jax call costs microseconds, a NumPy one less
TINY = 4096
#: arguments from this size on count where they start (`PlanOptions.in_offsets`): XLA's copy
#: of a smaller unaligned one costs a few microseconds at most
UNALIGNED_MIN_BYTES = 16384

__all__ = ["POLICIES", "TINY", "UNALIGNED_MIN_BYTES", "PlanOptions", "replace"]


@dataclass(frozen=True)
class PlanOptions:
    """How to plan and lower one graph (see `tgx.compile` for each option's meaning).

    `weights`: indices of the graph inputs that are weights (bound once per array object);
    `state`: (input index, output index) pairs of state buffers; `in_names`: the argument
    names errors use; `dims`: the binding the measured policies choose at (default: every
    symbol at the hint, 64); `simplify`: run `tgx.simplify` before selecting; `patterns`:
    offer pattern kernels where their patterns occur (`tgx.planning.kernel_patterns`); `fuse`:
    offer generated loops for regions of elementwise ops (`tgx.planning.regions`);
    `explore_budget`: seconds EXPLORE may spend measuring (None: until done);
    `lossy_below`: under `tolerance`, kernels holding weights in a lower precision may be
    chosen when the error they promise (`Kernel.lossy`) is below this (`tgx.compile` lowers
    it when a plan's error on the first call exceeds the tolerance); `args_on`: the backend
    whose arrays the caller passes (None: NumPy's), which whole plans are measured with;
    `in_offsets`: per graph input, where the caller's NumPy array starts past a
    `tgx.devices.ALIGNMENT` boundary (0 for weights, arrays under `UNALIGNED_MIN_BYTES` and
    other libraries' arrays; None: all 0). XLA copies an unaligned host argument on every
    call, so whole plans are measured on inputs placed as the caller's are.
    """

    policy: str = "fastest"
    backends: tuple[str, ...] | None = None
    device: str = "cpu"
    store: Any = field(default=None, compare=False)
    tolerance: float | None = None
    dims: tuple[tuple[str, int], ...] | None = None
    memory_budget: Any = None
    return_backend_arrays: bool = False
    in_names: tuple[str, ...] | None = None
    weights: tuple[int, ...] = ()
    state: tuple[tuple[int, int], ...] = ()
    simplify: bool = True
    patterns: bool = True
    fuse: bool = True
    explore_budget: float | None = None
    lossy_below: float = math.inf
    args_on: str | None = None
    in_offsets: tuple[int, ...] | None = None

    def __post_init__(self):
        if self.policy not in POLICIES:
            raise OptionError(f"unknown policy {self.policy!r} (expected one of {POLICIES})")
        b = self.explore_budget
        if b is not None and (isinstance(b, bool) or not isinstance(b, (int, float)) or b < 0):
            raise OptionError(f"explore_budget must be a number of seconds >= 0 (or None), "
                              f"got {b!r}")
        set_ = object.__setattr__
        set_(self, "device", device_name(self.device))
        if self.backends is not None:
            set_(self, "backends", tuple(self.backends))
        if isinstance(self.dims, Mapping):
            set_(self, "dims", tuple((str(k), int(v)) for k, v in self.dims.items()))
        if self.in_names is not None:
            set_(self, "in_names", tuple(self.in_names))
        set_(self, "weights", tuple(sorted(self.weights)))
        set_(self, "state", tuple(tuple(p) for p in self.state))
        if isinstance(self.memory_budget, Mapping):
            set_(self, "memory_budget", tuple(sorted(self.memory_budget.items())))

    @property
    def budget(self) -> int | dict | None:
        """`memory_budget` as given: bytes, {device: bytes} or None."""
        b = self.memory_budget
        return dict(b) if isinstance(b, tuple) else b

    @property
    def unaligned(self) -> bool:
        """Whether some input the caller passes is placed off an alignment boundary."""
        return any(self.in_offsets or ())

    @property
    def binding(self) -> dict[str, int] | None:
        """`dims` as a dict, or None."""
        return None if self.dims is None else dict(self.dims)

    @property
    def outputs(self) -> str | None:
        """Where results go: None keeps each in its backend's format, "host" copies it back."""
        return None if self.return_backend_arrays else "host"

    @classmethod
    def make(cls, *, backends: Sequence[str] | None = None, **kw) -> PlanOptions:
        """`PlanOptions` from `tgx.compile`-style keywords (lists and dicts accepted)."""
        return cls(backends=None if backends is None else tuple(backends), **kw)
