"""The XLA executables of jax regions are kept on disk (`tgx.backends.xla_cache`): a second
process loads what the first compiled; a broken, unwritable or switched-off cache changes
nothing but the compile time; the key separates what must not share an executable."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

pytest.importorskip("jax")

import jax  # noqa: E402

import tgx  # noqa: E402
import tgx.numpy as tnp  # noqa: E402
from tgx.backends import xla_cache as X  # noqa: E402

SCRIPT = textwrap.dedent("""
    import json, numpy as np, jax, tgx, tgx.numpy as tnp
    from tgx.backends import xla_cache
    xla_cache.MIN_COMPILE_S = 0          # keep even this small region

    def mlp(w, x):
        return tnp.tanh(x @ w["a"]) @ w["b"] + 1.0

    rng = np.random.default_rng(0)
    w = {"a": rng.standard_normal((8, 16)).astype(np.float32),
         "b": rng.standard_normal((16, 4)).astype(np.float32)}
    x = rng.standard_normal((3, 8)).astype(np.float32)
    f = tgx.compile(mlp, backends=["jax"], policy="heuristic", store=False, weights="w")
    y = f(w, x)
    assert jax.config.jax_compilation_cache_dir is None    # jax's own config untouched
    print(json.dumps({"stats": dict(xla_cache.STATS), "y": np.asarray(y).tolist()}))
""")


def _run(env_dir) -> dict:
    env = {**os.environ, "TGX_KERNEL_CACHE": str(env_dir)}
    r = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_a_second_process_loads_the_executable_the_first_compiled(tmp_path):
    first, second = _run(tmp_path), _run(tmp_path)
    assert first["stats"] == {"miss": 1, "write": 1}
    assert second["stats"] == {"hit": 1}                 # loaded: no trace, no compile
    assert len(list((tmp_path / "xla").glob("*.xla"))) == 1
    rng = np.random.default_rng(0)
    a = rng.standard_normal((8, 16)).astype(np.float32)
    b = rng.standard_normal((16, 4)).astype(np.float32)
    x = rng.standard_normal((3, 8)).astype(np.float32)
    want = np.tanh(x.astype(np.float64) @ a) @ b + 1.0
    np.testing.assert_allclose(first["y"], want, rtol=1e-5, atol=1e-5)
    assert second["y"] == first["y"]                    # the very same executable


def test_the_kernel_cache_lives_beside_the_default_store(monkeypatch, tmp_path):
    from tgx.backends.kernel_cache import kernel_cache_dir
    from tgx.store import default_store_path

    monkeypatch.delenv("TGX_KERNEL_CACHE", raising=False)
    monkeypatch.delenv("TGX_STORE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert kernel_cache_dir() == tmp_path / "tgx" / "kernels"
    assert os.path.dirname(default_store_path()) == str(tmp_path / "tgx")
    assert X.cache_dir() == tmp_path / "tgx" / "kernels" / "xla"
    monkeypatch.setenv("TGX_KERNEL_CACHE", "Off")
    assert kernel_cache_dir() is None and X.cache_dir() is None


def test_tgx_xla_cache_moves_or_switches_off_the_executables_alone(monkeypatch, tmp_path):
    from tgx.backends.kernel_cache import kernel_cache_dir

    monkeypatch.setenv("TGX_KERNEL_CACHE", str(tmp_path / "k"))
    monkeypatch.setenv("TGX_XLA_CACHE", str(tmp_path / "x"))
    assert X.cache_dir() == tmp_path / "x" and kernel_cache_dir() == tmp_path / "k"
    for off in ("off", "0", "False", "no"):   # as users spell "off" (0 was a directory)
        monkeypatch.setenv("TGX_XLA_CACHE", off)
        assert X.cache_dir() is None and kernel_cache_dir() == tmp_path / "k"
    monkeypatch.setenv("TGX_XLA_CACHE", " ")
    assert X.cache_dir() == tmp_path / "k" / "xla"


def test_tests_do_not_write_into_the_users_kernel_cache():
    # conftest.py points the run at a temporary cache (inherited by xdist's workers and by
    # the subprocesses tests start)
    from tgx.backends.kernel_cache import kernel_cache_dir

    user = os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"),
                        "tgx", "kernels")
    assert kernel_cache_dir() is not None and str(kernel_cache_dir()) != user
    if "TGX_TEST_KERNEL_CACHE" not in os.environ:
        assert os.path.basename(str(kernel_cache_dir())).startswith("tgx-test-kernels-")
    code = "from tgx.backends.kernel_cache import kernel_cache_dir; print(kernel_cache_dir())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out == str(kernel_cache_dir())


# ----------------------------------------------------------------- in one process


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A fresh kernel cache, every compile kept, the counters from zero."""
    monkeypatch.setenv("TGX_KERNEL_CACHE", str(tmp_path))
    monkeypatch.setattr(X, "MIN_COMPILE_S", 0.0)
    monkeypatch.setattr(X, "STATS", X.STATS.__class__())
    return tmp_path / "xla"


