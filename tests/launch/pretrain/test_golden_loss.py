"""Golden losses: the tiny CPU config's loss at each of its first 20 steps, to within float32 rounding.

Nothing else notices when a change silently moves the loss curve (a new init, a different masking
draw, another data order: each moves it by 1e-3 or more). Not bit for bit: the same code and corpus
give losses that differ in the last float32 bits from one CPU to another (AVX2 against AVX-512/AMX
kernel dispatch: up to 4.8e-7 over these 20 steps, measured), hence TOLERANCE. The run is real: `bertpipe pretrain --config tiny` in one process
(DeepSpeed ZeRO-1 over gloo, LAMB, fp32, deterministic algorithms, one OpenMP thread) on the shared
real corpus built from the bundled data. A change that is *meant* to move the numbers regenerates
the file on purpose, and the diff of `golden/tiny_losses.json` shows it in review:

    BERTPIPE_REGEN_GOLDEN=1 .venv/bin/python -m pytest tests/launch/pretrain/test_golden_loss.py
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

GOLDEN = Path(__file__).parent / "golden" / "tiny_losses.json"
STEPS = 20
TOLERANCE = 2e-6  # relative: a few float32 ulps at a loss of ~11
REGENERATE = "BERTPIPE_REGEN_GOLDEN"
FLAGS = ["--config", "tiny", "--nproc", "1", "--max-steps", str(STEPS), "--save-every", "0", "--deterministic",
         "--log.eval-every", "0", "--log.tensorboard", "false"]


def _losses(corpus: Path, out: Path) -> list[float]:
    bertpipe = Path(sys.executable).with_name("bertpipe")
    cmd = [str(bertpipe), "pretrain", "--data", str(corpus), "--out", str(out), *FLAGS]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600,
                          env=dict(os.environ, OMP_NUM_THREADS="1", PYTHONHASHSEED="0"))
    assert done.returncode == 0, done.stderr[-4000:]
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    assert [r["step"] for r in records] == list(range(1, STEPS + 1))
    return [r["loss"] for r in records]


@pytest.mark.slow
def test_tiny_config_losses_equal_the_golden_file(small_corpus, tmp_path):
    losses = _losses(small_corpus, tmp_path / "run")
    if os.environ.get(REGENERATE) == "1":
        GOLDEN.parent.mkdir(exist_ok=True)
        record = {"about": "bertpipe pretrain --data <small_corpus fixture> --out RUN " + " ".join(FLAGS)
                  + f"; regenerate with {REGENERATE}=1 (see this test's docstring)", "losses": losses}
        GOLDEN.write_text(json.dumps(record, indent=1) + "\n")
        pytest.skip(f"regenerated {GOLDEN}")  # never a silent pass: the run that writes the file checks nothing
    golden = json.loads(GOLDEN.read_text())["losses"]
    assert len(golden) == STEPS
    changed = [(step, want, got) for step, (want, got) in enumerate(zip(golden, losses), 1)
               if abs(want - got) > TOLERANCE * abs(want)]
    assert not changed, (f"the loss curve moved (step, golden, now): {changed[:5]}; if that is intended, "
                         f"regenerate with {REGENERATE}=1 and explain why in the commit")
