"""The Gemma-3 example (examples/gemma3.py) against Hugging Face `Gemma3ForCausalLM`.

The HF model is built offline from a `Gemma3TextConfig` (no download), the same random
weights are copied in, and the logits of a prefill and of several decode steps (tgx: a KV
cache kept as `state=`; HF: its own DynamicCache) must agree. The config is small but keeps
what makes Gemma-3 Gemma-3: local layers with a sliding window shorter than the sequence,
a global layer (the 6th) with the other RoPE base, QK-norm, GQA, (1 + w) norms, tied
embeddings.
"""

from __future__ import annotations

import dataclasses
import os
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "examples"))
import gemma3 as G  # noqa: E402

import tgx  # noqa: E402
from tgx.io import flatten_names  # noqa: E402

CFG = dataclasses.replace(G.Config(), num_hidden_layers=7, sliding_window=5,
                          num_key_value_heads=1, vocab_size=384)
PROMPT, DECODE = 11, 4
# float32 against float64 (HF in double): rounding of 7 layers, relative to max |logit|
RTOL = {torch.float64: 1e-5, torch.float32: 1e-5}


def hf_model(cfg: G.Config, params: dict, dtype):
    config = G.hf_config(cfg, max_position_embeddings=64)
    model = transformers.Gemma3ForCausalLM(config).eval()
    state = {k: torch.from_numpy(np.ascontiguousarray(v))
             for k, v in flatten_names(params).items()}
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}, (missing, unexpected)
    return model.to(dtype)


@pytest.fixture(scope="module")
def params():
    return G.random_params(CFG, seed=3)


@pytest.fixture(scope="module")
def tgx_logits(params):
    """tgx logits of the prompt and of DECODE greedy steps (tokens from tgx's argmax)."""
    step = tgx.compile(lambda p, t, c, pos: G.gemma3_step(p, t, c, pos, CFG),
                       weights="p", state="c", policy="heuristic")
    cache = G.empty_cache(CFG, PROMPT + DECODE)
    tokens = np.random.default_rng(0).integers(0, CFG.vocab_size, PROMPT)
    fed, out, pos = [], [], 0
    for _ in range(1 + DECODE):
        logits, cache = step(params, tokens, cache, np.int32(pos))
        fed.append(tokens)
        out.append(np.array(logits))
        pos += len(tokens)
        tokens = np.array([int(np.argmax(logits[-1]))])
    return fed, out


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["hf64", "hf32"])
def test_logits_match_hugging_face(params, tgx_logits, dtype):
    assert CFG.is_sliding(0) and not CFG.is_sliding(5) and PROMPT > CFG.sliding_window
    model = hf_model(CFG, params, dtype)
    fed, ours = tgx_logits
    past = transformers.DynamicCache(config=model.config)
    pos = 0
    with torch.no_grad():
        for step, (tokens, logits) in enumerate(zip(fed, ours)):
            ids = torch.from_numpy(tokens)[None]
            res = model(input_ids=ids, past_key_values=past, use_cache=True,
                        cache_position=torch.arange(pos, pos + len(tokens)))
            past, pos = res.past_key_values, pos + len(tokens)
            ref = res.logits[0].double().numpy()
            err = np.abs(logits - ref).max() / np.abs(ref).max()
            assert err < RTOL[dtype], (step, err)


def test_prefill_without_cache_matches_hugging_face(params):
    model = hf_model(CFG, params, torch.float64)
    tokens = np.random.default_rng(1).integers(0, CFG.vocab_size, 13)
    logits = tgx.compile(lambda p, t: G.gemma3(p, t, CFG), weights="p",
                         policy="heuristic")(params, tokens)
    with torch.no_grad():
        ref = model(input_ids=torch.from_numpy(tokens)[None]).logits[0].numpy()
    assert np.abs(logits - ref).max() / np.abs(ref).max() < 1e-5


def test_config_from_hugging_face_json(tmp_path):
    config = transformers.Gemma3TextConfig(vocab_size=32768, hidden_size=640,
                                           num_hidden_layers=18, head_dim=256,
                                           sliding_window=512)
    path = tmp_path / "config.json"
    config.to_json_file(str(path))
    cfg = G.Config.from_json(str(path))
    assert (cfg.rope_theta, cfg.rope_local_base_freq, cfg.sliding_window) == (1e6, 1e4, 512)
    assert [cfg.is_sliding(i) for i in range(18)] == [
        t == "sliding_attention" for t in config.layer_types]
