"""A step whose update DeepSpeed skips (an fp16 loss-scale overflow) is not counted as a step: the
run still makes `total_steps` real updates and its lr reaches the schedule's end."""

from __future__ import annotations

from pathlib import Path

import pytest

from lone_trainer import run_worker

WORKER = Path(__file__).with_name("overflow_worker.py")


@pytest.mark.slow
def test_a_step_deepspeed_skips_is_not_counted(small_corpus, tmp_path):
    r = run_worker(WORKER, small_corpus, tmp_path / "run")
    assert r["engine_skipped"] == 1 and r["weights_changed"] == [True, False, True]
    assert r["applied"] == [True, False, True] and r["step"] == 2
    assert r["lrs"][2] == r["lrs"][1] != r["lrs"][0]  # the skipped step did not advance the schedule
    assert r["position"] == 3 * 32  # its batch was consumed, as a non-finite loss's is
