"""Backends: kernel libraries over an array format (`numpy`, `torch`, `jax`).

Each backend lives in its own module, which imports its library (lazily: `import tgx` never
imports torch or jax) and registers its kernels in `tgx.backends.registry`. A backend whose
library is not installed reports itself unavailable, with the reason.

>>> from tgx.backends import backend_available, available_backends
>>> backend_available("numpy")
True
>>> "numpy" in available_backends()
True
"""

from __future__ import annotations

import importlib
import importlib.util

from ..errors import KernelError

# name -> (library that must import, module registering the kernels)
BACKENDS: dict[str, tuple[str, str]] = {
    "numpy": ("numpy", "tgx.backends.numpy_backend"),
    "torch": ("torch", "tgx.backends.torch_backend"),
    "jax": ("jax", "tgx.backends.jax_backend"),
}

_LOADED: dict[str, object] = {}
_FAILED: dict[str, str] = {}


def backend_available(name: str) -> bool:
    """Whether backend `name` is known and its library can be imported (does not import it)."""
    if name not in BACKENDS or name in _FAILED:
        return False
    return importlib.util.find_spec(BACKENDS[name][0]) is not None


def unavailable_reason(name: str) -> str | None:
    if name not in BACKENDS:
        return f"unknown backend {name!r} (known: {', '.join(BACKENDS)})"
    if name in _FAILED:
        return _FAILED[name]
    if importlib.util.find_spec(BACKENDS[name][0]) is None:
        return f"backend {name!r} needs the {BACKENDS[name][0]!r} package, which is not installed"
    return None


def available_backends() -> list[str]:
    """Names of the backends whose libraries are installed, in preference order."""
    return [b for b in BACKENDS if backend_available(b)]


def load_backend(name: str):
    """Import backend `name`'s module (registering its kernels); KernelError if unavailable."""
    mod = _LOADED.get(name)
    if mod is not None:
        return mod
    reason = unavailable_reason(name)
    if reason is not None:
        raise KernelError(reason)
    try:
        mod = importlib.import_module(BACKENDS[name][1])
    except ImportError as e:
        _FAILED[name] = f"backend {name!r} failed to import: {e}"
        raise KernelError(_FAILED[name]) from e
    _LOADED[name] = mod
    return mod
