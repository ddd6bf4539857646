"""The op table: one `OpInfo` per op drives every op test (Thunder's OpInfo idea).

An entry gives the tgx function, an *independent* reference (NumPy, PyTorch or JAX computing
the same thing on NumPy arrays), sample inputs, the dtypes to test and tolerances per dtype.
Families live in `tests/ops/ops_<family>.py` and call `register(...)`; `test_ops.py` collects
them all, so `pytest -k softmax` runs one op everywhere: shape rule, reference evaluation,
symbolic dims at several bindings, the fully decomposed graph, and every backend.
"""

from __future__ import annotations

import dataclasses
from typing import Any
from collections.abc import Callable

import numpy as np

import tgx
from tgx.shapes import bfloat16, float16, float32, float64

# Tolerances per dtype: (rtol, atol). Half precision is compared after rounding the inputs.
TOL = {
    float64: (1e-9, 1e-11),
    float32: (2e-5, 2e-6),
    float16: (5e-3, 5e-3),
    bfloat16: (3e-2, 3e-2),
}


@dataclasses.dataclass
class Sample:
    """Positional args (arrays or Python values), keyword args, and which axes of which
    positional args become symbolic dims in the symbolic test: {arg_index: {axis: "N"}}."""

    args: tuple
    kwargs: dict = dataclasses.field(default_factory=dict)
    symbolic: dict = dataclasses.field(default_factory=dict)
    name: str = ""


@dataclasses.dataclass
class OpInfo:
    name: str
    fn: Callable                      # the tgx op, called inside a trace
    ref: Callable                     # independent reference on NumPy arrays -> NumPy array(s)
    samples: Callable[[np.random.Generator, np.dtype], list]   # -> list[Sample]
    dtypes: tuple = (float32, float64)
    tol: dict = dataclasses.field(default_factory=dict)
    array_args: tuple | None = None   # indices of positional args that are traced (default:
                                      # every ndarray); the others are static Python values
    decomposes: bool = False          # a composite whose decomposition must also match
    ref_in_float64: bool = False      # reference computed in float64 from the same inputs
    skip: dict = dataclasses.field(default_factory=dict)   # {"backend:dtype": reason}

    def tolerance(self, dtype) -> tuple[float, float]:
        return self.tol.get(dtype, TOL.get(dtype, (0.0, 0.0)))

    def __repr__(self) -> str:
        return self.name


OPS: list[OpInfo] = []


def register(*infos: OpInfo) -> None:
    names = {o.name for o in OPS}
    for info in infos:
        assert info.name not in names, f"op {info.name} registered twice"
        OPS.append(info)


def randn(rng, shape, dtype, scale=1.0, positive=False, low=None, high=None):
    if low is not None:
        x = rng.uniform(low, high, size=shape)
    else:
        x = rng.standard_normal(size=shape) * scale
    if positive:
        x = np.abs(x) + 0.1
    return np.asarray(x).astype(dtype)


def split_args(info: OpInfo, sample: Sample):
    """(traced arg indices, a function of the traced args with static ones closed over)."""
    idx = info.array_args
    if idx is None:
        idx = tuple(i for i, a in enumerate(sample.args) if isinstance(a, np.ndarray))
    static = {i: a for i, a in enumerate(sample.args) if i not in idx}

    def fn(*traced):
        args = []
        it = iter(traced)
        for i in range(len(sample.args)):
            args.append(static[i] if i in static else next(it))
        return info.fn(*args, **sample.kwargs)

    return idx, fn


def reference(info: OpInfo, sample: Sample):
    args = sample.args
    if info.ref_in_float64:
        args = tuple(a.astype(np.float64) if isinstance(a, np.ndarray) and a.dtype.kind == "f"
                     or (isinstance(a, np.ndarray) and a.dtype == bfloat16) else a for a in args)
    return info.ref(*args, **sample.kwargs)


def assert_close(actual: Any, expected: Any, dtype, info: OpInfo, what: str) -> None:
    actual_l, _ = tgx.tree_flatten(actual)
    expected_l, _ = tgx.tree_flatten(expected)
    assert len(actual_l) == len(expected_l), f"{what}: {len(actual_l)} outputs vs {len(expected_l)}"
    rtol, atol = info.tolerance(dtype)
    for a, e in zip(actual_l, expected_l):
        a, e = np.asarray(a), np.asarray(e)
        assert a.shape == e.shape, f"{what}: shape {a.shape} vs reference {e.shape}"
        if a.dtype.kind in "biu" and e.dtype.kind in "biu":
            np.testing.assert_array_equal(a, e, err_msg=what)
        else:
            np.testing.assert_allclose(a.astype(np.float64), e.astype(np.float64), rtol=rtol,
                                       atol=atol, err_msg=what, equal_nan=True)


def sym_specs(sample: Sample, traced_idx) -> list:
    specs = []
    for i in traced_idx:
        a = sample.args[i]
        names = sample.symbolic.get(i, {})
        specs.append(tgx.Spec(tuple(names.get(ax, d) for ax, d in enumerate(a.shape)), a.dtype))
    return specs


def to_torch(a):
    """NumPy → torch for references; half precision is computed by the reference in float32
    (torch's CPU half kernels are not a reference)."""
    import torch

    if isinstance(a, np.ndarray):
        if a.dtype in (float16, bfloat16):
            a = a.astype(np.float32)
        return torch.from_numpy(np.array(a))
    return a


def torch_ref(f: Callable) -> Callable:
    """A reference calling the torch function `f` on converted arguments, returning float64
    NumPy (a tuple of them for tuple results)."""
    import warnings

    def ref(*args, **kwargs):
        with warnings.catch_warnings():  # e.g. kl_div's note on reduction="mean"
            warnings.simplefilter("ignore", UserWarning)
            out = f(*[to_torch(a) for a in args], **{k: to_torch(v) for k, v in kwargs.items()})
        if isinstance(out, tuple):
            return tuple(o.detach().double().numpy() for o in out)
        return out.detach().double().numpy()

    ref.torch_fn = f  # the gradient tests run torch.autograd on it
    return ref
