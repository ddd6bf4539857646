"""The kernel registry: every implementation of a primitive (or pattern) on one backend.

A kernel is a plain function `fn(*arrays, **params) -> array | list[array]` over the
backend's array type, registered with a checker that may decline an equation (dtype, shape,
device, library version) with a reason string. Lowering modules import primitives, never the
reverse; composite kernels are registered by primitive *name* and only when that primitive
exists, so backends do not depend on which composite families are loaded.

>>> from tgx.backends.registry import kernels_for
>>> import tgx.backends.numpy_backend  # registers the NumPy kernels
>>> sorted(k.variant for k in kernels_for("exp", "numpy"))
['default', 'out']
"""

from __future__ import annotations

import functools
import hashlib
import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..errors import TgxError
from .base import load_backend

Checker = Callable[[list, dict], "str | None"]


@dataclass(frozen=True)
class MethodCall:
    """A bound kernel that is the method `name` of its first argument, called with the rest
    and then `args`: `MethodCall("reshape", ((2, 3),))(x)` is `x.reshape((2, 3))`. The run
    function writes the method call itself (`v2 = v1.reshape(k3_0)`), so a view costs the
    library's method and no Python frame of tgx's: NumPy's reshape went from 1.07 us through
    the reference kernel and `np.reshape` to 0.16 us.

    >>> import numpy as np
    >>> MethodCall("transpose", ((1, 0),))(np.zeros((2, 3))).shape
    (3, 2)
    """

    name: str
    args: tuple = ()

    def __call__(self, x, *rest):
        return getattr(x, self.name)(*rest, *self.args)


def as_method(method: str, param: str) -> Callable:
    """A `Kernel.specialize` binding a one-operand view as the operand's `method` called
    with the value of its param `param` (`as_method("reshape", "new_sizes")`)."""
    return lambda params, out: MethodCall(method, (tuple(params[param]),))


@dataclass(frozen=True)
class Prepare:
    """A one-time conversion of a kernel's operand `operand` into the form the kernel reads
    (a weight held in bfloat16, or int8 with per-channel scales). Done once per bound weight
    (`tgx.compile(weights=)`), where the weight conversions to other backends are done; for
    an operand that is not a bound weight it would run on every call, so the selection offers
    such a kernel only where the operand is one. `label` names the held form in plans;
    `nbytes_ratio`: its size over the operand's."""

    operand: int
    fn: Callable
    label: str
    nbytes_ratio: float = 1.0


def source_hash(fn: Callable) -> str:
    """sha256 of the function's source (stable across runs; the store keys kernels by it)."""
    try:
        src = inspect.getsource(fn)
    except (OSError, TypeError):
        src = f"{getattr(fn, '__module__', '')}.{getattr(fn, '__qualname__', repr(fn))}"
    return hashlib.sha256(src.encode()).hexdigest()


class LazyForms:
    """A pattern kernel's forms (`Kernel.pattern`), traced on first use: tgx's own pattern
    library traced at import was ~0.25 s of a warm-store compile in a fresh process, which
    loads a measured plan and matches no pattern.

    >>> calls = []
    >>> lazy = LazyForms(lambda: calls.append(1) or ("form",))
    >>> len(calls)
    0
    >>> lazy.forms, lazy.forms, len(calls)
    (('form',), ('form',), 1)
    """

    def __init__(self, build: Callable[[], tuple]):
        self._build = build

    @functools.cached_property
    def forms(self) -> tuple:
        return tuple(self._build())


