"""`Backend`: everything tgx knows about one kernel library, in one object.

A backend is a library over an array format (NumPy, torch, jax, …). Its module subclasses
`Backend`, sets the traits below, registers its kernels (`tgx.backends.registry`) and ends with
`BACKEND = TheBackend()`; planning, lowering and the runtime ask the object, never the name.
Conversions go through the host format (NumPy) unless a backend offers a direct route
(`from_foreign`, e.g. DLPack between torch and jax).

>>> b = get_backend("numpy")
>>> b.host, b.value_device("cuda:0"), b.device_reason("cpu") is None
(True, 'cpu', True)
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..devices import HOST, Device
from ..errors import KernelError, Unsupported


class Backend:
    """One kernel library; subclass it and override what differs from these defaults."""

    #: the name kernels are registered under and plans print
    name: str = ""
    #: the package that must import for the backend to be available
    library: str = ""
    #: HEURISTIC's order when several backends are allowed: the lowest is the *primary*
    #: (given again at registration, so choosing needs no import of the library)
    preference: int = 50
    #: graph inputs arrive and outputs leave in this backend's format (NumPy; exactly one)
    host: bool = False
    #: runs on the host only (its equations of a GPU plan stay on the host)
    host_only: bool = False
    #: consecutive equations of a plan lower to one compiled call (`region`)
    fuses_regions: bool = False
    #: `out=` kernels may write into views of tgx's host workspace
    writes_workspace: bool = False
    #: a kernel allocating its result pays a pass over it when the selection chooses among
    #: this backend's kernels (`CostModel.fresh_output_s`): measured on torch; on NumPy it
    #: tipped 64-row GEMMs to the slow reference `linear` (the demo's NumPy plan 0.70 ->
    #: 1.08 ms), whose figures are close to BLAS's at those sizes
    prices_fresh_outputs: bool = False
    #: a call may return before it has read its host inputs (asynchronous dispatch): a state
    #: buffer it reads cannot be overwritten in place right after
    reads_host_async: bool = False
    #: per-call overhead (s), bandwidth (B/s), peak (flop/s): the cost model's roofline guess
    #: where nothing is measured (`tgx.planning.cost_model.calibrate` measures overheads)
    cost: tuple[float, float, float] = (1e-5, 5e9, 1e10)
    #: copying a value *into* this backend from backend `src`: (overhead s, bandwidth B/s,
    #: or None when the copy shares memory); other sources cost `DEFAULT_TRANSFER`
    transfer_in: Mapping[str, tuple[float, float | None]] = {}
    #: thread-pool contention (s) when work moves to this backend right after `src`'s
    switch_in: Mapping[str, float] = {}
    #: ... when the equation that follows does not wake the pool `switch_in` prices
    #: (`wakes_pool`)
    switch_in_light: Mapping[str, float] = {}
    #: primitive name → `fn(buffer, update, *index)` writing an update into a state buffer
    #: in place (`tgx.compile(state=)`); empty where arrays are immutable
    inplace: Mapping[str, Callable] = {}

    #: for `fuses_regions`: what a value a region returns costs (its result array made, and
    #: an argument passed where another region reads it)
    region_value_s: float = 0.0

    DEFAULT_TRANSFER = (1e-5, 5e9)

    # -- devices ------------------------------------------------------------------------------
    def device_reason(self, device: str | Device) -> str | None:
        """Why this backend cannot run kernels on `device`, or None when it can."""
        dev = Device.parse(device)
        if dev.is_host:
            return None
        if self.host_only:
            return f"{self.name} runs on the host (cpu) only"
        return f"backend {self.name!r} does not run on {dev}"

    def value_device(self, device: str) -> str:
        """Where this backend's values live in a plan whose device backends run on `device`."""
        return HOST if self.host_only else device

    def zero_copy_from_host(self, device: str) -> bool:
        """Whether converting a host (NumPy) array to this backend on `device` shares memory."""
        return False

    # -- arrays ---------------------------------------------------------------------------------
    def wakes_pool(self, eqn, kernel=None) -> bool:
        """Whether `eqn` run by `kernel` (None: a decomposition) wakes the thread pool that
        `switch_in` prices, so that it pays `switch_in` after another backend's work, and
        `switch_in_light` otherwise. Every equation here; NumPy's BLAS products only."""
        return True

    def is_array(self, x: Any) -> bool:
        """Whether `x` is an array of this backend's format."""
        return False

    def to_host(self, x: Any) -> np.ndarray:
        """`x` (an array of this backend) as a NumPy array, sharing memory where possible."""
        return np.asarray(x)

    def start_to_host(self, xs: list) -> None:
        """Start copying arrays `xs` of this backend to the host, all at once, so that the
        `to_host` calls that follow wait once rather than once per array (the default: nothing
        to start)."""

    def host_view(self, x: Any) -> np.ndarray | None:
        """A writable NumPy array sharing `x`'s memory, or None (immutable arrays, other
        devices): what state buffers of this backend need."""
        return None

    def from_host(self, x: np.ndarray, device: str = HOST) -> Any:
        """A NumPy array as this backend's array on `device`."""
        raise Unsupported(f"backend {self.name!r} has no from_host")

    def host_alias(self, x: np.ndarray) -> Any | None:
        """An array of this backend sharing `x`'s memory, which its kernels read afresh at
        every call (so it stays `x` as `x` changes), or None where there is none. The
        runtime makes one per NumPy argument object passed again and again."""
        return None

    def from_foreign(self, x: Any, device: str = HOST) -> Any | None:
        """`x`, an array of another backend, converted directly (DLPack …), or None to go
        through the host format."""
        return None

    def move(self, x: Any, device: str) -> Any:
        """`x` (an array of this backend) on `device`."""
        return x

    def convert(self, x: Any, device: str = HOST) -> Any:
        """`x`, an array of any backend or a NumPy array, as this backend's array on
        `device` (zero-copy where the libraries allow)."""
        if self.is_array(x):
            return self.move(x, device)
        if type(x) is not np.ndarray:
            direct = self.from_foreign(x, device)
            if direct is not None:
                return direct
            x = to_host(x)
        return self.from_host(x, device)

    def workspace_view(self, view: np.ndarray) -> Any:
        """`view` (a slice of the host workspace) in this backend's format, sharing memory."""
        return self.from_host(view)

    def empty(self, shape: tuple, dtype: np.dtype, like: Any = None) -> Any:
        """A fresh array for an `out=` kernel outside the workspace (on `like`'s device)."""
        return self.from_host(np.empty(shape, dtype))

    def sync_fn(self, device: str | None = None) -> Callable[[Any], None] | None:
        """For timing: a function `sync(result)` that waits for the asynchronous work
        producing `result` on `device` (None: wherever this backend runs now), or None when
        its calls return only once the work is done."""
        return None

    def region(self, steps: list, in_ids: list, out_ids: list) -> Callable:
        """For `fuses_regions`: one callable running `steps` — (fn, params, eqn) each, in
        order — on the values of `in_ids`, returning those of `out_ids`."""
        raise Unsupported(f"backend {self.name!r} does not fuse regions")

    def region_takes_host(self, device: str) -> bool:
        """For `fuses_regions`: whether a region running on `device` accepts host (NumPy)
        arrays as inputs and moves them itself, so the lowering passes them straight in
        instead of copying each one beforehand."""
        return False

    def __repr__(self) -> str:
        return f"<Backend {self.name}>"


