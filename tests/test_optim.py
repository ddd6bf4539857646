"""tgx.optim: each optimizer matches torch.optim step for step (params compared after every one
of 20 steps, float32, rtol 1e-5 / atol 1e-6), runs unchanged inside `tgx.compile` (also with
the params and optimizer state as in-place `state=` buffers), and each schedule matches
torch.optim.lr_scheduler or its closed form."""

from __future__ import annotations

import math

import hypothesis.extra.numpy as hnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import tgx
import tgx.optim as optim
from tgx.errors import BindingError, OptionError

torch = pytest.importorskip("torch")

STEPS = 20
RTOL, ATOL = 1e-5, 1e-6  # float32, after every step


def _params(rng):
    return {"w": rng.standard_normal((5, 3), dtype=np.float32),
            "b": rng.standard_normal(3, dtype=np.float32)}


def _grads(rng, steps=STEPS):
    return [{"w": rng.standard_normal((5, 3), dtype=np.float32),
             "b": rng.standard_normal(3, dtype=np.float32)} for _ in range(steps)]


OPTIMIZERS = [  # (id, tgx optimizer, torch optimizer class, its kwargs)
    ("sgd", optim.sgd(0.1), torch.optim.SGD, dict(lr=0.1)),
    ("sgd-wd", optim.sgd(0.1, weight_decay=0.1), torch.optim.SGD,
     dict(lr=0.1, weight_decay=0.1)),
    ("sgd-momentum", optim.sgd(0.05, momentum=0.9), torch.optim.SGD,
     dict(lr=0.05, momentum=0.9)),
    ("sgd-nesterov-wd", optim.sgd(0.05, momentum=0.8, nesterov=True, weight_decay=0.01),
     torch.optim.SGD, dict(lr=0.05, momentum=0.8, nesterov=True, weight_decay=0.01)),
    ("adam", optim.adam(0.01), torch.optim.Adam, dict(lr=0.01)),
    ("adam-wd-betas", optim.adam(0.05, b1=0.5, b2=0.9, eps=1e-6, weight_decay=0.1),
     torch.optim.Adam, dict(lr=0.05, betas=(0.5, 0.9), eps=1e-6, weight_decay=0.1)),
    ("adamw", optim.adamw(0.01), torch.optim.AdamW, dict(lr=0.01)),
    ("adamw-wd", optim.adamw(0.05, b1=0.8, b2=0.99, weight_decay=0.5), torch.optim.AdamW,
     dict(lr=0.05, betas=(0.8, 0.99), weight_decay=0.5)),
]


def _run_against_torch(opt, torch_opt, rng, scheduler=None):
    params = _params(rng)
    grads = _grads(rng)
    tparams = {k: torch.tensor(v.copy(), requires_grad=True) for k, v in params.items()}
    topt = torch_opt(list(tparams.values()))
    sched = scheduler(topt) if scheduler else None
    state = opt.init(params)
    for i, g in enumerate(grads):
        updates, state = opt.update(g, state, params)
        params = optim.apply_updates(params, updates)
        for k, t in tparams.items():
            t.grad = torch.from_numpy(g[k].copy())
        topt.step()
        if sched:
            sched.step()
        for k, t in tparams.items():
            np.testing.assert_allclose(params[k], t.detach().numpy(), rtol=RTOL, atol=ATOL,
                                       err_msg=f"{k} after step {i + 1}")
            assert params[k].dtype == np.float32
    return params, state


@pytest.mark.parametrize("name,opt,torch_cls,kw", OPTIMIZERS, ids=[o[0] for o in OPTIMIZERS])
def test_matches_torch_step_for_step(name, opt, torch_cls, kw, rng):
    params, state = _run_against_torch(opt, lambda ps: torch_cls(ps, **kw), rng)
    assert int(state.count) == STEPS
    leaves, _ = tgx.tree_flatten(state)
    assert state.count.shape == () and state.count.dtype == np.int32
    assert all(x.dtype == np.float32 for x in leaves[1:])


