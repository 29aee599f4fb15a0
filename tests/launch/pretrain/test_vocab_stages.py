"""One vocabulary rule through every stage, and export of a run whose vocabulary rows are padded.

For an uncased vocabulary (bert-base-uncased, which holds a capital letter 'ℝ') and a cased one
(WordPiece trained here on a book without lower-casing), the corpus job, export, fine-tuning and
feature extraction must all reach the same casing and tokenize a sentence the same way. Both runs
set `model.vocab_size` beyond the vocabulary (the documented padding option): export drops the
padded rows, and transformers loads the result.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from built_once import built_once
from launch import cli
from repo_paths import BOOKS, REPO, VOCAB

SENTENCE = "Sir Walter Elliot, of Kellynch Hall, was a vain Man."
PAD_ROWS = 6
STAGES = ("corpus", "run", "hf", "bare")  # the folders made per casing


def _cased_vocab(text: str, out: Path) -> Path:
    from tokenizers import BertWordPieceTokenizer

    tok = BertWordPieceTokenizer(lowercase=False, strip_accents=False)
    tok.train_from_iterator(text.splitlines(), vocab_size=3000, min_frequency=2)
    out.mkdir(parents=True)
    return Path(tok.save_model(str(out))[0])


@pytest.fixture(scope="module")
def stages(tmp_path_factory) -> dict[str, dict[str, Path]]:
    """Per casing: vocab, corpus, a 2-step padded-vocab run, its export, and a bare HF dir (weights,
    config and vocab.txt only: no tokenizer files, so readers fall back to the rule)."""

    def build(root: Path) -> None:
        root.mkdir()
        book = next(b for b in BOOKS if b.name == "persuasion.txt").read_text(encoding="utf-8")[:60000]
        text = root / "book.txt"
        text.write_text(book, encoding="utf-8")
        assert _cased_vocab(book, root / "cased_vocab") == root / "cased_vocab" / "vocab.txt"
        for casing, vocab in vocabs(root).items():
            corpus, run, hf, bare = (root / casing / name for name in STAGES)
            assert cli.main(["corpus", "--input", str(text), "--vocab", str(vocab), "--out", str(corpus),
                             "--seq-len", "32", "--dupe-factor", "1"]) == 0
            rows = sum(1 for _ in open(vocab, encoding="utf-8")) + PAD_ROWS
            cmd = [sys.executable, "-m", "launch.cli", "pretrain", "--config", "tiny", "--data", str(corpus),
                   "--out", str(run), "--nproc", "1", "--max-steps", "2", "--model.vocab-size", str(rows),
                   "--data.global-batch-size", "8", "--data.micro-batch-size", "8"]
            done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600)
            assert done.returncode == 0, done.stderr[-3000:]
            assert cli.main(["export", str(run), "--out", str(hf)]) == 0
            bare.mkdir()
            for name in ("config.json", "model.safetensors", "vocab.txt"):
                shutil.copyfile(hf / name, bare / name)

    def vocabs(root: Path) -> dict[str, Path]:
        return {"uncased": VOCAB, "cased": root / "cased_vocab" / "vocab.txt"}

    root = built_once(tmp_path_factory, "vocab_stages", build)
    return {casing: {"vocab": vocab, **{name: root / casing / name for name in STAGES}}
            for casing, vocab in vocabs(root).items()}


@pytest.mark.slow
@pytest.mark.parametrize("casing", ["uncased", "cased"])
def test_every_stage_decides_the_same_casing_and_tokenizes_alike(stages, casing):
    from launch.finetune.checkpoint import load_tokenizer, open_checkpoint
    from launch.finetune.feature_extraction import load_tokenizer as features_tokenizer
    from pipeline.manifest import read_manifest
    from pipeline.tokenize import build_tokenizer

    s = stages[casing]
    lowercase = casing == "uncased"
    manifest = read_manifest(s["corpus"])
    exported = json.loads((s["hf"] / "tokenizer_config.json").read_text())
    decided = {
        "corpus": manifest["lowercase"],
        "export": exported["do_lower_case"],
        "finetune": open_checkpoint(s["hf"]).lowercase,
        "finetune, no tokenizer files": open_checkpoint(s["bare"]).lowercase,
    }
    assert decided == dict.fromkeys(decided, lowercase)

    def tokens(tok) -> list[str]:
        return tok.encode(SENTENCE).tokens

    corpus_tok = build_tokenizer((s["corpus"] / "vocab.txt").read_text(encoding="utf-8"), manifest["lowercase"])
    expected = tokens(corpus_tok)
    assert ("Sir" in expected) != lowercase and ("sir" in expected) == lowercase
    from transformers import BertTokenizerFast

    hf_tok = BertTokenizerFast.from_pretrained(str(s["hf"]))
    assert hf_tok.convert_ids_to_tokens(hf_tok(SENTENCE)["input_ids"]) == expected
    assert exported["model_max_length"] == 512  # the tiny preset's positions
    for where in ("hf", "bare"):
        assert tokens(load_tokenizer(open_checkpoint(s[where]))) == expected, where
        assert tokens(features_tokenizer(s[where], 64)) == expected, where


@pytest.mark.parametrize("casing", ["uncased", "cased"])
def test_padded_vocab_run_exports_the_real_rows_and_loads_in_transformers(stages, casing):
    import transformers

    from launch.checkpoint_dirs import read_latest, read_meta
    from launch.pretrain.hf_export import consolidated_state_dict

    s = stages[casing]
    vocab_size = sum(1 for _ in open(s["vocab"], encoding="utf-8"))
    ckpt = s["run"] / "checkpoints"
    tag = read_latest(ckpt)
    meta = read_meta(ckpt, tag)
    assert meta["bert_config"]["vocab_size"] == vocab_size + PAD_ROWS  # the run really was padded
    trained = consolidated_state_dict(ckpt, tag, meta)

    model, info = transformers.BertForPreTraining.from_pretrained(str(s["hf"]), output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    assert model.config.vocab_size == vocab_size
    emb = model.bert.embeddings.word_embeddings.weight
    assert emb.shape[0] == vocab_size
    assert torch.equal(emb, trained["bert.embeddings.word.weight"][:vocab_size])
    assert torch.equal(model.cls.predictions.bias, trained["mlm.bias"][:vocab_size])


def test_a_padded_phase_1_run_starts_phase_2_with_the_same_padded_vocab_size(stages, tmp_path):
    # Its export keeps the real rows only; phase 2 with the very same model.vocab_size was refused
    # ("vocab_size 30522 there, 30528 here") though the user had set it as told.
    from launch.pretrain.hf_export import load_checkpoint_file

    s = stages["uncased"]
    rows = sum(1 for _ in open(s["vocab"], encoding="utf-8"))
    run = tmp_path / "phase2"
    cmd = [sys.executable, "-m", "launch.cli", "pretrain", "--config", "tiny", "--data", str(s["corpus"]), "--out",
           str(run), "--nproc", "1", "--max-steps", "1", "--model.vocab-size", str(rows + PAD_ROWS),
           "--data.global-batch-size", "8", "--data.micro-batch-size", "8", "--checkpoint.init-from", str(s["run"]),
           "--optim.lr", "1e-12"]  # one step that barely moves the weights
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"{rows} vocabulary rows from the checkpoint, {PAD_ROWS} padding rows drawn afresh" in done.stderr
    from safetensors.torch import load_file

    start = load_file(s["hf"] / "model.safetensors")["bert.embeddings.word_embeddings.weight"]
    after = load_checkpoint_file(run / "checkpoints" / "global_step1" / "mp_rank_00_model_states.pt")["module"]
    torch.testing.assert_close(after["bert.embeddings.word.weight"][:rows], start, rtol=0, atol=1e-6)


def test_init_from_an_hf_directory_without_vocab_txt_is_one_line(stages, tmp_path):
    # A FileNotFoundError traceback on rank 0, exit 1
    s = stages["uncased"]
    hf = Path(shutil.copytree(s["bare"], tmp_path / "novocab"))
    (hf / "vocab.txt").unlink()
    cmd = [sys.executable, "-m", "launch.cli", "pretrain", "--config", "tiny", "--data", str(s["corpus"]), "--out",
           str(tmp_path / "run"), "--nproc", "1", "--max-steps", "1", "--checkpoint.init-from", str(hf)]
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert f"checkpoint.init_from {hf} has no vocab.txt" in done.stderr
