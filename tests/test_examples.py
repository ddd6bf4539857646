"""Every example runs on its own (as `python examples/NAME.py`) and checks its own results."""

from __future__ import annotations

import pathlib
import runpy
import sys

import pytest

EXAMPLES = sorted((pathlib.Path(__file__).resolve().parents[1] / "examples").glob("*.py"))


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_example_runs(path, monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(sys, "argv", [str(path)])
    monkeypatch.syspath_prepend(str(path.parent))  # as `python examples/NAME.py` has it
    monkeypatch.setenv("TGX_STORE", str(tmp_path / "store.json"))
    monkeypatch.chdir(tmp_path)
    runpy.run_path(str(path), run_name="__main__")
    assert capsys.readouterr().out.strip()
