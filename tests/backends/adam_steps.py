"""A compiled Adam (AdamW) training step against `torch.optim`, shared by the tests of each
backend's `adam_update` kernels."""

import numpy as np

import tgx
import tgx.numpy as tnp


def check_adam_step_against_torch_optim(kind: str, backends: list, variant: str):
    """A small tanh regression's step compiled on `backends` runs one `{kind}_update`
    kernel of `variant` per parameter, written into the caller's state arrays in place, and
    follows `torch.optim.Adam` (`AdamW`) for five steps."""
    import torch

    from tgx import optim

    rng = np.random.default_rng(0)
    params = {"w": rng.standard_normal((16, 8)).astype(np.float32),
              "b": rng.standard_normal(8).astype(np.float32)}
    x = rng.standard_normal((32, 16)).astype(np.float32)
    opt = optim.adam(1e-2) if kind == "adam" else optim.adamw(1e-2, weight_decay=0.1)

    def loss(p, x):
        return tnp.mean(tnp.tanh(x @ p["w"] + p["b"]) ** 2)

    def step(p, s, x):
        val, grads = tgx.value_and_grad(loss)(p, x)
        updates, s = opt.update(grads, s, p)
        return val, (optim.apply_updates(p, updates), s)

    p = {k: v.copy() for k, v in params.items()}
    s = opt.init(p)
    f = tgx.compile(step, state=("p", "s"), backends=backends)
    tw = {k: torch.from_numpy(v.copy()).requires_grad_() for k, v in params.items()}
    topt = (torch.optim.Adam(list(tw.values()), lr=1e-2) if kind == "adam"
            else torch.optim.AdamW(list(tw.values()), lr=1e-2, weight_decay=0.1))
    tx = torch.from_numpy(x)
    w_id = id(p["w"])
    for _ in range(5):
        f(p, s, x)
        topt.zero_grad()
        torch.mean(torch.tanh(tx @ tw["w"] + tw["b"]) ** 2).backward()
        topt.step()
    plan = f.lower(p, s, x)
    labels = [i.label for i in plan.compiled.instructions if f"{kind}_update" in i.label]
    assert len(labels) == 2 and all(f"[{variant}]" in lab and "[into state]" in lab
                                    for lab in labels), labels
    assert id(p["w"]) == w_id
    for k in params:
        np.testing.assert_allclose(p[k], tw[k].detach().numpy(), rtol=1e-6, atol=1e-6)
