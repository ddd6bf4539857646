"""docs/store.md stays true to `BenchmarkStore`: its API table names every public method."""

from __future__ import annotations

import inspect
import pathlib
import re

from tgx.store import BenchmarkStore

DOC = pathlib.Path(__file__).resolve().parents[2] / "docs" / "store.md"


def test_the_api_table_names_every_public_method():
    text = DOC.read_text(encoding="utf-8")
    table = text.split("## API", 1)[1].split("\n## ", 1)[0]
    rows = [ln.split("|")[1] for ln in table.splitlines() if ln.startswith("| `")]
    named = set(re.findall(r"`(\w+)", " ".join(rows))) | set(re.findall(r"(?<=, `)(\w+)",
                                                                         " ".join(rows)))
    public = {n for n, _ in inspect.getmembers(BenchmarkStore, inspect.isfunction)
              if not n.startswith("_")}
    assert public - named == set(), sorted(public - named)
