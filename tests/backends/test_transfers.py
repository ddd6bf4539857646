"""copy_to round trips between every pair of backends are exact for every dtype."""

from __future__ import annotations

import numpy as np
import pytest

import tgx
import tgx.numpy as tnp
from tgx.backends import backend_available, get_backend, to_host
from tgx.primitives.transfer import copy_to
from tgx.shapes import DTYPES

BACKENDS = [b for b in ("numpy", "torch", "jax") if backend_available(b)]
PAIRS = [(a, b) for a in BACKENDS for b in BACKENDS if a != b]


def _sample(dtype, rng):
    if dtype == np.bool_:
        return rng.random((3, 5)) > 0.5
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return rng.integers(info.min, info.max, (3, 5), dtype=dtype, endpoint=True)
    x = rng.standard_normal((3, 5)).astype(dtype)
    x.flat[0] = np.inf
    x.flat[1] = -0.0
    return x


@pytest.mark.parametrize("src,dst", PAIRS)
@pytest.mark.parametrize("dtype", sorted(DTYPES.values(), key=str), ids=str)
def test_round_trip_exact(src, dst, dtype, rng):
    if "torch" in (src, dst) and dtype == np.uint32:
        pytest.skip("torch has few uint32 kernels; tgx never sends uint32 to torch")
    x = _sample(np.dtype(dtype), rng)
    a = get_backend(src).convert(x)
    b = get_backend(dst).convert(a)
    back = to_host(get_backend(src).convert(b))
    assert back.dtype == x.dtype
    np.testing.assert_array_equal(back.view(np.uint8), x.view(np.uint8))


def test_numpy_torch_is_zero_copy():
    pytest.importorskip("torch")
    x = np.arange(6, dtype=np.float32)
    t = get_backend("torch").convert(x)
    t[0] = 42.0
    assert x[0] == 42.0
    assert np.shares_memory(to_host(t), x)


def test_copy_to_is_a_primitive_in_the_ir_and_identity():
    g = tgx.make_graph(lambda x: copy_to(tnp.exp(x), backend="torch"))(tgx.Spec(("N",)))
    assert [e.primitive.name for e in g.eqns] == ["exp", "copy_to"]
    x = np.linspace(0, 1, 4, dtype=np.float32)
    np.testing.assert_array_equal(tgx.eval_graph(g, x), np.exp(x))


@pytest.mark.parametrize("backend", [b for b in BACKENDS if b != "numpy"])
def test_compiled_round_trip_exact(backend):
    f = tgx.compile(lambda x: copy_to(copy_to(x, backend=backend), backend="numpy"),
                    backends=["numpy", backend])
    for dtype in ("float32", "bfloat16", "bool", "int64", "float16"):
        x = _sample(np.dtype(DTYPES[dtype]), np.random.default_rng(1))
        np.testing.assert_array_equal(f(x).view(np.uint8), x.view(np.uint8))


@pytest.mark.cuda
def test_cuda_round_trip():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    x = np.arange(10, dtype=np.float32)
    np.testing.assert_array_equal(to_host(get_backend("torch").convert(x, "cuda:0")), x)
