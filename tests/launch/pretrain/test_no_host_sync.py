"""One real trainer micro-step makes no host sync: the loader's precomputed unpadding, no finiteness
all-reduce before backward, the loss and counts left on the device (issue 15, item 3)."""

from __future__ import annotations

from pathlib import Path

import pytest

from lone_trainer import run_worker

WORKER = Path(__file__).with_name("sync_count_worker.py")


@pytest.mark.slow
def test_a_trainer_micro_step_makes_no_host_sync(small_corpus, tmp_path):
    result = run_worker(WORKER, small_corpus, tmp_path / "run")
    assert result["layout_keys"] == ["cu_seqlens", "max_seqlen", "unpad_indices"]
    assert result["loss_sum"] > 0  # two micro-steps really ran
    # The counter sees syncs where they exist: the model left to build its own layout calls nonzero.
    assert any(call.startswith("nonzero") for call in result["control"]), result["control"]
    assert result["micro_step"] == [], "\n".join(result["micro_step"])