# -- the registry: the one place backends are known -----------------------------------------------

@dataclass(frozen=True)
class BackendSpec:
    """How to find a backend before loading it: the package it needs, the module defining
    it (None for a backend registered as an object), and the top-level modules whose array
    types it owns (so `to_host` can load it for an array it has never seen)."""

    name: str
    library: str
    module: str | None
    array_modules: tuple[str, ...]
    preference: int = 50


_SPECS: dict[str, BackendSpec] = {}
_LOADED: dict[str, Backend] = {}
_FAILED: dict[str, str] = {}


def register_backend(backend: str | Backend, *, library: str | None = None,
                     module: str | None = None, array_modules: tuple[str, ...] = (),
                     preference: int | None = None) -> None:
    """Make a backend known: by name, with the module that defines it (loaded on first use,
    so `import tgx` imports no torch or jax), or as a ready `Backend` object.

    >>> class Echo(Backend):
    ...     name, library = "echo-doc", "numpy"
    >>> register_backend(Echo()); get_backend("echo-doc").name
    'echo-doc'
    >>> unregister_backend("echo-doc")
    """
    if isinstance(backend, Backend):
        name = backend.name
        _LOADED[name] = backend
        library = backend.library or "numpy"
        preference = backend.preference if preference is None else preference
    else:
        name = backend
    if not name:
        raise KernelError("a backend needs a name")
    _OWNERS.clear()  # a type may belong to the new backend
    _SPECS[name] = BackendSpec(name, library or name, module,
                               tuple(array_modules) or (library or name,),
                               Backend.preference if preference is None else preference)
    _FAILED.pop(name, None)


