"""One real trainer micro-step makes no host sync: the loader's precomputed unpadding, no finiteness
all-reduce before backward, the loss and counts left on the device (issue 15, item 3)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

WORKER = Path(__file__).with_name("sync_count_worker.py")


@pytest.mark.slow
def test_a_trainer_micro_step_makes_no_host_sync(small_corpus, tmp_path):
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONHASHSEED="0")
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    done = subprocess.run([sys.executable, str(WORKER), str(small_corpus), str(tmp_path / "run")],
                          capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stderr[-4000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["layout_keys"] == ["cu_seqlens", "max_seqlen", "unpad_indices"]
    assert result["loss_sum"] > 0  # two micro-steps really ran
    # The counter sees syncs where they exist: the model left to build its own layout calls nonzero.
    assert any(call.startswith("nonzero") for call in result["control"]), result["control"]
    assert result["micro_step"] == [], "\n".join(result["micro_step"])