@dataclass(frozen=True)
class Kernel:
    """One implementation of primitive (or pattern) `name` on `backend`.

    - `checker(avals, params) -> None | reason`: None accepts, a string declines and says why.
    - `writes_out`: `fn` takes `out=` (a preallocated array of the output's shape and dtype in
      the backend's format) and writes the result there; the runtime passes workspace views.
    - `inplace_ok`: with `writes_out`, `out` may alias the first input (elementwise kernels).
    - `returns_view`: the result may share memory with an input (reshape, transpose …), so the
      buffer planner keeps the input's storage alive as long as the result.
    - `prepare`: `Prepare`s converting operands once (weights in a lower precision); `fn`
      receives the prepared forms.
    - `lossy`: the kernel trades accuracy for speed (weights in a lower precision): its error
      relative to the output's largest magnitude, as it promises it (the profiler's pass
      criterion). Only chosen under `tolerance=`, and only when the whole plan's error on the
      caller's inputs stays within it (`tgx.compile`).
    - `own_pool`: the kernel runs on a thread pool of its own (numba's): a plan with such
      kernels runs with BLAS on one thread (`tgx.backends.threads`).
    - `outs_into`: `fn` also takes `outs={output position: array}` and writes those outputs
      into the given arrays, where an input may be one of them, read index for index before
      it is written (the loops generated for an elementwise region: an optimizer step writes
      its new parameters and moments into the state buffers, `tgx.lowering.state`).
    """

    name: str
    backend: str
    fn: Callable
    checker: Checker | None = None
    variant: str = "default"
    writes_out: bool = False
    inplace_ok: bool = False
    returns_view: bool = False
    pattern: Any = None
    source_hash: str = field(default="", compare=False)
    # specialize(params, out) -> fn(*arrays): a callable with the params (and, for `out=`
    # kernels, the output view) baked in, doing once what needs doing once (jax jits, a
    # matmul works out its operand permutations); None: functools.partial(fn, **params).
    specialize: Callable | None = field(default=None, compare=False)
    # False: the result's dtype may differ from the shape rule's (reference implementations of
    # composites); the runtime casts it.
    dtype_exact: bool = True
    prepare: tuple = field(default=(), compare=False)
    lossy: float | None = None
    own_pool: bool = False
    outs_into: bool = False

    def prepared(self, args: list) -> list:
        """`args` with the operands this kernel prepares converted (what the profiler times,
        and what the runtime does once per bound weight)."""
        args = list(args)
        for p in self.prepare:
            args[p.operand] = p.fn(args[p.operand])
        return args

    @property
    def forms(self) -> tuple:
        """The pattern graphs this kernel computes (`pattern` is one graph, or a tuple of
        forms of one computation: at several ranks, written several ways, or `LazyForms`)."""
        if self.pattern is None:
            return ()
        if isinstance(self.pattern, LazyForms):
            return self.pattern.forms
        return self.pattern if isinstance(self.pattern, tuple) else (self.pattern,)

    def pattern_params(self, params: dict) -> dict:
        """What a pattern kernel is called with besides the inputs: the values its occurrence
        binds to the pattern's wildcard params (the `fused` equation's `kernel_params`)."""
        return dict(params.get("kernel_params", ()))

    def check(self, avals: list, params: dict) -> str | None:
        """None when the kernel accepts the equation, else the reason it declines."""
        if self.checker is None:
            return None
        try:
            return self.checker(avals, params)
        except Exception as e:  # a crashing checker declines, with the reason
            return f"checker raised {type(e).__name__}: {e}"

    def bind(self, params: dict, out=None) -> Callable:
        """This kernel with its params (and `out=` view) baked in: what an instruction calls.
        A pattern kernel takes the matched inputs and its wildcard params
        (`pattern_params`), not its `fused` equation's body."""
        if self.pattern is not None:
            params = self.pattern_params(params)
        if self.specialize is not None:
            return self.specialize(params, out)
        if out is not None:
            return functools.partial(self.fn, out=out, **params)
        if not params:
            return self.fn
        return functools.partial(self.fn, **params)

    @property
    def label(self) -> str:
        """`name[variant]` (the store's implementation name)."""
        return self.name + ("" if self.variant == "default" else f"[{self.variant}]")

    def __repr__(self) -> str:
        return f"{self.label}@{self.backend}"


_KERNELS: dict[tuple[str, str], list[Kernel]] = {}
# bumped at each change of `_KERNELS`: what is derived from the registry is cached under it
_GENERATION = [0]
# backend -> fn(name) registering kernels for a primitive declared after the backend loaded
# (NumPy wraps every primitive's reference implementation this way).
_LATE: dict[str, Callable[[str], None]] = {}


