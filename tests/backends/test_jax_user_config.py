"""The jax backend leaves the user's JAX configuration as it was: its calls run with 64-bit
types on (tgx graphs carry float64/int64), the user's `jnp` calls keep JAX's defaults."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("jax")

SCRIPT = textwrap.dedent("""
    import numpy as np
    import jax.numpy as jnp
    import tgx, tgx.numpy as tnp

    assert jnp.arange(3).dtype == jnp.int32
    f = tgx.compile(lambda x, i: tnp.sum(x * 2.0) + i, backends=["jax"], policy="heuristic")
    x = np.array([1e-12, 1.0], np.float64)
    r = f(x, np.int64(2**40))
    assert r.dtype == np.float64, r.dtype
    assert r == 2.0 + 2e-12 + 2**40, repr(r)      # 64-bit math inside the plan
    assert jnp.arange(3).dtype == jnp.int32         # the user's default is untouched
    assert jnp.asarray(1.5).dtype == jnp.float32
    g = tgx.compile(lambda x: x * 2, backends=["jax"], policy="heuristic",
                    return_backend_arrays=True)
    assert g(np.arange(3)).dtype == jnp.int64        # a jax array of the graph's dtype
    print("ok")
""")


def test_compiling_on_jax_keeps_the_users_jax_defaults():
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().endswith("ok")
