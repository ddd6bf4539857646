"""Shared by the tests and the doctests under tgx/: every test gets its own benchmark store
(`tgx.compile` defaults to policy "fastest", which reads and flags the default store)."""

import pytest


@pytest.fixture(autouse=True)
def _tmp_store(tmp_path, monkeypatch):
    monkeypatch.setenv("TGX_STORE", str(tmp_path / "tgx-store.json"))