def register_kernel(name: str, backend: str, *, checker: Checker | None = None,
                    variant: str = "default", writes_out: bool = False,
                    inplace_ok: bool = False, returns_view: bool = False,
                    pattern: Any = None, specialize: Callable | None = None,
                    prepare: tuple = (), lossy: float | None = None,
                    own_pool: bool = False) -> Callable[[Callable], Callable]:
    """Decorator: register `fn` as kernel `variant` of `name` on `backend`.

    Registering the same (name, backend, variant) twice is an error.

    >>> @register_kernel("my_demo_op", "numpy")
    ... def _k(x):
    ...     return x
    >>> kernels_for("my_demo_op", "numpy")[0].variant
    'default'
    >>> register_kernel("my_demo_op", "numpy")(lambda x: x)
    Traceback (most recent call last):
    ...
    tgx.errors.TgxError: kernel my_demo_op@numpy (variant 'default') is registered twice
    """

    def deco(fn: Callable) -> Callable:
        add_kernel(Kernel(name, backend, fn, checker, variant, writes_out, inplace_ok,
                          returns_view, pattern, "", specialize, prepare=tuple(prepare),
                          lossy=lossy, own_pool=own_pool))
        return fn

    return deco


def add_kernel(kernel: Kernel) -> Kernel:
    """Register an already built `Kernel` (for kernels made by factories)."""
    ks = _KERNELS.setdefault((kernel.name, kernel.backend), [])
    if any(k.variant == kernel.variant for k in ks):
        raise TgxError(f"kernel {kernel.name}@{kernel.backend} (variant {kernel.variant!r}) is "
                       f"registered twice")
    if not kernel.source_hash:
        # what the kernel computes: its function and the conversions of its operands
        h = source_hash(kernel.fn)
        if kernel.prepare:
            h = hashlib.sha256("".join([h, *(source_hash(p.fn) for p in kernel.prepare)])
                               .encode()).hexdigest()
        kernel = Kernel(**{**kernel.__dict__, "source_hash": h})
    ks.append(kernel)
    _GENERATION[0] += 1
    return kernel


def generation() -> int:
    """A number that changes whenever a kernel is registered or removed (a cache of what the
    registry offers keys by it)."""
    return _GENERATION[0]


def matmul_layout_reason(avals: list, params: dict) -> str | None:
    """Why a dot_general is not a batched matmul of (possibly transposed) operands — the
    layouts `matmul(out=)` kernels run, with `matmul_transposes` — or None when it is."""
    (lc, rc), (lb, rb) = params["dimension_numbers"]
    nb = len(lb)
    if avals[0].ndim != nb + 2 or avals[1].ndim != nb + 2:
        return "out= matmul needs one free dim per operand"
    if len(lc) != 1 or len(rc) != 1:
        return "out= matmul contracts one axis"
    return None


@functools.cache  # on every call of an out= matmul: its cost is the hot loop's
def matmul_permutations(dimension_numbers) -> tuple:
    """How to permute the operands of a dot_general accepted by `matmul_layout_reason` (a
    view, or None when already so) into `(batch..., M, K) @ (batch..., K, N)`: `simplify`
    folds transposes into the dot_general, and the matmul takes them back as strided views.

    >>> matmul_permutations((((1,), (0,)), ((), ())))
    (None, None)
    >>> matmul_permutations((((2,), (0,)), ((0,), (1,))))
    (None, (1, 0, 2))
    """
    (lc, rc), (lb, rb) = dimension_numbers
    ndim = len(lb) + 2

    def perm(batch, first, last):
        free = next(i for i in range(ndim) if i not in batch and i not in first + last)
        p = (*batch, *first, free, *last) if not first else (*batch, *first, free)
        return None if p == tuple(range(ndim)) else p

    return perm(lb, (), lc), perm(rb, rc, ())


def remove_kernel(name: str, backend: str, variant: str = "default") -> None:
    """Unregister a kernel (for experiments and tests that must leave the registry as found)."""
    ks = _KERNELS.get((name, backend), [])
    kept = [k for k in ks if k.variant != variant]
    if len(kept) == len(ks):
        raise TgxError(f"no kernel {name}@{backend} (variant {variant!r}) to remove")
    _KERNELS[(name, backend)] = kept
    _GENERATION[0] += 1


def kernels_for(name: str, backend: str) -> list[Kernel]:
    """Every kernel registered for primitive `name` on `backend` (loads that backend)."""
    load_backend(backend)
    ks = _KERNELS.get((name, backend))
    if ks is None and backend in _LATE:
        _LATE[backend](name)
        ks = _KERNELS.get((name, backend))
    return list(ks or ())


def on_missing(backend: str, fn: Callable[[str], None]) -> None:
    """Let `backend` register kernels for primitives declared after it was loaded."""
    _LATE[backend] = fn


def all_kernels() -> list[Kernel]:
    """Every kernel of the backends loaded so far."""
    return [k for ks in _KERNELS.values() for k in ks]
