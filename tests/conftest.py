"""Fixtures shared by the store-level test files."""

from __future__ import annotations

import pytest

from nbdurable.store import Store


@pytest.fixture(autouse=True)
def _no_env_key(monkeypatch):
    """Stores in tests use their own key file, whatever the environment says."""
    monkeypatch.delenv("NBDURABLE_KEY", raising=False)


@pytest.fixture
def store(tmp_path):
    """A fresh store in the test's temporary directory."""
    s = Store(tmp_path / "store")
    yield s
    s.close()
