"""Dedicated kernels for composite primitives, registered by primitive *name* and only when
`tgx.core.PRIMITIVES` has that name (composite families land independently of the backends).

Each backend module passes its table `{primitive name: (kernel, allowed params[, checker])}` to
`register`; params follow the primitive's own conventions, and a checker declines any parameter
it does not recognise.
"""

from __future__ import annotations

from .registry import _KERNELS, Kernel, add_kernel


def _known_params(allowed: set):
    def check(avals, params):
        extra = set(params) - allowed
        if extra:
            return f"kernel does not know params {sorted(extra)}"
        return None
    return check


def _both(a, b):
    def check(avals, params):
        return a(avals, params) or b(avals, params)
    return check


def register(backend: str, table: dict, primitives: dict) -> list[str]:
    """Register `backend`'s dedicated kernels for composites, `table` = {primitive name:
    (fn, allowed params[, checker])}, for those whose primitive exists; returns their names.

    The param names are guesses until the composite families settle: a kernel whose checker
    sees an unknown param declines, and the planner falls back to the decomposition.
    """
    done = []
    for name, (fn, allowed, *extra) in table.items():
        if name not in primitives or (name, backend) in _KERNELS:
            continue
        known = _known_params(allowed)
        checker = known if not extra else _both(known, extra[0])
        add_kernel(Kernel(name, backend, fn, checker, "library"))
        done.append(name)
    return done
