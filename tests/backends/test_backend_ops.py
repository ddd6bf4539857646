"""The op table on every backend: each sample compiled with `backends=[name]` and compared
with the reference under the OpInfo's tolerances (`pytest -k "softmax and torch"`)."""

from __future__ import annotations

import importlib
import os
import pathlib
import zlib

import numpy as np
import pytest

import tgx
from tgx.errors import KernelError
from tgx.backends import backend_available
from tests.ops.op_table import OPS, assert_close, reference, split_args

for _f in sorted((pathlib.Path(__file__).parent.parent / "ops").glob("ops_*.py")):
    importlib.import_module(f"tests.ops.{_f.stem}")

BACKENDS = ["numpy", "torch", "jax"]
# float64 behaves like float32 on torch and jax (same kernels); it runs there only with
# TGX_FULL_BACKEND_TESTS=1, which keeps the default run within the test-time budget.
FULL = os.environ.get("TGX_FULL_BACKEND_TESTS") == "1"
CASES = [pytest.param(info, dt, be, id=f"{info.name}-{np.dtype(dt).name}-{be}")
         for be in BACKENDS for info in OPS for dt in info.dtypes
         if FULL or be == "numpy" or np.dtype(dt) != np.float64 or len(info.dtypes) == 1]


def _samples(info, dtype):
    return info.samples(np.random.default_rng(zlib.crc32(info.name.encode())), np.dtype(dtype))


@pytest.mark.parametrize("info,dtype,backend", CASES)
def test_op_on_backend(info, dtype, backend):
    if not backend_available(backend):
        pytest.importorskip(backend)
    reason = info.skip.get(f"{backend}:{np.dtype(dtype).name}") or info.skip.get(backend)
    if reason:
        pytest.skip(reason)
    for sample in _samples(info, dtype):
        idx, fn = split_args(info, sample)
        args = [sample.args[i] for i in idx]
        compiled = tgx.compile(fn, backends=[backend])
        try:
            actual = compiled(*args)
        except KernelError as e:  # every kernel declined (e.g. uint32 on torch): say why
            if "no kernel on" in str(e):
                pytest.skip(str(e).split("\n")[0])
            raise
        expected = reference(info, sample)
        assert_close(actual, expected, dtype, info, f"{info.name}{sample.name} on {backend}")
        # dtypes follow the shape rule exactly
        graph = tgx.make_graph(fn)(*args)
        for aval, a in zip(graph.out_avals, tgx.tree_flatten(actual)[0]):
            assert np.asarray(a).dtype == aval.dtype, (
                f"{info.name}{sample.name} on {backend}: dtype {np.asarray(a).dtype}, shape "
                f"rule says {aval.dtype}")
