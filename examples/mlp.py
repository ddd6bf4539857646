"""A small MLP traced with a symbolic batch dim, printed as IR, compiled, and checked against
NumPy at two batch sizes with one plan.

Run: python examples/mlp.py
"""

from __future__ import annotations

import numpy as np

import tgx
import tgx.numpy as tnp


def init_params(rng: np.random.Generator) -> dict:
    def dense(n_in, n_out):
        return (rng.standard_normal((n_in, n_out)) / np.sqrt(n_in)).astype(np.float32)

    return {"w1": dense(784, 128), "b1": np.zeros(128, np.float32), "w2": dense(128, 10)}


def mlp(params: dict, x):
    h = tnp.maximum(x @ params["w1"] + params["b1"], 0.0)
    logits = h @ params["w2"]
    e = tnp.exp(logits - tnp.max(logits, axis=-1, keepdims=True))
    return e / tnp.sum(e, axis=-1, keepdims=True)


def mlp_numpy(params: dict, x: np.ndarray) -> np.ndarray:
    h = np.maximum(x @ params["w1"] + params["b1"], 0.0)
    logits = h @ params["w2"]
    e = np.exp(logits - logits.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def main() -> None:
    rng = np.random.default_rng(0)
    params = init_params(rng)
    graph = tgx.make_graph(mlp)(params, tgx.Spec(("N", 784), "float32"))
    print(graph)
    compiled = tgx.compile(mlp, dynamic={"x": {0: "N"}})
    print(compiled.lower(params, tgx.Spec(("N", 784), "float32")).summary())
    for n in (4, 32):
        x = rng.standard_normal((n, 784)).astype(np.float32)
        expected = mlp_numpy(params, x)
        for name, out in (("reference evaluator", tgx.eval_graph(graph, params, x)),
                          ("compiled", compiled(params, x))):
            err = np.abs(out - expected).max()
            print(f"N={n}: {name:19s} output {out.shape}, max |tgx - numpy| = {err:.2e}")
            assert err < 1e-5
    print(f"traced {compiled.trace_count}x for both batch sizes")


if __name__ == "__main__":
    main()
