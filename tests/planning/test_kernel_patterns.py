"""The patterns stage and `tgx.register_kernel`: a kernel written once for a pattern of atomic
ops is offered wherever the pattern occurs, checked against the pattern's float64 NumPy
evaluation first, and chosen only where the selection prices it lower than the op-by-op form."""

from __future__ import annotations

import warnings

import hypothesis.strategies as st
import numpy as np
import pytest
from hypothesis import given, settings

import tgx
import tgx.nn as tnn
import tgx.numpy as tnp
from tgx.planning import fastest
from tgx.planning.cost_model import CostModel, Estimate
from tgx.planning.kernel_patterns import match_patterns, pattern_name, verify_kernel

S = tgx.Spec


class Prices(CostModel):
    """Planted prices: a pattern kernel named in `pattern_s` costs that much; every other
    kernel `other_s` per equation (so the op-by-op form costs `other_s` times its length)."""

    def __init__(self, pattern_s: dict, other_s: float = 1e-5, transfer_s: float = 1.0):
        super().__init__()
        self.pattern_s, self.other_s, self.transfer_s = pattern_s, other_s, transfer_s

    def kernel(self, eqn, kernel, dims):
        if kernel.pattern is not None:
            return Estimate(self.pattern_s.get(kernel.name, 1.0), "measured", "planted")
        return Estimate(self.other_s, "measured", "planted")

    def transfer(self, aval, src, dst, dims):
        return Estimate(0.0 if src == dst else self.transfer_s, "cost model")


@pytest.fixture
def prices(monkeypatch):
    """`tgx.compile` under planted prices (FASTEST builds its cost model here)."""
    def plant(pattern_s, other_s=1e-5, transfer_s=1.0):
        monkeypatch.setattr(fastest, "CostModel",
                            lambda *a, **k: Prices(pattern_s, other_s, transfer_s))
    return plant


@pytest.fixture
def registered():
    """Kernels registered by a test, removed after it."""
    ks = []
    yield ks
    for k in ks:
        tgx.unregister_kernel(k)


def hand_rmsnorm(x, w):
    return x / tnp.sqrt(tnp.mean(x * x, axis=-1, keepdims=True) + 1e-6) * w


def ref_rmsnorm(x, w):
    x = x.astype(np.float64)
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + 1e-6) * w


def tanh_exp(a, b):       # a pattern tgx's library has no kernel for
    return tnp.tanh(a) * tnp.exp(b)


def ref_tanh_exp(a, b):
    return np.tanh(a.astype(np.float64)) * np.exp(b.astype(np.float64))


def tanh_exp_numpy(a, b):
    return np.tanh(a) * np.exp(b)


# -- the stage ------------------------------------------------------------------------------

def test_stage_turns_a_hand_written_rmsnorm_into_one_pattern_equation():
    g = tgx.make_graph(hand_rmsnorm)(S((4, 64)), S((64,)))
    g2 = match_patterns(g, ["numpy"])
    assert [pattern_name(e) for e in g2.eqns] == ["rms_norm_pattern"]
    assert len(g2.eqns[0].params["graph"].eqns) == len(g.eqns)
    cands = tgx.candidates(g2.eqns[0], ["numpy"])
    assert [c.kind for c in cands] == ["kernel", "decomposition"]  # the kernel, the ops
    x = np.random.default_rng(0).standard_normal((4, 64)).astype(np.float32)
    w = np.random.default_rng(1).standard_normal(64).astype(np.float32)
    np.testing.assert_allclose(tgx.eval_graph(g2, x, w), ref_rmsnorm(x, w), rtol=1e-5,
                               atol=1e-5)


def test_compile_prints_the_patterns_stage_and_options_turn_it_off():
    f = tgx.compile(hand_rmsnorm, policy="heuristic", backends=["numpy"])
    x, w = np.ones((2, 8), np.float32), np.ones(8, np.float32)
    plan = f.lower(x, w)
    assert "fused[name='rms_norm_pattern' eqns=7]" in str(plan.stages["patterns"])
    assert [repr(k) for k in plan.kernels] == ["rms_norm_pattern[rsqrt2d]@numpy"]
    off = tgx.compile(hand_rmsnorm, policy="heuristic", backends=["numpy"], patterns=False)
    assert len(off.lower(x, w).kernels) == 7


