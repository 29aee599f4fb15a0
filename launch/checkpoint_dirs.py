"""Checkpoint resolution and the vocabulary checks every fine-tuning run makes before training.

A `--checkpoint` is one of our pre-training RUN directories (resolved to an HF directory by
`launch.pretrain.hf_export.resolve_checkpoint`, which consolidates ZeRO shards) or an HF-format directory. The
tokenizer is built from the checkpoint's own `vocab.txt`, so the ids always match the embedding
rows; a user-supplied `--vocab` must be the same vocabulary, else the run stops before training.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

from launch.finetune.examples import DataError
from pipeline.manifest import sha256_file
from pipeline.vocab import build_tokenizer, check_embedding_rows, declared_lowercase, vocab_is_cased

logger = logging.getLogger(__name__)

WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin")


@dataclass(frozen=True)
class Checkpoint:
    hf_dir: Path
    vocab_file: Path
    vocab_size: int  # tokens in vocab.txt
    lowercase: bool


def _resolve(path: Path) -> Path:
    """Our RUN dir -> its consolidated HF dir (exported once, cached in the run); an HF dir -> itself."""
    if (path / "config.json").is_file() and any((path / w).is_file() for w in WEIGHT_FILES):
        return path  # what resolve_checkpoint returns too, without importing the DeepSpeed export stack
    from launch.pretrain.hf_export import resolve_checkpoint

    try:
        return Path(resolve_checkpoint(path))
    except ValueError as err:
        raise DataError(f"{path} holds no BERT: {err}") from None


def _lowercase(hf_dir: Path, vocab: list[str]) -> bool:
    """`do_lower_case` from tokenizer_config.json, else the vocabulary's own casing (`pipeline.vocab`)."""
    declared = declared_lowercase(hf_dir)
    return not vocab_is_cased(vocab) if declared is None else declared


def open_checkpoint(path: str | Path, vocab: str | Path | None = None) -> Checkpoint:
    """Validate a checkpoint directory before any training: BERT weights, config, a matching vocab."""
    path = Path(path)
    if not path.is_dir():
        raise DataError(f"checkpoint {path} is not a directory; pass a bertpipe RUN directory or a Hugging Face model directory")
    hf_dir = _resolve(path)
    config_file = hf_dir / "config.json"
    if not config_file.is_file() or not any((hf_dir / w).is_file() for w in WEIGHT_FILES):
        raise DataError(
            f"{path} holds no BERT: expected a bertpipe RUN directory (checkpoints/latest) or a Hugging Face "
            f"directory with config.json and one of {', '.join(WEIGHT_FILES)}"
        )
    config = json.loads(config_file.read_text(encoding="utf-8"))
    if config.get("model_type", "bert") != "bert":
        raise DataError(f"{hf_dir} holds a {config.get('model_type')!r} model, not BERT")
    vocab_file = hf_dir / "vocab.txt"
    if not vocab_file.is_file():
        raise DataError(f"{hf_dir} has no vocab.txt; the fine-tuning tokenizer must use the checkpoint's own vocabulary")
    tokens = vocab_file.read_text(encoding="utf-8").splitlines()
    try:
        check_embedding_rows(len(tokens), int(config.get("vocab_size", len(tokens))), vocab=str(vocab_file),
                             model=f"checkpoint {hf_dir}")
    except ValueError as err:
        raise DataError(str(err)) from None
    if vocab is not None:
        user = Path(vocab)
        if not user.is_file():
            raise DataError(f"--vocab {user} does not exist")
        if sha256_file(user) != sha256_file(vocab_file):
            raise DataError(
                f"--vocab {user} is not the vocabulary of checkpoint {path} ({vocab_file}); "
                "drop --vocab (the checkpoint's own is used) or pass the checkpoint it was trained with"
            )
    for special in ("[CLS]", "[SEP]", "[PAD]", "[UNK]"):
        if special not in tokens:
            raise DataError(f"{vocab_file} lacks the special token {special}; not a BERT WordPiece vocabulary")
    return Checkpoint(hf_dir, vocab_file, len(tokens), _lowercase(hf_dir, tokens))


def load_tokenizer(ckpt: Checkpoint):
    """A fast WordPiece tokenizer (HF `tokenizers`) over the checkpoint's vocab, no padding/truncation."""
    return build_tokenizer(ckpt.vocab_file.read_text(encoding="utf-8"), ckpt.lowercase)
