"""The environment sniffer: contents, stable ids across processes, robustness, formatting."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from tgx.store import environment as envmod
from tgx.store import environment_id, format_environment, sniff_environment


def test_sniff_reports_hardware_platform_and_libraries():
    env = sniff_environment()
    assert env["cpu_model"] and env["cpu_cores"] >= 1
    assert env["memory_bytes"] is None or env["memory_bytes"] > 2**20
    assert env["python"].count(".") == 2
    assert set(env["libraries"]) >= {"numpy", "torch", "jax", "tgx"}
    assert isinstance(env["gpus"], list)
    assert env["id"] == environment_id(env)
    json.dumps(env)  # storable as is


def test_id_is_stable_across_processes():
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    code = "from tgx.store import sniff_environment as s; print(s()['id'])"
    envvars = dict(os.environ, PYTHONPATH=repo, PYTHONHASHSEED="123")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=envvars, check=True, timeout=120)
    assert out.stdout.strip() == sniff_environment()["id"]


def test_id_depends_on_identity_fields_only():
    env = sniff_environment()
    assert environment_id(dict(env, id="x", sniffed_at=123.0, hostname="h")) == env["id"]
    other = dict(env, libraries=dict(env["libraries"], numpy="0.0.1"))
    assert environment_id(other) != env["id"]
    assert environment_id(dict(env, cpu_cores=env["cpu_cores"] + 1)) != env["id"]
    assert environment_id(dict(reversed(list(env.items())))) == env["id"]


def test_sniff_survives_missing_torch_and_libraries(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)  # "import torch" now raises ImportError
    monkeypatch.setattr(envmod, "_libraries", lambda: ["numpy", "surely-not-installed-pkg"])
    monkeypatch.setattr(envmod, "_cpu_model", lambda: "fallback cpu")
    env = sniff_environment()
    assert env["gpus"] == []
    assert env["libraries"]["surely-not-installed-pkg"] is None
    assert env["libraries"]["numpy"]


def test_format_environment_is_readable():
    env = {"id": "env-1", "cpu_model": "EPYC", "cpu_cores": 8, "memory_bytes": 64 * 2**30,
           "gpus": [{"name": "H100", "memory_bytes": 80 * 2**30, "compute_capability": "9.0",
                     "driver": "12040", "cuda": "12.4"}],
           "platform": "Linux-6", "python": "3.11.7",
           "libraries": {"numpy": "2.0", "torch": None}}
    text = format_environment(env)
    assert text.splitlines()[0] == "environment env-1"
    for part in ("EPYC (8 cores)", "64.0 GiB", "H100 (80.0 GiB, sm 9.0", "Linux-6", "3.11.7",
                 "torch   not installed"):
        assert part in text
    assert format_environment().startswith("environment env-")
