"""Kernel timings planted in a store, so a test decides what the selection prefers without
timing anything."""

import tgx
from tgx.backends.registry import kernels_for
from tgx.planning.cost_model import CostModel


def plant_kernel(store, fn, args, variant, seconds=1e-9, name="linear", backend="numpy",
                 decomposed=False):
    """Record `variant` of primitive `name` on `backend` as measured at `seconds` for fn's
    (first) such equation, traced over `args` and simplified as `tgx.compile` plans it
    (`decomposed`: then decomposed to atomic primitives)."""
    g = tgx.simplify(tgx.make_graph(fn)(*args))
    if decomposed:
        g = tgx.decompose(g)
    eqn = next(e for e in g.eqns if e.primitive.name == name)
    kernel = next(k for k in kernels_for(name, backend) if k.variant == variant)
    cm = CostModel(store)
    ghash, axes, inputs = cm.workload(eqn, {})
    wkey = store.add_workload(ghash, axes, inputs)
    store.add_implementation("KERNEL", kernel.label, kernel.backend, kernel.source_hash)
    store.add_trace(graph_hash=ghash, impl=cm.impl_key(kernel), workload=wkey,
                    env_id=cm.env_id, status="PASSED", median_s=seconds)