@settings(max_examples=15, deadline=None)
@given(rows=st.integers(1, 5), d=st.integers(1, 40), seed=st.integers(0, 2**16))
def test_chosen_pattern_kernel_matches_float64_reference(rows, d, seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, d)).astype(np.float32)
    w = rng.standard_normal(d).astype(np.float32)
    f = tgx.compile(hand_rmsnorm, policy="heuristic", backends=["numpy"], dynamic=False)
    assert any(k.pattern is not None for k in f.lower(x, w).kernels)
    np.testing.assert_allclose(f(x, w), ref_rmsnorm(x, w), rtol=2e-5, atol=2e-5)


@settings(max_examples=20, deadline=None)
@given(n=st.integers(1, 6), seed=st.integers(0, 2**16), swap=st.booleans())
def test_stage_preserves_semantics(n, seed, swap):
    """Whatever the stage rewrites, the graph computes the same (random expressions that
    contain the pattern, in either operand order, next to other ops)."""
    def f(x, w, y):
        r = hand_rmsnorm(x, w) if not swap else x / tnp.sqrt(
            1e-6 + tnp.mean(x * x, axis=-1, keepdims=True)) * w
        for _ in range(n % 3):
            r = tnp.exp(r * 0.1) + y
        return r, x * 2.0
    g = tgx.make_graph(f)(S(("N", 16)), S((16,)), S(("N", 16)))
    g2 = match_patterns(g, ["numpy"])
    assert sum(pattern_name(e) is not None for e in g2.eqns) == 1  # `add` commutes
    rng = np.random.default_rng(seed)
    args = [rng.standard_normal(s).astype(np.float32) for s in ((n, 16), (16,), (n, 16))]
    for a, b in zip(tgx.eval_graph(g2, *args), tgx.eval_graph(g, *args)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def test_selection_takes_the_kernel_only_where_it_is_cheaper(prices):
    x, w = np.ones((2, 8), np.float32), np.ones(8, np.float32)
    prices({"rms_norm_pattern": 1e-6})              # 1 µs against 7 ops of 10 µs
    cheap = tgx.compile(hand_rmsnorm, backends=["numpy"], store=None).lower(x, w)
    assert [k.name for k in cheap.kernels] == ["rms_norm_pattern"]
    prices({"rms_norm_pattern": 1e-3})              # 1 ms: the ops win
    dear = tgx.compile(hand_rmsnorm, backends=["numpy"], store=None).lower(x, w)
    assert len(dear.kernels) == 7 and all(k.pattern is None for k in dear.kernels)
    np.testing.assert_allclose(cheap(x, w), dear(x, w), rtol=1e-6)


def test_pattern_found_inside_a_composites_decomposition(prices):
    """`tnn.rms_norm` is one equation; its decomposition holds the pattern. With its own
    kernels priced out, the selection goes into the decomposition and takes the pattern."""
    def model(x, w):
        return tnn.rms_norm(x, (16,), w, eps=1e-6)
    x = np.random.default_rng(0).standard_normal((3, 16)).astype(np.float32)
    w = np.random.default_rng(1).standard_normal(16).astype(np.float32)
    prices({"rms_norm_pattern": 1e-7}, other_s=1e-4)
    plan = tgx.compile(model, backends=["numpy"], store=None).lower(x, w)
    assert [k.name for k in plan.kernels] == ["rms_norm_pattern"]
    np.testing.assert_allclose(plan(x, w), ref_rmsnorm(x, w), rtol=1e-5, atol=1e-5)


# -- tgx.register_kernel ----------------------------------------------------------------------

def test_registered_kernel_is_used_in_a_model_that_never_mentions_it(registered, prices):
    registered.append(tgx.register_kernel(tanh_exp, tanh_exp_numpy,
                                          specs=(S(("N", "F")), S(("N", "F")))))

    def mlp(x, wg, wu):      # the user's model: operands the other way round
        return tnp.multiply(tnp.exp(tnn.linear(x, wu)), tnp.tanh(tnn.linear(x, wg)))
    rng = np.random.default_rng(0)
    x, wg, wu = (rng.standard_normal(s).astype(np.float32) for s in ((4, 8), (12, 8), (12, 8)))
    prices({"tanh_exp": 1e-7})
    plan = tgx.compile(mlp, backends=["numpy"], store=None).lower(x, wg, wu)
    assert "tanh_exp" in [k.name for k in plan.kernels]
    want = ref_tanh_exp(x.astype(np.float64) @ wg.T, x.astype(np.float64) @ wu.T)
    np.testing.assert_allclose(plan(x, wg, wu), want, rtol=1e-4, atol=1e-5)


def test_decorator_form_and_unregister(registered):
    @tgx.register_kernel(tanh_exp, specs=(S(("N",)), S(("N",))), name="tanh_exp_1d")
    def gate(a, b):
        return tanh_exp_numpy(a, b)
    assert callable(gate) and gate.__name__ == "gate"
    g = tgx.make_graph(tanh_exp)(S((5,)), S((5,)))
    assert [pattern_name(e) for e in match_patterns(g, ["numpy"]).eqns] == ["tanh_exp_1d"]
    tgx.unregister_kernel("tanh_exp_1d")
    assert all(pattern_name(e) is None for e in match_patterns(g, ["numpy"]).eqns)
    with pytest.raises(tgx.TgxError, match="no kernel named 'tanh_exp_1d'"):
        tgx.unregister_kernel("tanh_exp_1d")


def test_kernel_that_computes_something_else_is_refused_at_registration():
    def wrong(a, b):
        return (a * b).astype(a.dtype)           # forgot the tanh and the exp
    with pytest.raises(tgx.KernelError, match=r"tanh_exp@numpy does not compute its pattern.*"
                                              r"elements outside"):
        tgx.register_kernel(tanh_exp, wrong, specs=(S(("N",)), S(("N",))))
    g = tgx.make_graph(tanh_exp)(S((5,)), S((5,)))   # and it was not left registered
    assert all(pattern_name(e) is None for e in match_patterns(g, ["numpy"]).eqns)


def test_wrong_dtype_and_crashing_kernels_are_refused():
    with pytest.raises(tgx.KernelError, match="returned float64 for output 0"):
        tgx.register_kernel(tanh_exp, lambda a, b: ref_tanh_exp(a, b),
                            specs=(S(("N",)), S(("N",))))
    with pytest.raises(tgx.KernelError, match="raised ZeroDivisionError"):
        tgx.register_kernel(tanh_exp, lambda a, b: 1 / 0, specs=(S(("N",)), S(("N",))))


def test_kernel_wrong_at_other_shapes_is_declined_there_with_a_warning(registered, prices):
    """Right at the example shape (N=64 for a symbolic N), wrong beyond 64 elements: checked
    per shape before it is offered, so that occurrence runs op by op, and tgx says why."""
    def short_only(a, b):
        out = tanh_exp_numpy(a, b)
        out[64:] = 0.0
        return out
    registered.append(tgx.register_kernel(tanh_exp, short_only, specs=(S(("N",)), S(("N",)))))
    prices({"tanh_exp": 1e-7})
    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal(20).astype(np.float32) for _ in range(2))
    c, d = (rng.standard_normal(100).astype(np.float32) for _ in range(2))
    f = tgx.compile(lambda a, b, c, d: (tanh_exp(a, b), tanh_exp(c, d)), backends=["numpy"],
                    store=None)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        plan = f.lower(a, b, c, d)
    assert [k.name for k in plan.kernels].count("tanh_exp") == 1   # the 20-element one
    assert any("tanh_exp@numpy is not used" in str(x.message) for x in w)
    y1, y2 = plan(a, b, c, d)
    np.testing.assert_allclose(y1, ref_tanh_exp(a, b), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(y2, ref_tanh_exp(c, d), rtol=1e-5, atol=1e-6)


def test_checker_declines_an_occurrence(registered):
    registered.append(tgx.register_kernel(
        tanh_exp, tanh_exp_numpy, specs=(S(("N",)), S(("N",))),
        checker=lambda a, b: None if a.shape[0] != 7 else "7 is unlucky"))
    g7 = tgx.make_graph(tanh_exp)(S((7,)), S((7,)))
    g8 = tgx.make_graph(tanh_exp)(S((8,)), S((8,)))
    assert pattern_name(match_patterns(g7, ["numpy"]).eqns[0]) is None
    assert pattern_name(match_patterns(g8, ["numpy"]).eqns[0]) == "tanh_exp"


def test_registration_errors():
    with pytest.raises(tgx.TgxError, match="needs name="):
        tgx.register_kernel(lambda x: tnp.exp(x), np.exp, specs=(S((3,)),))
    with pytest.raises(tgx.TgxError, match="needs example Specs"):
        tgx.register_kernel(tanh_exp, tanh_exp_numpy)


def test_a_kernel_for_one_primitive(registered):
    calls = []

    def my_exp(x):
        calls.append(x.shape)
        return np.exp(x)
    registered.append(tgx.register_kernel("exp", my_exp, variant="mine"))
    assert any(c.kernel.fn is my_exp for c in
               tgx.candidates(tgx.make_graph(tnp.exp)(S((3,))).eqns[0], ["numpy"]))


@pytest.mark.parametrize("backend", ["torch", "jax"])
def test_pattern_kernels_on_torch_and_jax(backend, registered, prices):
    pytest.importorskip(backend)
    if backend == "torch":
        import torch

        def impl(a, b):
            return torch.tanh(a) * torch.exp(b)
    else:
        import jax

        def impl(a, b):
            return jax.numpy.tanh(a) * jax.numpy.exp(b)
    registered.append(tgx.register_kernel(tanh_exp, impl, backend=backend,
                                          specs=(S(("N",)), S(("N",)))))
    prices({"tanh_exp": 1e-7}, transfer_s=1e-9)
    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal(33).astype(np.float32) for _ in range(2))
    plan = tgx.compile(lambda a, b: tanh_exp(a, b) + 1.0, backends=["numpy", backend],
                       store=None).lower(a, b)
    assert f"tanh_exp@{backend}" in [repr(k) for k in plan.kernels]
    np.testing.assert_allclose(plan(a, b), ref_tanh_exp(a, b) + 1, rtol=1e-5, atol=1e-5)


