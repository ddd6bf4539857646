"""A kernel failing at run time raises `KernelError` naming the instruction, the kernel, the
equation with the user's file:line and the input shapes, the original exception chained."""

from __future__ import annotations

import numpy as np
import pytest

import tgx
import tgx.numpy as tnp
from tgx.backends.registry import Kernel
from tgx.lowering.lower import lower_assignment
from tgx.planning.assignment import Assignment
from tgx.planning.heuristic import heuristic_assignment
from tgx.planning.options import PlanOptions


def _boom(x):
    raise FloatingPointError("the kernel gave up")


def model(x):
    y = tnp.sin(x)
    return tnp.exp(y) * 2.0  # the failing line


def test_failing_kernel_names_instruction_equation_and_user_line():
    g = tgx.make_graph(model)(tgx.Spec((3, 4)))
    a = heuristic_assignment(g, ["numpy"])
    i = [e.primitive.name for e in a.graph.eqns].index("exp")
    kernels = list(a.kernels)
    kernels[i] = Kernel("exp", "numpy", _boom, variant="boom")
    plan = lower_assignment(Assignment(a.graph, a.backends, kernels), PlanOptions())
    with pytest.raises(tgx.KernelError) as info:
        plan.run(np.ones((3, 4), np.float32))
    msg = str(info.value)
    assert "kernel exp[boom]@numpy (instruction 1 of 3, on numpy) failed: " \
           "FloatingPointError: the kernel gave up" in msg
    assert "inputs: float32[3, 4]" in msg
    assert "while running c:f32[3,4] = exp b" in msg
    assert f"test_kernel_errors.py:{model.__code__.co_firstlineno + 2}" in msg
    assert isinstance(info.value.__cause__, FloatingPointError)
    assert isinstance(info.value, tgx.TgxError)


def test_a_failing_region_names_its_equations(monkeypatch):
    pytest.importorskip("jax")
    from tgx.backends import get_backend

    g = tgx.make_graph(model)(tgx.Spec((3, 4)))
    plan = lower_assignment(heuristic_assignment(g, ["jax"]), PlanOptions())
    x = np.ones((3, 4), np.float32)
    np.testing.assert_allclose(plan.run(x), np.exp(np.sin(x)) * 2, rtol=1e-6)
    # the same plan, lowered with a region compiler that fails when the region is called
    monkeypatch.setattr(get_backend("jax"), "region", lambda steps, ins, outs: _boom)
    plan = lower_assignment(heuristic_assignment(g, ["jax"]), PlanOptions())
    with pytest.raises(tgx.KernelError, match=r"(?s)kernel jax\.jit\[3 eqns: sin exp mul\].*"
                                              r"while running c:.*= sin b.*d:.*= exp c.*"
                                              r"e:.*= mul d"):
        plan.run(x)


def test_a_registered_kernel_failing_inside_compile_names_the_users_line(tmp_path):
    """The user-level path: a kernel registered with `tgx.register_kernel` that raises at one
    size, picked by `tgx.compile` for a model that never mentions it."""
    def fragile(x):
        if x.shape[0] == 3:
            raise FloatingPointError("fragile gave up at 3 rows")
        return np.expm1(x)

    kernel = tgx.register_kernel(lambda x: tnp.exp(x) - 1.0, fragile,
                                 specs=(tgx.Spec(("N",)),), name="fragile_expm1")
    try:
        def user_model(x):
            return (tnp.exp(x) - 1.0) * 3.0  # the pattern occurs here

        f = tgx.compile(user_model, backends=["numpy"], dynamic={"x": {0: "N"}},
                        store=tgx.BenchmarkStore(tmp_path / "s.json"))
        np.testing.assert_allclose(f(np.zeros(5, np.float32)), np.zeros(5))
        assert any("fragile_expm1" in i.label
                   for i in f.lower(np.zeros(5, np.float32)).compiled.instructions)
        with pytest.raises(tgx.KernelError) as info:
            f(np.zeros(3, np.float32))
        msg = str(info.value)
        assert "fragile_expm1" in msg and "fragile gave up at 3 rows" in msg
        assert "inputs: float32[3]" in msg
        assert f"test_kernel_errors.py:{user_model.__code__.co_firstlineno + 1}" in msg
        assert isinstance(info.value.__cause__, FloatingPointError)
    finally:
        tgx.unregister_kernel(kernel)
