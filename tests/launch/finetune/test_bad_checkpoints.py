"""Damaged or unreadable checkpoints are refused in one line that names the file at fault, not blamed on
the weights' shapes, a missing file or the learning rate.

Each case is a copy of a real exported checkpoint (`tiny_checkpoint`) with one file changed.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from launch.finetune.checkpoint import open_checkpoint
from launch.finetune.examples import DataError
from launch.finetune.finetune_config import FinetuneConfig
from launch.finetune.runner import Finetuner
from model import BertModel, load_pretrained

from repo_paths import GLUE

REPO = Path(__file__).resolve().parents[3]


def _copy(src: Path, dest: Path) -> Path:
    return Path(shutil.copytree(src, dest))


def _edit_weights(ckpt: Path, name: str, edit) -> None:
    state = load_file(str(ckpt / "model.safetensors"))
    edit(state[name])
    save_file(state, str(ckpt / "model.safetensors"), metadata={"format": "pt"})


def _cfg(ckpt: Path, out: Path, **changes) -> FinetuneConfig:
    return FinetuneConfig(task="sst2", data_dir=str(GLUE), checkpoint=str(ckpt), out=str(out), max_train_samples=16,
                          max_eval_samples=16, epochs=1, batch_size=8, max_seq_len=32, save_model=False,
                          progress=False, **changes)


# -- 1. unreadable files ------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["model.safetensors", "config.json", "vocab.txt"])
def test_an_unreadable_file_is_named_not_said_to_be_missing(tiny_checkpoint, tmp_path, monkeypatch, name):
    # safetensors said "No such file or directory" of a model.safetensors it was not allowed to open.
    ckpt = _copy(tiny_checkpoint, tmp_path / "ckpt")
    access = os.access
    monkeypatch.setattr(os, "access", lambda p, mode, **kw: Path(p).name != name and access(p, mode, **kw))
    with pytest.raises(ValueError, match=rf"^cannot read {re.escape(str(ckpt / name))}: Permission denied; make it readable$"):
        load_pretrained(BertModel, ckpt)


@pytest.mark.parametrize("name", ["config.json", "vocab.txt"])
def test_fine_tuning_names_an_unreadable_config_or_vocab(tiny_checkpoint, tmp_path, monkeypatch, name):
    # vocab.txt was a PermissionError traceback; config.json was called damaged JSON.
    ckpt = _copy(tiny_checkpoint, tmp_path / "ckpt")
    read_text = Path.read_text

    def deny(self, *args, **kwargs):
        if self.name == name:
            raise PermissionError(13, "Permission denied", str(self))
        return read_text(self, *args, **kwargs)

    monkeypatch.setattr(Path, "read_text", deny)
    with pytest.raises(DataError, match=rf"^cannot read {re.escape(str(ckpt / name))}: Permission denied; make it readable$"):
        open_checkpoint(ckpt)


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None,
                    reason="needs root and setpriv: drops the capability that lets root read a chmod 000 file")
@pytest.mark.parametrize("name", ["model.safetensors", "vocab.txt"])
def test_the_cli_names_a_chmod_000_file_in_one_line(tiny_checkpoint, tmp_path, name):
    ckpt = _copy(tiny_checkpoint, tmp_path / "ckpt")
    (ckpt / name).chmod(0)
    caps = "-dac_override,-dac_read_search"
    code = ("import sys; from launch import cli; sys.exit(cli.main(['finetune', '--checkpoint', sys.argv[1], '--task', "
            "'sst2', '--data-dir', sys.argv[2], '--max-train-samples', '16', '--max-eval-samples', '16', '--epochs', "
            "'1', '--batch-size', '8', '--max-seq-len', '32', '--no-save-model', '--no-progress', '--out', sys.argv[3]]))")
    done = subprocess.run(["setpriv", f"--inh-caps={caps}", f"--bounding-set={caps}", sys.executable, "-c", code,
                           str(ckpt), str(GLUE), str(tmp_path / "o")], cwd=REPO, capture_output=True, text=True,
                          env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=300)
    if "setpriv:" in done.stderr:
        pytest.skip(f"setpriv cannot drop capabilities here: {done.stderr.strip()}")
    assert done.returncode == 2, done.stderr
    assert f"cannot read {ckpt / name}: Permission denied; make it readable" in done.stderr
    assert "Traceback" not in done.stderr and "No such file" not in done.stderr


# -- 2. non-finite values -----------------------------------------------------------------------------------


def test_a_checkpoint_holding_nan_is_refused_naming_the_tensor(tiny_checkpoint, tmp_path):
    # The run used to start and blame the learning rate for a loss that was NaN before any update.
    ckpt = _copy(tiny_checkpoint, tmp_path / "ckpt")
    _edit_weights(ckpt, "bert.embeddings.position_embeddings.weight", lambda t: t[0].__setitem__(0, math.nan))
    with pytest.raises(ValueError, match=r"model.safetensors holds NaN/inf in bert.embeddings.position_embeddings."
                                         r"weight; the checkpoint is damaged"):
        load_pretrained(BertModel, ckpt)


def test_a_first_step_loss_that_is_not_finite_blames_the_checkpoint_or_data_not_the_lr(tiny_checkpoint, tmp_path):
    # Finite weights whose products overflow: the loss is NaN before the optimizer has taken a step.
    ckpt = _copy(tiny_checkpoint, tmp_path / "ckpt")
    _edit_weights(ckpt, "bert.encoder.layer.0.output.dense.weight", lambda t: t.fill_(3e38))
    with pytest.raises(ValueError, match=r"the loss became (nan|inf) at epoch 1, step 1: before any update, so the "
                                         r"checkpoint's weights or the data are at fault, not the learning rate$"):
        Finetuner(_cfg(ckpt, tmp_path / "o")).run()


@pytest.mark.parametrize("name", ["lr", "feature_lr", "warmup", "weight_decay", "adam_epsilon", "max_grad_norm"])
@pytest.mark.parametrize("value", [math.inf, math.nan])
def test_a_hyperparameter_that_is_not_finite_is_refused(name, value):
    # --lr inf passed `lr > 0` and trained to a NaN loss blamed on divergence.
    cfg = _cfg(Path("ckpt"), Path("o"), **{name: value})
    with pytest.raises(ValueError, match=rf"^--{name.replace('_', '-')} must be a finite number, got {value}$"):
        cfg.validate()


# -- 3. config.json missing a size --------------------------------------------------------------------------


@pytest.mark.parametrize("key", ["hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size"])
def test_a_config_missing_a_size_is_refused_naming_the_key_not_the_weights(tiny_checkpoint, tmp_path, key):
    # BERT-Base's value filled it unseen: "lacks encoder weights (...layers.2...)", "has shape (30522, 32), the config
    # expects (30522, 768)", "hidden_size (32) must be a multiple of num_attention_heads (12)".
    ckpt = _copy(tiny_checkpoint, tmp_path / "ckpt")
    config = json.loads((ckpt / "config.json").read_text())
    del config[key]
    (ckpt / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=rf"^{re.escape(str(ckpt / 'config.json'))}: it has no {key}; add it \(the checkpoint's own "
                                         r"value\)$"):
        load_pretrained(BertModel, ckpt)


def test_a_config_missing_vocab_size_still_takes_it_from_the_vocab(tiny_checkpoint, tmp_path):
    ckpt = _copy(tiny_checkpoint, tmp_path / "ckpt")
    config = json.loads((ckpt / "config.json").read_text())
    del config["vocab_size"]
    (ckpt / "config.json").write_text(json.dumps(config))
    model, _ = load_pretrained(BertModel, ckpt)
    assert model.config.vocab_size == 30522 and torch.isfinite(model.embeddings.word.weight).all()
