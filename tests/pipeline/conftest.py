"""Fixtures of the corpus tests."""

from __future__ import annotations

import pytest

import object_store


@pytest.fixture
def store(tmp_path):
    """An `objstore://` file system (tests/object_store.py) rooted in a fresh folder: --out or inputs there
    take the corpus job's remote paths (no folders, no local renames)."""
    object_store.ROOT["path"] = str(tmp_path / "bucket")
    (tmp_path / "bucket").mkdir()
    yield tmp_path / "bucket"
    object_store.ROOT["path"] = ""