def test_verify_kernel_reports_numbers():
    from tgx.backends.registry import Kernel
    from tgx.core import Eqn, Params
    from tgx.primitives.fused import fused_p
    g = tgx.make_graph(tanh_exp)(S((16,)), S((16,)))
    eqn = Eqn(fused_p, tuple(g.invars), tuple(g.outvars), Params(graph=g, name="x"))
    k = Kernel("x", "numpy", lambda a, b: (a * b).astype(np.float32), pattern=g)
    assert "worst got" in verify_kernel(k, eqn)
    ok = Kernel("x", "numpy", tanh_exp_numpy, pattern=g)
    assert verify_kernel(ok, eqn) is None


def test_wildcard_params_serve_every_value(registered, prices):
    """A kernel for `tnn.rms_norm` with `params=("eps",)` runs models with any epsilon and
    receives each model's value."""
    seen = []

    def rms(x, w, *, eps):
        seen.append(eps)
        y = x.astype(np.float64)
        return (y / np.sqrt(np.mean(y * y, -1, keepdims=True) + eps) * w).astype(x.dtype)
    registered.append(tgx.register_kernel(
        lambda x, w: tnn.rms_norm(x, ("D",), w, eps=1e-6), rms, name="my_rms",
        specs=(S(("N", "D")), S(("D",))), params=("eps",)))
    prices({"my_rms": 1e-7})
    rng = np.random.default_rng(0)
    x, w = rng.standard_normal((3, 8)).astype(np.float32), np.ones(8, np.float32)
    for eps in (1e-5, 0.5):
        seen.clear()
        plan = tgx.compile(lambda x, w, eps=eps: tnn.rms_norm(x, (8,), w, eps=eps),
                           backends=["numpy"], store=None).lower(x, w)
        assert [k.name for k in plan.kernels] == ["my_rms"]
        assert f"eps={eps}" in str(plan.stages["patterns"])
        y = plan(x, w)
        assert seen[-1] == eps
        x64 = x.astype(np.float64)
        np.testing.assert_allclose(y, x64 / np.sqrt(np.mean(x64 ** 2, -1, keepdims=True) + eps),
                                   rtol=1e-5)
    with pytest.raises(tgx.TgxError, match=r"\['epsilon'\] are not params"):
        tgx.register_kernel(lambda x: tnn.rms_norm(x, (4,)), rms, name="bad",
                            specs=(S((2, 4)),), params=("epsilon",))


