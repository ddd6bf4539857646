"""Backends: kernel libraries over an array format (`numpy`, `torch`, `jax`), as objects.

Each backend is one module defining a `Backend` subclass (`base.py`: its traits, conversions,
devices, cost constants) and registering its kernels in `tgx.backends.registry`; the module is
imported on first use, so `import tgx` never imports torch or jax. A backend whose library is
not installed reports itself unavailable, with the reason. Nothing outside a backend's own
module branches on its name: the planner and the runtime ask `get_backend(name)`.

>>> from tgx.backends import backend_available, available_backends
>>> backend_available("numpy")
True
>>> "numpy" in available_backends()
True
"""

from __future__ import annotations

from .base import (
    _SPECS,  # noqa: F401 - the registered specs (store.environment reads them)
    Backend,
    BackendSpec,
    available_backends,
    backend_available,
    backend_of,
    check_backends,
    get_backend,
    host_backend,
    host_name,
    load_backend,
    owning_backend,
    preference,
    primary_backend,
    register_backend,
    start_to_host,
    to_callers_arrays,
    to_host,
    unavailable_reason,
    unregister_backend,
)

# The built-in backends, in the order `available_backends` lists them.
register_backend("numpy", library="numpy", module="tgx.backends.numpy_backend", preference=30)
register_backend("torch", library="torch", module="tgx.backends.torch_backend", preference=10)
register_backend("jax", library="jax", module="tgx.backends.jax_backend",
                 array_modules=("jax", "jaxlib"), preference=20)

__all__ = ["Backend", "BackendSpec", "available_backends", "backend_available", "backend_of",
           "check_backends", "get_backend", "host_backend", "host_name", "load_backend",
           "owning_backend", "preference", "primary_backend", "register_backend",
           "start_to_host", "to_callers_arrays", "to_host", "unavailable_reason",
           "unregister_backend"]