def test_schedules_match_torch_schedulers_inside_optimizers(rng):
    S = torch.optim.lr_scheduler
    # Adam with exponential decay == Adam + ExponentialLR
    _run_against_torch(optim.adam(optim.exponential_decay(0.05, 0.9, 1)),
                       lambda ps: torch.optim.Adam(ps, lr=0.05), rng,
                       lambda o: S.ExponentialLR(o, gamma=0.9))
    # SGD with momentum and a cosine decay == SGD + CosineAnnealingLR
    _run_against_torch(optim.sgd(optim.cosine_decay(0.1, STEPS, alpha=0.1), momentum=0.9),
                       lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9), rng,
                       lambda o: S.CosineAnnealingLR(o, T_max=STEPS, eta_min=0.01))


def test_float64_params_keep_their_dtype(rng):
    params = {k: v.astype(np.float64) for k, v in _params(rng).items()}
    opt = optim.adamw(0.01)
    state = opt.init(params)
    for g in _grads(rng, 3):
        g = {k: v.astype(np.float64) for k, v in g.items()}
        updates, state = opt.update(g, state, params)
        params = optim.apply_updates(params, updates)
    assert all(p.dtype == np.float64 for p in params.values())
    assert all(m.dtype == np.float64 for m in [*state.mu.values(), *state.nu.values()])
    assert state.count.dtype == np.int32 and int(state.count) == 3


# ---------------------------------------------------------------------------------------------
# Inside tgx.compile

COMPILED = [
    optim.sgd(0.05, momentum=0.9, nesterov=True, weight_decay=0.01),
    optim.adam(optim.exponential_decay(0.05, 0.5, 10), weight_decay=0.1),
    optim.adamw(optim.warmup_cosine_decay(0.0, 0.05, 3, STEPS), weight_decay=0.1),
]


@pytest.mark.parametrize("opt", COMPILED, ids=["sgd", "adam", "adamw"])
def test_compiled_step_matches_eager(opt, rng):
    def step(params, opt_state, grads):
        updates, opt_state = opt.update(grads, opt_state, params)
        return optim.apply_updates(params, updates), opt_state

    compiled = tgx.compile(step, policy="heuristic", backends=["numpy"])
    params = _params(rng)
    p_eager, s_eager = params, opt.init(params)
    p_comp, s_comp = params, opt.init(params)
    for g in _grads(rng, 6):
        p_eager, s_eager = step(p_eager, s_eager, g)
        p_comp, s_comp = compiled(p_comp, s_comp, g)
        eager, comp = tgx.tree_flatten((p_eager, s_eager))[0], tgx.tree_flatten((p_comp, s_comp))[0]
        for a, b in zip(eager, comp):
            assert a.dtype == b.dtype and a.shape == b.shape
            np.testing.assert_allclose(b, a, rtol=1e-6, atol=1e-7)
    assert compiled.trace_count == 1
    assert type(s_comp) is type(s_eager) and int(s_comp.count) == 6


def test_compiled_step_updates_params_and_state_in_place(rng):
    opt = optim.adamw(optim.linear_warmup(0.0, 0.05, 4), weight_decay=0.1)

    @tgx.compile(policy="heuristic", backends=["numpy"], state=("params", "opt_state"))
    def train_step(params, opt_state, grads):
        updates, opt_state = opt.update(grads, opt_state, params)
        loss = sum(tgx.numpy.sum(g * g) for g in tgx.tree_flatten(grads)[0])
        return loss, (optim.apply_updates(params, updates), opt_state)

    params = _params(rng)
    opt_state = opt.init(params)
    ref_p, ref_s = params, opt.init(params)
    buffers = [id(x) for x in tgx.tree_flatten((params, opt_state))[0]]
    for g in _grads(rng, 5):
        loss, (new_p, new_s) = train_step(params, opt_state, g)
        # the caller's arrays hold the new values, and the very same arrays come back
        assert [id(x) for x in tgx.tree_flatten((new_p, new_s))[0]] == buffers
        assert [id(x) for x in tgx.tree_flatten((params, opt_state))[0]] == buffers
        updates, ref_s = opt.update(g, ref_s, ref_p)
        ref_p = optim.apply_updates(ref_p, updates)
        np.testing.assert_allclose(loss, sum(float((v * v).sum()) for v in g.values()),
                                   rtol=1e-5)
        for a, b in zip(tgx.tree_flatten((ref_p, ref_s))[0],
                        tgx.tree_flatten((params, opt_state))[0]):
            np.testing.assert_allclose(b, a, rtol=1e-6, atol=1e-7)
    assert int(opt_state.count) == 5 and train_step.trace_count == 1