def test_explain_lists_choices_alternatives_and_the_op_by_op_form(registered):
    registered.append(tgx.register_kernel(
        tanh_exp, tanh_exp_numpy, specs=(S(("N",)), S(("N",))),
        checker=lambda a, b: None if a.shape[0] != 7 else "7 is unlucky"))
    x = np.ones(5, np.float32)
    plan = tgx.compile(lambda a, b, c: (tanh_exp(a, b), tnp.exp(c)), backends=["numpy"],
                       store=None).lower(x, x, x)
    text = plan.explain()
    assert "tanh_exp: tanh_exp@numpy" in text                 # what runs, with its figure
    assert "exp: exp[out]@numpy" in text and "exp@numpy: " in text   # an alternative
    assert "tanh_exp ×1, inputs f32[5], f32[5]" in text
    assert "tanh_exp@numpy: " in text and "— in the plan" in text
    assert "op by op on numpy (3 eqns)" in text
    seven = tgx.compile(tanh_exp, backends=["numpy"], store=None).lower(
        np.ones(7, np.float32), np.ones(7, np.float32))
    assert "tanh_exp" not in seven.explain()                  # declined: never an occurrence


def test_a_pattern_named_like_a_primitive_is_refused_and_never_offered_to_plain_ops():
    with pytest.raises(tgx.TgxError, match="'softmax' is the name of a primitive"):
        tgx.register_kernel(lambda x: tnn.softmax(x, axis=-1), lambda x: x, name="softmax",
                            specs=(S(("N", "D")),))
    cands = tgx.candidates(tgx.make_graph(lambda x: tnn.softmax(x, axis=0))(S((3, 4))).eqns[0],
                           ["numpy"])
    assert all(c.kernel is None or c.kernel.pattern is None for c in cands)


