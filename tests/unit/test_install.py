"""Installing tgx: the distribution's name and extras, and what a NumPy-only user imports."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import textwrap
import tomllib

import pytest

from tgx.store import environment

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_distribution_is_not_the_unrelated_tgx_and_torch_is_a_range():
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    # "tgx" on PyPI is an unrelated, empty package whose tgx/__init__.py shadows ours
    assert meta["name"] == "tgx-trace"
    assert meta["scripts"]["tgx"] == "tgx.cli:main"
    (torch,) = meta["optional-dependencies"]["torch"]
    assert "==" not in torch and ">=" in torch and "<" in torch.replace("<=", "<")
    readme = (ROOT / "README.md").read_text()
    install = readme.split("## Install", 1)[1].split("\n## ", 1)[0]
    for words in ("pip install -e .", 'pip install "tgx-trace[torch,jax]"', "pip install tgx",
                  "unrelated", "torch==2.13.0", "make"):
        assert words in install, words


@pytest.mark.skipif(environment._may_have_gpu(),
                    reason="a GPU driver is present: the environment is read through torch")
def test_numpy_only_compile_imports_neither_torch_nor_jax(tmp_path):
    code = textwrap.dedent("""
        import json, sys
        import numpy as np
        import tgx, tgx.numpy as tnp
        f = tgx.compile(lambda x: tnp.tanh(tnp.exp(x) * 2.0), backends=["numpy"])
        y = f(np.ones(8, np.float32))          # policy "fastest": reads and flags the store
        assert y.shape == (8,)
        print(json.dumps(sorted(m for m in ("torch", "jax", "jaxlib") if m in sys.modules)))
    """)
    env = dict(os.environ, TGX_STORE=str(tmp_path / "store.json"))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                       cwd=ROOT, timeout=300)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout.splitlines()[-1]) == []
    assert (tmp_path / "store.json").exists()  # the store was used (and its env recorded)


def test_import_tgx_loads_no_heavy_library():
    """What keeps `import tgx` short (0.3 s here, 0.22 s of it sympy): no backend, no scipy."""
    code = ("import sys, json, tgx; print(json.dumps(sorted(m for m in "
            "('torch', 'jax', 'scipy', 'numba', 'safetensors') if m in sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, check=True)
    assert json.loads(out.stdout) == []
