"""Shared by the tests and the doctests under tgx/: every test gets its own benchmark store
(`tgx.compile` defaults to policy "fastest", which reads and flags the default store), and
the run its own kernel cache (generated numba loops, XLA executables), so that tests never
write into the user's (`~/.cache/tgx/kernels`). `TGX_TEST_KERNEL_CACHE=DIR` keeps one
between runs instead (a cold cache adds ~25 s to the suite on 2 cores)."""

import atexit
import os
import shutil
import tempfile

import pytest

# Set at import, before pytest-xdist starts its workers: they inherit it and share the cache.
os.environ.pop("TGX_XLA_CACHE", None)  # the executables go beside the loops, in the test cache
# FASTEST calibrates a store it plans with (GEMM rates, bandwidths measured on this machine):
# tests plan with the cost model's defaults, so that what they plan does not depend on how
# fast the machine was at that moment (tests/planning/test_cost_model.py turns it on)
os.environ["TGX_CALIBRATE"] = "off"
if "TGX_TEST_KERNEL_CACHE" in os.environ:
    os.environ["TGX_KERNEL_CACHE"] = os.environ["TGX_TEST_KERNEL_CACHE"]
elif "_TGX_TEST_CACHE_OWNER" not in os.environ:
    _cache = tempfile.mkdtemp(prefix="tgx-test-kernels-")
    os.environ["TGX_KERNEL_CACHE"] = _cache
    os.environ["_TGX_TEST_CACHE_OWNER"] = str(os.getpid())
    atexit.register(shutil.rmtree, _cache, ignore_errors=True)


@pytest.fixture(autouse=True)
def _tmp_store(tmp_path, monkeypatch):
    monkeypatch.setenv("TGX_STORE", str(tmp_path / "tgx-store.json"))
