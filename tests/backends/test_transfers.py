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


@pytest.mark.parametrize("dst", [b for b in BACKENDS if b != "numpy"])
@pytest.mark.parametrize("shape", [(), (1,), (3,), (2, 3)])
@pytest.mark.parametrize("kind", ["read-only", "transposed", "plain"])
def test_conversion_keeps_the_shape(dst, shape, kind):
    # a jax result seen through NumPy is read-only: torch took a 0-d one as shape (1,)
    # (np.ascontiguousarray), which turned an optimizer's step count into a vector
    x = np.arange(1, 1 + int(np.prod(shape)), dtype=np.float32).reshape(shape)
    if kind == "transposed":
        x = x.T
    elif kind == "read-only":
        x.flags.writeable = False
    y = get_backend(dst).convert(x)
    assert tuple(y.shape) == x.shape
    np.testing.assert_array_equal(to_host(y), x)


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


@pytest.mark.skipif(not backend_available("jax"), reason="jax is not installed")
@pytest.mark.parametrize("backend_arrays", [False, True])
def test_a_device_plan_starts_its_copies_to_the_host_together(backend_arrays, monkeypatch):
    """A device plan whose results (here the new state) are jax arrays off the host starts
    every copy back before the first is waited for (`start_to_host`); a host plan starts
    none; the caller's arrays get exact values either way. The "GPU" is the CPU, with jax's
    host device standing for another one (as tests/runtime/test_device.py's fake_cuda)."""
    import sys

    import jax
    import jax.numpy as jnp

    started: list = []
    array_type = type(jnp.ones(1))
    real = array_type.copy_to_host_async

    def record(self):
        started.append(self.shape)
        return real(self)

    monkeypatch.setattr(array_type, "copy_to_host_async", record)

    def step(x, cache):
        return x.sum(), [c + x for c in cache]

    n = 8192   # over TINY: the adds run on jax, not on NumPy
    cache = [np.zeros(n, np.float32), np.ones(n, np.float32), np.full(n, 2, np.float32)]
    x = np.arange(n, dtype=np.float32)
    host = tgx.compile(step, state="cache", backends=["jax"], policy="heuristic",
                       return_backend_arrays=backend_arrays)
    host(x, cache)    # on the host: zero-copy views, nothing to start
    assert started == []
    np.testing.assert_array_equal(cache[2], x + 2)

    jb = get_backend("jax")
    mod = sys.modules[type(jb).__module__]
    cpu = jax.devices("cpu")[0]
    monkeypatch.setattr(jb, "device_reason", lambda d: None)
    monkeypatch.setattr(mod, "_jax_device", lambda d: object() if d == "cpu" else cpu)
    dev = tgx.compile(step, state="cache", backends=["jax"], device="cuda:0",
                      return_backend_arrays=backend_arrays)
    # the new state, and with NumPy results the sum too
    per_call = [(n,)] * 3 if backend_arrays else [(), *[(n,)] * 3]
    for calls in (1, 2):
        dev(x, cache)
        assert started == per_call * calls
        np.testing.assert_array_equal(cache[0], (calls + 1) * x)
        np.testing.assert_array_equal(cache[2], (calls + 1) * x + 2)


@pytest.mark.skipif(not backend_available("jax"), reason="jax is not installed")
def test_a_device_plan_starting_copies_still_donates_jax_state(monkeypatch):
    """The donating call of a region is built under the one starting its copies back
    (`CompiledGraph._variant`), and copies a mode leaves out (results kept as jax arrays)
    are not started."""
    import sys

    import jax
    import jax.numpy as jnp

    started: list = []
    array_type = type(jnp.ones(1))
    real = array_type.copy_to_host_async
    monkeypatch.setattr(array_type, "copy_to_host_async",
                        lambda self: (started.append(self.shape), real(self))[1])
    jb = get_backend("jax")
    mod = sys.modules[type(jb).__module__]
    cpu = jax.devices("cpu")[0]
    monkeypatch.setattr(jb, "device_reason", lambda d: None)
    monkeypatch.setattr(mod, "_jax_device", lambda d: object() if d == "cpu" else cpu)

    def step(x, cache):
        return (x.sum(), x * 2.0), [c + x for c in cache]

    n = 8192
    x = np.arange(n, dtype=np.float32)

    def fresh():
        return [jnp.zeros(n, jnp.float32), jnp.ones(n, jnp.float32)]

    f = tgx.compile(step, state="cache", backends=["jax"], device="cuda:0")
    cache = fresh()
    (total, doubled), new = f(x, cache)      # jax arrays in: results stay jax arrays
    assert float(total) == float(x.sum())
    np.testing.assert_array_equal(np.asarray(doubled), 2 * x)
    np.testing.assert_array_equal(np.asarray(new[1]), x + 1)
    assert all(c.is_deleted() for c in cache)        # donated, as jax.jit(donate_argnums)
    assert started == []                             # no copy back, none started
    # every result to NumPy (no out_backend) and the state donated, in one call: the four
    # copies started together, the state donated
    cache = fresh()
    outs = f.lower(x, cache).compiled.run_flat([x, *cache], donate=True)
    assert all(c.is_deleted() for c in cache)
    assert sorted(started) == [(), (n,), (n,), (n,)]
    assert type(outs[1]) is np.ndarray
    np.testing.assert_array_equal(outs[1], 2 * x)
    np.testing.assert_array_equal(np.asarray(outs[3]), x + 1)
