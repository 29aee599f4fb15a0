"""A corpus run shows progress while it runs, and ends with a summary of counters and wall time."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from pipeline.progress import ProgressWriter, format_progress, read_progress
from repo_paths import BOOKS, REPO, VOCAB, WIKI_DUMP


def test_progress_files_sum_across_writers(tmp_path):
    a, b = ProgressWriter(str(tmp_path), "tokenize"), ProgressWriter(str(tmp_path), "instances")
    a.add(documents=2, sentences=10, tokens=100)
    a.add(documents=1, sentences=5, tokens=50)
    b.add(instances=7)
    a.flush()
    b.flush()
    counts = read_progress(str(tmp_path))
    assert counts == {"documents": 3, "sentences": 15, "tokens": 150, "instances": 7}
    assert format_progress(counts, 2.0).startswith("progress: 3 documents, 15 sentences, 150 tokens (75 tokens/s), 7 instances")
    assert ProgressWriter(None, "x").path is None  # remote output: no files


def test_corpus_run_shows_progress_while_running(tmp_path):
    """The real CLI on the bundled data: progress lines arrive before the process has exited."""
    argv = [sys.executable, "-m", "launch.cli", "corpus", "--input", str(BOOKS[1]), str(WIKI_DUMP), "--vocab", str(VOCAB),
            "--out", str(tmp_path / "out"), "--seq-len", "64", "--dupe-factor", "1", "--progress-seconds", "0.5"]
    proc = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    live, lines = [], []
    start = time.monotonic()
    for line in proc.stdout:
        lines.append(line)
        if "progress:" in line and proc.poll() is None:
            live.append(line)
    assert proc.wait(300) == 0, "".join(lines[-40:])
    assert live, f"no progress line while the job ran ({time.monotonic() - start:.0f} s):\n{''.join(lines[-40:])}"
    # Documents and tokens are counted as they are tokenized, instances as they are made.
    assert any(" 0 documents" not in line and " 0 tokens" not in line for line in live), live
    assert any(" 0 instances" not in line for line in live), live
    done = [line for line in lines if "corpus done in" in line]
    assert done and '"instances":' in done[0] and '"tokens":' in done[0]