# ---------------------------------------------------------------------------------------------
# Schedules


def _torch_lrs(base, make, n):
    p = torch.zeros(1, requires_grad=True)
    o = torch.optim.SGD([p], lr=base)
    s = make(o)
    lrs = []
    for _ in range(n):
        lrs.append(s.get_last_lr()[0])
        o.step()
        s.step()
    return np.array(lrs)


def _ours(schedule, n):
    return np.array([float(schedule(np.int32(t))) for t in range(n)])


def test_schedules_match_torch_lr_schedulers():
    S = torch.optim.lr_scheduler
    n = 30
    cases = [
        (optim.constant(0.3), 0.3, lambda o: S.ConstantLR(o, factor=1.0)),
        (optim.linear_warmup(0.01, 0.1, 10), 0.1,
         lambda o: S.LinearLR(o, start_factor=0.1, total_iters=10)),
        (optim.exponential_decay(0.1, 0.9, 1), 0.1, lambda o: S.ExponentialLR(o, gamma=0.9)),
        (optim.exponential_decay(0.1, 0.5, 7, staircase=True), 0.1,
         lambda o: S.StepLR(o, step_size=7, gamma=0.5)),
        # CosineAnnealingLR rises again after T_max: compare up to it
        (optim.cosine_decay(0.1, n - 1, alpha=0.2), 0.1,
         lambda o: S.CosineAnnealingLR(o, T_max=n - 1, eta_min=0.02)),
    ]
    for schedule, base, make in cases:
        np.testing.assert_allclose(_ours(schedule, n), _torch_lrs(base, make, n),
                                   rtol=1e-6, atol=1e-9)


def test_schedules_match_closed_forms():
    t = np.arange(60, dtype=np.float64)
    ref = 0.5 * 0.3 ** (t / 4.5)  # float32 exponents up to -16: a few ulp of relative error
    np.testing.assert_allclose(_ours(optim.exponential_decay(0.5, 0.3, 4.5), 60), ref,
                               rtol=5e-6)
    ref = 1e-3 * (0.1 + 0.9 * 0.5 * (1 + np.cos(np.pi * np.minimum(t, 40) / 40)))
    np.testing.assert_allclose(_ours(optim.cosine_decay(1e-3, 40, alpha=0.1), 60), ref,
                               rtol=1e-6)
    init, peak, warm, decay, end = 1e-4, 1e-2, 10, 50, 1e-3
    cos = end + (peak - end) * 0.5 * (1 + np.cos(np.pi * np.clip(t - warm, 0, decay - warm)
                                                 / (decay - warm)))
    ref = np.where(t < warm, init + (peak - init) * t / warm, cos)
    np.testing.assert_allclose(_ours(optim.warmup_cosine_decay(init, peak, warm, decay, end),
                                     60), ref, rtol=1e-6)
    np.testing.assert_allclose(_ours(optim.linear_warmup(0.0, 2.0, 0), 3), [2.0] * 3)


