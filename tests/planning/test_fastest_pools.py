"""FASTEST prices the BLAS cap a kernel with a thread pool of its own brings to a plan
(`tgx.planning.fastest.blas_capped_s`): figures planted in a cost model, nothing timed."""

import numpy as np
import pytest

import tgx
import tgx.numpy as tnp
from tgx.backends.registry import register_kernel, remove_kernel
from tgx.planning.cost_model import CostModel, Estimate
from tgx.planning.fastest import blas_capped_s, fastest_assignment
from tgx.planning.options import PlanOptions

POOLED = "pooled-test"


@pytest.fixture
def pooled_tanh():
    """A NumPy tanh on "a pool of its own" (as numba's loops and torch's attention are)."""
    register_kernel("tanh", "numpy", variant=POOLED, own_pool=True)(
        lambda x: np.tanh(x))
    yield
    remove_kernel("tanh", "numpy", POOLED)


class Planted(CostModel):
    """The product at `product_s`; the pooled tanh at 1 us, NumPy's other tanh kernels at
    2 us; anything else (a decomposition's ops, a generated loop) at a second."""

    def __init__(self, product_s):
        super().__init__()
        self.product_s = product_s

    def without_own_pools(self):
        other = Planted(self.product_s)
        other.own_pools = False
        return other

    def kernel(self, eqn, kernel, dims):
        name = eqn.primitive.name
        if name in ("dot_general", "linear", "matmul"):
            return Estimate(self.product_s, "measured", "planted")
        if name == "tanh":
            return Estimate(1e-6 if kernel.variant == POOLED else 2e-6, "measured", "planted")
        return Estimate(1.0, "measured", "planted")


def plan_of(product_s):
    g = tgx.simplify(tgx.make_graph(lambda x, w: tnp.tanh(x @ w))(
        tgx.Spec((64, 128)), tgx.Spec((128, 128))))
    return fastest_assignment(g, PlanOptions(backends=("numpy",)), store=None,
                              cost_model=Planted(product_s), flag=False)


def tanh_variant(a):
    return next(k.variant for e, k in zip(a.graph.eqns, a.kernels)
                if e.primitive.name == "tanh")


def test_a_pooled_kernel_beside_a_dear_product_is_declined(pooled_tanh):
    # with the pool: 1 + 100 us on all threads, but the product on one BLAS thread then
    # costs 100 us more per extra thread; without it: 2 + 100 us
    a = plan_of(100e-6)
    assert tanh_variant(a) != POOLED
    assert blas_capped_s(a, threads=2) == 0.0


def test_a_pooled_kernel_beside_a_cheap_product_is_kept(pooled_tanh):
    # the product at 0.1 us: capped it costs 0.1 us more, less than the 1 us the pool saves
    a = plan_of(0.1e-6)
    assert tanh_variant(a) == POOLED
    assert blas_capped_s(a, threads=2) == pytest.approx(0.1e-6)
    assert blas_capped_s(a, threads=4) == pytest.approx(0.3e-6)
