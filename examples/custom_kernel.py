"""Write a kernel once, use it in every model: a user's kernel for a pattern of ops, picked up
inside the Gemma model (examples/gemma3.py) and a second model, neither of which mentions it.

The pattern: a scaled embedding lookup, `embedding(tokens, table) * scale` — Gemma multiplies
its embeddings by sqrt(hidden size), and so do many language models. Op by op that is a
gather and then a pass over its result; the kernel scales the rows as it gathers them.

Run: python examples/custom_kernel.py
"""

from __future__ import annotations

import numpy as np

import gemma3 as G
import tgx
import tgx.nn as tnn


def scaled_embedding(tokens, table, scale):
    """The pattern, written with tgx.nn as a model would write it."""
    return tnn.embedding(tokens, table) * scale


def scaled_embedding_kernel(tokens, table, scale):
    """The kernel, in NumPy: the pattern's inputs in, its output (same dtype) out."""
    out = np.take(table, tokens, axis=0)
    out *= scale
    return out


SPECS = (tgx.Spec(("P",), "int64"), tgx.Spec(("V", "D")), tgx.Spec(()))


def tiny_lm(params, tokens):
    """Another model with the same pattern: embeddings scaled by sqrt(d), one dense layer."""
    x = tnn.embedding(tokens, params["emb"]) * np.float32(np.sqrt(params["emb"].shape[1]))
    return tnn.linear(tnn.gelu(x), params["out"])


def main() -> None:
    kernel = tgx.register_kernel(scaled_embedding, scaled_embedding_kernel, specs=SPECS)
    try:
        cfg = G.Config(vocab_size=256, hidden_size=64, intermediate_size=128,
                       num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                       head_dim=32, sliding_window=16)
        params = G.random_params(cfg)
        tokens = np.random.default_rng(0).integers(0, cfg.vocab_size, 12)
        gemma = tgx.compile(lambda p, t: G.gemma3(p, t, cfg), weights="p",
                            backends=["numpy"], policy="heuristic")
        plan = gemma.lower(params, tokens)
        used = [k for k in plan.kernels if k.name == "scaled_embedding"]
        print(f"Gemma: {len(plan.kernels)} kernels, of which {used}")
        assert used == [kernel]
        err = np.abs(gemma(params, tokens) - G.gemma3_reference(params, tokens, cfg)).max()
        print(f"Gemma logits against the NumPy reference model: max |diff| {err:.1e}")
        assert err < 1e-4

        rng = np.random.default_rng(1)
        lm = {"emb": rng.standard_normal((100, 16)).astype(np.float32),
              "out": rng.standard_normal((100, 16)).astype(np.float32) * 0.25}
        plan = tgx.compile(tiny_lm, backends=["numpy"], policy="heuristic").lower(lm, tokens)
        assert kernel in plan.kernels
        print("tiny LM:", ", ".join(repr(k) for k in plan.kernels))
        print("\n".join(line for line in plan.explain().splitlines()[-4:]))
    finally:
        tgx.unregister_kernel(kernel)


if __name__ == "__main__":
    main()