def _region(c=2.0):
    """A fresh region callable (as `JaxBackend.region` makes one), x * c + y."""
    def run(x, y):
        return (x * c + y,)
    return X.persistent(run, lambda: f"test region x * {c} + y")


ARGS = (np.arange(6, dtype=np.float32).reshape(2, 3), np.ones((2, 3), np.float32))


def _check(out, c=2.0):
    np.testing.assert_array_equal(np.asarray(out[0]), ARGS[0] * c + ARGS[1])


def test_a_new_region_callable_loads_what_an_earlier_one_wrote(cache):
    _check(_region()(*ARGS))
    assert X.STATS == {"miss": 1, "write": 1}
    _check(_region()(*ARGS))
    assert X.STATS == {"miss": 1, "write": 1, "hit": 1}
    _check(_region(3.0)(*ARGS), 3.0)                     # another region: its own entry
    assert X.STATS["miss"] == 2 and len(list(cache.glob("*.xla"))) == 2


@pytest.mark.parametrize("damage", ["truncated", "flipped", "garbage", "empty"])
def test_a_broken_entry_is_compiled_again_and_replaced(cache, damage):
    _region()(*ARGS)
    (path,) = cache.glob("*.xla")
    data = path.read_bytes()
    path.write_bytes({"truncated": data[:len(data) // 2],
                      "flipped": data[:-10] + bytes([data[-10] ^ 1]) + data[-9:],
                      "garbage": os.urandom(len(data)), "empty": b""}[damage])
    _check(_region()(*ARGS))
    assert X.STATS == {"miss": 2, "write": 2, "corrupt": 1}    # and written again
    _check(_region()(*ARGS))
    assert X.STATS["hit"] == 1


def test_an_unwritable_cache_only_costs_the_compile(tmp_path, monkeypatch, cache):
    (tmp_path / "file").write_text("")                   # a file where the directory goes
    monkeypatch.setenv("TGX_KERNEL_CACHE", str(tmp_path / "file" / "kernels"))
    _check(_region()(*ARGS))
    _check(_region()(*ARGS))
    assert X.STATS == {"miss": 2, "write_failed": 2}


def test_switched_off_nothing_is_kept(cache, monkeypatch):
    monkeypatch.setenv("TGX_KERNEL_CACHE", "off")
    _check(_region()(*ARGS))
    assert X.STATS == {"off": 1} and not cache.exists()


def test_the_users_own_jax_cache_is_left_to_jax(cache, tmp_path):
    """Set up jax's persistent cache and tgx keeps nothing of its own: jax.jit caches the
    regions where the user said, with the user's thresholds."""
    assert X.cache_dir() == cache
    jax.config.update("jax_compilation_cache_dir", str(tmp_path / "mine"))
    try:
        assert X.cache_dir() is None
    finally:
        jax.config.update("jax_compilation_cache_dir", None)
    assert X.cache_dir() == cache


def test_slow_compiles_only_are_written(cache, monkeypatch):
    monkeypatch.setattr(X, "MIN_COMPILE_S", 1e9)
    _check(_region()(*ARGS))
    assert X.STATS == {"miss": 1} and not list(cache.glob("*.xla"))


def test_arguments_of_other_types_run_through_jax_jit(cache):
    f = _region()
    _check(f(*ARGS))
    out = f(ARGS[0], 1.0)                               # a weak Python scalar for y
    np.testing.assert_array_equal(np.asarray(out[0]), ARGS[0] * 2 + 1)
    assert X.STATS["fallback"] == 1


def test_the_least_recently_used_entries_go_above_the_size_limit(cache, monkeypatch):
    _region(2.0)(*ARGS)
    (old,) = cache.glob("*.xla")
    monkeypatch.setattr(X, "MAX_BYTES", old.stat().st_size * 3 // 2)
    os.utime(old, (1, 1))                               # used long ago
    _region(3.0)(*ARGS)
    assert [p.name for p in cache.glob("*.xla")] != [old.name]
    assert len(list(cache.glob("*.xla"))) == 1


def test_a_donating_region_has_its_own_entry_and_still_donates(cache):
    def region(donate):
        return X.persistent(lambda x, y: (x * 2.0 + y,), lambda: "donation test", donate)

    def args():
        return jax.device_put(ARGS[0]), jax.device_put(ARGS[1])

    for _ in range(2):                                  # compiled, then loaded
        x, y = args()
        _check(region((0,))(x, y))
        assert x.is_deleted() and not y.is_deleted()    # XLA took x's buffer
    assert X.STATS == {"miss": 1, "write": 1, "hit": 1}
    x, y = args()
    _check(region(())(x, y))                            # not donating: another executable
    assert not x.is_deleted() and X.STATS["miss"] == 2


def test_the_key_separates_what_needs_its_own_executable():
    d = "a region"
    x32, x64 = np.ones((2, 3), np.float32), np.ones((2, 3), np.float64)
    with jax.enable_x64(True):
        base = X.region_key(d, [x32], ())
        assert X.region_key(d, [x32], ()) == base
        assert X.region_key(d + " ", [x32], ()) != base               # the program
        assert X.region_key(d, [x64], ()) != base                      # a dtype
        assert X.region_key(d, [np.ones((3, 3), np.float32)], ()) != base  # a shape
        assert X.region_key(d, [x32], (0,)) != base                    # donation
        assert X.region_key(d, [np.float32(1)], ()) != X.region_key(d, [1.0], ())  # weak
        with jax.default_matmul_precision("bfloat16"):                 # a jax option
            assert X.region_key(d, [x32], ()) != base


def test_regions_with_kernels_from_outside_tgx_are_not_kept():
    """A user's kernel can change without tgx seeing it: such a region is compiled per
    process. tgx's own kernels are named, and literals and params are part of the text."""
    g = tgx.make_graph(lambda x: tnp.exp(x) * 2.0)(tgx.Spec((3,), "float32"))
    from tgx.backends import jax_backend  # noqa: F401 - registers the jax kernels
    from tgx.backends.registry import kernels_for

    steps = [(kernels_for(e.primitive.name, "jax")[0].fn, dict(e.params), e) for e in g.eqns]
    text = X.describe(steps, [v.id for v in g.invars], [v.id for v in g.outvars])
    assert "exp|tgx.backends.jax_backend.jax_exp" in text and "lit:float32" in text
    steps[0] = (lambda x: x, {}, g.eqns[0])
    with pytest.raises(X.NotKept, match="not tgx's or jax's"):
        X.describe(steps, [v.id for v in g.invars], [v.id for v in g.outvars])


def test_a_plan_on_jax_uses_the_cache_end_to_end(cache):
    f = tgx.compile(lambda x, y: tnp.sum(tnp.exp(x) * y, axis=1), backends=["jax"],
                    policy="heuristic", store=False)
    x, y = np.ones((4, 5), np.float32), np.full((4, 5), 2.0, np.float32)
    np.testing.assert_allclose(f(x, y), np.full(4, 10 * np.e, np.float32), rtol=1e-6)
    assert X.STATS == {"miss": 1, "write": 1}
    g = tgx.compile(lambda x, y: tnp.sum(tnp.exp(x) * y, axis=1), backends=["jax"],
                    policy="heuristic", store=False)
    np.testing.assert_allclose(g(x, y), np.full(4, 10 * np.e, np.float32), rtol=1e-6)
    assert X.STATS["hit"] == 1
