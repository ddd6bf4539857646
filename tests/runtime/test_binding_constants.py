"""Instructions that read only constants run once per binding of the symbolic dims
(`CompiledGraph._fold_constants`): an iota of a symbolic dim, the RoPE tables and attention
masks made from it. Checked against NumPy at several bindings, with the results' memory kept
apart from the caller's, and state writes never folded."""

from __future__ import annotations

import numpy as np
import pytest

import tgx
import tgx.nn as tnn
import tgx.numpy as tnp
from tgx.runtime import compiled as C
from tgx.runtime.codegen import FOLDED


def _rope_and_mask(x):
    """x: (S, D). The tables and the causal mask depend on S alone."""
    s = x.shape[0]
    pos = tnp.arange(s)
    cos, sin = tnn.rope_cos_sin(pos, x.shape[1], 10000.0)
    causal = pos[:, None] >= pos[None, :]
    scores = tnp.where(causal, x @ x.T, -1e9)
    return tnp.sum(scores, axis=1) + tnp.sum(x * cos + sin, axis=1)


def _numpy_rope_and_mask(x):
    x = x.astype(np.float64)
    s, d = x.shape
    inv = 1.0 / (10000.0 ** (np.arange(0, d, 2) / d))
    ang = np.arange(s)[:, None] * inv[None, :]
    ang = np.concatenate([ang, ang], axis=1)
    causal = np.arange(s)[:, None] >= np.arange(s)[None, :]
    scores = np.where(causal, x @ x.T, -1e9)
    return scores.sum(1) + (x * np.cos(ang) + np.sin(ang)).sum(1)


def _folded(f, *args):
    c = f.lower(*args).compiled
    spec = c.specialize(c._key(list(args)) if c.symbols else ())
    return [c.instructions[t].label for t, (fn, *_) in enumerate(spec.instrs) if fn is FOLDED]


@pytest.mark.parametrize("backend", ["numpy", "torch"])
def test_tables_and_masks_of_a_symbolic_dim_are_computed_once_per_binding(backend):
    pytest.importorskip(backend)
    f = tgx.compile(_rope_and_mask, backends=[backend], policy="heuristic",
                    dynamic={"x": {0: "S"}})
    rng = np.random.default_rng(0)
    for s in (5, 9, 5):
        x = rng.standard_normal((s, 8)).astype(np.float32)
        np.testing.assert_allclose(f(x), _numpy_rope_and_mask(x), rtol=2e-4, atol=2e-4)
        folded = _folded(f, x)
        assert any("rope_cos_sin" in lbl or "iota" in lbl for lbl in folded), folded
    assert f.trace_count == 1


def test_a_result_made_of_constants_alone_is_not_held_by_the_caller():
    """A returned value computed from constants is never folded, and a view of a folded
    value is copied: the caller writing into a result cannot change the next call's."""
    f = tgx.compile(lambda x: (x + 1.0, tnp.arange(x.shape[0]).reshape(1, -1) * 2),
                    backends=["numpy"], policy="heuristic", dynamic={"x": {0: "S"}})
    x = np.zeros(4, np.float32)
    _, r = f(x)
    r[...] = -7
    _, r2 = f(x)
    np.testing.assert_array_equal(r2, [[0, 2, 4, 6]])


def test_state_written_with_a_constant_is_written_every_call():
    f = tgx.compile(lambda x, s: (tnp.sum(x * s), tnp.ones_like(s) * 3.0), state="s",
                    backends=["numpy"], policy="heuristic")
    x = np.ones(3, np.float32)
    s = np.zeros(3, np.float32)
    for _ in range(2):
        f(x, s)
        np.testing.assert_array_equal(s, 3.0)
        s[...] = 0.0


def test_a_binding_past_the_budget_runs_its_instructions_in_the_call(monkeypatch):
    monkeypatch.setattr(C, "FOLD_MAX_BYTES", 0)
    f = tgx.compile(_rope_and_mask, backends=["numpy"], policy="heuristic",
                    dynamic={"x": {0: "S"}})
    x = np.random.default_rng(1).standard_normal((6, 8)).astype(np.float32)
    np.testing.assert_allclose(f(x), _numpy_rope_and_mask(x), rtol=2e-4, atol=2e-4)
    assert _folded(f, x) == []
