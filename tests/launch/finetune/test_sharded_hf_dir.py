"""A sharded Hugging Face directory (`model.safetensors.index.json` + shards) is a checkpoint for every
command that takes one: `launch.checkpoint_dirs` is the one place that says what a checkpoint
directory is (`launch.export_dirs.resolve_checkpoint` turns it into an HF directory) (`features` and `finetune` once answered that question differently).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from repo_paths import GLUE

BERTPIPE = Path(sys.executable).with_name("bertpipe")


@pytest.fixture(scope="module")
def sharded_minilm(minilm_dir, tmp_path_factory) -> Path:
    """The real MiniLM checkpoint saved by `transformers` in shards of at most 20 MB, with its vocab."""
    import transformers

    out = tmp_path_factory.mktemp("sharded") / "minilm"
    transformers.BertModel.from_pretrained(str(minilm_dir)).save_pretrained(out, max_shard_size="20MB")
    for name in ("vocab.txt", "tokenizer.json"):
        shutil.copyfile(minilm_dir / name, out / name)
    assert not (out / "model.safetensors").exists()
    assert len(set(json.loads((out / "model.safetensors.index.json").read_text())["weight_map"].values())) > 1
    return out


def run_ok(*args: object) -> subprocess.CompletedProcess:
    done = subprocess.run([str(BERTPIPE), *map(str, args)], capture_output=True, text=True, timeout=600,
                          env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def test_one_answer_to_what_a_checkpoint_directory_is(sharded_minilm, minilm_dir, tmp_path):
    from launch.checkpoint_dirs import is_hf_dir, is_run_dir
    from launch.export_dirs import resolve_checkpoint

    assert is_hf_dir(sharded_minilm) and is_hf_dir(minilm_dir) and not is_run_dir(sharded_minilm)
    assert resolve_checkpoint(sharded_minilm) == sharded_minilm
    shard = sorted(sharded_minilm.glob("model-*.safetensors"))[0]
    broken = Path(shutil.copytree(sharded_minilm, tmp_path / "broken"))
    (broken / shard.name).unlink()
    from model import BertModel, load_pretrained

    with pytest.raises(ValueError, match=f"names shards that are missing: {shard.name}"):
        load_pretrained(BertModel, broken)


@pytest.mark.slow
def test_features_and_finetune_take_a_sharded_hf_dir(sharded_minilm, minilm_dir, tmp_path):
    texts = tmp_path / "texts.txt"
    texts.write_text("the captain was at sea.\nanne walked to bath.\n")
    for name, ckpt in (("sharded", sharded_minilm), ("single", minilm_dir)):
        run_ok("features", "--checkpoint", ckpt, "--input", texts, "--layers", "last", "--pool", "mean",
               "--out", tmp_path / name)
    sharded, single = np.load(tmp_path / "sharded.npy"), np.load(tmp_path / "single.npy")
    assert sharded.shape == (2, 384)
    np.testing.assert_array_equal(sharded, single)  # the same weights, whichever way they are stored

    out = tmp_path / "sst2"
    run_ok("finetune", "--task", "sst2", "--data-dir", GLUE, "--checkpoint", sharded_minilm, "--out", out,
           "--max-train-samples", "32", "--max-eval-samples", "32", "--epochs", "1", "--batch-size", "16",
           "--max-seq-len", "32", "--no-progress", "--no-save-model")
    result = json.loads((out / "metrics.json").read_text())
    assert result["task"] == "sst2" and result["eval_examples"] == 32 and 0.0 <= result["score"] <= 1.0
