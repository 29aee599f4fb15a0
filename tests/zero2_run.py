"""A real 8-step ZeRO-2 pre-training run on 2 gloo processes (checkpoints at steps 4, 6 and 8), built once per
test run through the real CLI: the run directory the run-dir safety and disk-full tests damage copies of."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from built_once import built_once

BERTPIPE = Path(sys.executable).with_name("bertpipe")
STEPS = 8
TRAIN = ["--config", "tiny", "--max-steps", str(STEPS), "--save-every", "2", "--zero.stage", "2",
         "--checkpoint.keep-last", "3", "--log.eval-every", "0", "--log.tensorboard", "false"]


def bertpipe(*args: object, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([str(BERTPIPE), *map(str, args)], capture_output=True, text=True, cwd=cwd, timeout=600,
                          env=dict(os.environ, OMP_NUM_THREADS="1"))


def zero2_run(small_corpus: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    def build(out: Path) -> None:
        done = bertpipe("pretrain", "--data", small_corpus, "--out", out, "--nproc", "2", *TRAIN)
        assert done.returncode == 0, done.stderr[-3000:]

    return built_once(tmp_path_factory, "run_dir_safety_run", build)