def unregister_backend(name: str) -> None:
    """Forget backend `name` (its kernels stay registered; for tests and experiments)."""
    _SPECS.pop(name, None)
    _LOADED.pop(name, None)
    _OWNERS.clear()
    _FAILED.pop(name, None)


def backend_available(name: str) -> bool:
    """Whether backend `name` is known and its library can be imported (does not import it)."""
    return unavailable_reason(name) is None


def unavailable_reason(name: str) -> str | None:
    """Why backend `name` cannot be used here, or None."""
    spec = _SPECS.get(name)
    if spec is None:
        return f"unknown backend {name!r} (known: {', '.join(_SPECS)})"
    if name in _FAILED:
        return _FAILED[name]
    if name not in _LOADED and importlib.util.find_spec(spec.library) is None:
        return f"backend {name!r} needs the {spec.library!r} package, which is not installed"
    return None


def available_backends() -> list[str]:
    """Names of the backends whose libraries are installed, in registration order."""
    return [b for b in _SPECS if backend_available(b)]


def get_backend(name: str) -> Backend:
    """The `Backend` object `name` (importing its module, which registers its kernels);
    `KernelError` naming the reason when it is unavailable."""
    b = _LOADED.get(name)
    if b is not None:
        return b
    reason = unavailable_reason(name)
    if reason is not None:
        raise KernelError(reason)
    try:
        mod = importlib.import_module(_SPECS[name].module)
    except ImportError as e:
        _FAILED[name] = f"backend {name!r} failed to import: {e}"
        raise KernelError(_FAILED[name]) from e
    b = _LOADED[name] = mod.BACKEND
    return b


load_backend = get_backend


def host_backend() -> Backend:
    """The backend whose arrays are the graph's inputs and outputs (NumPy)."""
    for name in _SPECS:
        if backend_available(name) and get_backend(name).host:
            return _LOADED[name]
    raise KernelError("no host backend is registered")


def host_name() -> str:
    """The name of `host_backend()`."""
    return host_backend().name


def primary_backend(backends) -> str:
    """The backend HEURISTIC prefers among `backends` (the lowest `preference`; known from
    the registration, so no library is imported to choose)."""
    return min(backends, key=preference)


def preference(name: str) -> int:
    """HEURISTIC's rank of backend `name` (lower first)."""
    return _SPECS[name].preference


