"""Conversions between the backends' array formats, zero-copy where the libraries allow.

- NumPy → torch: `torch.from_numpy` (bfloat16 through a 16-bit integer view); read-only or
  non-contiguous arrays are copied first (torch tensors are writable).
- torch (CPU) → NumPy: `Tensor.numpy()` (bfloat16 through an int16 view).
- jax (CPU) → NumPy: `np.asarray` shares XLA's buffer (the result is read-only).
- NumPy → jax: `jax.device_put` (copies: XLA owns its buffers).
- torch ↔ jax: DLPack, which shares memory on one device.
- `device="cuda:<i>"`: NumPy → torch / jax copies to that GPU (`Tensor.to`, `jax.device_put`);
  torch / jax → NumPy copies back to the host; torch ↔ jax on one GPU stays zero-copy.

Every function accepts an array of any backend.
"""

from __future__ import annotations

import sys

import numpy as np

from ..shapes import bfloat16


def _is_torch(x) -> bool:
    t = sys.modules.get("torch")
    return t is not None and isinstance(x, t.Tensor)


def _is_jax(x) -> bool:
    j = sys.modules.get("jax")
    return j is not None and isinstance(x, j.Array)


def to_numpy(x):
    """`x` as a NumPy array (zero-copy from CPU torch and CPU jax)."""
    if type(x) is np.ndarray:
        return x
    if _is_torch(x):
        import torch

        if x.device.type != "cpu":
            x = x.cpu()
        if x.requires_grad:
            x = x.detach()
        if x.dtype == torch.bfloat16:
            return x.view(torch.int16).numpy().view(bfloat16)
        return x.numpy()
    return np.asarray(x)


def torch_dtype(dtype):
    import torch

    dtype = np.dtype(dtype)
    if dtype == bfloat16:
        return torch.bfloat16
    return getattr(torch, dtype.name)


def to_torch(x, device: str = "cpu"):
    """`x` as a torch tensor on `device` (zero-copy from NumPy and, via DLPack, from jax)."""
    import torch

    if isinstance(x, torch.Tensor):
        return x if x.device == torch.device(device) else x.to(device)
    if _is_jax(x):
        try:
            t = torch.from_dlpack(x)
            return t if str(t.device) == device else t.to(device)
        except Exception:  # dtypes DLPack cannot carry (bool on older stacks): through NumPy
            x = np.asarray(x)
    x = np.asarray(x)
    if not x.flags.writeable or not x.flags.c_contiguous:
        x = np.ascontiguousarray(x).copy() if not x.flags.writeable else np.ascontiguousarray(x)
    if x.dtype == bfloat16:
        t = torch.from_numpy(x.view(np.int16)).view(torch.bfloat16)
    else:
        t = torch.from_numpy(x)
    return t if device == "cpu" else t.to(device)


def to_jax(x, device: str = "cpu"):
    """`x` as a jax array (DLPack from torch, a device_put copy from NumPy)."""
    import jax

    if isinstance(x, jax.Array):
        if device == "cpu":
            return x
        dev = _jax_device(device)
        return x if x.devices() == {dev} else jax.device_put(x, dev)
    if not jax.config.jax_enable_x64:  # x64 comes with the backend (see jax_backend)
        from . import load_backend

        load_backend("jax")
    if _is_torch(x):
        try:
            r = jax.dlpack.from_dlpack(x.contiguous())
        except Exception:  # e.g. bool tensors on some versions: through NumPy
            x = to_numpy(x)
        else:  # DLPack keeps the tensor's device: move it when it is not `device`
            return to_jax(r, device)
    return jax.device_put(np.asarray(x), _jax_device(device))


def _jax_device(device: str):
    """The jax device of a tgx device string: `cpu` → jax's cpu:0, `cuda:<i>` → gpu device i."""
    import jax

    kind, _, idx = device.partition(":")
    platform = "gpu" if kind == "cuda" else kind
    return jax.devices(platform)[int(idx or 0)]


CONVERTERS = {"numpy": lambda x, device="cpu": to_numpy(x), "torch": to_torch, "jax": to_jax}