def test_a_verified_tgx_kernel_is_not_verified_again_by_another_process(tmp_path,
                                                                         monkeypatch):
    """A pattern kernel of tgx's own that passed `verify_kernel` leaves a mark in the kernel
    cache, and another process takes the mark instead of running the check again (21
    checks, 1 s of an 18-layer prefill's explore). A failure leaves none (it is checked,
    and warned about, again), nor does a kernel that is not tgx's."""
    import tgx.nn as tnn
    from tgx.backends.numpy_library import numpy_linear, numpy_matmul
    from tgx.backends.registry import Kernel
    from tgx.core import Eqn, Params
    from tgx.planning import kernel_patterns
    from tgx.primitives.fused import fused_p

    monkeypatch.setenv("TGX_KERNEL_CACHE", str(tmp_path))
    monkeypatch.setattr(kernel_patterns, "_VERIFIED", {})
    g = tgx.make_graph(lambda x, w: tnn.linear(x, w))(S((4, 8)), S((8, 8)))
    eqn = Eqn(fused_p, tuple(g.invars), tuple(g.outvars), Params(graph=g, name="lin"))
    right = Kernel("lin", "numpy", numpy_linear, pattern=g)
    wrong = Kernel("lin", "numpy", numpy_matmul, pattern=g)          # x @ w, not x @ w.T
    users = Kernel("lin", "numpy", lambda x, w: x @ w.T, pattern=g)
    marks = tmp_path / "verified"
    assert verify_kernel(wrong, eqn) is not None and not marks.exists()
    assert verify_kernel(users, eqn) is None and not marks.exists()
    assert verify_kernel(right, eqn) is None and len(list(marks.iterdir())) == 1

    def no_check(*a, **kw):
        raise AssertionError("checked again")
    monkeypatch.setattr(kernel_patterns, "_VERIFIED", {})          # another process
    monkeypatch.setattr(kernel_patterns, "kernel_job", no_check)
    assert verify_kernel(right, eqn) is None
    assert "raised AssertionError" in verify_kernel(wrong, eqn)
    assert "raised AssertionError" in verify_kernel(users, eqn)
    monkeypatch.setattr(kernel_patterns, "_VERIFIED", {})
    monkeypatch.setenv("TGX_KERNEL_CACHE", "off")                   # no cache: checked
    assert "raised AssertionError" in verify_kernel(right, eqn)
