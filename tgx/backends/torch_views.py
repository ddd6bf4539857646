"""NumPy arrays as torch tensors, for the NumPy-backend kernels that torch runs (oneDNN's
bfloat16 GEMMs, the fused attention).

`torch.from_numpy` shares the array's memory. torch tensors are writable, so it warns on a
read-only array (a weight memory-mapped from safetensors, a constant folded once per
binding); such an array is copied instead. Imports torch only when called: planning a NumPy
plan does not import it.

>>> import importlib.util, numpy as np
>>> a = np.arange(3.0)
>>> a.flags.writeable = False
>>> tensor_of(a).tolist() if importlib.util.find_spec("torch") else [0.0, 1.0, 2.0]
[0.0, 1.0, 2.0]
"""

from __future__ import annotations

import numpy as np


def tensor_of(a):
    """`a` (C-contiguous) as a torch tensor sharing its memory, or a copy's if `a` is
    read-only."""
    import torch

    a = np.asarray(a, order="C")   # (np.ascontiguousarray makes a 0-d array 1-d)
    return torch.from_numpy(a if a.flags.writeable else a.copy())
