"""A checkpoint as fine-tuning opens it: `open_checkpoint(path, vocab)` resolves it
(`launch.export_dirs.resolve_checkpoint`) and checks its config and vocabulary before any training.

The tokenizer is built from the checkpoint's own `vocab.txt`, so the ids always match the embedding
rows; a user-supplied `--vocab` must be the same vocabulary, else the run stops before training.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from launch.export_dirs import resolve_checkpoint
from launch.finetune.examples import DataError
from pipeline.manifest import sha256_file
from pipeline.vocab import build_tokenizer, check_embedding_rows, model_lowercase, read_vocab_tokens


@dataclass(frozen=True)
class Checkpoint:
    hf_dir: Path
    vocab_file: Path
    vocab_size: int  # tokens in vocab.txt
    lowercase: bool


def open_checkpoint(path: str | Path, vocab: str | Path | None = None) -> Checkpoint:
    """Validate a checkpoint directory before any training: BERT weights, config, a matching vocab."""
    path = Path(path)
    if not path.is_dir():
        raise DataError(f"checkpoint {path} is not a directory; pass a bertpipe RUN directory or a Hugging Face model directory")
    try:
        hf_dir = resolve_checkpoint(path)
    except ValueError as err:
        raise DataError(str(err)) from None
    config_file = hf_dir / "config.json"
    try:
        config = json.loads(_read(config_file, "utf-8"))
    except DataError:
        raise
    except (ValueError, OSError) as err:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise DataError(f"{config_file} cannot be read as JSON ({err}); the checkpoint's config is damaged") from None
    if not isinstance(config, dict):
        raise DataError(f"{config_file} holds a JSON {type(config).__name__}, not an object of settings; not a model config")
    if config.get("model_type", "bert") != "bert":
        raise DataError(f"{hf_dir} holds a {config.get('model_type')!r} model, not BERT")
    vocab_file = hf_dir / "vocab.txt"
    if not vocab_file.is_file():
        raise DataError(f"{hf_dir} has no vocab.txt; the fine-tuning tokenizer must use the checkpoint's own vocabulary")
    try:
        tokens = read_vocab_tokens(_read(vocab_file, "utf-8-sig"))
    except UnicodeDecodeError as err:
        raise DataError(f"{vocab_file} is not UTF-8 text ({err.reason} at byte {err.start}); a vocab.txt holds one "
                        "token per line in UTF-8") from None
    try:
        check_embedding_rows(len(tokens), int(config.get("vocab_size", len(tokens))), vocab=str(vocab_file),
                             model=f"checkpoint {hf_dir}")
    except ValueError as err:
        raise DataError(str(err)) from None
    if vocab is not None:
        user = Path(vocab)
        if not user.is_file():
            raise DataError(f"--vocab {user} {'is a directory, not a vocab.txt' if user.is_dir() else 'does not exist'}")
        if sha256_file(user) != sha256_file(vocab_file):
            raise DataError(
                f"--vocab {user} is not the vocabulary of checkpoint {path} ({vocab_file}); "
                "drop --vocab (the checkpoint's own is used) or pass the checkpoint it was trained with"
            )
    for special in ("[CLS]", "[SEP]", "[PAD]", "[UNK]"):
        if special not in tokens:
            raise DataError(f"{vocab_file} lacks the special token {special}; not a BERT WordPiece vocabulary")
    return Checkpoint(hf_dir, vocab_file, len(tokens), model_lowercase(hf_dir, tokens))


def _read(f: Path, encoding: str) -> str:
    """`f`'s text; a file that may not be read is named in one line (it was a traceback, or "damaged")."""
    try:
        return f.read_text(encoding=encoding)
    except OSError as err:  # UnicodeDecodeError, a ValueError, is the caller's to name
        hint = "; make it readable" if isinstance(err, PermissionError) else ""
        raise DataError(f"cannot read {f}: {err.strerror or err}{hint}") from None


def load_tokenizer(ckpt: Checkpoint):
    """A fast WordPiece tokenizer (HF `tokenizers`) over the checkpoint's vocab, no padding/truncation."""
    return build_tokenizer(ckpt.vocab_file.read_text(encoding="utf-8-sig"), ckpt.lowercase)