@pytest.mark.parametrize("schedule", [
    optim.constant(0.1), optim.linear_warmup(0.0, 0.1, 5), optim.cosine_decay(0.1, 12, 0.1),
    optim.exponential_decay(0.1, 0.7, 3, staircase=True),
    optim.warmup_cosine_decay(0.0, 0.1, 4, 15, end=0.01),
], ids=["constant", "linear_warmup", "cosine", "exponential", "warmup_cosine"])
def test_schedules_trace(schedule):
    f = tgx.compile(lambda step: schedule(step), policy="heuristic", backends=["numpy"])
    for t in range(20):
        got = f(np.asarray(t, np.int32))
        assert got.dtype == np.float32 and got.shape == ()
        np.testing.assert_allclose(got, schedule(t), rtol=1e-6)
    assert f.trace_count == 1


# ---------------------------------------------------------------------------------------------
# Properties and errors


@given(shape=hnp.array_shapes(min_dims=0, max_dims=3, max_side=5),
       lr=st.floats(0.0, 10.0, allow_subnormal=False), seed=st.integers(0, 2**16))
def test_plain_sgd_is_params_minus_lr_grad(shape, lr, seed):
    rng = np.random.default_rng(seed)
    p = rng.standard_normal(shape).astype(np.float32)
    g = rng.standard_normal(shape).astype(np.float32)
    opt = optim.sgd(lr)
    updates, state = opt.update((g,), opt.init((p,)))
    (new,) = optim.apply_updates((p,), updates)
    assert isinstance(new, np.ndarray) and new.dtype == np.float32 and new.shape == shape
    np.testing.assert_array_equal(new, p - np.float32(lr) * g)
    assert int(state.count) == 1


@given(shape=hnp.array_shapes(min_dims=1, max_dims=2, max_side=6),
       lr=st.floats(1e-4, 1.0), seed=st.integers(0, 2**16))
def test_adam_first_step_is_lr_times_sign(shape, lr, seed):
    g = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    opt = optim.adam(lr, eps=0.0)
    updates, _ = opt.update([g], opt.init([np.zeros(shape, np.float32)]))
    np.testing.assert_allclose(updates[0], -np.float32(lr) * np.sign(g), rtol=1e-6)


def test_errors_name_the_problem():
    params = {"w": np.ones(2, np.float32)}
    with pytest.raises(BindingError, match="grads has structure"):
        optim.adam(0.1).update({"v": np.ones(2, np.float32)}, optim.adam(0.1).init(params))
    with pytest.raises(BindingError, match="weight_decay=0.01 needs the params"):
        opt = optim.adamw(0.1)
        opt.update(params, opt.init(params))
    with pytest.raises(OptionError, match="b2 must be in"):
        optim.adam(0.1, b2=1.0)
    with pytest.raises(OptionError, match="nesterov"):
        optim.sgd(0.1, nesterov=True)
    with pytest.raises(OptionError, match="learning_rate"):
        optim.sgd(-1.0)
    assert math.isclose(float(optim.constant(0.25)(3)), 0.25)


@pytest.mark.parametrize("make", [lambda: optim.adam(1e-3), lambda: optim.sgd(0.1, momentum=0.9)])
def test_init_state_is_writable_and_aligned(make):
    # a JAX region reads a host array in place only when it is 64-byte aligned
    params = {"w": np.ones((300, 301), np.float32), "b": np.ones(7, np.float64)}
    leaves = [x for x in tgx.tree_flatten(make().init(params))[0] if np.ndim(x)]
    assert leaves and all(x.flags.writeable and x.ctypes.data % 64 == 0 for x in leaves)
    assert all(not x.any() for x in leaves)
    assert {x.dtype for x in leaves} == {np.dtype(np.float32), np.dtype(np.float64)}


def test_aligned_copies_a_tree():
    src = {"a": [np.arange(5.0)], "b": np.ones((3, 3), np.int32)}
    out = tgx.aligned(src)
    np.testing.assert_array_equal(out["a"][0], src["a"][0])
    np.testing.assert_array_equal(out["b"], src["b"])
    assert out["b"].dtype == np.int32 and out["b"].ctypes.data % 64 == 0
    out["b"][0, 0] = 7
    assert src["b"][0, 0] == 1  # a copy
