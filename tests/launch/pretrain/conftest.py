"""Fixtures of the pre-training tests."""

from __future__ import annotations

import datetime

import pytest
import torch.distributed as dist


@pytest.fixture
def gloo_group_of_one(tmp_path):
    """A gloo process group of one in this process, for code that calls collectives (a save, a load)."""
    assert not dist.is_initialized(), "an earlier test left a process group open in this process"
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1, timeout=datetime.timedelta(seconds=60))
    try:
        yield
    finally:
        dist.destroy_process_group()
