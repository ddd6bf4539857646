"""HEURISTIC's device rule (tgx.planning.heuristic, rule 5): on a GPU the whole-program
backend comes first and a fused region the primary has a generated kernel for is kept."""

import numpy as np
import pytest

import tgx
import tgx.numpy as tnp
from tgx.backends import backend_available
from tgx.planning.heuristic import decompose_unsupported, heuristic_primary
from tgx.planning.kernel_patterns import is_region
from tgx.planning.regions import HAVE_NUMBA, fuse_regions


def chain(x, y):
    return tnp.tanh(tnp.exp(x) * y + 1.0) - x * 0.5


@pytest.mark.parametrize("backends", [["numpy"], ["numpy", "torch"], ["torch", "jax"],
                                      ["numpy", "jax"], ["numpy", "torch", "jax"]])
def test_primary_on_the_host_is_the_preference_and_on_a_gpu_the_whole_program_backend(
        backends):
    if not all(backend_available(b) for b in backends):
        pytest.skip("a backend is not installed")
    assert heuristic_primary(backends) == min(
        backends, key=["torch", "jax", "numpy"].index)
    on_gpu = heuristic_primary(backends, "cuda:0")
    if "jax" in backends:
        assert on_gpu == "jax"          # XLA: one program, not one launch per op
    else:
        assert on_gpu == ("torch" if "torch" in backends else "numpy")


@pytest.mark.skipif(not HAVE_NUMBA, reason="numba is not installed")
def test_a_region_is_kept_only_where_asked_and_the_primary_runs_it():
    g = fuse_regions(tgx.make_graph(chain)(tgx.Spec((8, 64)), tgx.Spec((8, 64))), ["numpy"])
    assert any(is_region(e) for e in g.eqns)
    # the host: a generated loop waits for a measurement, so its ops are planned one by one
    expanded = decompose_unsupported(g, ["numpy"], "numpy")
    assert not any(is_region(e) for e in expanded.eqns)
    assert len(expanded.eqns) > len(g.eqns)
    kept = decompose_unsupported(g, ["numpy"], "numpy", keep_regions=True)
    assert [e.primitive.name for e in kept.eqns] == [e.primitive.name for e in g.eqns]
    # both graphs compute the chain
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((2, 8, 64)).astype(np.float32)
    want = np.tanh(np.exp(x.astype(np.float64)) * y + 1.0) - x * 0.5
    for graph in (expanded, kept):
        np.testing.assert_allclose(tgx.eval_graph(graph, x, y), want, rtol=1e-5, atol=1e-5)
