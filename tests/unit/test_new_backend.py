"""A new backend is one module: this file defines a whole backend — a `Backend` subclass and
its kernels — and registers it; planning, lowering, the runtime, `tgx.paths` and the cost
model use it without a line changed elsewhere.

The "boxed" backend keeps its values in a `Box` around a NumPy array (so every conversion is
visible) and runs `exp`, `mul`, `add` and `copy_to`."""

from __future__ import annotations

import numpy as np
import pytest

import tgx
import tgx.numpy as tnp
from tgx.backends import Backend, register_backend, unregister_backend
from tgx.backends.registry import kernels_for, register_kernel, remove_kernel

NAME = "boxed"


class Box:
    """A value of the boxed backend."""

    def __init__(self, a):
        self.a = np.asarray(a)

    shape = property(lambda self: self.a.shape)
    dtype = property(lambda self: self.a.dtype)


class BoxedBackend(Backend):
    name, library = NAME, "numpy"
    preference = 5                       # HEURISTIC's primary when allowed
    cost = (2e-6, 8e9, 3e10)
    transfer_in = {"numpy": (1e-6, None)}

    def __init__(self):
        self.conversions = 0

    def is_array(self, x):
        return isinstance(x, Box)

    def to_host(self, x):
        return x.a

    def from_host(self, x, device="cpu"):
        self.conversions += 1
        return Box(x)


BACKEND = BoxedBackend()
KERNELS = {"exp": lambda x: Box(np.exp(x.a)), "mul": lambda x, y: Box(np.multiply(x.a, y.a)),
           "add": lambda x, y: Box(np.add(x.a, y.a))}


@pytest.fixture
def boxed():
    register_backend(BACKEND)
    for name, fn in KERNELS.items():
        register_kernel(name, NAME)(fn)
    register_kernel("copy_to", NAME)(lambda x, *, backend, device: BACKEND.convert(x, device))
    yield BACKEND
    for name in (*KERNELS, "copy_to"):
        remove_kernel(name, NAME)
    unregister_backend(NAME)


def f(x, y):
    return tnp.exp(x) * y + 1.0


def test_a_backend_in_one_module_plans_lowers_and_runs(boxed):
    n = 5000  # above HEURISTIC's tiny-tensor size, which stays on NumPy
    x, y = np.linspace(0, 1, n, dtype=np.float32), np.full(n, 2.0, np.float32)
    compiled = tgx.compile(f, policy="heuristic", backends=["numpy", NAME])
    np.testing.assert_allclose(compiled(x, y), np.exp(x) * y + 1, rtol=1e-6)
    plan = compiled.lower(x, y)
    work = {b for e, b in zip(plan.graph.eqns, plan.graph.backends)
            if e.primitive.name != "copy_to"}
    assert work == {NAME}
    assert boxed.conversions > 0
    # the other planners see it too: FASTEST prices it with its cost constants, paths count it
    fast = tgx.compile(f, policy="fastest", store=None, backends=[NAME]).lower(x, y)
    assert "boxed" in str(fast) and fast.predicted_s > 0
    np.testing.assert_allclose(fast.run(x, y), np.exp(x) * y + 1, rtol=1e-6)
    assert tgx.paths(f)(x, y, backends=["numpy", NAME]).count() > \
        tgx.paths(f)(x, y, backends=["numpy"]).count()


def test_unregistered_backend_is_a_clear_error(boxed):
    unregister_backend(NAME)
    with pytest.raises(tgx.KernelError, match="unknown backend 'boxed'"):
        tgx.compile(f, backends=[NAME])
    register_backend(BACKEND)
    assert kernels_for("exp", NAME)
