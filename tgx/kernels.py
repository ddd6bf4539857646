"""`tgx.register_kernel`: write a kernel once, and every compiled model that contains its
pattern can use it.

A *pattern* is a plain function written with `tgx.numpy` / `tgx.nn`, traced over example
`Spec`s (symbolic dims match any size). Wherever a compiled function contains it — in any
equivalent form: other variable names, commutative operands either way round, inside the
decomposition of a composite — the patterns stage (`tgx.planning.kernel_patterns`) turns the
occurrence into one equation whose candidates are the registered kernels and the op-by-op
form; the selection takes the kernel only where it is faster, measured or modelled, like any
other kernel. A kernel is checked against the float64 NumPy evaluation of its pattern when it
is registered and again, per shape, before it is first offered: one that computes something
else is refused with the numbers.

>>> import numpy as np, tgx, tgx.numpy as tnp
>>> def scaled_tanh(x, s):
...     return tnp.tanh(x) * s
>>> def fast_scaled_tanh(x, s):               # numpy arrays in, a numpy array out
...     return np.tanh(x, out=np.empty_like(x)).__imul__(s)
>>> k = tgx.register_kernel(scaled_tanh, fast_scaled_tanh, specs=(tgx.Spec(("N",)), tgx.Spec(())))
>>> f = tgx.compile(lambda a, b: tnp.tanh(a) * b + 1.0, backends=["numpy"], store=False)
>>> x = np.ones(3, np.float32)
>>> print(f.lower(x, np.float32(2)).kernels[0])
scaled_tanh@numpy
>>> tgx.unregister_kernel(k)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from .backends import backend_available, check_backends, load_backend
from .backends.registry import Kernel, add_kernel, all_kernels, remove_kernel
from .core import PRIMITIVES, Eqn, Graph, Params
from .errors import KernelError, TgxError
from .graph.pattern import as_pattern, param_wildcards
from .planning.kernel_patterns import verify_kernel
from .primitives.fused import fused_p
from .shapes import Spec


def register_kernel(pattern: Callable | Graph | str, impl: Callable | None = None, *,
                    specs: Sequence[Spec] = (), backend: str = "numpy",
                    checker: Callable | None = None, name: str | None = None,
                    variant: str = "default", params: Sequence[str] = ()) -> Any:
    """Register `impl` as a kernel of `pattern` on `backend`; without `impl`, a decorator.

    - `pattern`: a function of arrays written with `tgx.numpy` / `tgx.nn` (traced over
      `specs`, one `tgx.Spec` per argument), an already traced `Graph`, or the name of a
      primitive (a kernel for that one primitive).
    - `impl(*inputs)`: the pattern's inputs, in order, as arrays of `backend` (NumPy arrays
      for "numpy" — numba kernels are NumPy kernels —, tensors for "torch", jax arrays for
      "jax"); returns the pattern's output(s) with the same dtypes.
    - `checker(*avals) -> None | str`: declines an occurrence (returns the reason) that
      `impl` cannot run, e.g. a dtype it does not handle.
    - `name`: what plans call the pattern (default: the pattern function's name); kernels
      registered under one name on several backends compete with each other.
    - `variant`: to register a second kernel of one name on one backend.
    - `params`: names of the pattern's equation params that match any value (e.g. "eps" of
      `tnn.rms_norm`: one kernel for every model's epsilon); `impl` receives each as a
      keyword argument. Other params match only the value the pattern was traced with.

    Returns the `Kernel` (the decorator returns `impl` itself); `unregister_kernel` removes
    it. Raises `KernelError` when `impl` does not compute the pattern at the example specs
    (symbolic dims at 64), checked on random inputs against the float64 NumPy evaluation.

    >>> import numpy as np, tgx, tgx.numpy as tnp
    >>> @tgx.register_kernel(lambda x: tnp.exp(x) - 1.0, specs=(tgx.Spec(("N",)),),
    ...                      name="expm1_pattern")
    ... def expm1(x):
    ...     return np.expm1(x)
    >>> tgx.unregister_kernel("expm1_pattern")
    """
    if impl is None:
        def deco(fn: Callable) -> Callable:
            register_kernel(pattern, fn, specs=specs, backend=backend, checker=checker,
                            name=name, variant=variant, params=params)
            return fn
        return deco
    check_backends([backend])
    if backend_available(backend):
        load_backend(backend)  # its own kernels first: a clash is then this call's error
    check = None if checker is None else (lambda avals, params: checker(*avals))
    if isinstance(pattern, str):
        return add_kernel(Kernel(pattern, backend, impl, check, variant))
    graph = traced = as_pattern(pattern, tuple(specs))
    unknown = set(params) - {k for e in graph.eqns for k in e.params}
    if unknown:
        raise TgxError(f"register_kernel: params {sorted(unknown)} are not params of any "
                       f"equation of the pattern")
    if params:
        graph = param_wildcards(graph, params)
    if not graph.eqns:
        raise TgxError("register_kernel: the pattern computes nothing (no equations)")
    name = name or getattr(pattern, "__name__", None)
    if not name or name == "<lambda>":
        raise TgxError("register_kernel: a pattern given as a lambda (or a Graph) needs name=")
    if name in PRIMITIVES:
        raise TgxError(f"register_kernel: {name!r} is the name of a primitive; give the "
                       f"pattern another name= (or register a kernel for the primitive by "
                       f"passing its name as the pattern)")
    kernel = add_kernel(Kernel(name, backend, impl, check, variant, pattern=graph))
    if backend_available(backend):  # checked on the pattern as traced (wildcards bound)
        eqn = Eqn(fused_p, tuple(graph.invars), tuple(graph.outvars),
                  Params(graph=traced, name=name, kernel_params=tuple(sorted(
                      (k, v) for e in traced.eqns for k, v in e.params.items()
                      if k in params))))
        reason = kernel.check([v.aval for v in graph.invars], {}) or \
            verify_kernel(kernel, eqn)
        if reason is not None:
            remove_kernel(name, backend, variant)
            raise KernelError(f"register_kernel: {kernel!r} does not compute its pattern "
                              f"{name}: it {reason}")
    return kernel


def unregister_kernel(kernel: Kernel | str, backend: str | None = None,
                      variant: str | None = None) -> None:
    """Remove a kernel `register_kernel` returned, or every kernel registered under a name
    (on `backend`, of `variant`, when given)."""
    if isinstance(kernel, Kernel):
        remove_kernel(kernel.name, kernel.backend, kernel.variant)
        return
    found = [k for k in all_kernels() if k.name == kernel
             and (backend is None or k.backend == backend)
             and (variant is None or k.variant == variant)]
    if not found:
        raise TgxError(f"unregister_kernel: no kernel named {kernel!r}"
                       + (f" on {backend}" if backend else ""))
    for k in found:
        remove_kernel(k.name, k.backend, k.variant)
