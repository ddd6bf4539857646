"""Every Python code block in README.md and docs/*.md runs (blocks of one page share a
namespace, in order)."""

from __future__ import annotations

import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_code_blocks_run(page, tmp_path, monkeypatch):
    blocks = BLOCK.findall(page.read_text())
    if not blocks:
        pytest.skip("no python blocks")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(ROOT / "examples"))   # pages may import the examples
    monkeypatch.setenv("TGX_STORE", str(tmp_path / "store.json"))
    ns: dict = {"__name__": f"docs_{page.stem}"}
    for i, src in enumerate(blocks):
        code = compile(src, f"{page.name}[block {i}]", "exec")
        exec(code, ns)