def check_backends(backends=None, device: str = "cpu") -> list[str]:
    """The backends to plan with: `backends` after checking that each is installed (None:
    every available one). On a non-host `device` each backend that is not host-only must
    reach the device: an explicitly named one that cannot is a `KernelError` naming the device
    and why (``torch.cuda.is_available() is False``); by default those that cannot are left
    out, and an error is raised when none can.

    >>> check_backends(["numpy"])
    ['numpy']
    """
    if backends is None:
        out = available_backends()
    else:
        for b in backends:
            reason = unavailable_reason(b)
            if reason is not None:
                raise KernelError(reason)
        out = list(backends)
    dev = Device.parse(device)
    if dev.is_host:
        return out
    why = {b: get_backend(b).device_reason(dev) for b in out if not get_backend(b).host_only}
    bad = {b: r for b, r in why.items() if r is not None}
    if backends is not None and bad:
        raise KernelError(f"device {dev} is not available to "
                          + "; ".join(f"{b}: {r}" for b, r in bad.items()))
    if len(bad) == len(why):
        raise KernelError(f"device {dev} is not available: "
                          + ("; ".join(f"{b}: {r}" for b, r in bad.items()) if bad
                             else f"no backend of {out} runs on it")
                          + "".join(f" ({b} runs on the host only)" for b in out
                                    if get_backend(b).host_only))
    return [b for b in out if b not in bad]


def to_host(x: Any) -> np.ndarray:
    """`x`, an array of any backend (or a scalar, or a list), as a NumPy array (zero-copy
    from CPU torch and CPU jax)."""
    if type(x) is np.ndarray:
        return x
    b = _cached_owner(x)
    return b.to_host(x) if b is not None else np.asarray(x)


def to_callers_arrays(outs: list, inputs: Sequence, backend: Backend,
                      device: str = "cpu") -> list:
    """`outs`, each NumPy result that is not one of `inputs` converted into `backend`'s
    arrays on `device` (in place; returned): what `tgx.compile` hands back to a caller who
    passed `backend`'s arrays, and what explore times a plan with (a NumPy plan called with
    jax arrays pays a `device_put` per result; timed without it, it looked 8x faster).

    >>> to_callers_arrays([np.ones(1)], [], get_backend("numpy"))[0].tolist()
    [1.0]
    """
    ids = None
    for j, o in enumerate(outs):
        if type(o) is np.ndarray:
            if ids is None:
                ids = {id(x) for x in inputs}
            if id(o) not in ids:
                outs[j] = backend.convert(o, device)
    return outs


def start_to_host(xs: Sequence) -> None:
    """Start the copies of `xs` (arrays of any backend; NumPy's are skipped) to the host at
    once: each backend's `Backend.start_to_host` gets its own. On a GPU, 36 KV-cache leaves
    copied one synchronized `to_host` after another cost a wait each.

    >>> start_to_host([np.ones(2)])   # NumPy arrays are on the host already
    """
    by: dict = {}
    for x in xs:
        b = None if type(x) is np.ndarray else _cached_owner(x)
        if b is not None:
            by.setdefault(b, []).append(x)
    for b, arrays in by.items():
        b.start_to_host(arrays)


_UNSEEN = object()
#: array type -> the backend that owns it (None: NumPy converts it), filled by `to_host`
_OWNERS: dict[type, Backend | None] = {}


def _cached_owner(x: Any) -> Backend | None:
    """`_owner(x)`, looked up once per array type (on every copy back to the host: one dict
    lookup)."""
    b = _OWNERS.get(type(x), _UNSEEN)
    if b is _UNSEEN:
        b = _OWNERS[type(x)] = _owner(x)
    return b


def _owner(x: Any) -> Backend | None:
    """The backend owning `x`'s type: one named by the type's module (loaded for it), else
    any loaded backend that recognises it."""
    top = type(x).__module__.partition(".")[0]
    for spec in _SPECS.values():
        if top in spec.array_modules and backend_available(spec.name):
            b = get_backend(spec.name)
            if b.is_array(x):
                return b
    return backend_of(x)


def owning_backend(x: Any) -> Backend | None:
    """The backend whose array `x` is, loaded for it if need be (`backend_of` sees loaded
    backends only: a caller's first torch tensor comes before tgx loads torch), or None.

    >>> import numpy as np
    >>> owning_backend(np.ones(2)).name
    'numpy'
    """
    return _owner(x)


def backend_of(x: Any) -> Backend | None:
    """The loaded backend whose array type `x` is, or None."""
    for b in _LOADED.values():
        if b.is_array(x):
            return b
    return None
