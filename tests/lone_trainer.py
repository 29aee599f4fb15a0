"""Run a worker script that builds the real Trainer in a lone process (a process group of one), and
read the JSON it prints last. Its own process: DeepSpeed's process group must not outlive the test."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any


def run_worker(script: Path, corpus: Path, out: Path, *args: str) -> dict[str, Any]:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONHASHSEED="0")
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)  # the trainer then makes its own group of one
    done = subprocess.run([sys.executable, str(script), str(corpus), str(out), *args],
                          capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])
