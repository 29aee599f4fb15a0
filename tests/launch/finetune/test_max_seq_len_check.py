"""`--max-seq-len` beyond the checkpoint's position embeddings is refused before any work."""

from __future__ import annotations

import pytest

from launch import cli
from repo_paths import GLUE


def test_max_seq_len_beyond_the_positions_is_refused_up_front(tiny_checkpoint, tmp_path, capsys):
    out = tmp_path / "sst2"
    argv = ["finetune", "--task", "sst2", "--data-dir", str(GLUE), "--checkpoint", str(tiny_checkpoint),
            "--out", str(out), "--max-seq-len", "512", "--max-train-samples", "16", "--epochs", "1", "--no-progress"]
    with pytest.raises(SystemExit) as exit_:
        cli.main(argv)
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == (f"bertpipe finetune: error: --max-seq-len 512 exceeds the checkpoint's 256 position "
                       f"embeddings ({tiny_checkpoint}); use --max-seq-len 256 or less")
    assert "Traceback" not in "\n".join(err)
    assert not (out / "metrics.json").exists()
