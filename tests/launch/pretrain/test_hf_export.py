"""`bertpipe export` on a checkpoint folder laid out as `bertpipe pretrain` writes it (no ZeRO, fp32), so
no training is needed; the end-to-end export of a real run is in test_pretrain_e2e.py."""

from __future__ import annotations

import json
import os
from dataclasses import asdict
from pathlib import Path

import pytest
import torch

from launch import cli
from launch.checkpoint_dirs import META, file_records
from model import BertConfig, BertForPreTraining

VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(998)]  # 1,003 pieces


def write_run(run: Path, **meta_changes) -> Path:
    """A one-checkpoint run whose model has 1,024 vocabulary rows for the 1,003-piece vocab.txt."""
    folder = run / "checkpoints" / "global_step10"
    folder.mkdir(parents=True)
    config = BertConfig.preset("tiny", vocab_size=1024)
    torch.manual_seed(0)
    torch.save({"module": BertForPreTraining(config).state_dict()}, folder / "mp_rank_00_model_states.pt")
    (folder / "vocab.txt").write_text("\n".join(VOCAB) + "\n")
    meta = {"step": 10, "position": 80, "world_size": 1, "zero_stage": 0, "precision": "fp32",
            "config": {"data": {"global_batch_size": 8}, "optim": {"name": "adamw", "lr": 1e-4}},
            "bert_config": asdict(config), "corpus": {"lowercase": True}, **meta_changes}
    (folder / META).write_text(json.dumps({**meta, "files": file_records(folder)}))
    (run / "checkpoints" / "latest").write_text("global_step10\n")
    return run


def test_the_model_card_gives_the_exported_vocabulary_not_the_padded_rows(tmp_path):
    run = write_run(tmp_path / "run")
    assert cli.main(["export", str(run), "--out", str(tmp_path / "hf")]) == 0
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["vocab_size"] == 1003
    card = (tmp_path / "hf" / "README.md").read_text()
    assert "vocabulary 1003," in card and "1024" not in card


def test_metadata_without_the_model_shape_is_one_line_naming_the_file(tmp_path, capsys):
    # `bert_config` missing: export used to fail with a NameError traceback on the way to saying so.
    run = write_run(tmp_path / "run", bert_config=None)
    with pytest.raises(SystemExit) as exc:
        cli.main(["export", str(run), "--out", str(tmp_path / "hf")])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    meta = run / "checkpoints" / "global_step10" / META
    assert f"{meta} lacks bert_config" in err and "damaged" in err and "Traceback" not in err
    assert not (tmp_path / "hf").exists()


def test_an_export_removes_the_folder_a_killed_export_of_the_same_out_left_and_nothing_else(tmp_path):
    # A killed export left `.OUT-xxxxxxxx/` (a whole model) beside OUT, and no later export removed it.
    import subprocess
    import sys

    run = write_run(tmp_path / "run")
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    stopped = tmp_path / f".hf.bertpipe-partial-{int(dead.stdout)}-abcd1234"
    running = tmp_path / f".hf.bertpipe-partial-{os.getpid()}-abcd1234"  # a live process's: not ours to touch
    users = tmp_path / ".hf-notes"
    for folder in (stopped, running, users):
        folder.mkdir()
        (folder / "model.safetensors").write_bytes(b"partial")
    assert cli.main(["export", str(run), "--out", str(tmp_path / "hf")]) == 0
    assert not stopped.exists() and running.is_dir() and users.is_dir()
    assert {p.name for p in tmp_path.iterdir() if p.name.startswith(".hf")} == {running.name, users.name}
