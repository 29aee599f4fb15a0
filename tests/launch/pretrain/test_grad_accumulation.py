"""A step with gradient accumulation applies the mean of its micro-batches' gradients, in every
precision: bf16 on ZeRO-1 (BERT-Base's preset) applied micro-batch k's gradient GA-k times, as
DeepSpeed's pre-backward step (which clears the bf16 gradients) never ran on our dataclass output."""

from __future__ import annotations

from pathlib import Path

import pytest

from lone_trainer import run_worker

WORKER = Path(__file__).with_name("accumulation_worker.py")


@pytest.mark.parametrize("dtype,stage", [("bf16", "1"), ("fp32", "1")])
def test_the_step_applies_the_mean_of_its_micro_batch_gradients(small_corpus, tmp_path, dtype, stage):
    r = run_worker(WORKER, small_corpus, tmp_path / "run", dtype, stage)
    assert r["optimizer"] == ("BF16_Optimizer" if dtype == "bf16" else "DeepSpeedZeroOptimizer")
    assert abs(r["first_twice_norm"] - r["mean_norm"]) > 0.2 * r["mean_norm"]  # the wrong sum is far off
    tolerance = 0.01 if dtype == "bf16" else 1e-5  # bf16 forward and backward round
    assert abs(r["handed_norm"] - r["mean_norm"]) < tolerance * r["mean_norm"], r
