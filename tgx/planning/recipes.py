"""Whole-graph single-backend plans as candidates of their own ("a region is a candidate").

The cost model prices a plan as the sum of its equations measured one at a time. That is right
for NumPy and torch, which run one kernel per equation, but over-predicts a run of JAX
equations, which the lowering turns into one `jax.jit` that XLA fuses. So EXPLORE also measures
the plan that puts the whole graph on one backend, as a whole, and records it as a
GRAPH_RECIPE trace; FASTEST compares those measurements with its selection's predicted total
and takes the whole-graph plan when it was measured faster.

>>> import tgx, tgx.numpy as tnp, numpy as np
>>> from tgx.store import BenchmarkStore
>>> import tempfile, os
>>> store = BenchmarkStore(os.path.join(tempfile.mkdtemp(), "s.json"))
>>> g = tgx.make_graph(lambda x: tnp.exp(x) * 2.0)(tgx.Spec(("N",)))
>>> measure_recipes(g, ["numpy"], store, {"N": 32}, budget_s=0.01)
1
>>> best_recipe(g, ["numpy"], store, {"N": 32})[0]
'numpy'
"""

from __future__ import annotations

from collections.abc import Sequence

RECIPE_NAME = "whole-graph-on-one-backend"
RECIPE_VERSION = "1"  # bump when the lowering of single-backend plans changes


def _graph_keys(graph, dims: dict) -> tuple[str, str]:
    """(graph hash, workload key) of the whole graph at `dims`: the same for every backend."""
    from ..graph import structural_hash
    from ..shapes import eval_dim, sym
    from ..store.schema import workload_key

    env = {sym(str(k)): int(v) for k, v in dims.items()}
    inputs = [([eval_dim(d, env) for d in v.aval.shape], v.aval.dtype.name)
              for v in graph.invars]
    ghash = structural_hash(graph)
    return ghash, workload_key(ghash, {str(k): int(v) for k, v in dims.items()}, inputs)


def _impl_key(backend: str, weights: Sequence[int] = ()) -> str:
    from ..store.schema import implementation_key

    return implementation_key("GRAPH_RECIPE", _name(weights), backend, RECIPE_VERSION)


def _keys(graph, dims: dict, backend: str, weights: Sequence[int] = ()) -> tuple[str, str, str]:
    return (*_graph_keys(graph, dims), _impl_key(backend, weights))


def _name(weights: Sequence[int]) -> str:
    # Bound weights cost nothing per call; without them every call converts them.
    return RECIPE_NAME + ("+bound-weights" if tuple(weights) else "")


def best_recipe(graph, backends: Sequence[str], store, dims: dict,
                env_id: str | None = None, weights: Sequence[int] = ()
                ) -> tuple[str, float] | None:
    """(backend, measured median) of the fastest whole-graph single-backend plan the store has
    a PASSED trace of at `dims` on this machine, or None."""
    from ..store import environment_id, sniff_environment

    env_id = env_id or environment_id(sniff_environment())
    best = None
    ghash, wkey = _graph_keys(graph, dims)  # hashed once, not once per backend
    for b in backends:
        t = store.measured(ghash, _impl_key(b, weights), wkey, env_id)
        if t and t.get("status") == "PASSED" and t.get("median_s") is not None:
            if best is None or t["median_s"] < best[1]:
                best = (b, float(t["median_s"]))
    return best


def measure_recipes(graph, backends: Sequence[str], store, dims: dict, *,
                    budget_s: float = 0.2, env_id: str | None = None,
                    weights: Sequence[int] = ()) -> int:
    """Time the whole graph on each backend in turn (random inputs at `dims`, checked against
    the reference evaluator; the inputs at positions `weights` bound once, as
    `tgx.compile(weights=...)` does) and record GRAPH_RECIPE traces; returns how many were
    measured. Backends already measured at `dims` are skipped."""
    import warnings

    import numpy as np

    from ..compiler import plan_graph
    from ..interpreters.evaluate import eval_graph_flat
    from ..profiling.pending import random_inputs
    from ..profiling.runner import profile
    from ..shapes import eval_dim, sym
    from ..store import environment_id, sniff_environment

    env_id = env_id or environment_id(sniff_environment())
    env = {sym(str(k)): int(v) for k, v in dims.items()}
    args = list(random_inputs([([eval_dim(d, env) for d in v.aval.shape], v.aval.dtype.name)
                               for v in graph.invars]))
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        golden = eval_graph_flat(graph, args)
    # A whole graph accumulates rounding over many equations (each kernel was already checked
    # tightly on its own): accept what a float32 pipeline of this depth normally differs by.
    scale = max((float(np.max(np.abs(o))) for o in golden if np.size(o)), default=1.0)
    atol, rtol = 1e-3 * scale, 1e-2
    n = 0
    ghash, wkey = _graph_keys(graph, dims)
    for b in backends:
        impl = _impl_key(b, weights)
        if store.measured(ghash, impl, wkey, env_id):
            continue
        plan = plan_graph(graph, policy="heuristic", backends=[b], weights=tuple(weights))
        store.add_workload(ghash, {str(k): int(v) for k, v in dims.items()},
                           [(list(np.shape(a)), np.asarray(a).dtype.name) for a in args])
        store.add_implementation("GRAPH_RECIPE", _name(weights), b, RECIPE_VERSION)
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            run = plan.compiled.run_flat
            profile(lambda *xs, run=run: _single(run(list(xs))), args, golden=_single(golden),
                    atol=atol, rtol=rtol, store=store,
                    graph_hash=ghash, impl=impl, workload=wkey, env_id=env_id,
                    budget_s=budget_s)
        n += 1
    return n


def _single(outs: list):
    return outs[0] if len(outs) == 1 else tuple(outs)
